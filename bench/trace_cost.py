"""What `--trace` costs: hostpin's own CPU and the pin's time, with and without it.

    python bench/trace_cost.py [--size 128MiB] [--runs 3] [--rates 11MB/s,none] [--out DIR]

Each case is `hostpin repro register --method mlock --swap-out SIZE` (a temporary swap file, a
memory cgroup pushing the region out, reads from the swap device throttled to RATE; "none":
unthrottled, the fastest this machine reads swap), run alternately with and without --trace.
Per run it keeps the pin's seconds, the swap-in rate (pages/s, from the run's own counters),
hostpin's CPU over the run (the watchdog and, with --trace, the tracer's reader threads: one
process, os.times) and, with --trace, the events and bytes read from tracefs and the events lost.
11 MB/s gives about 2,800 swap-in pages/s, the paper's slow node. Root; prints one JSON document.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one(size: str, rate: str, trace: bool, out: Path) -> dict:
    args = [sys.executable, "-m", "repro.cli", "repro", "register", "--json", "--out", str(out), "--method", "mlock",
            "--size", size, "--swap-out", size, "--make-swap", "1GiB", "--no-calibrate", "--ignore-leftovers"]
    if rate != "none":
        args += ["--swap-in-rate", rate]
    if trace:
        args.append("--trace")
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-400:], "trace": trace}
    d = json.loads(r.stdout)
    w = d.get("watchdog") or {}
    row = {"trace": trace, "pin_s": d.get("seconds"), "swapin_pages_s": d.get("swapin_pages_per_s"),
           "hostpin_cpu_s": w.get("watchdog_cpu_s"), "wall_s": w.get("wall_s"),
           "hostpin_cpu_pct_of_core": w.get("watchdog_cpu_pct_of_core")}
    if trace and d.get("trace"):
        t = d["trace"]
        b = d.get("time_budget") or {}
        row.update(events=t.get("events"), trace_bytes=t.get("raw_bytes"), dropped=t.get("dropped"),
                   buffer_bytes=t.get("buffer_bytes"), io_share=(b.get("causes") or {}).get("io", 0) / b["wall_s"]
                   if b.get("wall_s") else None, requests=(b.get("io") or {}).get("requests"))
    return row


def summarize(rows: list[dict]) -> dict:
    def med(key, arm):
        xs = [r[key] for r in rows if r.get("trace") is arm and r.get(key) is not None]
        return round(statistics.median(xs), 3) if xs else None
    out = {}
    for key in ("pin_s", "swapin_pages_s", "hostpin_cpu_s", "hostpin_cpu_pct_of_core"):
        out[key] = {"without": med(key, False), "with": med(key, True)}
    a, b = out["hostpin_cpu_pct_of_core"]["without"], out["hostpin_cpu_pct_of_core"]["with"]
    out["trace_cpu_pct_of_core"] = round(b - a, 2) if a is not None and b is not None else None
    p0, p1 = out["pin_s"]["without"], out["pin_s"]["with"]
    out["pin_slower_pct"] = round(100 * (p1 - p0) / p0, 1) if p0 and p1 else None
    out["dropped"] = sum(r.get("dropped") or 0 for r in rows if r.get("trace"))
    out["events_per_s"] = med("events", True) and round(med("events", True) / med("wall_s", True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="128MiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rates", default="11MB/s,none")
    ap.add_argument("--out", default=None)
    o = ap.parse_args()
    out = Path(o.out or tempfile.mkdtemp(prefix="hostpin-trace-cost-"))
    cases = {}
    for rate in o.rates.split(","):
        rows = []
        for i in range(o.runs):
            for trace in ((False, True) if i % 2 == 0 else (True, False)):
                row = one(o.size, rate, trace, out)
                rows.append(row)
                print(json.dumps({"rate": rate, **row}), file=sys.stderr, flush=True)
        cases[rate] = {"runs": rows, "summary": summarize(rows)}
    print(json.dumps({"size": o.size, "runs_per_arm": o.runs, "cases": cases, "runs_dir": str(out)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
