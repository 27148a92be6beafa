"""Counts test cases over Bazel's gtest XML reports: one line per test target and a total.

The total line has the form 'tests: N passed, N failed, N skipped' so that CI readers (and
people) see GPU tests that were skipped on a machine without a GPU, instead of Bazel's PASSED.
For a target with failures it also repeats the failing lines of its test.log (gtest's
"[  FAILED  ]", a script's "FAIL:"/"FAILED:"), so they are at the end of a long CI log too.

Usage: test_summary.py TESTLOGS [TARGETS_FILE]. With TARGETS_FILE (one label per line, e.g. the
output of `bazel query 'tests(//...)'`), only those targets' reports count: the output base keeps
the reports of targets that no longer exist (a moved or deleted test), which would otherwise be
counted again.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET

FAILURE_MARKS = ("[  FAILED  ]", "FAIL: ", "FAILED: ", "Failure", "Traceback")


def failing_lines(test_log: str, limit: int = 40) -> list:
    """The marked lines, and each gtest assertion ("file:line: Failure") with its next 5 lines."""
    try:
        with open(test_log, errors="replace") as f:
            log = [l.rstrip() for l in f]
    except OSError:
        return []
    lines, follow = [], 0
    for l in log:
        if l.endswith(": Failure"):
            follow = 6
        if follow > 0 or l.lstrip().startswith(FAILURE_MARKS):
            lines.append(l)
        follow -= 1
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def report_dir(label: str) -> str:
    """//a/b:c -> a/b/c, the folder of the target's reports under bazel-testlogs."""
    pkg, _, name = label.strip().lstrip("/").partition(":")
    return os.path.join(pkg, name) if name else pkg


def main(testlogs: str, targets_file: str = "") -> int:
    totals = [0, 0, 0]
    wanted = None
    if targets_file:
        with open(targets_file) as f:
            wanted = {report_dir(l) for l in f if l.strip().startswith("//")}
    for path in sorted(glob.glob(os.path.join(testlogs, "**", "test.xml"), recursive=True)):
        rel = os.path.relpath(os.path.dirname(path), testlogs)
        if wanted is not None and rel not in wanted:
            continue
        target = "//" + rel
        counts = [0, 0, 0]
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            print(f"{target}: unreadable test.xml")
            totals[1] += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                counts[1] += 1
            elif case.find("skipped") is not None or case.get("result") == "skipped":
                counts[2] += 1
            else:
                counts[0] += 1
        totals = [a + b for a, b in zip(totals, counts)]
        print(f"{target}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
        if counts[1]:
            for line in failing_lines(os.path.join(os.path.dirname(path), "test.log")):
                print("    " + line)
    print(f"tests: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
