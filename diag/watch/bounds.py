"""What a pin is waiting on, and when it will end: pure functions over samples.

A sample (diag.watch.sampler writes one per interval) is a dict:

    {"t": seconds since watching began,
     "vm": {counter: value - value at the start},          # /proc/vmstat, system-wide
     "mem": {"Cached": bytes, "Shmem": bytes, ...},          # /proc/meminfo, system-wide
     "procs": {pid: {"state": "D", "vm_rss": bytes, "vm_swap": bytes, "rss_anon": bytes,
                     "rss_file": bytes, "rss_shmem": bytes, "read_bytes": bytes (/proc/PID/io),
                     "minflt": n, "majflt": n (all threads),
                     "threads": {tid: {"state": "D", "wchan": "...", "frames": [innermost, ...],
                                       "minflt": n, "majflt": n}}}}}

Per-process signals come first: the target's own VmSwap falling is its swap-in, its own
read_bytes rising is its disk reads, its threads' faults are its faults, its stack says where
it waits. System-wide counters (pswpin, zswpin, pgpgin, Cached, compact_stall, pins) are read
only as deltas, and the reason says when another process may be moving them. A stack that
names a cause decides first; "every page is pinned and the call has not returned" (the driver
mapping them) comes only after it; then counters; a stack that says only "walking pages" or
"in the driver" comes last. Samples from before these per-process fields
existed (recorded timelines) are read the same way: a missing field is no evidence.
"""
from __future__ import annotations

from typing import Any

from .. import catalog
from .frames import BOUNDS, in_pin_path, stack_bound

__all__ = ["BOUNDS", "catalog_for", "remedy_for", "signals", "stack_votes", "classify", "estimate_eta", "swapin_rate",
           "busy_threads"]

# more faults than this per page of progress is a fault loop, not a fault-in (one fault per
# page, or per huge page)
REFAULTS = 100

# stacks that say only "in the pin" or "in the driver": counters that name a cause outrank them
_WEAK = ("cpu", "driver")


def catalog_for(bound: str | None, evidence: dict | None = None) -> int | None:
    """The failure-catalog entry (diag.catalog, the one source) a bound shows, picked with its
    evidence: reclaim inside a memory cgroup is its container limit (12), on the node headroom (8).
    'driver' alone (every page pinned, the driver mapping them) is a normal phase of every
    registration: its entries (3, 7) are named by the error or by concurrent ranks, not by it."""
    if not bound or bound == "driver":
        return None
    ids = [e.id for e in catalog.for_bound(bound)]
    if bound == "reclaim":
        return 12 if "mem_cgroup" in str((evidence or {}).get("frame") or "") else 8
    return ids[0] if ids else None


def remedy_for(bound: str | None, entry: int | None = None) -> str | None:
    """What to do, from the catalog entry (or, for a bound no entry covers, what the bound means)."""
    if entry is not None:
        found = next((e for e in catalog.ENTRIES if e.id == entry), None)
        if found is not None:
            return found.remedy
    if not bound:
        return None
    chosen = catalog_for(bound)
    if chosen is not None:
        return remedy_for(bound, chosen)
    return catalog.bound_note(bound)


def _procs(sample: dict, pids=None) -> list[dict]:
    procs = sample.get("procs") or {}
    return [p for pid, p in procs.items() if pids is None or str(pid) in pids or pid in pids]


def _sum(sample: dict, key: str, pids=None) -> int | None:
    values = [p.get(key) for p in _procs(sample, pids)]
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def _delta(first: dict, last: dict, key: str, pids=None) -> int | None:
    a, b = _sum(first, key, pids), _sum(last, key, pids)
    return None if a is None or b is None else b - a


def _threads_faults(sample: dict, pids=None) -> tuple[int | None, int | None]:
    mins, majs = [], []
    for p in _procs(sample, pids):
        if p.get("minflt") is not None:
            mins.append(p["minflt"])
            majs.append(p.get("majflt") or 0)
    return (sum(mins), sum(majs)) if mins else (None, None)


