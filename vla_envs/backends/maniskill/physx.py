"""SAPIEN's PhysX GPU library: checked before a GPU-batched env is built, fetched on demand.

``sapien.physx.enable_gpu()`` (called by ManiSkill for ``sim_backend="physx_cuda"``) loads
``~/.sapien/physx/<version>/libPhysXGpu_64.so`` and, when it is missing, downloads
``linux-so.zip`` from the ``sapien-sim/physx-precompiled`` GitHub release named by
``sapien.physx.version()``. No package index carries it. On an offline node that download fails
with a raw ``requests`` traceback, and parallel workers race on it and can leave a truncated file.
So: ``check_physx_library`` raises ``AssetsMissingError`` naming the folder, the file, the URL and
``vla-envs fetch-physx``, which downloads and verifies the library on a machine with internet and
writes it atomically, into any home folder (a cluster's shared disk, then linked from
``~/.sapien/physx``).
"""

from __future__ import annotations

import http.client
import os
import platform
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from vla_envs.errors import AssetsMissingError

LIBRARY = "libPhysXGpu_64.so"
MIN_LIBRARY_BYTES = 1_000_000
"""The real library is tens of MB; anything smaller is a truncated or wrong file."""
RELEASES = "https://github.com/sapien-sim/physx-precompiled/releases/download"


def physx_version() -> str:
    """The PhysX build the installed SAPIEN expects (its release name)."""
    import sapien

    return sapien.physx.version()


def physx_folder(home: str | Path | None = None, version: str | None = None) -> Path:
    """Where SAPIEN looks: ``<home>/.sapien/physx/<version>/`` (home: the user's)."""
    return Path(home or Path.home()) / ".sapien" / "physx" / (version or physx_version())


def physx_url(version: str | None = None) -> str:
    """The release asset SAPIEN downloads on this platform."""
    machine = platform.machine()
    if platform.system() != "Linux" or machine not in ("x86_64", "AMD64", "aarch64", "arm64"):
        raise RuntimeError(f"SAPIEN's GPU PhysX has no build for {platform.system()} {machine}")
    asset = "linux-so.zip" if machine in ("x86_64", "AMD64") else "linux-aarch64-so.zip"
    return f"{RELEASES}/{version or physx_version()}/{asset}"


def physx_library_status(home: str | Path | None = None, version: str | None = None) -> tuple[bool, Path]:
    """``(present, path)`` of the library; present means a file of a plausible size."""
    path = physx_folder(home, version) / LIBRARY
    return path.is_file() and path.stat().st_size >= MIN_LIBRARY_BYTES, path


def check_physx_library(home: str | Path | None = None, version: str | None = None) -> Path:
    """The library's path, or an ``AssetsMissingError`` saying how to get it (never a download).

    Raises:
        AssetsMissingError: naming the folder, the file, the URL and ``vla-envs fetch-physx``.
    """
    version = version or physx_version()
    present, path = physx_library_status(home, version)
    if present:
        return path
    what = "is truncated" if path.is_file() else "is missing"
    raise AssetsMissingError(
        f"sim_backend='physx_cuda' needs SAPIEN's PhysX GPU library, which {what}: {path} (PhysX {version}). "
        f"SAPIEN would download it at the first GPU env, which fails offline. On a machine with internet run "
        f"`vla-envs fetch-physx` (or `vla-envs fetch-physx --home /shared/dir` for a cluster's shared disk, then "
        f"link /shared/dir/.sapien/physx to ~/.sapien/physx on each node), or download {physx_url(version)} and "
        f"unzip it into {path.parent}. `vla-envs doctor` checks it. Without a GPU use sim_backend='physx_cpu'.")


def fetch_physx(home: str | Path | None = None, url: str | None = None, version: str | None = None,
                timeout_s: float = 600.0, min_bytes: int = MIN_LIBRARY_BYTES) -> Path:
    """Download, verify and install the library; atomic: a failure leaves nothing half-written.

    Verification: the zip's CRCs, the library inside it and its size, and, where CUDA's driver
    library is present, that the library loads.

    Args:
        home: the home folder to install under (default: the user's).
        url: where to download from (default: SAPIEN's release URL for this version and platform).

    Returns:
        The installed library's path.

    Raises:
        RuntimeError: the download or a check failed (the message names which); nothing installed.
    """
    version = version or physx_version()
    url = url or physx_url(version)
    folder = physx_folder(home, version)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{version}.fetch-") as tmp:
        archive = Path(tmp) / "physx.zip"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response, open(archive, "wb") as out:
                shutil.copyfileobj(response, out)
                declared = response.headers.get("Content-Length")
        except (OSError, http.client.HTTPException) as e:  # a cut chunked stream: IncompleteRead
            raise RuntimeError(f"downloading {url} failed: {e!r}") from None
        if declared is not None and declared.isdigit() and archive.stat().st_size != int(declared):
            raise RuntimeError(f"downloading {url} failed: truncated, {archive.stat().st_size} of {declared} bytes")
        try:
            with zipfile.ZipFile(archive) as z:
                bad = z.testzip()
                if bad is not None:
                    raise RuntimeError(f"{url}: {bad} in the archive is corrupt (CRC mismatch)")
                if LIBRARY not in z.namelist():
                    raise RuntimeError(f"{url}: the archive holds {z.namelist()}, not {LIBRARY}")
                z.extractall(Path(tmp) / "out")
        except zipfile.BadZipFile as e:
            raise RuntimeError(f"{url}: not a zip archive (truncated download?): {e}") from None
        library = Path(tmp) / "out" / LIBRARY
        if library.stat().st_size < min_bytes:
            raise RuntimeError(f"{url}: {LIBRARY} is {library.stat().st_size} bytes, below {min_bytes}: not the library")
        _try_load(library)
        staged = Path(tmp) / "out"
        if folder.exists():  # replace a truncated or older install as a whole
            old = Path(tmp) / "old"
            os.replace(folder, old)
        os.replace(staged, folder)
    return folder / LIBRARY


def _try_load(library: Path) -> None:
    """Load the library where CUDA's driver is present (it links against libcuda); elsewhere skip."""
    import ctypes
    import ctypes.util

    if ctypes.util.find_library("cuda") is None:
        return
    try:
        ctypes.CDLL("libcuda.so", ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(library), ctypes.RTLD_LOCAL)
    except OSError as e:
        raise RuntimeError(f"{LIBRARY} does not load on this machine: {e}") from None
