"""Every pin phase of a watch, each with its own tracker (pure: samples in, results out)."""
from __future__ import annotations

from typing import Any

from .phases import Phase, PhaseDetector, alive
from .result import BEFORE_ATTACH, PhaseResult
from .tracker import Tracker, judged

__all__ = ["PhaseBook"]


class PhaseBook:
    def __init__(self, size_bytes: int | None = None, page: int = 4096, window_s: float = 2.0, nvidia: bool = True,
                 interval_s: float = 0.5):
        self.size_bytes = size_bytes
        self.page = page
        self.window_s = window_s
        self.interval_s = interval_s
        self.detector = PhaseDetector(nvidia=nvidia)
        self.open: dict[tuple[int, int], tuple[Phase, Tracker]] = {}
        self.closed: list[tuple[Phase, Tracker]] = []
        self.prev: dict | None = None
        self.first_t: float | None = None  # the watch's first sample: a phase begun at it was going on at the attach
        # each phase's last few (t, progress): a phase ends at the first sample seen outside, and
        # what follows may already be its undo (cudaFreeHost, unregister) taking the pages back
        self.history: dict[tuple[int, int], list[tuple[float, dict]]] = {}

    def update(self, sample: dict) -> tuple[list[Phase], list[Phase]]:
        if self.first_t is None:
            self.first_t = sample["t"]
        procs = sample.get("procs") or {}
        if not all(alive(p) for p in procs.values()):  # a zombie's figures are no progress (VmSwap reads 0)
            sample = dict(sample, procs={pid: p for pid, p in procs.items() if alive(p)},
                          listed=[str(pid) for pid in procs])  # a zombie was seen: it did not vanish
        started, ended = self.detector.update(sample)
        # the ended first: a thread that goes from one pin to the next (a prefault, then mlock) ends
        # one phase and starts another in the same sample, under the same key
        for ph in ended:
            entry = self.open.pop((ph.pid, ph.tid), None)
            if entry is not None:
                if sample["t"] <= ph.ended_t + 1e-9:
                    entry[1].update(sample, in_call=False)
                entry[1].end({"t": ph.ended_t})
                if ph.end_reason == "returned":
                    entry[1].drop_from(ph.ended_t)
                hist = self.history.pop((ph.pid, ph.tid), [])
                ph.at_return = next((p for t, p in reversed(hist) if t <= ph.ended_t + 1e-9), None)
                self.closed.append(entry)
        for ph in started:
            size = self.size_bytes or ph.size_hint
            tr = Tracker(size_bytes=size, page=self.page, pids={ph.pid}, tids={ph.tid}, window_s=self.window_s)
            seen = ph.seen_start and self.prev is not None
            # an allocation seen from the thread's times began by the sample before (its phase starts
            # there): seen at the attach, its time and figures count from the attach, not a sample later
            before = self.prev is not None and ph.started_t <= self.prev["t"] + 1e-9
            tr.begin(self.prev if seen or before else sample, seen_start=seen)
            self.open[(ph.pid, ph.tid)] = (ph, tr)
        for ph, tr in self.open.values():
            if tr.expected is None and ph.size_hint:  # mlock's length, read after the phase was first seen
                tr.expected = ph.size_hint // self.page
            if tr.samples[-1] is not sample:  # a phase first seen in this sample began on it
                tr.update(sample, in_call=True)
            hist = self.history.setdefault((ph.pid, ph.tid), [])
            hist.append((sample["t"], dict(tr.progress)))
            del hist[:-8]
        self.prev = sample
        return started, ended

    def active_tids(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for pid, tid in self.open:
            out.setdefault(pid, set()).add(tid)
        return out

    def pinning(self) -> dict[int, Phase]:
        """Each process with a pin phase open now: its earliest open phase (LoadBook.update's `pinning`)."""
        out: dict[int, Phase] = {}
        for (pid, _), (ph, _) in self.open.items():
            if pid not in out or ph.started_t < out[pid].started_t:
                out[pid] = ph
        return out

    def progress(self) -> dict[str, Any] | None:
        """The progress of the longest open phase, for the progress line and the timeline."""
        if not self.open:
            return None
        ph, tr = min(self.open.values(), key=lambda e: e[0].started_t)
        return dict(tr.progress, phase="pin", pid=ph.pid, tid=ph.tid)

    def results(self) -> list[PhaseResult]:
        out = []
        for ph, tr in self.closed + list(self.open.values()):
            at_attach = self.first_t is None or ph.started_t <= self.first_t + 1e-9
            out.append(_result(ph, tr, self.size_bytes, self.page, self.interval_s, at_attach))
        return sorted(out, key=lambda r: r.started_s)


# a cudaHostAlloc allocates fresh pages: swap-in or a file read seen at its end is the copy's after it
_NOT_ITS_BOUND = {"hostalloc": ("swap-in", "file-read")}


def _result(ph: Phase, tr: Tracker, size_bytes: int | None, page: int, interval_s: float = 0.5,
            at_attach: bool = True) -> PhaseResult:
    s = tr.summary(not_bounds=_NOT_ITS_BOUND.get(ph.kind or "", ()))
    p = tr.progress
    at_return = ph.at_return
    if at_return is not None and ph.end_reason == "returned" and at_return.get("pinned_pages") is not None:
        # what the pin had done when it was first seen outside, not what an undo left after it
        p = at_return
        s = dict(s, pinned_pages=at_return["pinned_pages"], rate_pages_s=tr._phase_rate(at_return["pinned_pages"]))
    outcome = "open" if ph.ended_t is None else ("completed" if ph.end_reason == "returned" else "exited")
    inferred = outcome == "exited" and (p.get("pct") or 0) >= 99.5 and ph.end_reason in ("process gone",
                                                                                        "process vanished")
    if inferred:  # every page was in when the process went away: the pin had done its work
        outcome = "completed"
    elif ph.end_reason == "process vanished":  # gone between two samples, how it ended unseen
        outcome = "unknown"
    size = size_bytes or ph.size_hint
    r = PhaseResult(pid=ph.pid, tid=ph.tid, comm=ph.comm, kind=ph.kind, started_s=round(ph.started_t, 3),
                    seen_start=ph.seen_start, outcome=outcome, seconds=s["seconds"], size_bytes=size,
                    size_from="--size" if size_bytes else ("mlock length" if ph.size_hint else None),
                    pinned_pages=s["pinned_pages"], expected_pages=s["expected_pages"], pct=p.get("pct"),
                    rate_pages_s=p.get("rate_pages_s"), eta_s=p.get("eta_s") if outcome == "open" else None,
                    eta_basis=p.get("eta_basis"), progress_basis=s["progress_basis"], bound=s["bound"],
                    bound_reason=s["bound_reason"], bound_frame=s["bound_frame"], bound_counts=s["bound_counts"],
                    first_bound=s["first_bound"], first_bound_at_s=s["first_bound_at_s"], catalog=s["catalog"],
                    eta_at_20pct=s["eta_at_20pct"], eta_first=s["eta_first"], shared_counters=s["shared_counters"],
                    figures=s["figures"])
    if outcome == "completed" and not inferred:
        r.eta_error = judged(r.eta_at_20pct, r.seconds, r.bound)
        r.eta_first_error = judged(r.eta_first, r.seconds, r.bound)
    left = (p.get("swap_pages_left") or 0) * page
    basis = str((r.eta_first or {}).get("basis"))
    if outcome == "completed" and r.bound == "swap-in" and left >= (1 << 20) and "of the region" in basis:
        r.notes.append(f"{left / (1 << 20):,.0f} MiB of the process's memory stayed in swap after the pin: memory it "
                       "did not cover, which its ETA did not count (the region's swap, from smaps)")
    elif outcome == "completed" and r.bound == "swap-in" and left >= (1 << 20) and "still in swap" in basis:
        r.notes.append(f"{left / (1 << 20):,.0f} MiB of the process's memory stayed in swap after the pin: memory it "
                       "did not cover, which the VmSwap-based ETA counted (--size, or mlock's length, bounds it)")
    if outcome == "unknown":
        eta = p.get("eta_s")
        due = f", due to end {eta:.1f} s later" if eta is not None else ""
        pct = f" at {p['pct']:.0f}%" if p.get("pct") is not None else ""
        r.notes.append(f"exited; last seen in the pin{pct}{due}: outcome unknown (the process was gone by the next "
                       f"sample, {interval_s:g} s later, and nothing showed how it ended)")
    if outcome == "completed" and s["rate_pages_s"] is not None:
        r.rate_pages_s = s["rate_pages_s"]  # over the whole phase, not the last window (which ends in the return)
    if inferred:
        r.notes.append("the process exited right after its pages were all in: the return is inferred from 100% done")
    if not ph.seen_start:
        # an allocation seen from counters needs a whole interval in the kernel: one that began inside
        # an interval of other work is first seen a sample later, its start between two samples
        r.notes.append((f"{BEFORE_ATTACH}: its time counts from the attach" if at_attach else
                        f"its start fell between two samples after hostpin attached: its time counts from "
                        f"{ph.started_t:.1f} s")
                       + ("; progress counts all of the process's memory of that kind" if tr.basis in
                          ("resident", "shmem") else ""))
    if outcome == "completed" and size and r.pct is not None and r.pct < 90:
        r.notes.append(f"the call returned at {r.pct:.0f}% of {size // (1 << 20):,} MiB: the process may pin in "
                       "chunks, or --size is larger than this call")
    return r
