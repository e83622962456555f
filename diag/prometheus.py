"""Preflight figures in the node_exporter textfile format, written atomically.

A monitor that watches locked memory reports a driver-pinned table as zero (the paper's
operators learnt it); these gauges carry what matters instead: headroom where it binds,
MemAvailable, swap in use, the predicted cost of pinning what could be in swap, free
huge-page blocks, PSI, and each check's status. They are read from the typed result's
fields (diag/results.py), never from its sentences. Point node_exporter's
--collector.textfile.directory at the file's directory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .results import PreflightResult

__all__ = ["render_textfile", "write_textfile", "STATUS_VALUE"]

STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "skip": 3, "error": 4}


def _esc(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample_value(value) -> str:
    """A sample in the text format's own spelling, whatever the reading: an integer exactly while a
    float holds it, a float otherwise, +Inf/-Inf past a float's range (a damaged MemTotal of
    10^400 kB), NaN for a value that is not a number."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 53:
        return str(value)
    try:
        v = float(value)
    except OverflowError:
        return "+Inf" if value > 0 else "-Inf"
    except (TypeError, ValueError):
        return "NaN"
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 2 ** 63 else repr(v)


def render_textfile(result: PreflightResult | dict[str, Any], timestamp: float) -> str:
    r = result if isinstance(result, PreflightResult) else PreflightResult.from_dict(result)
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], float | None]]) -> None:
        samples = [(labels, v) for labels, v in samples if v is not None]
        if not samples:
            return
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
            text = _sample_value(value)
            lines.append(f"{name}{{{lab}}} {text}" if lab else f"{name} {text}")

    plan = r.plan or {}
    base = {"method": str(plan.get("method")), "ranks": str(plan.get("ranks"))}
    facts = r.facts or {}
    gauge("hostpin_preflight_status", "Preflight verdict: 0 pass, 1 warn, 2 fail, 4 not evaluated.",
          [(base, STATUS_VALUE.get(r.status, 4))])
    gauge("hostpin_preflight_check_status", "Each check: 0 pass, 1 warn, 2 fail, 3 skip, 4 error.",
          [({"check": c.id}, STATUS_VALUE.get(c.status, 4)) for c in sorted(r.checks, key=lambda c: c.id)])
    gauge("hostpin_headroom_bytes", "Memory the plan can use now where it binds: MemAvailable, or the cgroup's "
          "limit minus its working set.", [({"binding": r.binding or "unknown"}, r.binding_bytes)])
    gauge("hostpin_plan_need_bytes", "What the plan needs where it binds: size x ranks plus the driver's tables "
          "(node) or page tables (cgroup), and the reserve.", [(base, r.need_bytes)])
    gauge("hostpin_mem_available_bytes", "MemAvailable: the figure that shows driver-pinned memory (locked-memory "
          "counters do not).", [({}, facts.get("mem_available_bytes"))])
    gauge("hostpin_swap_used_bytes", "Swap in use.", [({}, r.swap_used_bytes)])
    gauge("hostpin_swapin_pages_per_second", "Swap-in demand over preflight's sample (0 when no swap is in use).",
          [({}, r.swapin_pages_per_s)])
    gauge("hostpin_predicted_pin_seconds", "Predicted seconds to pin back the part of the plan that could be in "
          "swap, at what the swap device delivers.", [(base, r.predicted_pin_seconds)])
    gauge("hostpin_free_order9_bytes", "Free memory in blocks of the THP order or more (huge-page sized).",
          [({}, r.free_huge_bytes)])
    gauge("hostpin_unusable_index_order9", "Unusable free space index at the THP order, Normal zone (0 good, 1 bad).",
          [({}, facts.get("unusable_index_order9"))])
    psi = (r.check("psi").evidence.get("psi") if r.check("psi") else None) or {}
    gauge("hostpin_psi_memory_avg10", "Memory pressure stall information, avg10 percent.",
          [({"kind": k}, (v or {}).get("avg10")) for k, v in sorted(psi.items())])
    gauge("hostpin_catalog_predicted", "Failure catalog entries whose condition holds on this node (1 each).",
          [({"entry": str(e)}, 1) for e in r.catalog_predicted])
    gauge("hostpin_preflight_duration_seconds", "How long preflight took.", [({}, r.duration_s)])
    gauge("hostpin_preflight_timestamp_seconds", "When preflight ran (Unix time).", [({}, timestamp)])
    return "\n".join(lines) + "\n"


def write_textfile(result: PreflightResult | dict[str, Any], path: Path | str, timestamp: float) -> Path:
    """Write next to the target and rename over it, so node_exporter never reads half a file (or
    through a pipe or terminal: `-`, /dev/stdout; a link is never replaced). The directory must
    exist (node_exporter's textfile directory): none is ever created (FileNotFoundError). The
    file is 0644, as node_exporter, another user, must read it."""
    from .confined import write_output
    write_output(path, render_textfile(result, timestamp).encode(), mode=0o644)
    return Path(path)
