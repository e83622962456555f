"""`hostpin repro staging`: host memory that copies leave behind, with a control arm.

Each repeat is a child (repro.staging_child), a fresh process, that runs bursts of one to three
sides in one sequence: copies from pageable buffers, from pinned buffers, and the control (the
same bursts as memcpy between pageable buffers, no CUDA). After every burst the memory
accounting settles (repro.settle, diag.memacct): in use = MemTotal - MemAvailable without the
pages parked on per-CPU free lists and the watermark boost's share, net of the process's own RSS
and of the anonymous memory other processes took or gave back meanwhile.

This module starts the children, keeps their raw output, and does the accounting (pure
functions, tested on recorded runs): per side and repeat the memory its bursts left (summed),
where it sits (vmalloc, shmem, kernel, unevictable, pins outstanding, the cgroup), the median
and range across repeats, the noise (what the control arm moved, plus what the readings still
moved when they were taken), and the effect beyond the control. An effect is the driver's only
when it exceeds the control by more than twice the noise (a difference of two arms, each of which
moves by up to the noise).

Records made before the per-CPU counts were read (schema 1) are summarized as uncorrected and
never attributed.
"""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from diag.cuda import child_env
from diag.evidence import RunDir
from diag.results import SideFigures, StagingResult
from diag.facts import node_facts
from diag.memacct import KERNEL_KEYS, corrected_in_use, corrections, in_use, memcg_dir, page_reporting_active
from diag.meminfo import read_meminfo
from diag.nvidia import read_nvidia
from diag.rootfs import Root
from diag.units import GiB, MiB, format_bytes

from .settle import Settler

__all__ = ["StagingOptions", "StagingResult", "SideFigures", "SIDES", "sequence", "step_accounting",
           "summarize_repeat", "summarize", "verdict", "reserve_hint", "run_staging", "parse_sides", "mib", "noise_mib"]

SIDES = ("pageable", "pinned", "control")
CUDA_SIDES = ("pageable", "pinned")
CGROUP_STAT = ("anon", "shmem", "file", "kernel", "vmalloc", "percpu")
# where retained memory can sit: /proc/meminfo, pins outstanding, the memory cgroup (memory.current and
# its memory.stat lines), IOMMU page tables, huge pages waiting on the deferred split queue
PLACES = ("vmalloc", "shmem", "kernel", "unevictable", "pins", "cgroup", *(f"cgroup_{k}" for k in CGROUP_STAT),
          "iommu", "deferred_split")
NO_GPU = ("no NVIDIA driver / no GPU on this node: the pageable and pinned sides copy to a GPU and need one; "
          "`hostpin repro staging --sides control` runs the control arm alone and measures this node's noise "
          "floor without one")


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
    sides: tuple[str, ...] = SIDES
    settle_tolerance: int = 1 * MiB
    settle_max_s: float = 3.0
    timeout_s: float = 600.0
    force: bool = False


def parse_sides(text: str) -> tuple[str, ...]:
    """'pageable,control' -> ('pageable', 'control'), in the canonical order; ValueError names a bad one.

    >>> parse_sides("control, pageable")
    ('pageable', 'control')
    """
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SIDES]
    if bad or not names:
        raise ValueError(f"{text!r}: sides are {', '.join(SIDES)} (comma-separated), e.g. pageable,pinned,control")
    return tuple(s for s in SIDES if s in names)


def sequence(order: str, bursts: int, sides: tuple[str, ...] = ("pageable", "pinned")) -> list[str]:
    """The order of bursts. 'alternate' runs the sides forward, then backward (ABBA, ABCCBA): no
    side always goes first or always follows another. 'X-first' runs all of X's bursts first.

    >>> sequence("alternate", 2), sequence("pinned-first", 2)
    (['pageable', 'pinned', 'pinned', 'pageable'], ['pinned', 'pinned', 'pageable', 'pageable'])
    >>> sequence("alternate", 2, SIDES)
    ['pageable', 'pinned', 'control', 'control', 'pinned', 'pageable']
    """
    if order.endswith("-first"):
        first = order[:-len("-first")]
        ordered = [first] + [s for s in sides if s != first] if first in sides else list(sides)
        return [s for s in ordered for _ in range(bursts)]
    out: list[str] = []
    for i in range(bursts):
        out += list(sides) if i % 2 == 0 else list(reversed(sides))
    return out


