"""The reliability report: every test marked ``reliability`` is run and summed up, one row per
fault or bad-input class, as the table in docs/reliability.md.

    .venv/bin/python bench/reliability.py [--out docs/reliability.md] [-- extra pytest arguments]

A test declares what it injects and what must happen with
``@pytest.mark.reliability(fault="...", cases=N, outcome="...")``; ``cases`` is how many faults or
inputs one run of it tries (hypothesis examples, kills, parametrized inputs count per item). A row
holds only when every test of it passed; a failed or skipped test is shown as such, not hidden.
The robot safety fuzz runs its full 10,000 chunks here (about 15 min; CI runs 300).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Collector:
    """A pytest plugin: each reliability item's declaration and outcome."""

    def __init__(self) -> None:
        self.declared: dict[str, dict] = {}
        self.outcome: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            mark = item.get_closest_marker("reliability")
            if mark is not None:
                self.declared[item.nodeid] = dict(mark.kwargs)

    def pytest_runtest_logreport(self, report) -> None:
        if report.nodeid not in self.declared:
            return
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped and self.outcome.get(report.nodeid) != "failed":
            self.outcome[report.nodeid] = "skipped"
        elif report.when == "call" and report.passed:
            self.outcome.setdefault(report.nodeid, "passed")


def table(collector: Collector) -> str:
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {"cases": 0, "tests": [], "results": []})
    for nodeid, kw in collector.declared.items():
        row = rows[(kw.get("fault", nodeid), kw.get("outcome", "?"))]
        row["cases"] += int(kw.get("cases", 1))
        row["tests"].append(nodeid.split("[")[0])
        row["results"].append(collector.outcome.get(nodeid, "not run"))
    lines = ["| fault or bad input | cases tried | required outcome | result | tests |", "|---|---|---|---|---|"]
    for (fault, outcome), row in rows.items():
        results = row["results"]
        passed = results.count("passed")
        verdict = ("held" if passed == len(results) else
                   f"{passed} of {len(results)} passed, " + ", ".join(sorted({r for r in results if r != 'passed'})))
        tests = ", ".join(f"`{t}`" for t in dict.fromkeys(row["tests"]))
        lines.append(f"| {fault} | {row['cases']} | {outcome} | {verdict} | {tests} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write the report (markdown) here")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = p.parse_args(argv)
    collector = Collector()
    os.environ.setdefault("VLA_SAFETY_FUZZ_CHUNKS", "10000")  # read by tests/robot/test_safety_fuzz.py
    start = time.time()
    code = pytest.main(["-m", "reliability", "-q", "-p", "no:cacheprovider", str(ROOT / "tests"),
                        *args.pytest_args], plugins=[collector])
    minutes = (time.time() - start) / 60
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    report = (f"Produced by `.venv/bin/python bench/reliability.py --out docs/reliability.md` at commit {commit} "
              f"({minutes:.1f} min, pytest exit status {int(code)}).\n\n" + table(collector) + "\n")
    print("\n" + report)
    if args.out is not None:
        text = args.out.read_text() if args.out.exists() else ""
        begin, end = "<!-- report: begin -->", "<!-- report: end -->"
        if begin in text and end in text:  # the prose around the generated table stays
            text = text[:text.index(begin) + len(begin)] + "\n" + report + text[text.index(end):]
        else:
            text = f"{begin}\n{report}{end}\n"
        args.out.write_text(text)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
