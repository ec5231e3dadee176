"""Where the test suite's CPU goes, per file and per test, from the JSON lines that
``EMBED_SWEEP_TEST_CPU=FILE`` makes tests/conftest.py write (the CPU of each test's whole process
tree: the servers, clusters and commands it started). On the 2-core machine the suite's wall time
is bounded below by its CPU seconds / 2, so this, not ``--durations``, says what to cut.

    rm -f /tmp/cpu.jsonl; EMBED_SWEEP_TEST_CPU=/tmp/cpu.jsonl CI=true bash .ci/test
    .venv/bin/python -m bench.suite.cpu /tmp/cpu.jsonl [--tests 30] [--write-durations tests/durations.json]

``--write-durations`` records each file's summed wall seconds, the order tests/conftest.py hands
whole files to the two pytest processes in (longest first).
"""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--tests", type=int, default=30, help="how many of the costliest tests to list")
    ap.add_argument("--write-durations", metavar="JSON", help="write each file's wall seconds here")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.file) if line.strip()]
    cpu, wall = collections.Counter(), collections.Counter()
    for r in rows:
        f = r["test"].split("::")[0]
        cpu[f] += r["cpu"]
        wall[f] += r["wall"]
    total = sum(cpu.values())
    print(f"{len(rows)} tests: {total:.0f} CPU s (>= {total / 2 / 60:.1f} min of wall on 2 cores), "
          f"{sum(wall.values()):.0f} s of test wall time summed")
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>8}  file")
    for f, c in cpu.most_common():
        print(f"{c:8.1f} {c / total:6.1%} {wall[f]:8.1f}  {f}")
    if a.write_durations:
        with open(a.write_durations, "w") as f:
            json.dump({k.split("/")[-1]: round(v, 1) for k, v in wall.most_common()}, f, indent=1)
            f.write("\n")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for r in sorted(rows, key=lambda r: -r["cpu"])[: a.tests]:
        print(f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['test']}")


if __name__ == "__main__":
    main()
