"""Cost of one repeat of `hostpin repro staging`, control side, on this machine.

    python bench/staging_cost.py [--runs 3] [--bytes 3GiB] [--threads 24] [--bursts 2]

Runs `hostpin repro staging --sides control --repeat 1` --runs times (run it under the shared
lock on the CI machine: it copies gigabytes). Prints per run: the command's wall time, the
repeat's own time (the child process, from the manifest), the settle time the readings took,
the peak RSS of the child (getrusage of waited-for descendants) and the peak rise of the node's
in-use memory (MemTotal - MemAvailable without the per-CPU lists, sampled every 50 ms); then
the medians. The GPU sides cost more (a CUDA context, cudaHostAlloc): see bench/gpu_staging_control.sh.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diag.memacct import corrected_in_use, reading  # noqa: E402
from diag.rootfs import Root  # noqa: E402

MiB = 1 << 20


def peak_in_use(stop: threading.Event, out: list) -> None:
    root = Root("/")
    start = corrected_in_use(reading(root))
    peak = start
    while not stop.wait(0.05):
        peak = max(peak, corrected_in_use(reading(root)))
    out.append(peak - start)


def one(args, out_dir: str) -> dict:
    stop, rise = threading.Event(), []
    sampler = threading.Thread(target=peak_in_use, args=(stop, rise))
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "repro", "staging", "--sides", "control", "--repeat", "1",
                           "--bytes", args.bytes, "--threads", str(args.threads), "--bursts", str(args.bursts),
                           "--json", "--out", out_dir], capture_output=True, text=True)
    wall = time.monotonic() - t0
    stop.set()
    sampler.join()
    result = json.loads(proc.stdout)
    manifest = json.load(open(os.path.join(result["run_dir"], "manifest.json")))
    child_s = next(e["duration_s"] for e in manifest["entries"] if e.get("kind") == "repeat")
    settle = sum(c["settle_s"] for c in result["corrections"] if c.get("settle_s"))
    return {"wall_s": wall, "repeat_s": child_s, "settle_s": settle, "rc": proc.returncode,
            "retained_mib": result["sides"]["control"]["retained_bytes"] / MiB,
            "in_use_rise_mib": rise[0] / MiB if rise else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bytes", default="3GiB")
    ap.add_argument("--threads", type=int, default=24)
    ap.add_argument("--bursts", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostpin-bench-") as out_dir:
        for i in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            row = one(args, out_dir)
            row["child_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            if row["child_peak_rss_mib"] * 1024 < before:
                row["child_peak_rss_mib"] = None  # an earlier, larger child still holds the maximum
            rows.append(row)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in row.items()), flush=True)
    med = {k: statistics.median(r[k] for r in rows if r[k] is not None) for k in rows[0] if k != "rc"}
    print(f"one repeat, control side, {args.bytes} x {args.bursts} bursts over {args.threads} threads: "
          f"{med['repeat_s']:.1f} s (command {med['wall_s']:.1f} s, of which settling {med['settle_s']:.1f} s); "
          f"peak child RSS {med['child_peak_rss_mib']:.0f} MiB, node in-use rise {med['in_use_rise_mib']:.0f} MiB "
          f"(median of {len(rows)})")


if __name__ == "__main__":
    main()