# -- accounting of one repeat (pure) -------------------------------------------------------------
def _rss(snap: dict) -> int:
    """The process's resident memory that in-use counts: all of RSS but file-backed mappings,
    whose pages are page cache and count as available (mm/show_mem.c si_mem_available)."""
    rss = snap.get("rss") or {}
    return rss.get("total", 0) - rss.get("file", 0)


def _figures(snap: dict) -> dict[str, Any]:
    """What one snapshot says, for new records (reading + settle) and for schema-1 ones
    (in_use_bytes + meminfo, no per-CPU counts)."""
    rss = snap.get("rss") or {}
    if "reading" not in snap:  # schema 1: recorded before per-CPU lists were counted
        m = snap.get("meminfo") or {}
        return {"raw": snap.get("in_use_bytes"), "corrected": None, "pcp": None, "boost": None, "others_anon": None,
                "rss": _rss(snap), "lazy": 0, "residue": snap.get("in_use_spread_bytes"), "settled": None,
                "places": {"vmalloc": m.get("VmallocUsed"), "shmem": m.get("Shmem"),
                           "kernel": sum(m.get(k, 0) for k in KERNEL_KEYS), "unevictable": m.get("Unevictable")},
                "reporting": {}}
    r = snap["reading"]
    m, v = r.get("meminfo") or {}, r.get("vmstat") or {}
    size = r.get("page_size") or 4096
    c = corrections(r)
    cg = r.get("cgroup") or {}
    pins = (v["nr_foll_pin_acquired"] - v["nr_foll_pin_released"]) * size if "nr_foll_pin_acquired" in v else None
    settle = snap.get("settle") or {}
    anon = m.get("AnonPages")
    return {"raw": in_use(r), "corrected": corrected_in_use(r), "pcp": c["per_cpu_lists"], "boost": c["watermark_boost"],
            "others_anon": anon - rss.get("anon", 0) if anon is not None and "anon" in rss else None,
            "rss": _rss(snap), "lazy": rss.get("lazyfree", 0), "residue": settle.get("residue_bytes"),
            "settled": settle.get("settled"), "settle_s": settle.get("seconds"), "folded": settle.get("folded"),
            "places": {"vmalloc": m.get("VmallocUsed"), "shmem": m.get("Shmem"),
                       "kernel": sum(m.get(k, 0) for k in KERNEL_KEYS), "unevictable": m.get("Unevictable"),
                       "pins": pins, "cgroup": cg.get("current"), **{f"cgroup_{k}": cg.get(k) for k in CGROUP_STAT},
                       "iommu": v["nr_iommu_pages"] * size if "nr_iommu_pages" in v else None,
                       "deferred_split": r.get("thp_partially_mapped_bytes")},
            "reporting": {**{f"page_reporting.{k}": x for k, x in (r.get("page_reporting") or {}).items()},
                          "balloon_pages": v.get("nr_balloon_pages"),
                          "pglazyfree": v.get("pglazyfree"), "thp_deferred_split_page": v.get("thp_deferred_split_page")},
            "stat_drift_bytes": (r["stat_drift_pages"] * size) if r.get("stat_drift_pages") is not None else None}


def _delta(a: int | None, b: int | None) -> int | None:
    return b - a if a is not None and b is not None else None


