"""`hostpin repro staging`: host memory the driver keeps after copies from pageable memory,
against copies from pinned memory, measured with repeats in fresh processes.

Each repeat is a child (repro.staging_child) with its own CUDA context; this module starts
them, keeps their raw output, and does the accounting (pure functions, tested on recorded
runs): memory left behind per side after the first burst and after later bursts, the part no
process counter shows (in-use delta minus RSS delta), throughput, the median and range across
repeats, and whether the noise of the node is larger than the effect.
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from diag.cuda import child_env
from diag.evidence import RunDir
from diag.facts import node_facts
from diag.meminfo import read_meminfo
from diag.nvidia import read_nvidia
from diag.rootfs import Root
from diag.units import GiB, MiB, format_bytes

__all__ = ["StagingOptions", "sequence", "summarize", "verdict", "run_staging"]

SIDES = ("pageable", "pinned")


@dataclass
class StagingOptions:
    bytes: int = 3 * GiB
    threads: int = 24
    direction: str = "h2d"
    bursts: int = 2
    order: str = "alternate"
    repeat: int = 3
    hold_s: int = 0
    device: int = 0
    samples: int = 5
    timeout_s: float = 600.0
    force: bool = False


def sequence(order: str, bursts: int) -> list[str]:
    """The order of bursts. 'alternate' is ABBA: neither side always goes first or follows the other.

    >>> sequence("alternate", 2), sequence("pinned-first", 2)
    (['pageable', 'pinned', 'pinned', 'pageable'], ['pinned', 'pinned', 'pageable', 'pageable'])
    """
    if order == "pageable-first":
        return ["pageable"] * bursts + ["pinned"] * bursts
    if order == "pinned-first":
        return ["pinned"] * bursts + ["pageable"] * bursts
    out: list[str] = []
    for i in range(bursts):
        out += ["pageable", "pinned"] if i % 2 == 0 else ["pinned", "pageable"]
    return out


def _stats(values: list[float]) -> dict[str, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize_repeat(rep: dict) -> dict[str, Any]:
    """One child's raw output -> per-side figures (bytes)."""
    sides: dict[str, Any] = {}
    for side in SIDES:
        steps = [s for s in rep["steps"] if s["side"] == side]
        deltas = [s["delta_in_use_bytes"] for s in steps]
        rss = [s["delta_rss_bytes"] for s in steps]
        hidden = [d - r for d, r in zip(deltas, rss)]
        gbs = [t["gb_s"] for s in steps for t in s["throughput"].values()]
        sides[side] = {
            "bursts": len(steps), "deltas_bytes": deltas,
            "first_bytes": deltas[0] if deltas else None,
            "later_mean_bytes": statistics.mean(deltas[1:]) if len(deltas) > 1 else None,
            "total_bytes": sum(deltas) if deltas else None,
            "hidden_first_bytes": hidden[0] if hidden else None,
            "hidden_total_bytes": sum(hidden) if hidden else None,
            "throughput_gb_s": statistics.median(gbs) if gbs else None,
            "rss_breakdown_after": steps[-1]["after"]["rss"] if steps else None,
        }
    spreads = [rep["baseline"]["in_use_spread_bytes"]] + [s["after"]["in_use_spread_bytes"] for s in rep["steps"]]
    mem_totals = {rep["baseline"]["mem_total_bytes"]} | {s["after"]["mem_total_bytes"] for s in rep["steps"]}
    last = rep["steps"][-1]["after"]["in_use_bytes"] if rep["steps"] else rep["baseline"]["in_use_bytes"]
    out = {
        "sides": sides,
        "noise_bytes": abs(rep.get("baseline_drift_bytes", 0)) + max(spreads),
        "mem_total_changed": len(mem_totals) > 1,
        "after_reset_vs_baseline_bytes": rep["after_reset"]["in_use_bytes"] - rep["baseline"]["in_use_bytes"],
        "after_reset_vs_before_context_bytes": rep["after_reset"]["in_use_bytes"] - rep["before_context"]["in_use_bytes"],
        "context_bytes": rep["baseline"]["in_use_bytes"] - rep["before_context"]["in_use_bytes"],
    }
    if rep.get("hold"):
        out["hold_returned_bytes"] = last - rep["hold"][-1]["in_use_bytes"]
        out["hold_s"] = rep["hold"][-1]["t"]
    return out


def summarize(repeats: list[dict]) -> dict[str, Any]:
    """Across repeats: median and range of every figure, the noise, and the paired difference."""
    per = [summarize_repeat(r) for r in repeats if "steps" in r]
    if not per:
        return {"repeats": 0}
    out: dict[str, Any] = {"repeats": len(per), "per_repeat": per, "sides": {}}
    for side in SIDES:
        figures = {}
        for key in ("first_bytes", "later_mean_bytes", "total_bytes", "hidden_first_bytes", "hidden_total_bytes",
                    "throughput_gb_s"):
            figures[key] = _stats([p["sides"][side][key] for p in per])
        out["sides"][side] = figures
    out["noise_bytes"] = _stats([p["noise_bytes"] for p in per])
    out["difference_hidden_total_bytes"] = _stats(
        [p["sides"]["pageable"]["hidden_total_bytes"] - p["sides"]["pinned"]["hidden_total_bytes"] for p in per
         if p["sides"]["pageable"]["hidden_total_bytes"] is not None and p["sides"]["pinned"]["hidden_total_bytes"] is not None])
    out["after_reset_vs_baseline_bytes"] = _stats([p["after_reset_vs_baseline_bytes"] for p in per])
    out["context_bytes"] = _stats([p["context_bytes"] for p in per])
    out["mem_total_changed"] = any(p["mem_total_changed"] for p in per)
    if any("hold_returned_bytes" in p for p in per):
        out["hold_returned_bytes"] = _stats([p.get("hold_returned_bytes") for p in per])
    return out


