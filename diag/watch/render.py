"""Words for what a watch saw: the live progress line, the launcher's heartbeat, the verdict
sentence (verdict first, the figures behind it, the remedy) and the terminal result."""
from __future__ import annotations

import sys
import time
from typing import Any

from tabulate import tabulate

from ..safetext import one_line
from ..units import GiB, format_bytes, format_duration
from .bounds import remedy_for
from .result import PhaseResult, WatchResult

__all__ = ["ProgressLine", "heartbeat_line", "cause_sentence", "phase_verdict", "watch_verdict", "render_watch",
           "watch_body", "remedy_for"]


class ProgressLine:
    """One rewritten line on stderr when it is a terminal: phase, bar, rate, ETA, bound.
    The same line for `hostpin repro register` and `hostpin watch`."""

    def __init__(self, stream=sys.stderr, enabled: bool | None = None, page: int = 4096):
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.page = page
        self._t0 = time.monotonic()

    def __call__(self, prog: dict[str, Any]) -> None:
        if not self.enabled:
            return
        phase = prog.get("phase")
        if phase == "pin" and (prog.get("pct") is not None or prog.get("bound")):
            pct = prog.get("pct")
            bar = ("#" * int(pct / 5) + "-" * (20 - int(pct / 5))) if pct is not None else "?" * 20
            rate = max(0.0, prog.get("rate_pages_s") or 0) * self.page / GiB  # falling memory is no pin rate
            eta = format_duration(prog.get("eta_s")) if prog.get("eta_s") is not None else "?"
            pct_text = f"{pct:5.1f}%" if pct is not None else "    ?%"
            text = (f"pin      [{bar}] {pct_text}  {rate:6.2f} GiB/s  ETA {eta:>7s}  bound {prog.get('bound')}"
                    f"  ({format_duration(prog.get('elapsed_s'))})")
        elif phase == "prefault":
            text = f"prefault touched {format_bytes(prog.get('rss_bytes'))}  ({format_duration(time.monotonic() - self._t0)})"
        else:
            text = f"{phase} ..."
        self.stream.write("\r\033[K" + text)
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def heartbeat_line(pid: int, prog: dict[str, Any], page: int = 4096) -> str:
    """'hostpin: pid 4711 pinning 47 GiB: 12% at 2,800 pages/s, bound swap-in, ETA 23 min'."""
    expected = prog.get("expected_pages")
    head = f"hostpin: pid {pid} pinning" + (f" {format_bytes(expected * page)}" if expected else "")
    parts = []
    emptied = prog.get("pct") is None and prog.get("bound") == "swap-in" and prog.get("swap_pages_left") == 0
    if prog.get("pct") is not None:
        parts.append(f"{prog['pct']:.0f}%")
    elif prog.get("swap_pages_left"):
        parts.append(f"{format_bytes(prog['swap_pages_left'] * page)} still in swap")
    elif emptied:
        parts.append("nothing left in swap")
    # a falling figure is memory given back (the pin has returned, or is being undone), not a rate
    if prog.get("rate_pages_s") is not None and prog["rate_pages_s"] >= 0:
        parts.append(f"at {prog['rate_pages_s']:,.0f} pages/s")
    text = head + (": " + " ".join(parts) if parts else "")
    text += f", bound {prog.get('bound') or 'unknown'}"
    if prog.get("eta_s") is not None:
        text += f", ETA {format_duration(prog['eta_s'])}"
    elif emptied:
        text += ", finishing"
    elif prog.get("eta_basis") == "ETA needs --size":
        text += ", ETA needs --size"
    return text + f" ({format_duration(prog.get('elapsed_s'))} in)"


