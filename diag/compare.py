"""`hostpin compare`: runs or nodes side by side, what differs first, equal facts folded.

Works on any mix of run directories and bundles: preflight runs, snapshots and reproductions,
from one node before and after a change or from many nodes collected with srun, pdsh/clush or
a DaemonSet (see the README).
"""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .facts import FACT_LABELS
from .results import StagingResult, load_result, preflight_result, repro_result
from .runs import Run
from .safetext import md_cell, one_line
from .units import format_bytes, format_duration

__all__ = ["comparison_rows", "render_compare"]

_BYTES = {"mem_total_bytes", "mem_available_bytes", "swap_total_bytes", "swap_used_bytes", "free_order9_bytes",
          "headroom_bytes"}


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in _BYTES:
        return format_bytes(value)
    if key in ("pin_seconds",):
        return format_duration(value)
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def run_figures(run: Run) -> dict[str, Any]:
    """The figures that matter for pinning, from whatever kind of run this is."""
    r = run.result
    out: dict[str, Any] = {"command": run.command, "status": run.status, "verdict": r.get("verdict")}
    out.update({k: v for k, v in run.facts().items() if k in FACT_LABELS})
    pre = preflight_result(r) if r.get("checks") else None
    if pre is not None:
        out["plan"] = (pre.plan or {}).get("describe")
        out["headroom_bytes"] = pre.binding_bytes
        out["binding"] = pre.binding
        out["swapin_pages_per_s"] = pre.swapin_pages_per_s
        out["predicted_pin_seconds"] = pre.predicted_pin_seconds
        for c in sorted(pre.checks, key=lambda c: c.id):
            out[f"check {c.id}"] = c.status
    rep = repro_result(r)
    if rep is not None:
        out.update(plan=_plan(rep.options), pin_seconds=rep.seconds, rate_gib_s=rep.rate_gib_s,
                   clean_rate_gib_s=rep.clean_rate_gib_s, bound=rep.bound, swapin_pages_per_s=rep.swapin_pages_per_s)
    if r.get("command") == "repro staging" and (r.get("summary") or {}).get("repeats"):
        side = r["summary"]["sides"]["pageable"]["hidden_total_bytes"]
        out["staging_pageable_hidden_mib"] = side["median"] / (1 << 20)
    elif isinstance(staging := load_result(r), StagingResult):  # corrected figures, per side
        for name, side in staging.sides.items():
            if side.retained_bytes is not None:
                out[f"staging_{name}_retained_mib"] = side.retained_bytes / (1 << 20)
    return out


def _plan(o: dict) -> str | None:
    return f"{o.get('ranks', 1)} x {format_bytes(o.get('size'))} by {o.get('method')}" if o else None


LABELS = {"command": "command", "status": "verdict", "plan": "plan", "headroom_bytes": "headroom (binding)",
          "binding": "binds at", "predicted_pin_seconds": "predicted pin s (swapped part)",
          "swapin_pages_per_s": "swap-in pages/s", "pin_seconds": "pin time", "rate_gib_s": "pin GiB/s",
          "clean_rate_gib_s": "clean rate GiB/s", "bound": "bound", "staging_pageable_hidden_mib": "staging left, MiB",
          "staging_pageable_retained_mib": "staging retained (pageable), MiB",
          "staging_pinned_retained_mib": "staging retained (pinned), MiB",
          "staging_control_retained_mib": "staging control arm, MiB",
          **FACT_LABELS}


def comparison_rows(runs: list[Run]) -> tuple[list[list[str]], list[list[str]]]:
    """(rows that differ, rows that are equal), each row [label, value per run]."""
    figures = [run_figures(r) for r in runs]
    keys: list[str] = []
    for f in figures:
        keys += [k for k in f if k not in keys and k != "verdict"]
    differ, equal = [], []
    for key in keys:
        values = [_fmt(key, f.get(key)) for f in figures]
        row = [LABELS.get(key, key)] + values
        # a figure one run recorded and another did not differs too ("-": not recorded)
        (equal if len(set(values)) <= 1 else differ).append(row)
    return differ, equal


def render_compare(runs: list[Run], fmt: str = "markdown") -> str:
    md = fmt == "markdown"
    names = [one_line(f"{r.facts().get('host') or '?'}: {r.path.name}") for r in runs]
    differ, equal = comparison_rows(runs)
    cell = md_cell if md else one_line  # every figure came from a run: anyone's text
    differ, equal = ([[cell(v) if isinstance(v, str) else v for v in row] for row in rows] for rows in (differ, equal))
    tf = "github" if md else "simple"
    out = [("# " if md else "") + f"hostpin compare: {len(runs)} runs, {len(differ)} figures differ"]
    out.append("")
    for name, r in zip(names, runs):
        line = one_line(f"{name}: {str(r.status).upper()}: {r.result.get('verdict') or 'no verdict'}")
        out.append(f"- {md_cell(line)}" if md else line)
    out.append("")
    if differ:
        out.append(tabulate(differ, headers=["differs"] + [f"run {i + 1}" for i in range(len(runs))], tablefmt=tf))
    else:
        out.append("Every compared figure is equal.")
    if equal:
        table = tabulate(equal, headers=["equal"] + [f"run {i + 1}" for i in range(len(runs))], tablefmt=tf)
        out.append("")
        out.append(f"<details><summary>{len(equal)} figures are equal</summary>\n\n{table}\n\n</details>" if md
                   else "equal: " + ", ".join(row[0] for row in equal))
    return "\n".join(out) + "\n"