def signals(window: list[dict], page: int = 4096, pids=None) -> dict[str, Any]:
    """Rates over a window of samples (oldest first): per process (the targets, or `pids`)
    and system-wide. A figure that the samples do not carry is None."""
    first, last = window[0], window[-1]
    dt = max(1e-6, last["t"] - first["t"])
    vm0, vm1 = first.get("vm", {}), last.get("vm", {})
    mem0, mem1 = first.get("mem") or {}, last.get("mem") or {}

    def sys(key: str) -> int:
        return vm1.get(key, 0) - vm0.get(key, 0)

    def rate(value: int | None, per: float = 1.0) -> float | None:
        return None if value is None else round(value / per / dt, 1)

    swap_d = _delta(first, last, "vm_swap", pids)
    min0, maj0 = _threads_faults(first, pids)
    min1, maj1 = _threads_faults(last, pids)
    cached = None if mem0.get("Cached") is None or mem1.get("Cached") is None else mem1["Cached"] - mem0["Cached"]
    shmem = None if mem0.get("Shmem") is None or mem1.get("Shmem") is None else mem1["Shmem"] - mem0["Shmem"]
    return {
        "dt_s": round(dt, 3),
        "proc_swapin_pages_s": None if swap_d is None else round(max(0, -swap_d) / page / dt, 1),
        "proc_swap_pages": None if _sum(last, "vm_swap", pids) is None else _sum(last, "vm_swap", pids) // page,
        "proc_read_bytes_s": rate(_delta(first, last, "read_bytes", pids)),
        "proc_resident_pages_s": rate(_delta(first, last, "vm_rss", pids), page),
        "proc_shmem_pages_s": rate(_delta(first, last, "rss_shmem", pids), page),
        "proc_minflt_s": None if min0 is None or min1 is None else round((min1 - min0) / dt, 1),
        "proc_majflt_s": None if maj0 is None or maj1 is None else round((maj1 - maj0) / dt, 1),
        "sys_swapin_pages_s": round((sys("pswpin") + sys("zswpin")) / dt, 1),
        "sys_zswpin_pages_s": round(sys("zswpin") / dt, 1),
        "sys_pgpgin_kib_s": round(sys("pgpgin") / dt, 1),
        "sys_cached_bytes_s": None if cached is None else round(cached / dt, 1),
        "sys_shmem_pages_s": None if shmem is None else round(shmem / page / dt, 1),
        "sys_pgfault_s": round(sys("pgfault") / dt, 1),
        "sys_pins_pages_s": round((sys("nr_foll_pin_acquired") - sys("nr_foll_pin_released")) / dt, 1),
        "compact_stall": sys("compact_stall"),
        "pgmigrate_success": sys("pgmigrate_success"),
        "pins_released": sys("nr_foll_pin_released"),
        "thp_fault_alloc": sys("thp_fault_alloc"),
        "allocstall": sum(vm1.get(k, 0) - vm0.get(k, 0) for k in vm1 if k.startswith("allocstall")),
        "pgscan_direct": sys("pgscan_direct"),
    }


def busy_threads(sample: dict, pids=None, tids=None) -> list[dict]:
    """The threads whose stacks speak for the pin: `tids` when given (the ones in a pin
    phase), else threads in D state or inside a pin."""
    out = []
    for p in _procs(sample, pids):
        for tid, th in (p.get("threads") or {}).items():
            if tids is not None:
                if int(tid) in tids:
                    out.append(th)
            elif th.get("state") == "D" or in_pin_path(th.get("frames") or []):
                out.append(th)
    return out


def stack_votes(window: list[dict], last_frames: dict[int, list[str]] | None = None, pids=None,
                tids=None) -> tuple[dict[str, int], dict[str, Any] | None]:
    """Votes per bound from the busy threads of the last two samples, and the evidence of the
    first vote (frame, thread). A sample whose thread carries no frames uses the latest stack
    seen for it (stacks are written only when they change)."""
    votes: dict[str, int] = {}
    evidence: dict[str, Any] | None = None
    waiting_in = None
    for sample in window[-2:]:
        for th in busy_threads(sample, pids, tids):
            tid = th.get("tid")
            frames = th.get("frames") or (last_frames or {}).get(int(tid) if tid is not None else -1) or []
            bound, frame = stack_bound(frames)
            if bound:
                votes[bound] = votes.get(bound, 0) + 1
                if evidence is None or evidence["bound"] != max(votes, key=votes.get):
                    evidence = {"bound": bound, "frame": frame, "tid": tid, "state": th.get("state"),
                                "wchan": th.get("wchan")}
            elif frame:
                waiting_in = waiting_in or frame
    if evidence is None and waiting_in:
        evidence = {"bound": None, "frame": waiting_in}
    return votes, evidence


