"""Where the test suite's CPU goes, per file and per test, from the JSON lines that
``EMBED_SWEEP_TEST_CPU=FILE`` makes tests/conftest.py write (the CPU of each test's whole process
tree: the servers, clusters and commands it started). On the 2-core machine the suite's wall time
is bounded below by its CPU seconds / 2, so this, not ``--durations``, says what to cut.

    rm -f /tmp/cpu.jsonl; EMBED_SWEEP_TEST_CPU=/tmp/cpu.jsonl CI=true bash .ci/test
    .venv/bin/python -m bench.suite.cpu /tmp/cpu.jsonl [--tests 30] [--write-durations tests/durations.json]

``--write-durations`` records each file's summed wall seconds, the order tests/conftest.py hands
whole files to the two pytest processes in (longest first). ``--replay DURATIONS`` replays that
hand-out on the given per-file seconds (FILE is then not read): each of the two processes takes
the next whole file when it has finished its own, so it says when each would end.

    .venv/bin/python -m bench.suite.cpu --replay tests/durations.json
"""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--tests", type=int, default=30, help="how many of the costliest tests to list")
    ap.add_argument("--write-durations", metavar="JSON", help="write each file's wall seconds here")
    ap.add_argument("--replay", metavar="JSON", help="replay the two processes' hand-out on these seconds")
    ap.add_argument("--workers", type=int, default=2, help="processes to replay (--replay)")
    a = ap.parse_args()
    if a.replay:
        with open(a.replay) as f:
            replay(json.load(f), a.workers)
        return
    if not a.file:
        ap.error("FILE is needed unless --replay is given")
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


def replay(seconds: dict, workers: int = 2) -> list[float]:
    """Each process's end when ``workers`` processes take whole files longest first (the order of
    tests/conftest.py), each taking the next when it has finished its own; prints the files each
    took and returns the end times. A model of the hand-out only: the real processes also slow each
    other down, and pytest-xdist hands a process its next file a little before it has finished."""
    ends, took = [0.0] * workers, [[] for _ in range(workers)]
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        w = min(range(workers), key=lambda i: ends[i])
        ends[w] += s
        took[w].append(name)
    for w in range(workers):
        last = took[w][-1] if took[w] else "-"
        print(f"process {w}: {ends[w]:7.1f} s, {len(took[w])} files, the last {last}")
    print(f"the run ends at {max(ends):.1f} s (files summed {sum(seconds.values()):.1f} s)")
    return ends


if __name__ == "__main__":
    main()