def step_accounting(before: dict, after: dict) -> dict[str, Any]:
    """From one snapshot to the next: the raw change of in use, what the corrections took out of
    it, the process's RSS change (LazyFree pages are in RSS but already count as available), the
    anonymous memory other processes on the node took or gave back meanwhile (AnonPages minus
    our own anonymous RSS: a neighbour's malloc is not the driver's), and what stayed:
    retained = corrected change - (RSS change - LazyFree change) - other processes' anon change.
    Without per-CPU counts (schema 1) retained is the uncorrected figure and 'corrected' is False."""
    a, b = _figures(before), _figures(after)
    rss = b["rss"] - a["rss"]
    lazy = b["lazy"] - a["lazy"]
    raw = _delta(a["raw"], b["raw"])
    corrected = _delta(a["corrected"], b["corrected"])
    others = _delta(a["others_anon"], b["others_anon"]) if corrected is not None else None
    base = corrected if corrected is not None else raw
    out = {"raw_delta_bytes": raw, "per_cpu_lists_bytes": _delta(a["pcp"], b["pcp"]),
           "watermark_boost_bytes": _delta(a["boost"], b["boost"]), "rss_bytes": rss, "lazyfree_bytes": lazy,
           "other_processes_anon_bytes": others,
           "retained_bytes": None if base is None else base - (rss - lazy) - (others or 0),
           "uncorrected_bytes": None if raw is None else raw - rss,
           "corrected": corrected is not None,
           "residue_bytes": max(a["residue"] or 0, b["residue"] or 0),  # how far the readings still moved
           "settled": None if a["settled"] is None else bool(a["settled"] and b["settled"]),
           "settle_s": b.get("settle_s"),
           "places": {k: _delta(a["places"].get(k), b["places"].get(k)) for k in PLACES}}
    moved = {k: _delta(a["reporting"].get(k), b["reporting"].get(k)) for k in b["reporting"]}
    out["seen"] = {k: d for k, d in moved.items() if d}
    if b.get("stat_drift_bytes") is not None and not b.get("folded"):
        out["stat_drift_bound_bytes"] = b["stat_drift_bytes"]  # counters read without folding may be off by this
    return out


def _sum(values: list) -> int | None:
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def summarize_repeat(rep: dict) -> dict[str, Any]:
    """One child's raw output (and the parent's readings around it, if kept) -> per-side figures."""
    prev = rep["baseline"]
    steps = []
    for s in rep["steps"]:
        acc = step_accounting(prev, s["after"])
        acc.update(index=s["index"], side=s["side"],
                   gb_s=statistics.median([t["gb_s"] for t in s["throughput"].values()]) if s["throughput"] else None)
        steps.append(acc)
        prev = s["after"]
    sides: dict[str, Any] = {}
    for side in SIDES:
        mine = [a for a in steps if a["side"] == side]
        if not mine:
            continue
        sides[side] = {
            "bursts": len(mine),
            "retained_bytes": _sum([a["retained_bytes"] for a in mine]),
            "uncorrected_bytes": _sum([a["uncorrected_bytes"] for a in mine]),
            "first_bytes": mine[0]["retained_bytes"],
            "residue_bytes": sum(a["residue_bytes"] for a in mine),
            "places": {k: _sum([a["places"][k] for a in mine]) for k in PLACES},
            "throughput_gb_s": statistics.median([a["gb_s"] for a in mine if a["gb_s"]]) if any(a["gb_s"] for a in mine) else None,
        }
    last = rep["steps"][-1]["after"] if rep["steps"] else rep["baseline"]
    out: dict[str, Any] = {
        "steps": steps, "sides": sides, "corrected": all(a["corrected"] for a in steps) if steps else False,
        "baseline_drift_bytes": (step_accounting(rep["baseline_first"], rep["baseline"])["retained_bytes"]
                                 if "baseline_first" in rep else rep.get("baseline_drift_bytes")),
        "reset_left_bytes": step_accounting(rep.get("before_context") or rep["baseline"], rep["after_reset"])["retained_bytes"],
    }
    if "before_context" in rep:
        out["context_bytes"] = step_accounting(rep["before_context"], rep["baseline"])["retained_bytes"]
    if rep.get("hold"):
        back = step_accounting(last, rep["hold"][-1])["retained_bytes"]
        out["hold_returned_bytes"] = None if back is None else -back
        out["hold_s"] = rep["hold"][-1]["t"]
    parent = rep.get("parent") or {}
    if parent.get("before_start") and parent.get("after_exit"):
        out["exit_left_bytes"] = step_accounting(parent["before_start"], parent["after_exit"])["retained_bytes"]
    return out