def _fmt(value: float | None, unit: str) -> str:
    return "?" if value is None else f"{value:,.0f} {unit}"


def _shared(system: float | None, own: float | None, what: str) -> str | None:
    """A note when a system-wide rate is well above what the target itself shows."""
    if system is None or own is None or system <= 1.5 * own + 100:
        return None
    return f"{what} moves faster system-wide ({system:,.0f}/s) than for this process ({own:,.0f}/s): another process may be moving it"


def classify(window: list[dict], progress_pages_s: float | None = None, last_frames: dict | None = None,
             pids=None, tids=None, all_pinned: bool = False, page: int = 4096) -> dict[str, Any]:
    """Name the bound over a window of samples (oldest first), with the evidence behind it:
    {"bound", "reason", "evidence": {"stack": ..., "signals": ...}, "shared": [notes]}."""
    if len(window) < 2:
        return {"bound": "unknown", "reason": "not enough samples yet", "evidence": {}, "shared": []}
    sig = signals(window, page, pids)
    votes, stack = stack_votes(window, last_frames, pids, tids)
    by_stack = None
    if votes:
        top = max(votes.values())
        by_stack = next(b for b in BOUNDS if votes.get(b) == top)  # ties: the order of BOUNDS
        if stack and stack.get("bound") != by_stack:
            stack = dict(stack, bound=by_stack)
    progress = progress_pages_s if progress_pages_s is not None else sig["proc_resident_pages_s"]
    moving = (progress or 0) > 0
    own_swapin = sig["proc_swapin_pages_s"] or 0.0
    sys_swapin = sig["sys_swapin_pages_s"]
    read_bps = sig["proc_read_bytes_s"]
    shared: list[str] = []

    def said(frame_text: str | None = None) -> str:
        if stack and stack.get("frame") and stack.get("bound"):
            who = f" of thread {stack['tid']}" if stack.get("tid") is not None else ""
            return f"{stack['frame']} in the stack{who}"
        return frame_text or ""

    def figures(bound: str) -> list[str]:
        out = []
        if bound == "swap-in":
            if own_swapin > 0:
                out.append(f"its VmSwap falls {_fmt(own_swapin, 'pages/s')}")
            elif sig["proc_shmem_pages_s"]:  # shared memory's swap is the file's, not in VmSwap
                out.append(f"its RssShmem grows {_fmt(sig['proc_shmem_pages_s'], 'pages/s')} (shmem swap is not in "
                           "VmSwap)")
            if own_swapin <= 0 and read_bps:
                out.append(f"it reads {read_bps / (1 << 20):,.1f} MiB/s from disk (read_bytes)")
            out.append(f"pswpin+zswpin {_fmt(sys_swapin, 'pages/s')} system-wide"
                       + (f" (zswap {sig['sys_zswpin_pages_s']:,.0f})" if sig["sys_zswpin_pages_s"] else ""))
            own = None if sig["proc_swapin_pages_s"] is None else max(own_swapin, (read_bps or 0) / page,
                                                                     sig["proc_shmem_pages_s"] or 0)
            note = _shared(sys_swapin, own, "swap-in")
            if note:
                shared.append(note)
        elif bound == "file-read":
            if read_bps is not None:
                out.append(f"it reads {read_bps / (1 << 20):,.1f} MiB/s from disk (read_bytes)")
            out.append(f"pgpgin {sig['sys_pgpgin_kib_s'] / 1024:,.1f} MiB/s system-wide")
            if sig["sys_cached_bytes_s"] is not None:
                out.append(f"Cached {sig['sys_cached_bytes_s'] / (1 << 20):+,.1f} MiB/s")
            if read_bps is not None:
                note = _shared(sig["sys_pgpgin_kib_s"] * 1024 / page, read_bps / page, "pgpgin")
                if note:
                    shared.append(note)
        elif bound == "compaction":
            out.append(f"{sig['compact_stall']} direct compaction stalls system-wide")
        elif bound == "migration":
            out.append(f"{sig['pgmigrate_success']:,} pages migrated, {sig['pins_released']:,} pins released "
                       "system-wide")
        elif bound == "reclaim":
            out.append(f"{sig['allocstall']} allocation stalls, {sig['pgscan_direct']:,} pages scanned by direct "
                       "reclaim system-wide")
        elif bound == "fault-in/zeroing":
            if sig["proc_minflt_s"] is not None:
                out.append(f"its threads fault {sig['proc_minflt_s']:,.0f}/s")
            if sig["proc_shmem_pages_s"]:
                out.append(f"its RssShmem grows {sig['proc_shmem_pages_s']:,.0f} pages/s")
            elif sig["sys_shmem_pages_s"]:
                out.append(f"the node's Shmem grows {sig['sys_shmem_pages_s']:,.0f} pages/s (system-wide)")
            if sig["thp_fault_alloc"]:
                out.append(f"{sig['thp_fault_alloc']} huge-page faults system-wide")
        if moving and bound not in ("driver",):
            out.append(f"progress {progress:,.0f} pages/s")
        return out

    def result(bound: str, head: str) -> dict[str, Any]:
        parts = [p for p in [head] + figures(bound) if p]
        return {"bound": bound, "reason": "; ".join(parts), "evidence": {"stack": stack, "votes": votes, "signals": sig},
                "shared": shared}

    if by_stack and by_stack not in _WEAK:
        return result(by_stack, said())
    if all_pinned:
        return result("driver", "every page is pinned and the call has not returned: the driver is mapping them")
    if own_swapin > 100 or (sys_swapin > 100 and moving and sig["proc_swapin_pages_s"] is None):
        return result("swap-in", "swapped pages come back" + (f" ({said()})" if said() else ""))
    file_bps = None if read_bps is None else read_bps - own_swapin * page  # read_bytes counts swap-in too
    if (file_bps or 0) > (1 << 20) and moving:
        return result("file-read", "the pin reads its pages from disk")
    if read_bps is None and sig["sys_pgpgin_kib_s"] > 1024 and (sig["sys_cached_bytes_s"] or 0) > 0 and moving:
        return result("file-read", "disk reads and page cache growth while the pin moves (system-wide only)")
    if sig["compact_stall"] > 0:
        return result("compaction", "")
    if sig["allocstall"] > 0 and not moving:
        return result("reclaim", "allocations stall in direct reclaim while the pin does not move")
    if sig["pgmigrate_success"] > 0 and sig["pins_released"] > 0:
        return result("migration", "")
    shmem_rising = (sig["proc_shmem_pages_s"] or 0) > 0 or (sig["sys_shmem_pages_s"] or 0) > 0
    faults_s = sig["proc_minflt_s"] or 0
    if faults_s > 20000 and (progress or 0) * REFAULTS < faults_s and not shmem_rising:
        # seen on the H200: a read-only registration of a MAP_PRIVATE file with a cold page cache,
        # 840k-1.35M faults/s for minutes while nothing was read, allocated or pinned
        return result("fault-in/zeroing", "the same pages are faulted again and again: almost nothing is allocated, "
                                          "read or pinned for the faults taken (a fault loop, not progress)")
    if moving and ((sig["proc_minflt_s"] or 0) > 20000 or sig["thp_fault_alloc"] > 0 or sig["sys_pgfault_s"] > 20000
                   or shmem_rising):
        return result("fault-in/zeroing", "pages are allocated and zeroed as the pin goes")
    if by_stack:
        return result(by_stack, said())
    if moving:
        return result("cpu", "walking resident pages")
    frame = stack.get("frame") if stack else None
    return {"bound": "unknown", "reason": f"waiting in {frame}" if frame else "no stack or counter points anywhere",
            "evidence": {"stack": stack, "votes": votes, "signals": sig}, "shared": shared}


