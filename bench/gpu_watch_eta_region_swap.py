"""The swap-in ETA of `hostpin watch --pid` on swapped PyTorch loads, on the GPU machine
(bench/gpu_watch_eta_region_swap.sh): whether the first ETA and the ETA at 20% come within 10%
now that the pages left are the region's swap (smaps: the VMAs being drained) at the process's
own swap-read rate, not the whole VmSwap at its fall.

  c  torch.cuda.cudart().cudaHostRegister of a 16 GiB tensor, 3 GiB of the process in swap, swap
     reads throttled to 48 MB/s, watched 3 s in with --size 16GiB and without (2026-12-01 before
     this change: first ETA +35% in both, ETA@20% the same figure, 297 MiB of the process's swap
     was torch's and CUDA's own and stayed in swap)
  a  Tensor.pin_memory() of the same: the pinned allocation, then the copy from swap (before:
     the copy's ETA@20% +8.9%, first ETA +12%)

The cases are bench/gpu_watch_whole_load.py's (its target, its swap push and throttle, its
cleanup). Prints and writes a summary: per phase the first ETA and the ETA at 20% of its work with
their errors and bases, the region's swap and the swap outside it, and what the smaps readings
cost (ms per read, VMAs) in the torch process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_watch_whole_load as wl  # noqa: E402

GiB = 1 << 30


def readings(run_dir: str | None) -> list[dict]:
    out = []
    try:
        for line in Path(run_dir).joinpath("timeline.jsonl").read_text().splitlines():
            for p in (json.loads(line).get("procs") or {}).values():
                r = p.get("smaps_swap") or {}
                if "vmas" in r or "waiting_s" in r or "error" in r:
                    out.append(r)
    except (OSError, TypeError, ValueError):
        pass
    return out


def judged(res: dict, label: str) -> list[str]:
    if "error" in res:
        return [f"  {label}: {res['error']}"]
    rs = readings(res.get("run_dir"))
    ms = sorted(r["ms"] for r in rs if "ms" in r)
    w = res.get("watcher") or {}
    out = [f"  {label}: rc {res.get('_rc')} outcome {res.get('outcome')}; watcher {w.get('cpu_pct_of_core')}% of a "
           f"core; smaps {len(ms)} reads, {ms[len(ms) // 2] if ms else None} ms median, {ms[-1] if ms else None} ms max, "
           f"{max((r.get('vma_count') or 0) for r in rs) if rs else None} VMAs; waits {sum(1 for r in rs if 'waiting_s' in r)}, "
           f"errors {[r['error'] for r in rs if 'error' in r][:2]}"]
    for p in res.get("phases") or []:
        e1, e20, f = p.get("eta_first") or {}, p.get("eta_at_20pct") or {}, p.get("figures") or {}
        ok = all(e is not None and abs(e) <= 0.10 for e in (p.get("eta_first_error"), p.get("eta_error"))
                 if p.get("bound") == "swap-in")
        out.append(f"    {p.get('kind')} {p.get('seconds')} s bound {p.get('bound')}: first ETA {e1.get('predicted_total_s')} s "
                   f"at {e1.get('at_s')} s err {p.get('eta_first_error')}; ETA@20% {e20.get('predicted_total_s')} s at "
                   f"{e20.get('at_s')} s ({e20.get('work_pct')}% of its work, {e20.get('pct')}% of --size) err "
                   f"{p.get('eta_error')}" + ("  [within 10%]" if ok and p.get("bound") == "swap-in" else
                                             "  [NOT within 10%]" if p.get("bound") == "swap-in" else ""))
        out.append(f"      basis: {e1.get('basis')}")
        out.append(f"      region {f.get('region_from')}: {f.get('region_swap_at_start_bytes')} bytes in swap at its first "
                   f"reading, {f.get('swap_outside_region_bytes')} bytes outside it; swapped in {f.get('swapped_in_bytes')}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--summary", type=Path)
    o = ap.parse_args()
    from repro.swapfile import SwapFile
    o.runs.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    wl.BUDGET_S = 280
    swap = SwapFile("/var/tmp", 8 * GiB).create()
    try:
        wl.log("swap file ready")
        cases = [("c-register-swap", "register", [["--size", "16GiB"], []]), ("a-pin-memory-swap", "pin_memory", [[]])]
        for name, mode, watches in cases:
            if wl.left() < 100:
                summary.append(f"{name}: skipped, {wl.left():.0f} s left")
                continue
            lines: list[str] = []
            wl.run_case(name, mode, 16 * GiB, 3 * GiB, 48_000_000, o.runs, watches, lines)
            summary.append(lines[0] if lines else f"{name}: no result")
            summary.extend(line for line in lines[1:] if "FAILED" in line or "cleanup" in line)
            for i, extra in enumerate(watches):
                f = o.runs / f"{name}-{i}.json"
                try:
                    res = json.loads(f.read_text())
                    res["_rc"] = res.get("exit_code")
                except (OSError, ValueError) as exc:
                    res = {"error": f"no JSON file: {exc}"}
                summary.extend(judged(res, f"watch {' '.join(extra) or '(no --size)'}"))
            wl.log(f"{name} done")
    finally:
        problems = swap.remove()
        if problems:
            summary.append(f"swap cleanup problems {problems}")
        text = "\n".join(summary)
        print("\n== summary ==\n" + text, flush=True)
        if o.summary:
            o.summary.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
