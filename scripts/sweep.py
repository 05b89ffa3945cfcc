#!/usr/bin/env python3
"""A long simulation sweep over every core, and the sum of what its seeds reached (issue #9).

    scripts/sweep.py run COUNT [--start S] [--jobs J] [--out DIR] [--bin PATH] [--groups G]
    scripts/sweep.py sum DIR...

`run` builds latchkey-sim with the `sweep` profile (release + LTO), splits seeds
S .. S+COUNT into J contiguous ranges (J defaults to the number of cores) and runs one
niced `latchkey-sim --seeds N --start S` per range, its per-seed lines in DIR/job-K.out
(DIR defaults to target/sweeps/<commit>-<S>), with TMPDIR on /dev/shm where there is one
(the snapshot files' fsync is the one I/O of a seed). `--bin` runs a binary built before
(to go on with the binary of an earlier part of the sweep) instead of building. Then, as `sum` does, it prints the
seeds run, the failed ones with their replay command, the wall time, and every count
summed from the per-seed lines. `sum` reads the lines of a sweep that was stopped too,
so a sweep cut short still says exactly which seeds it covered.

A seed is a pure function of the code and the seed (see crates/sim/src/lib.rs,
"Determinism"), so the ranges of one commit add up, whichever sitting ran them; record the
commit with the result. Exit status: 0 when every seed passed, 1 when one failed, 2 on misuse.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What `latchkey-sim` prints: one line per passing seed, a report per failing one.
OK = re.compile(
    r"^seed (\d+): ok \((\d+) nodes, (?:\d+ groups, )?(\d+) clients, (\d+) idle sessions, (\d+) ops, (\d+) grants, "
    r"(\d+) committed entries, (\d+) hold checks within 1s of their expiry, (\d+) faults; (.*)\) in ([\d.]+)s$"
)
FAILED = re.compile(r"^=== latchkey-sim: seed (\d+) FAILED ===$")
REACHED = re.compile(r"^reached: (.*)$")
COUNT = re.compile(r"(\d+) ([a-z][a-z ]*?)(?=[,;()]|$)")
RUN_FIELDS = ["ops", "grants", "committed entries", "hold checks near expiry", "faults"]


def coverage(text):
    """The labelled counts of a coverage string, e.g. {'snapshot installs': 3, ...}."""
    return {label.strip(): int(n) for n, label in COUNT.findall(text)}


def summarize(dirs):
    seeds, failed, totals, seconds = set(), [], {}, 0.0
    for d in dirs:
        # The group count the sweep ran with (`run` writes it; 1 for sweeps from before it did).
        groups_file = Path(d) / "groups"
        groups = int(groups_file.read_text()) if groups_file.is_file() else 1
        for path in sorted(Path(d).glob("job-*.out")):
            with open(path) as f:
                for line in f:
                    line = line.rstrip("\n")
                    m = OK.match(line)
                    if m:
                        seeds.add(int(m.group(1)))
                        for name, v in zip(RUN_FIELDS, m.groups()[4:9]):
                            totals[name] = totals.get(name, 0) + int(v)
                        for k, v in coverage(m.group(10)).items():
                            totals[k] = totals.get(k, 0) + v
                        seconds += float(m.group(11))
                        continue
                    m = FAILED.match(line)
                    if m:
                        seeds.add(int(m.group(1)))
                        failed.append((int(m.group(1)), groups))
                        continue
                    m = REACHED.match(line)
                    if m and failed:
                        for k, v in coverage(m.group(1)).items():
                            totals[k] = totals.get(k, 0) + v
    return sorted(seeds), sorted(failed), totals, seconds


def report(dirs, wall=None):
    seeds, failed, totals, seconds = summarize(dirs)
    if not seeds:
        print("no seed lines found in", ", ".join(map(str, dirs)))
        return 2
    ranges, start = [], seeds[0]
    for a, b in zip(seeds, seeds[1:] + [None]):
        if b != a + 1:
            ranges.append(f"{start}-{a}" if start != a else f"{a}")
            start = b
    print(f"{len(seeds)} seeds ({', '.join(ranges)}), {len(failed)} failed")
    if wall is not None:
        print(f"wall time {wall:.0f} s; {seconds:.0f} seed-seconds in the passing seeds")
    else:
        print(f"{seconds:.0f} seed-seconds in the passing seeds")
    for k, v in totals.items():
        print(f"  {v:>10,} {k}")
    for s, groups in failed:
        flag = f" --groups {groups}" if groups != 1 else ""
        print(f"FAILED seed {s}: cargo run --release -p latchkey-sim -- --reproduce {s}{flag}")
    return 1 if failed else 0


def run(args):
    cores = os.cpu_count() or 1
    jobs = args.jobs or cores
    if args.count < 1 or jobs < 1:
        print("COUNT and --jobs must be at least 1", file=sys.stderr)
        return 2
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        print("note: the work tree has uncommitted changes; the sweep is not of one commit")
    suffix = f"-g{args.groups}" if args.groups != 1 else ""
    out = Path(args.out or REPO / "target" / "sweeps" / f"{commit}-{args.start}{suffix}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "groups").write_text(f"{args.groups}\n")
    if args.bin:
        binary = Path(args.bin).resolve()
    else:
        subprocess.run(["cargo", "build", "--profile", "sweep", "-p", "latchkey-sim", "--locked"],
                       cwd=REPO, check=True)
        binary = REPO / "target" / "sweep" / "latchkey-sim"
    env = dict(os.environ)
    if Path("/dev/shm").is_dir():
        env["TMPDIR"] = "/dev/shm"
    per, extra = divmod(args.count, jobs)
    procs, start = [], args.start
    for k in range(jobs):
        n = per + (1 if k < extra else 0)
        if n == 0:
            continue
        f = open(out / f"job-{k}.out", "w")
        groups = ["--groups", str(args.groups)] if args.groups != 1 else []
        procs.append((subprocess.Popen(["nice", "-n", "19", str(binary), "--seeds", str(n),
                                        "--start", str(start)] + groups,
                                       stdout=f, stderr=subprocess.STDOUT, env=env), f))
        start += n
    print(f"commit {commit}: seeds {args.start}..{start} in {len(procs)} jobs, lines in {out}")
    began = time.monotonic()
    try:
        for p, f in procs:
            p.wait()
            f.close()
    except KeyboardInterrupt:
        for p, _ in procs:
            p.terminate()
        print("stopped; what ran so far:")
    return report([out], time.monotonic() - began)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="run a sweep")
    r.add_argument("count", type=int)
    r.add_argument("--start", type=int, default=0)
    r.add_argument("--jobs", type=int, default=0)
    r.add_argument("--out")
    r.add_argument("--groups", type=int, default=1, help="Raft groups per run (issue #16)")
    r.add_argument("--bin", help="a latchkey-sim binary to run instead of building one")
    s = sub.add_parser("sum", help="sum the per-seed lines of sweeps already run")
    s.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    if args.verb == "run":
        return run(args)
    return report(args.dirs)


if __name__ == "__main__":
    sys.exit(main())
