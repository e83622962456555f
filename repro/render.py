"""Terminal output for reproductions: a live progress line, the verdict, the figures."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from diag.report import staging_body
from diag.units import format_bytes, format_duration
from diag.watch.render import ProgressLine

__all__ = ["ProgressLine", "render_result", "render_matrix", "render_staging"]


def _verdict_after(r: dict) -> str:
    """The verdict after its outcome's label, without saying the outcome twice ("REFUSED: refused: ...")."""
    verdict, said = str(r.get("verdict")), f"{r.get('outcome')}: "
    return verdict[len(said):] if verdict.lower().startswith(said.lower()) else verdict


def render_result(r: dict[str, Any]) -> str:
    lines = [f"hostpin repro register: {str(r['outcome']).upper()}: {_verdict_after(r)}"]
    o = r.get("options", {})
    if o:
        lines.append(f"  plan: {o.get('ranks', 1)} x {format_bytes(o.get('size'))} by {o.get('method')}"
                     f" (source {o.get('source')}/{o.get('map')}, THP {dict([(True, 'on'), (False, 'off')]).get(o.get('thp'), 'policy default')}, prefault {o.get('prefault')}"
                     + (f", chunk {format_bytes(o['chunk'])}" if o.get("chunk") else "")
                     + (f", swap-out {format_bytes(o['swap_out'])}" if o.get("swap_out") else "")
                     + (f", swap-in limited to {format_bytes(o['swap_in_rate'])}/s" if o.get("swap_in_rate") else "")
                     + (f", reads limited to {format_bytes(o['read_rate'])}/s" if o.get("read_rate") else "")
                     + ")")
    facts = []
    for key, label, fmt in (("seconds", "pin time", format_duration), ("rate_gib_s", "rate", lambda v: f"{v:.2f} GiB/s"),
                            ("clean_rate_gib_s", "this node's clean rate", lambda v: f"{v:.2f} GiB/s"),
                            ("bound", "bound", str), ("first_bound_at_s", "bound named after", lambda v: f"{v:.1f} s"),
                            ("eta_error", "ETA at 20% vs actual", lambda v: f"{v * 100:+.0f}%"),
                            ("swapin_pages_per_s", "swap-in during the pin", lambda v: f"{v:,.0f} pages/s")):
        if r.get(key) is not None:
            facts.append([label, fmt(r[key])])
    if r.get("file_cache"):
        fc = r["file_cache"]
        facts.append(["file in the page cache", f"{100 * (fc.get('cached_before') or 0):.0f}% before the run, "
                                                f"{100 * (fc.get('cached_after') or 0):.0f}% after dropping it"])
    if r.get("pinned_pages") is not None:
        facts.append(["pinned (counter " + str(r.get("progress_counter")) + ")",
                      f"{r['pinned_pages']:,} of {r['expected_pages']:,} pages"])
    if r.get("watchdog"):
        facts.append(["watchdog cost", f"{r['watchdog']['watchdog_cpu_pct_of_core']:.1f}% of one core"])
    if facts:
        lines.append("")
        lines.append(tabulate(facts, tablefmt="plain"))
    if len(r.get("ranks", [])) > 1 or any(rk.get("chunks") and len(rk["chunks"]) > 1 for rk in r.get("ranks", [])):
        rows = []
        gpus = any(rk.get("device") is not None for rk in r["ranks"])  # --method mlock opens none
        for rk in r["ranks"]:
            pf = rk.get("prefault") or {}
            rows.append([rk["rank"]] + ([rk.get("device")] if gpus else []) + [
                         rk["outcome"], format_duration(rk.get("seconds")),
                         f"{rk['rate_gib_s']:.2f}" if rk.get("rate_gib_s") else "",
                         f"{pf.get('rate_gib_s'):.2f}" if pf.get("rate_gib_s") else "",
                         len(rk.get("chunks") or []), format_duration(rk.get("unpin_s"))])
        lines.append("")
        lines.append(tabulate(rows, headers=["rank"] + (["GPU"] if gpus else []) +
                              ["outcome", "pin", "GiB/s", "prefault GiB/s", "chunks", "unpin"]))
    for rk in r.get("ranks", []):
        chunks = rk.get("chunks") or []
        if len(chunks) > 1:
            times = ", ".join(f"{c['seconds']:.2f}" for c in chunks[:32]) + (" ..." if len(chunks) > 32 else "")
            lines.append(f"rank {rk['rank']} chunks of {format_bytes(chunks[0]['bytes'])}, seconds each: {times}")
    for note in r.get("notes", []):
        lines.append(f"note: {note}")
    for step in r.get("cleanup", []):
        if not step["ok"]:
            lines.append(f"CLEANUP PROBLEM: {step['undo']}: {'; '.join(step['problems'])}")
    lines.append("")
    if r.get("watchdog"):
        lines.append(f"evidence: {r['run_dir']} (timeline.jsonl, events.jsonl, child logs, manifest.json)")
    else:
        lines.append(f"evidence: {r['run_dir']} (result.json, manifest.json)")
    return "\n".join(lines)


def render_matrix(rows: list[dict[str, Any]], size: int, run_dir: str) -> str:
    table = [[r["method"], r["thp"], r["prefault"], format_duration(r.get("seconds")),
              f"{r['rate_gib_s']:.2f}" if r.get("rate_gib_s") else "", r["outcome"],
              r.get("bound") or "", (r.get("verdict") or "")[:70] if r["outcome"] not in ("completed",) else ""]
             for r in rows]
    return (f"hostpin repro register --matrix: {format_bytes(size)} per case, one child each\n\n"
            + tabulate(table, headers=["method", "THP", "prefault", "seconds", "GiB/s", "outcome", "bound", "note"])
            + f"\n\nevidence: {run_dir} (cases/<case>/...)")


def render_staging(r: dict[str, Any]) -> str:
    o = r.get("options", {})
    lines = [f"hostpin repro staging: {str(r['outcome']).upper()}: {_verdict_after(r)}"]
    if o:
        lines.append(f"  {o['repeat']} repeats x {o['bursts']} bursts per side of {format_bytes(o['bytes'])} over "
                     f"{o['threads']} threads, {o['direction']}, order {' '.join(r.get('sequence', []))}")
    if r.get("repeats"):
        lines.append("")
        lines.append(staging_body(r, md=False).rstrip("\n"))
    for f in r.get("failures", []):
        lines.append(f"repeat {f['repeat']} failed: {f['error']}")
    lines.append("")
    lines.append(f"evidence: {r['run_dir']} (repeats/N.json raw, repeats/N.parent.json, repeats/N.log per step, "
                 "manifest.json)")
    return "\n".join(lines)