def _stats(values: list) -> dict[str, Any]:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(repeats: list[dict]) -> dict[str, Any]:
    """Across repeats: per side the median and range of what it retained, its noise and its effect
    beyond the control (paired by repeat), and the run's reset, exit, hold and drift figures."""
    per = [summarize_repeat(r) for r in repeats if "steps" in r]
    if not per:
        return {"repeats": 0}
    out: dict[str, Any] = {"repeats": len(per), "per_repeat": per, "corrected": all(p["corrected"] for p in per),
                           "sides": {}}
    control = [p["sides"]["control"]["retained_bytes"] for p in per if "control" in p["sides"]]
    control_noise = max(abs(c) for c in control if c is not None) if any(c is not None for c in control) else None
    drift = [abs(p["baseline_drift_bytes"]) for p in per if p.get("baseline_drift_bytes") is not None]
    for side in SIDES:
        mine = [p for p in per if side in p["sides"]]
        if not mine:
            continue
        figs = [p["sides"][side] for p in mine]
        residue = max(f["residue_bytes"] for f in figs)
        floor = control_noise if control_noise is not None else (max(drift) if drift else 0)
        s = {"retained": _stats([f["retained_bytes"] for f in figs]),
             "uncorrected": _stats([f["uncorrected_bytes"] for f in figs]),
             "first": _stats([f["first_bytes"] for f in figs]),
             "throughput_gb_s": _stats([f["throughput_gb_s"] for f in figs]),
             "places": {k: _stats([f["places"][k] for f in figs])["median"] for k in PLACES},
             "noise_bytes": floor + residue, "residue_bytes": residue, "bursts": figs[0]["bursts"]}
        if side != "control" and control_noise is not None:
            s["beyond_control"] = _stats([p["sides"][side]["retained_bytes"] - p["sides"]["control"]["retained_bytes"]
                                          for p in mine if "control" in p["sides"]
                                          and p["sides"][side]["retained_bytes"] is not None
                                          and p["sides"]["control"]["retained_bytes"] is not None])
        out["sides"][side] = s
    out["noise_floor_bytes"] = control_noise
    out["baseline_drift_bytes"] = _stats([p.get("baseline_drift_bytes") for p in per])
    for key in ("reset_left_bytes", "exit_left_bytes", "context_bytes", "hold_returned_bytes"):
        if any(p.get(key) is not None for p in per):
            out[key] = _stats([p.get(key) for p in per])
    seen: dict[str, int] = {}
    bound = 0
    for p in per:
        for a in p["steps"]:
            for k, d in a["seen"].items():
                seen[k] = seen.get(k, 0) + d
            bound = max(bound, a.get("stat_drift_bound_bytes") or 0)
    out["seen"] = seen
    out["stat_drift_bound_bytes"] = bound or None
    settled = [a["settled"] for p in per for a in p["steps"] if a["settled"] is not None]
    out["steps_settled"] = [sum(settled), len(settled)]
    return out


# -- what it says --------------------------------------------------------------------------------
def mib(n: float | None, signed: bool = True) -> str:
    """Whole MiB as a person reads them: '0', '+3', '-1' (signed), 'n/a' for no figure.

    >>> mib(0.4 * MiB), mib(-1.2 * MiB), mib(2.6 * MiB), mib(None)
    ('0', '-1', '+3', 'n/a')
    """
    if n is None:
        return "n/a"
    v = round(n / MiB)
    return f"{v:+d}" if signed and v else str(v)


def noise_mib(n: float | None) -> str:
    """The noise in MiB: whole above 1 MiB, one decimal below (a noise of 0 would claim too much).

    >>> noise_mib(2.4 * MiB), noise_mib(0.27 * MiB)
    ('2', '0.3')
    """
    if n is None:
        return "n/a"
    return f"{n / MiB:.1f}" if n < MiB else str(round(n / MiB))


def _range(s: dict) -> str:
    return f"{mib(s['min'])}..{mib(s['max'])}"


