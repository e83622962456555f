"""Rendering results for a terminal: the verdict first, failures and warnings with remedies."""
from __future__ import annotations

import shutil
from typing import Any

from tabulate import tabulate

__all__ = ["render_preflight", "STATUS_LABEL"]

STATUS_LABEL = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip", "error": "ERROR"}


def render_preflight(result: dict[str, Any]) -> str:
    width = max(60, min(shutil.get_terminal_size((120, 40)).columns, 160) - 24)
    lines = [f"hostpin preflight: {STATUS_LABEL.get(result['status'], result['status'])}: {result['verdict']}"]
    where = "live node" if result.get("live") else f"captured tree {result['root']}"
    page = (f", {result['page_size'] // 1024} KiB pages ({result.get('page_size_source')})"
            if result.get("page_size") else "")
    lines.append(f"  plan: {(result.get('plan') or {}).get('describe')}; {where}"
                 + (f", kernel {result['kernel']}" if result.get("kernel") else "") + page)
    if result.get("binding"):
        from .units import format_bytes
        at = f" {result['binding_dir']}" if result.get("binding_dir") else ""
        lines.append(f"  binds: {result['binding']}{at}: {format_bytes(result.get('binding_bytes'))} available"
                     + (f", the plan needs {format_bytes(result['need_bytes'])}" if result.get("need_bytes") else "")
                     + (f"; predicted pin time for the part that could be in swap: "
                        f"{result['predicted_pin_seconds']:.1f} s" if result.get("predicted_pin_seconds") else ""))
    rows = []
    for c in result.get("checks", []):
        text = c["summary"]
        if c["status"] in ("fail", "warn", "error") and c.get("remedy"):
            text += f"\n-> {c['remedy']}"
        rows.append([STATUS_LABEL[c["status"]], c["id"], text])
    if rows:
        lines.append("")
        lines.append(tabulate(rows, headers=["", "check", "finding (-> remedy)"], tablefmt="simple",
                              maxcolwidths=[None, None, width]))
    lines.append("")
    if result.get("run_dir"):
        lines.append(f"evidence: {result['run_dir']} (manifest.json; raw files under root/)")
    lines.append(f"took {result.get('duration_s', 0):.2f} s; exit code {result.get('exit_code')}")
    return "\n".join(lines)