def swapin_rate(sig: dict[str, Any], page: int = 4096) -> tuple[float | None, str]:
    """The process's swap-in rate over a window, in pages/s, and where it comes from.

    Its own swap reads (read_bytes, which counts the reads it issues, readahead included) when it
    shows them, at most pswpin system-wide (read_bytes counts its file reads too). Not the fall of
    its VmSwap: a page read ahead waits in the swap cache and leaves VmSwap only when it is mapped,
    so VmSwap falls slower than the device reads at first and faster later (the H200's register of
    16 GiB with 3 GiB in swap at 48 MB/s: VmSwap fell 9,620 pages/s in the first second while the
    reads ran at the throttle's 11,720 throughout, SwapCached growing 43 -> 156 MiB, and 14,962 at
    the end). With zswap in play (no reads for its loads) or no read_bytes: VmSwap's fall."""
    fall = sig["proc_swapin_pages_s"]
    read = sig["proc_read_bytes_s"]
    pswpin = sig["sys_swapin_pages_s"] - sig["sys_zswpin_pages_s"]
    if read is not None and read > 0 and not sig["sys_zswpin_pages_s"] and pswpin > 0:
        return round(min(read / page, pswpin), 1), "its swap reads"
    if fall is not None:
        return fall, "its VmSwap's fall"
    return sig["sys_swapin_pages_s"], "pswpin system-wide"