def _attributed(s: dict) -> bool:
    """The effect beyond the control is a difference of two arms that each move by up to the
    noise, so it counts only past twice the noise. Once past the noise alone, the H200's ~2 MiB
    (noise ±1.4..1.8 MiB) was 'retained' in one device call and 'none' in the next."""
    b = s.get("beyond_control") or {}
    return b.get("median") is not None and abs(b["median"]) > 2 * s["noise_bytes"]


def _where(s: dict) -> str:
    """Places whose change exceeds the noise, largest first."""
    places = [(k, v) for k, v in s["places"].items() if v is not None and abs(v) > s["noise_bytes"]]
    if not places:
        return "in no counter: not vmalloc, shmem, kernel, unevictable, pins or the cgroup"
    places.sort(key=lambda kv: -abs(kv[1]))
    names = {"pins": "pins outstanding", "cgroup": "the cgroup", "deferred_split": "deferred-split huge pages",
             "iommu": "IOMMU page tables", **{f"cgroup_{k}": f"the cgroup's {k}" for k in CGROUP_STAT}}
    return "in " + ", ".join(f"{names.get(k, k)} {mib(v, signed=False)} MiB" for k, v in places)


def _returned(summary: dict, noise: int) -> str:
    reset = (summary.get("reset_left_bytes") or {}).get("median")
    exit_ = (summary.get("exit_left_bytes") or {}).get("median")
    if reset is not None and abs(reset) <= noise:
        return "cudaDeviceReset returned it"
    if exit_ is not None and abs(exit_) <= noise:
        return f"cudaDeviceReset left {mib(reset, signed=False)} MiB; process exit returned it"
    if exit_ is not None:
        return f"{mib(exit_, signed=False)} MiB stayed after the process exited"
    return "whether reset or exit returns it was not measured"


def verdict(summary: dict) -> str:
    if not summary.get("repeats"):
        return "no repeat finished: nothing to report"
    n = summary["repeats"]
    sides = summary["sides"]
    parts = []
    if not summary.get("corrected"):
        for side in ("pageable", "pinned"):
            if side in sides:
                s = sides[side]
                parts.append(f"{side} bursts moved in-use by {mib(s['retained']['median'])} MiB (median of {n}, "
                             f"range {_range(s['retained'])} MiB)")
        return ("recorded without the per-CPU free list counts, uncorrected: " + "; ".join(parts)
                + "; freed pages parked on per-CPU lists move MemAvailable by this much on their own, so none of it "
                  "is attributed (measure again with this version)")
    for side in ("pageable", "pinned"):
        if side not in sides:
            continue
        s = sides[side]
        r, noise = s["retained"], s["noise_bytes"]
        figures = f"{mib(r['median'])} MiB (median of {n}, range {_range(r)}, noise ±{noise_mib(noise)} MiB)"
        if "beyond_control" not in s:
            parts.append(f"{side} bursts left {figures}, not attributed: the control arm was not run "
                         "(add control to --sides)")
        elif not _attributed(s):
            parts.append(f"{side} copies: no staging memory retained: {figures}" if side == "pageable"
                         else f"pinned copies retained nothing: {figures}")
        else:
            b = s["beyond_control"]
            head = "retained" if b["median"] > 0 else "gave back"
            parts.append(f"{side} copies {head} {mib(abs(b['median']), signed=False)} MiB beyond the control arm "
                         f"(median of {n}, range {_range(b)} MiB, noise ±{noise_mib(noise)} MiB), "
                         f"{_where(s)}; {_returned(summary, noise)}")
    if "control" in sides:
        c = sides["control"]
        text = (f"control arm (memcpy, no CUDA): {mib(c['retained']['median'])} MiB (median of {n}, range "
                f"{_range(c['retained'])}, noise ±{noise_mib(c['noise_bytes'])} MiB)")
        if len(sides) == 1:
            text += ": this node's noise floor for the staging measurement"
        parts.append(text)
    sentence = "; ".join(parts)
    if "hold_returned_bytes" in summary:
        back = summary["hold_returned_bytes"]["median"]
        noise = max(s["noise_bytes"] for s in sides.values())
        sentence += (f"; {mib(back, signed=False)} MiB came back during the hold"
                     if back is not None and abs(back) > noise else "; nothing came back during the hold")
    settled, steps = summary.get("steps_settled") or [0, 0]
    if steps and settled < steps:
        sentence += f" ({steps - settled} of {steps} readings did not settle: the node was busy; see corrections)"
    return sentence + "."