def cause_sentence(bound: str | None, figures: dict | None, rate_pages_s: float | None = None) -> str | None:
    """What the bound means for a pin, with the process's own figures (Tracker.figures)."""
    f = figures or {}
    secs = f.get("seconds") or 0
    if bound == "swap-in":
        if not f.get("swapped_in_bytes") and f.get("system_swapin_pages"):  # shared memory: not in VmSwap
            return (f"its shared memory came back from swap (RssShmem +{format_bytes(f.get('shmem_growth_bytes'))}; "
                    f"{f['system_swapin_pages_s']:,.0f} pages/s swapped in system-wide)")
        part = (f"{format_bytes(f['swap_at_start_bytes'])} of its memory was in swap and was"
                if f.get("swap_at_start_bytes") else "swapped pages were")
        rate = f.get("swapin_pages_s") or rate_pages_s
        return f"{part} read back one page at a time" + (f" at {rate:,.0f} pages/s" if rate else "")
    if bound == "file-read":
        read = f.get("read_bytes")
        text = "the pages were read from their file on disk during the pin"
        if read and secs:
            text += f" ({format_bytes(read)} at {read / (1 << 20) / secs:,.1f} MiB/s)"
        return text + "; a private mapping's pages are then copied"
    if bound == "fault-in/zeroing":
        if (f.get("shmem_growth_bytes") or 0) > 0:
            return f"the driver allocated and zeroed {format_bytes(f['shmem_growth_bytes'])} (its RssShmem)"
        return "the pages were allocated and zeroed (or copied) as the pin faulted them in" + (
            f" ({f['faults']:,} faults)" if f.get("faults") else "")
    if bound == "compaction":
        return "huge-page faults stalled in direct compaction"
    if bound == "migration":
        return "pages were migrated out of movable/CMA memory before pinning"
    if bound == "reclaim":
        return "each allocation waited on memory reclaim"
    if bound == "iommu":
        return "the driver mapped every page through the IOMMU"
    if bound == "driver-lock":
        return "the pin waited on the NVIDIA driver's lock, held by another pin or allocation"
    if bound == "lock wait":
        return "the pin waited on a lock"
    if bound == "driver":
        return "the kernel had the pages; the driver was mapping them"
    if bound == "cpu":
        return "the pages were resident; the kernel walked them"
    return None


def phase_verdict(ph: PhaseResult, page: int = 4096) -> str:
    who = f"pid {ph.pid}" + (f" ({one_line(ph.comm)})" if ph.comm else "")  # any user names its process
    size = format_bytes(ph.size_bytes) if ph.size_bytes else None
    why = f"bound {ph.bound}" if ph.bound else "bound unknown"
    if ph.bound_reason:
        why += f" ({ph.bound_reason})"
    if ph.outcome == "completed":
        since = "" if ph.seen_start else " after hostpin attached"
        head = f"{who} pinned {size or 'its region'} in {format_duration(ph.seconds)}{since}"
        cause = cause_sentence(ph.bound, ph.figures, ph.rate_pages_s)
        text = f"{head}, {why}" + (f": {cause}" if cause else "")
    else:
        where = f"{ph.pct:.0f}% of {size}" if ph.pct is not None and size else (size or "an unknown size")
        state = "exited inside the pin" if ph.outcome == "exited" else "still pinning"
        rate = f" at {ph.rate_pages_s:,.0f} pages/s" if ph.rate_pages_s and ph.rate_pages_s > 0 else ""
        eta = (f", ETA {format_duration(ph.eta_s)}" if ph.eta_s is not None
               else ", ETA needs --size" if ph.eta_basis == "ETA needs --size" else "")
        text = f"{who} {state} after {format_duration(ph.seconds)}: {where}{rate}, {why}{eta}"
    if ph.catalog:
        text += f" (catalog {ph.catalog})"
    return text + "."


def watch_verdict(r: WatchResult) -> str:
    main = r.main_phase
    if r.outcome == "gone":
        return r.verdict or f"no process {r.pid} to watch"
    if main is None:
        what = f"pid {r.pid}" + (f" ({r.name})" if r.name else "")
        if r.mode == "command":
            return f"{_command_text(r)} ended ({_exit_text(r)}); no pin phase was seen."
        how = {"deadline": f"until the {format_duration(r.deadline_s)} deadline",
               "exited": "until it exited", "interrupted": "until interrupted"}.get(r.outcome, "")
        return f"{what}: no pin phase seen in {format_duration(r.watched_s)} of watching {how}".rstrip() + "."
    text = phase_verdict(main)
    if r.mode == "command":
        more = f" ({len(r.phases)} pin phases; the longest above)" if len(r.phases) > 1 else ""
        return f"{_command_text(r)} ended ({_exit_text(r)}){more}; {text}"
    if r.outcome == "deadline":
        text = f"deadline ({format_duration(r.deadline_s)}) reached: " + text
    return text


