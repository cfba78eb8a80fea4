"""What ``pip install .`` (not editable) installs: every file of the packages, data files too.

An editable install, which the setup scripts make, reads data files from the checkout, so a file
missing from ``package-data`` only shows up for users who install a wheel. The wheel is built for
real, with setuptools, from a copy of the packages (building in the checkout would leave ``build/``
there).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return [p.rstrip("*") for p in patterns]


def _source_files(top: Path) -> set[str]:
    return {p.relative_to(top.parent).as_posix() for p in top.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_the_wheel_holds_every_file_of_the_packages(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    expected: set[str] = set()
    for name in _package_dirs():
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        expected |= _source_files(src / name)
    assert any(f.endswith(".json") for f in expected) and any(f.endswith(".yaml") for f in expected)

    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "--disable-pip-version-check", str(src), "-w", str(out)], check=True, timeout=300)
    (wheel,) = out.glob("*.whl")
    packaged = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}

    missing = sorted(expected - packaged)
    assert not missing, f"files of the packages a wheel leaves out (add them to package-data): {missing}"