def _mib(n: float | None, signed: bool = False) -> str:
    if n is None:
        return "n/a"
    v = n / MiB
    return f"{v:+.0f} MiB" if signed else f"{v:.0f} MiB"


def _range(s: dict) -> str:
    return f"{s['min'] / MiB:+.0f}..{s['max'] / MiB:+.0f} MiB"


def significant(value: float | None, noise: float | None) -> bool:
    return value is not None and noise is not None and abs(value) > 2 * noise


def verdict(summary: dict) -> str:
    if not summary.get("repeats"):
        return "no repeat finished: nothing to report"
    n = summary["repeats"]
    noise = summary["noise_bytes"]["median"]
    parts = []
    for side in SIDES:
        h = summary["sides"][side]["hidden_total_bytes"]
        if h["median"] is None:
            continue
        head = (f"{side} copies left {_mib(h['median'])} (median of {n}, range {_range(h)}) of host memory that no "
                "process counter shows")
        if significant(h["median"], noise) and h["median"] < 0:
            # seen on an H200: a pinned burst after pageable ones releases the staging they left
            head = (f"{side} bursts gave back {_mib(-h['median'])} (median of {n}, range {_range(h)}): memory that "
                    "earlier bursts had left behind was released")
        elif not significant(h["median"], noise):
            head = (f"{side} copies left {_mib(h['median'], True)} (median of {n}, range {_range(h)}), within the "
                    f"noise (this node moved ±{_mib(noise)} on its own; an effect must exceed twice that)")
        parts.append(head)
    sentence = "; ".join(parts)
    reset = summary["after_reset_vs_baseline_bytes"]["median"]
    if reset is not None:
        if reset <= (noise or 0) * 2:
            sentence += "; it was returned when the context was destroyed"
        else:
            sentence += f"; {_mib(reset)} stayed after the context was destroyed"
    if "hold_returned_bytes" in summary:
        back = summary["hold_returned_bytes"]["median"]
        sentence += (f"; {_mib(back)} came back during the hold" if significant(back, noise)
                     else "; nothing came back during the hold")
    if summary.get("mem_total_changed"):
        sentence += " (MemTotal changed during a repeat: memory was plugged in; in-use figures allow for it)"
    return sentence + "."


def reserve_hint(summary: dict) -> str | None:
    """What preflight should set aside per rank for a process that copies from pageable memory."""
    p = summary.get("sides", {}).get("pageable", {}).get("total_bytes", {})
    if not p or p.get("max") is None or not significant(p["max"], summary["noise_bytes"]["median"]):
        return None
    mib = max(1, math.ceil(p["max"] / MiB))
    return (f"a rank that copies from pageable memory needs about {mib} MiB more than its pinned table: "
            f"hostpin preflight --size SIZE --ranks N --reserve {mib}MiB")


def run_staging(opts: StagingOptions, run: RunDir, progress=None) -> dict[str, Any]:
    result: dict[str, Any] = {"tool": "hostpin", "command": "repro staging", "options": asdict(opts),
                              "run_dir": str(run.path), "sequence": sequence(opts.order, opts.bursts)}
    result["facts"] = node_facts(Root("/", run=run))
    if not read_nvidia(Root("/")).loaded:
        result.update(outcome="unevaluated", verdict="no NVIDIA driver / no GPU on this node: the staging "
                      "measurement copies to a GPU and needs one")
        return result
    mem = read_meminfo(Root("/"))
    need = opts.bytes + GiB
    if not opts.force and mem and mem.available_bytes is not None and mem.available_bytes < need:
        result.update(outcome="refused", verdict=f"refused: a burst needs {format_bytes(need)} of host memory, "
                      f"MemAvailable is {format_bytes(mem.available_bytes)} (--force runs it anyway)")
        return result
    spec = {"bytes": opts.bytes, "threads": opts.threads, "direction": opts.direction, "device": opts.device,
            "sequence": result["sequence"], "hold_s": opts.hold_s, "samples": opts.samples}
    env = child_env()
    repeats, failures = [], []
    for i in range(opts.repeat):
        if progress:
            progress(f"repeat {i + 1}/{opts.repeat}")
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "repro.staging_child", json.dumps(spec)], capture_output=True,
                                  timeout=opts.timeout_s, env=env, stdin=subprocess.DEVNULL)
            stdout, stderr, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
        except subprocess.TimeoutExpired as exc:
            stdout, stderr, rc, timed_out = exc.stdout or b"", exc.stderr or b"", None, True
        run.add_file(f"repeats/{i}.json", stdout, kind="repeat", duration_s=time.monotonic() - t0, returncode=rc,
                     timed_out=timed_out)
        run.add_file(f"repeats/{i}.log", stderr, kind="repeat-log")
        try:
            data = json.loads(stdout.decode() or "{}")
        except json.JSONDecodeError:
            data = {}
        if "steps" in data:
            repeats.append(data)
        else:
            failures.append({"repeat": i, "returncode": rc, "timed_out": timed_out,
                             "error": data.get("error") or stderr.decode(errors="replace").strip()[-300:]})
    summary = summarize(repeats)
    result.update(summary=summary, failures=failures)
    if not repeats:
        result.update(outcome="failed", verdict="every repeat failed: " + (failures[0]["error"] if failures else "?"))
        return result
    result.update(outcome="completed", verdict=verdict(summary), reserve_hint=reserve_hint(summary))
    return result