def reserve_bytes(summary: dict) -> int | None:
    """What preflight should set aside per rank for copies from pageable memory: the largest
    effect beyond the control across repeats, rounded up to MiB; 0 where nothing is attributed;
    None where it cannot be said (no pageable side, no control arm, uncorrected records)."""
    s = (summary.get("sides") or {}).get("pageable")
    if not s or not summary.get("corrected") or "beyond_control" not in s:
        return None
    if not _attributed(s) or s["beyond_control"]["median"] <= 0:
        return 0
    return max(1, math.ceil(s["beyond_control"]["max"] / MiB)) * MiB


def reserve_hint(summary: dict) -> str | None:
    reserve = reserve_bytes(summary)
    if reserve is None:
        return None
    if reserve == 0:
        return ("copies from pageable memory retained nothing here: preflight needs no --reserve for them "
                "(hostpin preflight --size SIZE --ranks N --reserve 0)")
    m = reserve // MiB
    return (f"a rank that copies from pageable memory needs about {m} MiB more than its pinned table: "
            f"hostpin preflight --size SIZE --ranks N --reserve {m}MiB")


# -- the result: diag.results.StagingResult (report and compare read its fields) ------------------
def side_figures(summary: dict) -> dict[str, SideFigures]:
    out = {}
    for side, s in (summary.get("sides") or {}).items():
        r, u = s["retained"], s["uncorrected"]
        b = s.get("beyond_control")
        out[side] = SideFigures(
            retained_bytes=r["median"], retained_range_bytes=[r["min"], r["max"]], noise_bytes=s["noise_bytes"],
            attribution=dict(s["places"]), throughput_gb_s=s["throughput_gb_s"]["median"],
            beyond_control_bytes=b["median"] if b else None,
            beyond_control_range_bytes=[b["min"], b["max"]] if b else None,
            attributed=_attributed(s) if summary.get("corrected") else False,
            first_burst_bytes=s["first"]["median"], uncorrected_bytes=u["median"],
            uncorrected_range_bytes=[u["min"], u["max"]], bursts=s["bursts"])
    return out


def correction_rows(summary: dict) -> list[dict]:
    """Per step of every repeat: what was subtracted from the raw change, and what stayed."""
    rows = []
    for i, p in enumerate(summary.get("per_repeat") or []):
        for a in p["steps"]:
            rows.append({"repeat": i, "step": a["index"], "side": a["side"], "raw_delta_bytes": a["raw_delta_bytes"],
                         "per_cpu_lists_bytes": a["per_cpu_lists_bytes"],
                         "watermark_boost_bytes": a["watermark_boost_bytes"], "rss_bytes": a["rss_bytes"],
                         "other_processes_anon_bytes": a["other_processes_anon_bytes"],
                         "lazyfree_bytes": a["lazyfree_bytes"], "retained_bytes": a["retained_bytes"],
                         "residue_bytes": a["residue_bytes"], "settled": a["settled"], "settle_s": a["settle_s"],
                         **({"seen": a["seen"]} if a["seen"] else {})})
    return rows


def build_result(summary: dict, **fields) -> StagingResult:
    """The result of a run whose repeats were summarized (outcome 'completed')."""
    figures = {k: summary[k] for k in ("baseline_drift_bytes", "reset_left_bytes", "exit_left_bytes", "context_bytes",
                                       "hold_returned_bytes", "noise_floor_bytes", "seen", "stat_drift_bound_bytes",
                                       "steps_settled", "corrected") if k in summary}
    return StagingResult(outcome="completed", verdict=verdict(summary), sides=side_figures(summary),
                         corrections=correction_rows(summary), repeats=summary["repeats"], figures=figures,
                         reserve_bytes=reserve_bytes(summary), reserve_hint=reserve_hint(summary), **fields)


