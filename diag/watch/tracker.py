"""One pin phase followed sample by sample: progress, rate, bound and ETA (pure: no I/O).

`Tracker.begin(sample)` marks where the phase starts (the sample before it, when hostpin saw
it start; the first sample, when it attached in the middle); `update(sample)` returns the
progress dict that goes into the timeline and the progress line; `summary()` is what the
result keeps. Progress is counted on one basis:

- ``pins``: pins outstanding, delta(nr_foll_pin_acquired - nr_foll_pin_released) since the
  start (system-wide: short-term pins of O_DIRECT and io_uring come and go and cancel out;
  another long-term pinner is noted). For a cudaHostRegister hostpin started itself.
- ``resident``: the process's VmRSS above a base (mlock: the RSS before the region was
  touched; a pin fault brings each page in).
- ``shmem``: the process's RssShmem above a base (cudaHostAlloc'd pages are the process's
  shared memory: +4,096 MiB for 4 GiB on the H200).
- ``swap``: the total less the pages still in the process's VmSwap.
- ``node-shmem``: the node's Shmem above its start (system-wide): for a driver allocation
  whose pages are counted as the node's shared memory before they are mapped into the process.
- ``auto`` (a process hostpin did not start): swap while the bound is swap-in, else shmem
  when it grows, else resident, else pins.
- ``read``: the process's read_bytes above its start (a load phase reading a file).
- ``vm:COUNTER``: any counter of the samples' "vm" (a recorded timeline's own progress).

An ETA comes from the phase it predicts, at that phase's rate: the pages still in swap at
the swap-in rate only while the phase itself is bound by swap-in (a pinned allocation before
a copy from swap must not be predicted from the copy's swap), else the pages left at the
phase's own progress rate. The pages in swap are the region's (diag.watch.regions: from the
smaps readings in the samples), not the whole VmSwap, which also holds memory the phase never
reads; a phase whose samples carry readings waits for its region up to regions.WAIT_S after
swap-in first bound it, and one without counts the whole VmSwap and says so. The swap-in rate
is the process's own swap reads (bounds.swapin_rate), not its VmSwap's fall, which readahead
slows at first; pages read ahead are not counted again. The ETA "at 20%"
is the first one given once 20% of the phase's own work is done: of the region's swap, else of
the pages that were left when the phase was first seen (a pin attached at 82% of --size is at
20% when a fifth of the other 18% is in).
"""
from __future__ import annotations

from typing import Any

from .bounds import catalog_for, classify, estimate_eta
from .regions import WAIT_S, RegionSwap

__all__ = ["Tracker", "progress_signature", "moved", "targets_sum", "judged"]


def targets_sum(sample: dict, key: str, pids=None) -> int:
    total = 0
    for pid, p in (sample.get("procs") or {}).items():
        if pids is None or str(pid) in pids or pid in pids:
            total += p.get(key) or 0
    return total


def judged(eta: dict | None, seconds: float | None, bound: str | None) -> float | None:
    """The error of an ETA against the real end, as a fraction, where the prediction can be
    judged: made inside the phase, before its end, for the work the phase was doing (its bound
    then is the phase's bound). An ETA made from another kind of work (a pinned allocation
    predicted from the swap a copy will read later) predicted something else: no error."""
    if not eta or not seconds or eta.get("at_s") is None or eta["at_s"] >= seconds:
        return None
    if eta.get("bound") is not None and eta["bound"] != bound:
        return None
    return round((eta["predicted_total_s"] - seconds) / seconds, 4)


def _pins(sample: dict) -> int:
    vm = sample.get("vm") or {}
    return vm.get("nr_foll_pin_acquired", 0) - vm.get("nr_foll_pin_released", 0)


def progress_signature(sample: dict, pids=None, pins: bool = False) -> tuple:
    """What must move for a pin to count as progressing: the targets' own memory and disk reads;
    with `pins`, also pins outstanding (system-wide: for a register, whose resident pages move
    nothing of the process's own). Faults alone are no progress: a pin that faults the same pages
    again and again (seen on the H200: a MAP_PRIVATE file behind a read throttle, 940k faults/s
    for 200 s with no page pinned, nothing read and RSS flat) is stuck, not working."""
    return (targets_sum(sample, "vm_swap", pids), targets_sum(sample, "vm_rss", pids),
            targets_sum(sample, "rss_shmem", pids), targets_sum(sample, "read_bytes", pids),
            _pins(sample) if pins else 0)


