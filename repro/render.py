"""Terminal output for reproductions: a live progress line, the verdict, the figures."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from diag.report import staging_body
from diag.reproresult import ReproRegisterResult
from diag.units import format_bytes, format_duration
from diag.watch.render import ProgressLine

__all__ = ["ProgressLine", "render_result", "render_matrix", "render_staging"]


def _verdict_after(verdict: str | None, outcome: str | None) -> str:
    """The verdict after its outcome's label, without saying the outcome twice ("REFUSED: refused: ...")."""
    verdict, said = str(verdict), f"{outcome}: "
    return verdict[len(said):] if verdict.lower().startswith(said.lower()) else verdict


def render_result(r: ReproRegisterResult) -> str:
    lines = [f"hostpin repro register: {r.outcome.upper()}: {_verdict_after(r.verdict, r.outcome)}"]
    o = r.options
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
        if getattr(r, key) is not None:
            facts.append([label, fmt(getattr(r, key))])
    if r.file_cache:
        fc = r.file_cache
        facts.append(["file in the page cache", f"{100 * (fc.get('cached_before') or 0):.0f}% before the run, "
                                                f"{100 * (fc.get('cached_after') or 0):.0f}% after dropping it"])
    if r.pinned_pages is not None:
        facts.append([f"pinned (counter {r.progress_counter})", f"{r.pinned_pages:,} of {r.expected_pages:,} pages"])
    if r.watchdog:
        facts.append(["watchdog cost", f"{r.watchdog['watchdog_cpu_pct_of_core']:.1f}% of one core"])
    if facts:
        lines.append("")
        lines.append(tabulate(facts, tablefmt="plain"))
    if len(r.ranks) > 1 or any(rk.chunks and len(rk.chunks) > 1 for rk in r.ranks):
        rows = []
        gpus = any(rk.device is not None for rk in r.ranks)  # --method mlock opens none
        for rk in r.ranks:
            pf_rate = rk.prefault.rate_gib_s if rk.prefault else None
            rows.append([rk.rank] + ([rk.device] if gpus else []) + [
                         rk.outcome, format_duration(rk.seconds), f"{rk.rate_gib_s:.2f}" if rk.rate_gib_s else "",
                         f"{pf_rate:.2f}" if pf_rate else "", len(rk.chunks or []), format_duration(rk.unpin_s)])
        lines.append("")
        lines.append(tabulate(rows, headers=["rank"] + (["GPU"] if gpus else []) +
                              ["outcome", "pin", "GiB/s", "prefault GiB/s", "chunks", "unpin"]))
    for rk in r.ranks:
        chunks = rk.chunks or []
        if len(chunks) > 1:
            times = ", ".join(f"{c['seconds']:.2f}" for c in chunks[:32]) + (" ..." if len(chunks) > 32 else "")
            lines.append(f"rank {rk.rank} chunks of {format_bytes(chunks[0]['bytes'])}, seconds each: {times}")
    for note in r.notes:
        lines.append(f"note: {note}")
    for step in r.cleanup:
        if not step.ok:
            lines.append(f"CLEANUP PROBLEM: {step.undo}: {'; '.join(step.problems)}")
    lines.append("")
    if r.watchdog:
        lines.append(f"evidence: {r.run_dir} (timeline.jsonl, events.jsonl, child logs, manifest.json)")
    else:
        lines.append(f"evidence: {r.run_dir} (result.json, manifest.json)")
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
    lines = [f"hostpin repro staging: {str(r['outcome']).upper()}: {_verdict_after(r.get('verdict'), r.get('outcome'))}"]
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