# -- running it ----------------------------------------------------------------------------------
def run_staging(opts: StagingOptions, run: RunDir, progress=None) -> StagingResult:
    seq = sequence(opts.order, opts.bursts, opts.sides)
    base = dict(options=asdict(opts), run_dir=str(run.path), sequence=seq)
    root = Root("/", run=run)
    base["facts"] = node_facts(root)
    for rel in ("proc/zoneinfo", "proc/vmstat"):  # the per-CPU lists and counters as the run found them
        root.read_text(rel)
    base["figures"] = {"page_reporting_active": page_reporting_active(Root("/"))}
    if set(opts.sides) & set(CUDA_SIDES) and not read_nvidia(Root("/")).loaded:
        return StagingResult(outcome="unevaluated", verdict=NO_GPU, **base)
    mem = read_meminfo(Root("/"))
    need = opts.bytes * (2 if "control" in opts.sides else 1) + GiB
    dest = ", the control arm's destination" if "control" in opts.sides else ""
    if not opts.force and mem and mem.available_bytes is not None and mem.available_bytes < need:
        return StagingResult(outcome="refused", **base,
                             verdict=f"refused: the bursts need {format_bytes(need)} of host memory (sources{dest} "
                                     f"and 1 GiB), MemAvailable is {format_bytes(mem.available_bytes)} "
                                     "(--force runs it anyway)")
    spec = {"bytes": opts.bytes, "threads": opts.threads, "direction": opts.direction, "device": opts.device,
            "sequence": seq, "hold_s": opts.hold_s, "settle_tolerance": opts.settle_tolerance,
            "settle_max_s": opts.settle_max_s}
    env = child_env()
    live = Root("/")
    settler = Settler(live, memcg_dir(live), tolerance=opts.settle_tolerance, max_s=opts.settle_max_s)
    repeats, failures = [], []
    interrupted = False
    for i in range(opts.repeat):
        if progress:
            progress(f"repeat {i + 1}/{opts.repeat}")
        try:
            data, failure = _one_repeat(i, spec, env, settler, run, opts.timeout_s)
        except KeyboardInterrupt:  # subprocess.run has killed the child; keep what finished
            interrupted = True
            break
        if failure:
            failures.append(failure)
        else:
            repeats.append(data)
    head = f"interrupted after {len(repeats)} of {opts.repeat} repeats" if interrupted else ""
    if not repeats:
        return StagingResult(outcome="interrupted" if interrupted else "failed", failures=failures, **base,
                             verdict=f"{head}: nothing to report" if interrupted else
                             "every repeat failed: " + (failures[0]["error"] if failures else "?"))
    figures = base.pop("figures")
    result = build_result(summarize(repeats), failures=failures, **base)
    result.figures.update(figures)
    if interrupted:
        result.outcome, result.verdict = "interrupted", f"{head}: {result.verdict}"
    return result


def _one_repeat(i: int, spec: dict, env: dict, settler: Settler, run: RunDir,
                timeout_s: float) -> tuple[dict | None, dict | None]:
    """One fresh child, between two settled readings of the parent; (its output, None) or (None, failure)."""
    before = settler.settle()
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "repro.staging_child", json.dumps(spec)], capture_output=True,
                              timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
        stdout, stderr, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, rc, timed_out = exc.stdout or b"", exc.stderr or b"", None, True
    seconds = time.monotonic() - t0
    after = settler.settle()
    run.add_file(f"repeats/{i}.json", stdout, kind="repeat", duration_s=seconds, returncode=rc,
                 timed_out=timed_out)
    run.add_file(f"repeats/{i}.log", stderr, kind="repeat-log")
    parent = {"before_start": before, "after_exit": after}
    run.add_json(f"repeats/{i}.parent.json", parent)
    try:
        data = json.loads(stdout.decode() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = {}
    if isinstance(data, dict) and "steps" in data:
        data["parent"] = parent
        return data, None
    error = data.get("error") if isinstance(data, dict) else None
    return None, {"repeat": i, "returncode": rc, "timed_out": timed_out,
                  "error": error or stderr.decode(errors="replace").strip()[-300:]}