def _command_text(r: WatchResult) -> str:
    import os
    argv = list(r.argv or [])
    if argv:
        argv[0] = os.path.basename(argv[0])
    text = " ".join(argv)
    return text if len(text) <= 60 else text[:57] + "..."


def _exit_text(r: WatchResult) -> str:
    e = r.command_exit or {}
    if e.get("signal"):
        return f"killed by signal {e['signal']}"
    return f"exit code {e.get('returncode')}"


def render_watch(r: WatchResult) -> str:
    lines = [f"hostpin watch: {r.outcome.upper()}: {r.verdict}"]
    main = r.main_phase
    if main is not None:
        rows = []
        for label, value in (
                ("bound", main.bound),
                ("bound named after", f"{main.first_bound_at_s:.1f} s" if main.first_bound_at_s is not None else None),
                ("pinned", f"{main.pinned_pages:,} of {main.expected_pages:,} pages ({main.progress_basis})"
                 if main.pinned_pages is not None and main.expected_pages else None),
                ("rate", f"{main.rate_pages_s:,.0f} pages/s" if main.rate_pages_s and main.rate_pages_s > 0 else None),
                ("ETA", (format_duration(main.eta_s) if main.eta_s is not None else main.eta_basis)
                 if main.outcome == "open" else None),
                ("ETA at 20% vs actual", f"{main.eta_error * 100:+.0f}%" if main.eta_error is not None else None),
                ("size from", main.size_from), ("kind", main.kind)):
            if value:
                rows.append([label, value])
        lines += ["", tabulate(rows, tablefmt="plain")]
        if r.remedy:
            lines += ["", f"remedy: {r.remedy}"]
    if len(r.phases) > 1:
        table = [[p.pid, p.tid, p.kind or "", format_duration(p.started_s), format_duration(p.seconds), p.outcome,
                  p.bound or "", f"{p.pct:.0f}%" if p.pct is not None else ""] for p in r.phases]
        lines += ["", tabulate(table, headers=["pid", "tid", "kind", "at", "took", "outcome", "bound", "done"])]
    for note in list(r.notes) + [n for p in r.phases for n in p.shared_counters + p.notes]:
        lines.append(f"note: {note}")
    for what, why in r.unreadable.items():
        lines.append(f"note: cannot read {what}: {why}")
    if r.watcher:
        lines.append(f"watch cost: {r.watcher['cpu_pct_of_core']:.1f}% of one core over {r.watcher['samples']} samples")
    lines += ["", f"evidence: {r.run_dir} (timeline.jsonl, stacks-*.txt, result.json, manifest.json)"]
    return "\n".join(lines)


def watch_body(r: dict[str, Any], md: bool) -> str:
    """A watch's result.json as `hostpin report` shows it: the phases, the figures, the notes."""
    fmt = "github" if md else "simple"
    rows = [[p.get("pid"), p.get("kind") or "", format_duration(p.get("started_s")), format_duration(p.get("seconds")),
             p.get("outcome"), p.get("bound") or "", f"{p['pct']:.0f}%" if p.get("pct") is not None else "",
             f"{p['rate_pages_s']:,.0f}" if p.get("rate_pages_s") else "",
             f"{100 * p['eta_error']:+.0f}%" if p.get("eta_error") is not None else "",
             p.get("catalog") or ""] for p in r.get("phases") or []]
    out = (tabulate(rows, headers=["pid", "kind", "at", "took", "outcome", "bound", "done", "pages/s",
                                   "ETA at 20% vs end", "catalog"], tablefmt=fmt) + "\n") if rows else "No pin phase.\n"
    for p in r.get("phases") or []:
        if p.get("bound_reason"):
            out += f"\npid {p['pid']} {p.get('bound')}: {p['bound_reason']}\n"
    if r.get("remedy"):
        out += f"\nremedy: {r['remedy']}\n"
    for note in (r.get("notes") or []) + [n for p in r.get("phases") or [] for n in p.get("shared_counters", [])]:
        out += f"\nnote: {note}\n"
    return out
