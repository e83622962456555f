"""Wall time of `hostpin preflight`, as a launcher sees it (a fresh process each time).

    python bench/preflight_speed.py [--runs 15] [--cuda] [--size 47.2GiB --ranks 2]

Prints the median, min and max over the runs, with and without the CUDA probe. Targets
(issue 2): median < 0.5 s with --no-cuda on the CI machine, < 3 s with the probe on a GPU node.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time


def time_runs(args: list[str], runs: int) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "repro.cli", "preflight", *args, "--out", tmp],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--cuda", action="store_true", help="also time runs with the CUDA probe")
    ap.add_argument("--size", default="47.2GiB")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    plan = ["--size", opts.size, "--ranks", opts.ranks]
    cases = {"no-cuda": plan + ["--no-cuda"]}
    if opts.cuda:
        cases["cuda"] = plan
    report = {}
    for name, args in cases.items():
        time_runs(args, 1)  # warm the page cache for the interpreter and the package
        times = time_runs(args, opts.runs)
        report[name] = {"runs": len(times), "median_s": statistics.median(times), "min_s": min(times),
                        "max_s": max(times)}
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        for name, r in report.items():
            print(f"preflight {name:8s} median {r['median_s']:.3f} s  min {r['min_s']:.3f}  max {r['max_s']:.3f}"
                  f"  ({r['runs']} runs)")


if __name__ == "__main__":
    main()
