"""Words for what a watch saw: the live progress line, the launcher's heartbeat, the verdict
sentence (verdict first, the figures behind it, the remedy) and the terminal result."""
from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

from tabulate import tabulate

from ..safetext import md_cell, one_line
from ..units import GiB, format_bytes, format_duration
from .bounds import remedy_for
from .result import LOAD_KINDS, PhaseResult, WatchResult

__all__ = ["ProgressLine", "fit_progress", "load_verdict", "heartbeat_line", "cause_sentence", "phase_verdict", "watch_verdict", "render_watch",
           "watch_body", "remedy_for"]


def _columns(stream) -> int:
    """The terminal's width (COLUMNS when set, as shutil reads it), 80 when it cannot be told."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size((80, 24)).columns


def fit_progress(label: str, prog: dict[str, Any], page: int, width: int) -> str:
    """The progress line in at most width - 1 columns (the last column would wrap on some
    terminals): the least needed parts go first (elapsed time, then the rate), the bar narrows."""
    pct = prog.get("pct")
    rate = max(0.0, prog.get("rate_pages_s") or 0) * page / GiB  # falling memory is no pin rate
    eta = format_duration(prog.get("eta_s")) if prog.get("eta_s") is not None else "?"
    pct_text = f"{pct:5.1f}%" if pct is not None else "    ?%"
    elapsed = f"({format_duration(prog.get('elapsed_s'))})"
    for bar_w, parts in ((20, "rbe"), (20, "rb"), (10, "rb"), (10, "b"), (0, "b"), (0, "")):
        bar = ""
        if bar_w:
            n = int((pct or 0) / 100 * bar_w)
            bar = "[" + (("#" * n + "-" * (bar_w - n)) if pct is not None else "?" * bar_w) + "] "
        text = f"{label:<8s} {bar}{pct_text}"
        if "r" in parts:
            text += f"  {rate:6.2f} GiB/s" if rate >= 1 else f"  {rate * 1024:6.1f} MiB/s"
        text += f"  ETA {eta}"
        if "b" in parts:
            text += f"  bound {prog.get('bound')}"
        if "e" in parts:
            text += f"  {elapsed}"
        if len(text) < width:
            return text
    return text[:max(1, width - 1)]


class ProgressLine:
    """One rewritten line on stderr when it is a terminal: phase, bar, rate, ETA, bound, fitted
    to the terminal's width (a longer line wraps, and each rewrite then scrolls a row).
    The same line for `hostpin repro register` and `hostpin watch`."""

    def __init__(self, stream=sys.stderr, enabled: bool | None = None, page: int = 4096, width: int | None = None):
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.page = page
        self.width = width  # None: the terminal's, read at each line (a window may be resized)
        self._t0 = time.monotonic()

    def __call__(self, prog: dict[str, Any]) -> None:
        if not self.enabled:
            return
        phase = prog.get("phase")
        width = self.width or _columns(self.stream)
        if phase in ("pin",) + LOAD_KINDS and (prog.get("pct") is not None or prog.get("bound")):
            text = fit_progress("pin" if phase == "pin" else phase, prog, self.page, width)
        elif phase == "prefault":
            text = f"prefault touched {format_bytes(prog.get('rss_bytes'))}  ({format_duration(time.monotonic() - self._t0)})"
        else:
            text = f"{phase} ..."
        self.stream.write("\r\033[K" + text[:max(1, width - 1)])
        self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def heartbeat_line(pid: int, prog: dict[str, Any], page: int = 4096) -> str:
    """'hostpin: pid 4711 pinning 47 GiB: 12% at 2,800 pages/s, bound swap-in, ETA 23 min'."""
    expected = prog.get("expected_pages")
    doing = "pinning" if prog.get("phase", "pin") == "pin" else f"{prog['phase']} (not a pin)"
    head = f"hostpin: pid {pid} {doing}" + (f" {format_bytes(expected * page)}" if expected else "")
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


def cause_sentence(bound: str | None, figures: dict | None, rate_pages_s: float | None = None,
                   kind: str | None = None, shmem_at_end: int | None = None,
                   from_s: float | None = None) -> str | None:
    """What the bound means for a pin, with the process's own figures (Tracker.figures); `kind`:
    the pin's (only a hostalloc's zeroing is the driver's); `shmem_at_end`: the process's RssShmem
    when a hostalloc whose start was not seen returned (the figures then count from the attach, or
    from `from_s`, the sample its phase starts at, for one begun between two later samples)."""
    f = figures or {}
    secs = f.get("seconds") or 0
    if kind == "hostalloc" and bound in ("swap-in", "file-read"):
        # a cudaHostAlloc allocates fresh pages: it reads no file and brings nothing back from swap
        what = "read a file" if bound == "file-read" else "read memory back from swap"
        return (f"the process {what} while the driver allocated (a cudaHostAlloc reads neither: another thread's "
                "work, or the copy's after it)")
    if bound == "fault-in/zeroing" and kind == "hostalloc" and shmem_at_end:
        before = f.get("shmem_at_start_bytes") or 0
        if from_s is not None:
            return (f"the driver allocated and zeroed {format_bytes(max(0, shmem_at_end - before))} (its RssShmem: "
                    f"{format_bytes(before)} at {from_s:.1f} s, where the phase starts, {format_bytes(shmem_at_end)} "
                    "at the return)")
        return (f"the driver allocated and zeroed {format_bytes(max(0, shmem_at_end - before))} after hostpin attached "
                f"(its RssShmem: {format_bytes(before)} at the attach, {format_bytes(shmem_at_end)} at the return)")
    if bound == "swap-in":
        if not f.get("swapped_in_bytes") and f.get("system_swapin_pages"):  # shared memory: not in VmSwap
            return (f"its shared memory came back from swap (RssShmem +{format_bytes(f.get('shmem_growth_bytes'))}; "
                    f"{f['system_swapin_pages_s']:,.0f} pages/s swapped in system-wide)")
        part = (f"{format_bytes(f['swapped_in_bytes'])} of its memory was"
                if f.get("swapped_in_bytes") else "swapped pages were")
        rate = f.get("swapin_pages_s") or rate_pages_s
        left = (f.get("swap_at_start_bytes") or 0) - (f.get("swapped_in_bytes") or 0)
        return f"{part} read back from swap one page at a time" + (f" at {rate:,.0f} pages/s" if rate else "") + (
            f" ({format_bytes(left)} more of it stayed in swap)" if left >= (1 << 20) else "")
    if bound == "file-read":
        read = f.get("read_bytes")
        text = "the pages were read from their file on disk during the pin"
        if read and secs:
            text += f" ({format_bytes(read)} at {read / (1 << 20) / secs:,.1f} MiB/s)"
        return text + "; a private mapping's pages are then copied"
    if bound == "fault-in/zeroing":
        if (f.get("shmem_growth_bytes") or 0) > 0 and kind == "hostalloc":
            return f"the driver allocated and zeroed {format_bytes(f['shmem_growth_bytes'])} (its RssShmem)"
        if (f.get("shmem_growth_bytes") or 0) > 0:
            return f"its shared memory was allocated and zeroed as the pin faulted it in (RssShmem " \
                   f"+{format_bytes(f['shmem_growth_bytes'])})"
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


_LOAD_DONE = {"copy-from-swap": ("read {swapped} back from swap", "reading its memory back from swap"),
              "file-read": ("read {read} from disk", "reading from disk"),
              "alloc": ("grew its resident memory by {grown}", "growing its resident memory")}


def load_verdict(ph: PhaseResult) -> str:
    """A phase that is no pin: what the process did, in its own faults, and what bound it."""
    who = f"pid {ph.pid}" + (f" ({one_line(ph.comm)})" if ph.comm else "")  # any user names its process
    f = ph.figures or {}
    done, doing = _LOAD_DONE.get(ph.kind or "", ("was busy with memory", "busy with memory"))
    if ph.kind == "copy-from-swap" and not f.get("swapped_in_bytes") and (f.get("shmem_growth_bytes") or 0) > 0:
        # shared memory (MAP_SHARED, /dev/shm, memfd) comes back from swap outside VmSwap: its RssShmem grows
        done = f"read {format_bytes(f['shmem_growth_bytes'])} of its shared memory back from swap (its RssShmem)"
    done = done.format(swapped=format_bytes(f.get("swapped_in_bytes") or 0), read=format_bytes(f.get("read_bytes") or 0),
                       grown=format_bytes(max(0, f.get("resident_growth_bytes") or 0)))
    why = f"bound {ph.bound}" if ph.bound else "bound unknown"
    if ph.bound_reason:
        why += f" ({ph.bound_reason})"
    if ph.outcome == "open":
        where = f"{ph.pct:.0f}% of {format_bytes(ph.size_bytes)}" if ph.pct is not None and ph.size_bytes else ""
        eta = f", ETA {format_duration(ph.eta_s)}" if ph.eta_s is not None else ""
        text = f"{who} still {doing} after {format_duration(ph.seconds)}" + (f" ({where})" if where else "") + \
            f": {ph.words}, {why}{eta}"
    else:
        since = "" if ph.seen_start else " after hostpin attached"
        ended = " before it exited" if ph.outcome == "exited" else ""
        text = f"{who} {done} in {format_duration(ph.seconds)}{since}{ended} ({ph.kind}: {ph.words}), {why}"
    if ph.catalog:
        text += f" (catalog {ph.catalog})"
    return text + "."


def phase_verdict(ph: PhaseResult, page: int = 4096) -> str:
    if not ph.pin:
        return load_verdict(ph)
    who = f"pid {ph.pid}" + (f" ({one_line(ph.comm)})" if ph.comm else "")  # any user names its process
    size = format_bytes(ph.size_bytes) if ph.size_bytes else None
    why = f"bound {ph.bound}" if ph.bound else "bound unknown"
    if ph.bound_reason:
        why += f" ({ph.bound_reason})"
    if ph.outcome == "completed":
        attached = ph.began_before_attach()
        since = " after hostpin attached" if attached else ""
        head = f"{who} pinned {size or 'its region'} in {format_duration(ph.seconds)}{since}"
        at_end = (ph.pinned_pages * page if not ph.seen_start and ph.progress_basis == "shmem" and ph.pinned_pages
                  else None)  # its start not seen, progress counts all of its RssShmem
        cause = cause_sentence(ph.bound, ph.figures, ph.rate_pages_s, ph.kind, at_end,
                               None if attached else ph.started_s)
        text = f"{head}, {why}" + (f": {cause}" if cause else "")
    elif ph.outcome == "unknown":
        where = f" at {ph.pct:.0f}%" + (f" of {size}" if size else "") if ph.pct is not None else ""
        due = next((n.split(", due to end ", 1)[1].split(":", 1)[0] for n in ph.notes if ", due to end " in n), None)
        text = (f"{who} exited; last seen in the pin{where}" + (f", due to end {due}" if due else "")
                + f": outcome unknown, {why}")
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
               "exited": "until it exited", "interrupted": "until interrupted",
               "quiet": f"until it had been quiet for {format_duration(r.quiet_after_s)}"}.get(
            r.ended_by or r.outcome, "")
        load = ", and no load (swap-in, file reads, memory growth) either" if r.until == "quiet" else ""
        return f"{what}: no pin phase seen in {format_duration(r.watched_s)} of watching {how}".rstrip() + load + "."
    text = _load_text(r) if any(not p.pin for p in r.phases) else phase_verdict(main)
    if r.mode == "command":
        more = f" ({len(r.phases)} pin phases; the longest above)" if len(r.phases) > 1 and all(
            p.pin for p in r.phases) else ""
        return f"{_command_text(r)} ended ({_exit_text(r)}){more}; {text}"
    if r.outcome == "completed" and r.ended_by == "quiet" and r.quiet_after_s:
        text += f" Quiet for {format_duration(r.quiet_after_s)} after that: the load is over."
    if r.outcome == "deadline":
        text = f"deadline ({format_duration(r.deadline_s)}) reached: " + text
    return text


def _load_text(r: WatchResult) -> str:
    """Every phase of a load in order (a pin, then the copy that reads its source), or the
    longest of each kind when there are many."""
    phases = r.phases
    if len(phases) > 4:
        longest: dict[tuple[bool, str | None], PhaseResult] = {}
        for p in phases:
            key = (p.pin, p.kind)
            if key not in longest or (p.seconds or 0) > (longest[key].seconds or 0):
                longest[key] = p
        pins = sum(1 for p in phases if p.pin)
        head = f"{len(phases)} phases ({pins} pins, {len(phases) - pins} not pins); the longest of each kind: "
        return head + " ".join(phase_verdict(p) for p in sorted(longest.values(), key=lambda p: p.started_s))
    return " Then ".join(phase_verdict(p) for p in phases)


def _command_text(r: WatchResult) -> str:
    import os
    argv = list(r.argv or [])
    if argv:
        argv[0] = os.path.basename(argv[0])
    text = " ".join(" ".join(argv).split())  # one line: an argument may hold newlines (python -c CODE)
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
                ("pinned" if main.pin else "done", f"{main.pinned_pages:,} of {main.expected_pages:,} pages "
                 f"({main.progress_basis})" if main.pinned_pages is not None and main.expected_pages else None),
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
        table = [[p.pid, p.tid, p.kind or "", "yes" if p.pin else "no", format_duration(p.started_s),
                  format_duration(p.seconds), p.outcome, p.bound or "", f"{p.pct:.0f}%" if p.pct is not None else "",
                  f"{p.eta_error * 100:+.0f}%" if p.eta_error is not None else ""] for p in r.phases]
        lines += ["", tabulate(table, headers=["pid", "tid", "kind", "pin", "at", "took", "outcome", "bound", "done",
                                               "ETA at 20% vs end"])]
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
    safe = md_cell if md else one_line  # a bundle's result is foreign text: no cell, heading or beacon of its own
    rows = [[safe(p.get("pid")), safe(p.get("kind") or ""), format_duration(p.get("started_s")),
             format_duration(p.get("seconds")), safe(p.get("outcome")), safe(p.get("bound") or ""),
             f"{p['pct']:.0f}%" if p.get("pct") is not None else "",
             f"{p['rate_pages_s']:,.0f}" if p.get("rate_pages_s") else "",
             f"{100 * p['eta_error']:+.0f}%" if p.get("eta_error") is not None else "",
             safe(p.get("catalog") or "")] for p in r.get("phases") or []]
    out = (tabulate(rows, headers=["pid", "kind", "at", "took", "outcome", "bound", "done", "pages/s",
                                   "ETA at 20% vs end", "catalog"], tablefmt=fmt) + "\n") if rows else "No pin phase.\n"
    for p in r.get("phases") or []:
        if p.get("bound_reason"):
            out += f"\npid {safe(p['pid'])} {safe(p.get('bound'))}: {safe(p['bound_reason'])}\n"
    if r.get("remedy"):
        out += f"\nremedy: {safe(r['remedy'])}\n"
    for note in (r.get("notes") or []) + [n for p in r.get("phases") or [] for n in p.get("shared_counters", [])]:
        out += f"\nnote: {safe(note)}\n"
    return out