MOVE_BYTES = 4 << 20   # a figure must move this far (pins: this many bytes of pages) to count as progress
MOVE_PAGES = 1024


def moved(sig: tuple, ref: tuple | None) -> bool:
    """Whether a progress signature has moved since `ref` (the signature when progress was last
    seen) by more than jitter: RSS that swings by a huge page and back (the H200's stuck pin:
    ±2 MiB for 200 s) is no progress, and a slow pin's small steps add up until they count."""
    if ref is None or len(ref) != len(sig):
        return True
    *byte_figures, pins = sig
    *ref_bytes, ref_pins = ref
    return any(abs(a - b) >= MOVE_BYTES for a, b in zip(byte_figures, ref_bytes)) or abs(pins - ref_pins) >= MOVE_PAGES


class Tracker:
    def __init__(self, *, size_bytes: int | None = None, page: int = 4096, basis: str = "auto", pids=None,
                 tids=None, clean_pages_s: float | None = None, window_s: float = 2.0,
                 base_resident: int | None = None, whole_intervals: bool = False):
        self.page = page
        self.expected = size_bytes // page if size_bytes else None
        self.basis_wanted = basis
        self.pids = {str(p) for p in pids} if pids is not None else None
        self.tids = set(tids) if tids is not None else None
        self.clean_pages_s = clean_pages_s
        self.window_s = window_s
        self.base_resident = base_resident
        # figures from the sample before the phase through the one at its end: a load phase's work
        # lies between those (a pin's sample before may be long before, the one after its undo)
        self.whole_intervals = whole_intervals
        self.t0: float | None = None
        self.t_end: float | None = None
        self.seen_start = True
        self.samples: list[dict] = []
        self.done_hist: list[tuple[float, int | None]] = []
        self.last_frames: dict[int, list[str]] = {}
        self.bound_counts: dict[str, int] = {}
        self.bound_seen: dict[str, list[dict]] = {}  # the classifications that named each bound
        self.first_bound: dict | None = None
        self.first_bound_at: float | None = None
        self._counted: list[tuple[float, str, dict]] = []  # the last classifications counted: (t, bound, it)
        self.eta_at_20: dict | None = None
        self.eta_first: dict | None = None  # the first ETA given, with or without a known total
        self.shared: list[str] = []
        self.progress: dict[str, Any] = {}
        self.at_end: dict[str, Any] | None = None
        self.basis: str | None = None
        self._first: dict | None = None
        self._first_inside: dict | None = None
        self._last_sig = None
        self.last_progress_t: float | None = None
        self._bases: dict[str, int] = {}
        # the swap of the memory the phase reads (one process only: a tracker over a tree has none)
        self.region = RegionSwap(next(iter(self.pids)), self.tids) if self.pids and len(self.pids) == 1 else None
        self._swapin_since: float | None = None  # the first sample that swap-in bounded

    # -- the phase ---------------------------------------------------------------------------
    def begin(self, sample: dict, seen_start: bool = True) -> None:
        """`sample`: the last one before the phase (seen_start) or the first one in it."""
        self.t0 = sample["t"]
        self.seen_start = seen_start
        self.samples = [sample]
        self._first = sample
        self._first_inside = None if seen_start else sample
        self._remember_frames(sample)
        counted = seen_start or self.basis_wanted in ("pins",)
        self._bases = {
            "pins": _pins(sample),
            "resident": (self.base_resident if self.base_resident is not None
                         else targets_sum(sample, "vm_rss", self.pids) if counted else 0),
            "shmem": targets_sum(sample, "rss_shmem", self.pids) if counted else 0,
            "rss0": targets_sum(sample, "vm_rss", self.pids),
            "shm0": targets_sum(sample, "rss_shmem", self.pids),
            "swap0": targets_sum(sample, "vm_swap", self.pids),
            "read0": targets_sum(sample, "read_bytes", self.pids),
            "node_shm0": (sample.get("mem") or {}).get("Shmem") or 0,
        }
        if self.basis_wanted.startswith("vm:"):
            self._bases[self.basis_wanted] = (sample.get("vm") or {}).get(self.basis_wanted[3:], 0)
        self.done_hist = [(sample["t"], self._done(sample, None)[0])]
        self.last_progress_t = sample["t"]
        self._last_sig = progress_signature(sample, self.pids, pins=self.basis_wanted in ("pins", "auto"))
        if self.region is not None:
            self.region.feed(sample)

    def end(self, sample: dict) -> None:
        self.t_end = sample["t"]

    def drop_from(self, t: float) -> None:
        """Take back the bounds counted from samples at or after `t`, where the phase returned:
        the sample that first saw the thread outside the pin was counted while the pin was still
        open (its end needs two such samples), and its stack is whatever came next (a copy's file
        read after a pinned allocation). Kept when nothing else would be left (so the first bound,
        counted before them, stays)."""
        late = [x for x in self._counted if x[0] >= t - 1e-9]
        if not late or len(late) >= sum(self.bound_counts.values()):
            return
        for _, bound, c in late:
            self.bound_counts[bound] -= 1
            if not self.bound_counts[bound]:
                del self.bound_counts[bound]
            kept = self.bound_seen.get(bound) or []
            for i, seen in enumerate(kept):
                if seen is c:
                    del kept[i]
                    break
        self._counted = [x for x in self._counted if x[0] < t - 1e-9]

    @property
    def elapsed(self) -> float | None:
        if self.t0 is None or not self.samples:
            return None
        return (self.t_end if self.t_end is not None else self.samples[-1]["t"]) - self.t0

    def _remember_frames(self, sample: dict) -> None:
        for pid, p in (sample.get("procs") or {}).items():
            if self.pids is not None and str(pid) not in self.pids:
                continue
            for tid, th in (p.get("threads") or {}).items():
                if th.get("frames"):
                    self.last_frames[int(tid)] = th["frames"]

    def _pick_basis(self, sample: dict, bound: str | None) -> str:
        if self.basis_wanted != "auto":
            return self.basis_wanted
        b = self._bases
        rss = targets_sum(sample, "vm_rss", self.pids) - b["rss0"]
        shm = targets_sum(sample, "rss_shmem", self.pids) - b["shm0"]
        # VmSwap can count the pin's work only when all of it can be the region's: a process with
        # more in swap than the pin covers holds swap the pin never reads (another buffer, the
        # launcher's own heap), and counting it as the pin's makes the progress 0% and the ETA late
        swap_fits = self.expected is None or b["swap0"] // self.page <= self.expected
        if self.basis in ("shmem", "node-shmem") or (self.basis == "swap" and swap_fits):
            return self.basis  # once the pin showed what it is, it stays so
        swap = targets_sum(sample, "vm_swap", self.pids)
        if bound == "swap-in" and 0 < swap < b["swap0"] and swap_fits:  # (shmem's swap is not in VmSwap)
            return "swap"
        if shm > 0 and shm >= rss // 2:
            return "shmem"
        node_shm = ((sample.get("mem") or {}).get("Shmem") or 0) - b["node_shm0"]
        if node_shm >= (64 << 20) and rss < node_shm // 4:
            return "node-shmem"  # the driver's pages counted as the node's Shmem before they are mapped
        if rss > 0:
            return "resident"
        if _pins(sample) - b["pins"] > 0:
            return "pins"
        return "resident"

    def _done_for(self, sample: dict, basis: str) -> int | None:
        page, b = self.page, self._bases
        if basis == "swap":
            swap = targets_sum(sample, "vm_swap", self.pids) // page
            if self.expected is None:
                return max(0, targets_sum(sample, "vm_rss", self.pids) - b["rss0"]) // page
            return self.expected - min(self.expected, swap)
        if basis == "pins":
            done = _pins(sample) - b["pins"]
        elif basis == "read":
            done = (targets_sum(sample, "read_bytes", self.pids) - b["read0"]) // page
        elif basis.startswith("vm:"):
            done = (sample.get("vm") or {}).get(basis[3:], 0) - b.get(basis, 0)
        elif basis == "shmem":
            done = (targets_sum(sample, "rss_shmem", self.pids) - b["shmem"]) // page
        elif basis == "node-shmem":
            done = (((sample.get("mem") or {}).get("Shmem") or 0) - b["node_shm0"]) // page
        else:
            done = (targets_sum(sample, "vm_rss", self.pids) - b["resident"]) // page
        done = max(0, done)
        return min(done, self.expected) if self.expected else done

    def _done(self, sample: dict, bound: str | None) -> tuple[int | None, str]:
        basis = self._pick_basis(sample, bound)
        if basis != self.basis and self.basis is not None and self.samples:
            # a new basis: count the window's history the same way, or the rate jumps
            self.done_hist = [(x["t"], self._done_for(x, basis)) for x in self.samples[:-1]]
        self.basis = basis
        return self._done_for(sample, basis), basis

    # -- each sample -------------------------------------------------------------------------
    def update(self, sample: dict, in_call: bool = True) -> dict[str, Any]:
        if self.t0 is None:
            self.begin(sample, seen_start=False)
        if self.pids is not None and not any(str(pid) in self.pids for pid in (sample.get("procs") or {})):
            return self.progress  # the process is gone: its last sample stands
        self.samples.append(sample)
        # VmSwap's highest in the phase: the sample before a phase seen to start may be older than
        # the region's swap-out (a launcher pages out, then pins, between two samples)
        self._bases["swap0"] = max(self._bases.get("swap0", 0), targets_sum(sample, "vm_swap", self.pids))
        if self._first_inside is None and (not self.seen_start or sample["t"] > self.t0):
            self._first_inside = sample
        if len(self.samples) > 400:  # the window is seconds long; the timeline file has everything
            del self.samples[:100]
        self._remember_frames(sample)
        t = sample["t"]
        window = [x for x in self.samples if x["t"] >= t - self.window_s - 1e-9]
        # rates and the ETA from samples inside the phase only: the sample before it (the base
        # of a phase seen to start) would count idle time as slowness
        inside = [x for x in window if not self.seen_start or x["t"] > self.t0]
        prev_bound = self.progress.get("bound")
        done, basis = self._done(sample, prev_bound)
        self.done_hist.append((t, done))
        if len(self.done_hist) > 400:
            del self.done_hist[:100]
        rate = self._rate(t)
        all_pinned = bool(basis == "pins" and self.expected and done is not None and done >= self.expected and in_call)
        c = classify(window, rate, self.last_frames, self.pids, self.tids, all_pinned, self.page)
        if self.basis_wanted == "auto" and self._pick_basis(sample, c["bound"]) != basis:
            done, basis = self._done(sample, c["bound"])  # the basis the bound calls for, from this sample on
            self.done_hist.append((t, done))
            rate = self._rate(t)
        vm_swap = targets_sum(sample, "vm_swap", self.pids)
        swap_left = vm_swap // self.page
        eta_left, swap_of, whole_why, waiting = swap_left, None, "no per-region swap in the samples", False
        if self.region is not None:
            self.region.feed(sample)
            region_left = self.region.left_bytes(vm_swap)
            if c["bound"] == "swap-in" and self._swapin_since is None:
                self._swapin_since = t  # smaps is read for a phase that swap-in bounds: from then on
            since = self._swapin_since if self._swapin_since is not None else t
            if region_left is not None:
                eta_left, swap_of = region_left // self.page, self.region.words()
            elif self.region.seen_readings and t - since < WAIT_S:
                waiting = True  # the region is known after two readings: an ETA from VmSwap would be late
            elif self.region.seen_readings:
                whole_why = f"the region's swap was not known {WAIT_S:g} s in"
        if len(inside) >= 2 and inside[-1]["t"] - inside[0]["t"] >= self.window_s / 2 - 1e-6 and not (
                waiting and c["bound"] == "swap-in"):
            # the pages still in swap predict this phase only while swap-in is what it waits on
            eta = estimate_eta(inside, done, self.expected, eta_left if c["bound"] == "swap-in" else None,
                               self.clean_pages_s, rate, self.pids, self.page, swap_of, whole_why,
                               self._read_ahead(sample))
        else:  # one interval says little: disk throttles and readahead come in bursts
            eta = {"eta_s": None, "eta_basis": "ETA waits for the region's swap (smaps)" if waiting else None,
                   "swapin_pages_s": None}
        elapsed = t - self.t0
        pct = (min(100.0, 100.0 * done / self.expected) if self.expected and done is not None else None)
        work = self._work_pct(sample, done, basis, eta_left if swap_of else None)
        prog = {"pinned_pages": done, "expected_pages": self.expected, "pct": pct, "basis": basis,
                "rate_pages_s": rate, "eta_s": eta["eta_s"], "eta_basis": eta["eta_basis"],
                "swapin_pages_s": eta["swapin_pages_s"], "swap_pages_left": swap_left, "bound": c["bound"],
                "reason": c["reason"], "elapsed_s": round(elapsed, 3)}
        if swap_of:
            prog["region_swap_pages_left"] = eta_left
        if in_call and c["bound"] != "unknown" and len(window) >= 2:
            self.bound_counts[c["bound"]] = self.bound_counts.get(c["bound"], 0) + 1
            kept = self.bound_seen.setdefault(c["bound"], [])
            kept.append(c)
            self._counted.append((t, c["bound"], c))
            del self._counted[:-8]
            if len(kept) > 200:  # a long phase: keep every other one, evenly over the phase
                del kept[::2]
            if self.first_bound is None:
                self.first_bound, self.first_bound_at = c, elapsed
            for note in c["shared"]:  # once per kind: the first time it was seen, with its figures
                if not any(n.split(" moves ")[0] == note.split(" moves ")[0] for n in self.shared):
                    self.shared.append(note)
        if in_call and self.eta_first is None and eta["eta_s"] is not None:
            self.eta_first = {"at_s": round(elapsed, 3), "eta_s": round(eta["eta_s"], 3), "pct": pct,
                              "predicted_total_s": round(elapsed + eta["eta_s"], 3), "basis": eta["eta_basis"],
                              "bound": c["bound"]}
        unfinished = eta_left > 0 if swap_of else (self.expected is not None and done < self.expected)
        if (in_call and self.eta_at_20 is None and work is not None and work >= 20.0 and unfinished
                and eta["eta_s"] is not None):
            self.eta_at_20 = {"at_s": round(elapsed, 3), "eta_s": round(eta["eta_s"], 3),
                              "pct": round(pct, 2) if pct is not None else None, "work_pct": round(work, 2),
                              "predicted_total_s": round(elapsed + eta["eta_s"], 3), "basis": eta["eta_basis"],
                              "bound": c["bound"]}
        sig = progress_signature(sample, self.pids, pins=self.basis_wanted in ("pins", "auto"))
        if moved(sig, self._last_sig):
            self._last_sig = sig
            self.last_progress_t = t
        self.progress = prog
        if self.t_end is not None and self.at_end is None:
            self.at_end = prog  # the first sample after the return: what the pin left (an undo may follow)
        return prog

    @property
    def waits_for_region(self) -> bool:
        """Its region is not known yet and it still waits for it (diag.watch.smaps reads the process
        sooner while it does; after WAIT_S of swap-in the ETA counts the whole VmSwap instead)."""
        if self.region is None or self.region.known or not self.samples:
            return False
        return self._swapin_since is None or self.samples[-1]["t"] - self._swapin_since < WAIT_S

    def _read_ahead(self, sample: dict) -> int:
        """Pages read from swap since the phase's first sample that VmSwap has not lost yet (read
        ahead into the swap cache), at most the node's SwapCached (read_bytes counts file reads too)."""
        first = self._first_inside or self._first
        if first is None or first is sample:
            return 0
        read = targets_sum(sample, "read_bytes", self.pids) - targets_sum(first, "read_bytes", self.pids)
        fell = targets_sum(first, "vm_swap", self.pids) - targets_sum(sample, "vm_swap", self.pids)
        cached = (sample.get("mem") or {}).get("SwapCached")
        if cached is None:
            return 0
        return max(0, min((read - max(0, fell)) // self.page, cached // self.page))

    def _work_pct(self, sample: dict, done: int | None, basis: str, region_left: int | None) -> float | None:
        """How much of the phase's own work is done, in percent: of the region's swap at its first
        reading (with the VmSwap lost before it), else of the pages left at the phase's first
        sample (a phase attached to in the middle, or one whose total was mostly resident)."""
        if region_left is not None and self.region is not None and self.region.total0:
            before = max(0, self._bases.get("swap0", 0) - self.region.first["vm_swap"])  # lost before the reading
            total = (self.region.total0 + before) // self.page
            return 100.0 * max(0, total - region_left) / total if total > 0 else None
        if not self.expected or done is None:
            return None
        done0 = self._done_for(self._first, basis) or 0
        if done0 >= self.expected:
            return None
        return 100.0 * max(0, done - done0) / (self.expected - done0)

    def _rate(self, t: float) -> float | None:
        pts = [(x, d) for x, d in self.done_hist if x >= t - self.window_s - 1e-9 and d is not None
               and (not self.seen_start or x > self.t0)]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        return round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 1)

    def stalled_for(self, t: float) -> float:
        return 0.0 if self.last_progress_t is None else t - self.last_progress_t

    # -- the end -----------------------------------------------------------------------------
    def summary(self, not_bounds: tuple[str, ...] = ()) -> dict[str, Any]:
        """`not_bounds`: bounds that cannot be this kind of phase's own (named only if nothing else was seen)."""
        counts = {b: n for b, n in self.bound_counts.items() if b not in not_bounds} or self.bound_counts
        bound = max(counts, key=counts.get) if counts else None
        seen = self.bound_seen.get(bound) if bound else None
        named = seen[len(seen) // 2] if seen else None  # the middle of the phase speaks for it
        stack = ((named or {}).get("evidence") or {}).get("stack") or {}
        return {"bound": bound, "bound_counts": dict(self.bound_counts),
                "bound_reason": named["reason"] if named else None,
                "bound_frame": stack.get("frame"),
                "first_bound": self.first_bound["bound"] if self.first_bound else None,
                "first_bound_reason": self.first_bound["reason"] if self.first_bound else None,
                "first_bound_at_s": round(self.first_bound_at, 3) if self.first_bound_at is not None else None,
                "catalog": catalog_for(bound, stack), "eta_at_20pct": self.eta_at_20, "eta_first": self.eta_first,
                "pinned_pages": (self.at_end or self.progress).get("pinned_pages"), "expected_pages": self.expected,
                "progress_basis": self.basis, "seen_start": self.seen_start,
                "seconds": round(self.elapsed, 3) if self.elapsed is not None else None,
                "rate_pages_s": self._phase_rate(),
                "shared_counters": list(self.shared), "figures": self.figures()}

    def _phase_rate(self, done_at_end: int | None = None) -> float | None:
        """Pages per second over the whole phase, on the basis it ended with (up to done_at_end
        pages done, where the caller knows what was done at the return)."""
        if not self.samples or not self.basis or not self.elapsed:
            return None
        first = self._first if self.basis in ("pins", "resident", "shmem") else (self._first_inside or self._first)
        a = self._done_for(first, self.basis)
        b = done_at_end if done_at_end is not None else self._done_for(self.samples[-1], self.basis)
        if a is None or b is None:
            return None
        span = self.elapsed if first is self._first else max(1e-6, (self.t_end or self.samples[-1]["t"]) - first["t"])
        return round((b - a) / span, 1)

    def figures(self) -> dict[str, Any]:
        """What the process itself showed over the whole phase, first sample to last."""
        if not self.samples:
            return {}
        # up to the return (a process may free everything right after), from the first sample
        # inside the phase (the one before it may be long before)
        if self.whole_intervals:
            last = next((x for x in reversed(self.samples) if self.t_end is None or x["t"] <= self.t_end + 1e-9),
                        self.samples[-1])
            first = self._first
        else:
            last = next((x for x in reversed(self.samples) if self.t_end is None or x["t"] < self.t_end - 1e-9),
                        self.samples[-1])
            first = self._first_inside or self._first
        end = self.t_end if self.t_end is not None else last["t"]
        dt = max(1e-6, end - first["t"]) if first is not last else max(1e-6, self.elapsed or 0.0)

        def d(key: str) -> int:
            return targets_sum(last, key, self.pids) - targets_sum(first, key, self.pids)

        swapped_in = max(0, -d("vm_swap"))
        vm0, vm1 = first.get("vm") or {}, last.get("vm") or {}
        sys_swapin = sum(vm1.get(k, 0) - vm0.get(k, 0) for k in ("pswpin", "zswpin"))
        region = self.region.summary() if self.region is not None else None
        where = {"region_swap_at_start_bytes": region["swap_at_first_bytes"],
                 "swap_outside_region_bytes": region["outside_bytes"], "region_from": region["from"]} if region else {}
        return {**where, "swap_at_start_bytes": targets_sum(first, "vm_swap", self.pids), "swapped_in_bytes": swapped_in,
                "swapin_pages_s": round(swapped_in / self.page / dt, 1), "system_swapin_pages": sys_swapin,
                "system_swapin_pages_s": round(sys_swapin / dt, 1), "read_bytes": d("read_bytes"),
                "resident_growth_bytes": d("vm_rss"), "shmem_growth_bytes": d("rss_shmem"),
                "shmem_at_start_bytes": targets_sum(first, "rss_shmem", self.pids),
                "faults": d("minflt") + d("majflt"), "major_faults": d("majflt"),
                "pins_outstanding_delta": _pins(last) - _pins(first), "seconds": round(dt, 3)}