def estimate_eta(window: list[dict], done_pages: int | None, expected_pages: int | None, swap_left_pages: int | None,
                 clean_pages_s: float | None = None, progress_rate: float | None = None,
                 pids=None, page: int = 4096, swap_of: str | None = None,
                 whole_why: str = "no per-region swap in the samples", ahead_pages: int = 0) -> dict[str, Any]:
    """Seconds left, and how that figure was made. Pages still in swap come back at the
    swap-in rate (swapin_rate); the rest pins at this node's clean rate when it was measured,
    else is not counted (it is far faster). Without swap: the pages left at the window's progress
    rate, which needs the total. `swap_of`: whose swap `swap_left_pages` is, in words (the
    region's, from smaps); None: the whole VmSwap, for the reason `whole_why`. `ahead_pages`: pages
    the process has read from swap since the phase began that VmSwap has not lost yet (read ahead,
    waiting in the swap cache): with a rate of swap reads, those need no read."""
    out: dict[str, Any] = {"eta_s": None, "eta_basis": None, "rate_pages_s": progress_rate,
                           "swapin_pages_s": None, "swap_pages_left": swap_left_pages}
    if len(window) < 2:
        return out
    sig = signals(window, page, pids)
    # shared memory's swap is not in VmSwap: its pages count below, as pages left at the pin's rate
    swapin, rate_from = swapin_rate(sig, page)
    out["swapin_pages_s"] = swapin
    if swap_of and swap_left_pages == 0:  # the region's swap is all back: what VmSwap still holds is not its
        out["eta_s"] = 0.0
        out["eta_basis"] = f"0 pages of the region still in swap ({swap_of})"
        return out
    if swap_left_pages and swapin and swapin > 0:
        left = swap_left_pages if expected_pages is None or done_pages is None else \
            min(swap_left_pages, max(0, expected_pages - done_pages))
        rest = 0 if expected_pages is None or done_pages is None else max(0, expected_pages - done_pages - left)
        ahead = min(left, ahead_pages) if rate_from == "its swap reads" else 0
        out["eta_s"] = (left - ahead) / swapin + (rest / clean_pages_s if clean_pages_s else 0.0)
        where = f"of the region still in swap ({swap_of})" if swap_of else \
            f"still in swap (the whole VmSwap: {whole_why})"
        read = f", {ahead:,} of them read ahead" if ahead else ""
        out["eta_basis"] = f"{left:,} pages {where}{read} at {swapin:,.0f} pages/s ({rate_from})"
        return out
    if expected_pages is None or done_pages is None:
        out["eta_basis"] = "ETA needs --size"
        return out
    if progress_rate and progress_rate > 0:
        out["eta_s"] = max(0, expected_pages - done_pages) / progress_rate
        out["eta_basis"] = f"{max(0, expected_pages - done_pages):,} pages left at {progress_rate:,.0f} pages/s"
    return out
