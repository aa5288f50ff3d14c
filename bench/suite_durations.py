"""Where the test suite's time goes, per file: sums pytest's `--durations=0` lines (setup,
call and teardown of every test) by file, from one or more saved pytest outputs, or the
test times of a JUnit XML report (`--junitxml`, which scripts/test.sh takes through
PYTEST_ADDOPTS).

    pytest -q --durations=0 > /tmp/suite.log; python bench/suite_durations.py /tmp/suite.log

With two logs (before, after) it prints both columns side by side. Under xdist the
durations are per test, as serially; the suite's wall time is what `pytest` itself prints.
"""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?\.py)::")
WALL = re.compile(r" in (\d+(?:\.\d+)?)s(?: \(|=| *$)")


def per_file(log: Path) -> tuple[dict[str, float], float | None]:
    """Seconds per test file, and the wall time pytest printed (None if it printed none)."""
    sums: defaultdict[str, float] = defaultdict(float)
    wall = None
    if log.suffix == ".xml":
        root = ET.parse(log).getroot()
        for case in root.iter("testcase"):
            name = case.get("classname", "").split(".")
            file = "/".join(
                name[: next(i for i, n in enumerate(name) if n.startswith("test_")) + 1]
            )
            sums[f"{file}.py"] += float(case.get("time", 0))
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        return sums, float(suite.get("time", 0)) if suite is not None else None
    for line in log.read_text(errors="replace").splitlines():
        if m := LINE.match(line):
            sums[m[3]] += float(m[1])
        elif (w := WALL.search(line)) and ("passed" in line or "failed" in line):
            wall = float(w[1])
    return sums, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path, help="pytest outputs run with --durations=0")
    ap.add_argument("--top", type=int, default=25, help="how many files to list")
    args = ap.parse_args()
    runs = [per_file(log) for log in args.logs]
    first = runs[0][0]
    names = sorted(first, key=lambda n: -first[n])[: args.top]
    print("file".ljust(44) + "".join(f"{log.name[-12:]:>14}" for log in args.logs))
    for name in names:
        print(name.ljust(44) + "".join(f"{sums.get(name, 0.0):>13.1f}s" for sums, _ in runs))
    print("sum of tests".ljust(44) + "".join(f"{sum(s.values()):>13.1f}s" for s, _ in runs))
    print(
        "pytest wall".ljust(44)
        + "".join(f"{w:>13.1f}s" if w is not None else f"{'?':>14}" for _, w in runs)
    )


if __name__ == "__main__":
    main()
