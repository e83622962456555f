"""Preflight figures in the node_exporter textfile format, written atomically.

A monitor that watches locked memory reports a driver-pinned table as zero (the paper's
operators learnt it); these gauges carry what matters instead: headroom, MemAvailable, swap in
use and the swap-in rate, free order-9 memory, the unusable index, PSI, and each check's status.
Point node_exporter's --collector.textfile.directory at the file's directory.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["render_textfile", "write_textfile", "STATUS_VALUE"]

STATUS_VALUE = {"pass": 0, "warn": 1, "fail": 2, "skip": 3, "error": 3}


def _esc(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_textfile(result: dict[str, Any], timestamp: float) -> str:
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], float | None]]) -> None:
        samples = [(labels, v) for labels, v in samples if v is not None]
        if not samples:
            return
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
            v = float(value)
            text = str(int(v)) if v.is_integer() else repr(v)
            lines.append(f"{name}{{{lab}}} {text}" if lab else f"{name} {text}")

    plan = result.get("plan", {})
    base = {"method": str(plan.get("method")), "ranks": str(plan.get("ranks"))}
    checks = {c["id"]: c for c in result.get("checks", [])}
    facts = result.get("facts") or {}
    gauge("hostpin_preflight_status", "Preflight verdict: 0 pass, 1 warn, 2 fail, 3 not evaluated.",
          [(base, STATUS_VALUE.get(result.get("status"), 3))])
    gauge("hostpin_preflight_check_status", "Each check: 0 pass, 1 warn, 2 fail, 3 skip.",
          [({"check": cid}, STATUS_VALUE[c["status"]]) for cid, c in sorted(checks.items())])
    head = checks.get("headroom", {}).get("evidence", {})
    gauge("hostpin_headroom_bytes", "Memory the plan can use now: MemAvailable or the cgroup's limit minus usage, "
          "whichever binds.", [({"binding": "cgroup" if "cgroup" in str(head.get("binding")) else "MemAvailable"},
                                head.get("binding_bytes"))])
    gauge("hostpin_plan_need_bytes", "What the plan needs: size x ranks plus driver page tables and reserve.",
          [(base, head.get("need_with_tables_bytes"))])
    gauge("hostpin_mem_available_bytes", "MemAvailable: the figure that shows driver-pinned memory (locked-memory "
          "counters do not).", [({}, facts.get("mem_available_bytes"))])
    gauge("hostpin_swap_used_bytes", "Swap in use.", [({}, facts.get("swap_used_bytes"))])
    swap_ev = checks.get("swap", {}).get("evidence", {})
    sample = swap_ev.get("swapin_sample") or {}
    rate = sample.get("pages_per_s")
    if rate is None and swap_ev and not swap_ev.get("swap_total_bytes"):
        rate = 0.0  # no swap configured: nothing can be swapped in
    gauge("hostpin_swapin_pages_per_second", "Swap-in rate over preflight's sample (0 when no swap is in use).",
          [({}, rate)])
    gauge("hostpin_free_order9_bytes", "Free memory in blocks of order 9 or more (huge-page sized).",
          [({}, facts.get("free_order9_bytes"))])
    gauge("hostpin_unusable_index_order9", "Unusable free space index at order 9, Normal zone (0 good, 1 bad).",
          [({}, facts.get("unusable_index_order9"))])
    psi = checks.get("psi", {}).get("evidence", {}).get("psi") or {}
    gauge("hostpin_psi_memory_avg10", "Memory pressure stall information, avg10 percent.",
          [({"kind": k}, v.get("avg10")) for k, v in sorted(psi.items())])
    gauge("hostpin_preflight_duration_seconds", "How long preflight took.", [({}, result.get("duration_s"))])
    gauge("hostpin_preflight_timestamp_seconds", "When preflight ran (Unix time).", [({}, timestamp)])
    return "\n".join(lines) + "\n"


def write_textfile(result: dict[str, Any], path: Path | str, timestamp: float) -> Path:
    """Write next to the target and rename over it, so node_exporter never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(render_textfile(result, timestamp))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
