"""The result of `hostpin watch`, as typed data: a diag.resultbase.Result, written by write_result."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..resultbase import Result

__all__ = ["WatchResult", "PhaseResult", "OUTCOMES", "LOAD_KINDS", "BEFORE_ATTACH"]

# the note of a pin phase that was going on at the attach (one begun between two later samples has another)
BEFORE_ATTACH = "the pin had begun before hostpin attached"

# completed: the pin returned while watched; deadline: still pinning at --deadline; exited: the
# process (or the thread) ended inside the pin; no-pin: no pin phase was seen; gone: nothing to
# watch (no such process, a zombie, a kernel thread); interrupted: Ctrl-C or SIGTERM; command: the launcher form, CMD ended (its code is kept)
# unknown: the process vanished between two samples while inside a pin (how it ended unseen)
OUTCOMES = ("completed", "deadline", "exited", "no-pin", "gone", "interrupted", "command", "unknown")

# the kinds of phase that are not pins (diag.watch.load): the load around a pin
LOAD_KINDS = ("copy-from-swap", "file-read", "alloc")


@dataclass
class PhaseResult:
    pid: int
    tid: int
    comm: str | None
    kind: str | None                   # a pin: register, hostalloc, mlock, populate, or None; not a pin: LOAD_KINDS
    started_s: float                   # since watching began
    seen_start: bool                   # False: its start was not seen (already pinning when hostpin attached,
                                       # or an allocation first seen from counters between two samples)
    outcome: str                       # completed, open (still going), exited, unknown
    seconds: float | None = None       # as watched: from the start (or the attach) to the return
    size_bytes: int | None = None
    size_from: str | None = None       # '--size' or 'mlock length'
    pinned_pages: int | None = None
    expected_pages: int | None = None
    pct: float | None = None
    rate_pages_s: float | None = None
    eta_s: float | None = None
    eta_basis: str | None = None
    progress_basis: str | None = None
    bound: str | None = None
    bound_reason: str | None = None
    bound_frame: str | None = None
    bound_counts: dict[str, int] = field(default_factory=dict)
    first_bound: str | None = None
    first_bound_at_s: float | None = None  # since the phase was first seen
    catalog: int | None = None
    eta_at_20pct: dict | None = None
    eta_error: float | None = None     # the ETA given at 20% done against the real end, as a fraction
    eta_first: dict | None = None      # the first ETA given (also without a known total)
    eta_first_error: float | None = None
    shared_counters: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)   # what the process showed over the phase (Tracker.figures)
    notes: list[str] = field(default_factory=list)
    pin: bool = True                   # False: the load around a pin (a copy from swap, a file read, an allocation)
    words: str | None = None           # what a phase that is no pin is, in words
    time_budget: dict | None = None    # --trace: diag.trace.budget (causes, explained, events, dropped, io)

    def began_before_attach(self) -> bool:
        """A pin that was going on when hostpin attached (not one whose start fell between two samples)."""
        return not self.seen_start and any(n.startswith(BEFORE_ATTACH) for n in self.notes)


@dataclass
class WatchResult(Result):
    SCHEMA: ClassVar[str] = "hostpin.watch"
    SCHEMA_VERSION: ClassVar[int] = 1

    mode: str                          # 'pid' or 'command'
    pid: int | None
    outcome: str = "no-pin"
    verdict: str = ""
    exit_code: int = 0
    tool: str = "hostpin"
    command: str = "watch"
    argv: list[str] | None = None      # the launched command
    name: str | None = None            # the process's name (status), never its cmdline
    size_bytes: int | None = None
    interval_s: float = 0.5
    deadline_s: float | None = None
    until: str | None = None           # --pid: 'quiet' (the whole load) or 'pin' (the first pin's return)
    quiet_after_s: float | None = None
    ended_by: str | None = None        # --pid: what ended the watch: quiet, exited, pin, deadline, interrupted
    watched_s: float | None = None
    phases: list[PhaseResult] = field(default_factory=list)
    bound: str | None = None
    bound_reason: str | None = None
    catalog: int | None = None
    remedy: str | None = None
    command_exit: dict | None = None   # launcher: {"returncode", "signal"}
    stalls: list[dict] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    watcher: dict | None = None        # the watch's own cost: cpu_s, wall_s, cpu_pct_of_core, samples
    facts: dict | None = None
    trace: dict | None = None          # --trace: the tracer's summary (instances, events, dropped, buffers, xids)
    run_dir: str | None = None

    @property
    def main_phase(self) -> PhaseResult | None:
        """The phase the verdict speaks of: the longest."""
        return max(self.phases, key=lambda p: p.seconds or 0.0) if self.phases else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WatchResult":
        phase_names = {f.name for f in dataclasses.fields(PhaseResult)}
        phases = [PhaseResult(**{k: v for k, v in p.items() if k in phase_names})
                  for p in data.get("phases") or [] if isinstance(p, dict)]
        names = {f.name for f in dataclasses.fields(cls)} - {"phases"}
        kwargs = {k: data[k] for k in names if k in data}
        kwargs.setdefault("mode", data.get("mode") or "pid")
        kwargs.setdefault("pid", data.get("pid"))
        return cls(phases=phases, **kwargs)
