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
    lines.append(f"  plan: {result['plan']['describe']}; {where}"
                 + (f", kernel {result['kernel']}" if result.get("kernel") else ""))
    rows = []
    for c in result.get("checks", []):
        text = c["summary"]
        if c["status"] in ("fail", "warn") and c.get("remedy"):
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
