#!/usr/bin/env python3
"""Measure how fast this machine's swap devices give pages back to a pin, per kind.

The swap check of `hostpin preflight` predicts the cost of pinning a region that is partly in
swap from the device's kind (diag/swap.py SWAPIN_PAGES_PER_S). This script measures those
defaults for the kinds this machine has, with the same mechanism the reproducer uses: a child
touches a region inside a memory cgroup whose limit pushes part of it into swap for real, the
limit is lifted, and mlock faults the swapped pages back one by one (the driver's pin walks the
same path); the swap-in rate is pswpin over the pin's duration.

Kinds measured: the disk under --swap-dir (a swap file, `hostpin repro register --make-swap`)
at vm.page-cluster 3 and 0, and zram when /sys/block/zram0 exists and is unused. Everything it
sets up (zram size, swap, cgroups, page-cluster) is restored on every exit path.
Needs root; run it alone (it changes vm.page-cluster for a few seconds):

    flock /tmp/hostpin-suite.lock .venv/bin/python bench/swapin_rates.py
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from diag.swap import classify_block_device  # noqa: E402


def repro(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-m", "repro.cli", "repro", "register", "--method", "mlock", "--json",
                               "--out", out, *args], capture_output=True, text=True, cwd=REPO, timeout=600)
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"outcome": "error", "stderr": proc.stderr[-2000:]}


def write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def one(label: str, args: list[str], runs: int) -> dict:
    rates = []
    for _ in range(runs):
        r = repro(args)
        rate = r.get("swapin_pages_per_s")
        if r.get("outcome") not in ("completed", "slow") or not rate:
            return {"kind": label, "error": r.get("verdict") or r.get("stderr") or r.get("outcome")}
        rates.append(round(rate))
    return {"kind": label, "pages_per_s": sorted(rates), "median": sorted(rates)[len(rates) // 2]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512MiB")
    ap.add_argument("--swap-out", default="384MiB")
    ap.add_argument("--swap-dir", default="/var/tmp")
    ap.add_argument("--runs", type=int, default=3)
    opts = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (swap files, cgroups)", file=sys.stderr)
        return 3
    st = os.stat(opts.swap_dir)
    disk = classify_block_device(os.major(st.st_dev), os.minor(st.st_dev))
    out = {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(), "results": []}
    pc_path = "/proc/sys/vm/page-cluster"
    old_pc = open(pc_path).read().strip()
    base = ["--size", opts.size, "--swap-out", opts.swap_out]
    try:
        for pc in ("3", "0"):
            write(pc_path, pc)
            res = one(f"{disk['media']} ({disk['name']}, rotational flag {disk['rotational']})",
                      base + ["--make-swap", "1GiB", "--swap-dir", opts.swap_dir], opts.runs)
            res["page_cluster"] = int(pc)
            out["results"].append(res)
    finally:
        write(pc_path, old_pc)
    zram = Path("/sys/block/zram0")
    if zram.is_dir() and (zram / "disksize").read_text().strip() == "0":
        try:
            write(str(zram / "comp_algorithm"), "lzo-rle") if "lzo-rle" in (zram / "comp_algorithm").read_text() else None
            write(str(zram / "disksize"), str(1 << 30))
            subprocess.run(["mkswap", "/dev/zram0"], check=True, capture_output=True)
            subprocess.run(["swapon", "-p", "100", "/dev/zram0"], check=True, capture_output=True)
            res = one(f"zram ({(zram / 'comp_algorithm').read_text().strip()})", base, opts.runs)
            res["page_cluster"] = int(old_pc)
            out["results"].append(res)
        finally:
            subprocess.run(["swapoff", "/dev/zram0"], capture_output=True)
            write(str(zram / "reset"), "1")
    else:
        out["results"].append({"kind": "zram", "error": "no unused /sys/block/zram0"})
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
