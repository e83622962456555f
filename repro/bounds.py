"""What a pin is waiting on, and when it will end: pure functions over watchdog samples.

A sample (one per interval) is a dict:

    {"t": seconds since the run started,
     "vm": {counter: value since the run started},        # /proc/vmstat deltas
     "procs": {pid: {"state": "D", "vm_swap": bytes, "vm_rss": bytes,
                     "threads": {tid: {"state": "D", "wchan": "...", "frames": [innermost, ...]}}}}}

The bound is named from the kernel stacks and the counters together: a stack alone can be
stale (it is a snapshot), counters alone are system-wide; each confirms the other.
"""
from __future__ import annotations

from typing import Any

__all__ = ["BOUNDS", "stack_bound", "classify", "estimate_eta", "progress_signals", "PAGE"]

PAGE = 4096
BOUNDS = ("swap-in", "fault-in/zeroing", "compaction", "migration", "lock wait", "cpu", "driver", "unknown")

# frames that say only "waiting": look further out for the reason
_GENERIC = {"schedule", "__schedule", "io_schedule", "folio_wait_bit_common", "__folio_lock_or_retry",
            "folio_wait_bit", "__folio_lock", "__folio_lock_killable", "schedule_timeout", "wait_on_page_bit_common",
            "__lock_page_or_retry", "asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault"}
_SWAP = {"do_swap_page", "swap_read_folio", "swap_readpage", "swapin_readahead", "swap_cluster_readahead",
         "swap_vma_readahead", "__read_swap_cache_async", "read_swap_cache_async", "swap_read_folio_bdev_sync",
         "swap_read_folio_bdev_async", "swapin_folio", "blk_throtl_bio"}
_COMPACT = {"try_to_compact_pages", "compact_zone", "compact_zone_order", "__alloc_pages_direct_compact",
            "isolate_migratepages", "isolate_migratepages_block", "compaction_alloc", "kcompactd"}
_MIGRATE = {"migrate_pages", "migrate_pages_batch", "migrate_longterm_unpinnable_folios",
            "migrate_longterm_unpinnable_pages", "check_and_migrate_movable_pages",
            "check_and_migrate_movable_folios", "migrate_folio", "move_to_new_folio", "migrate_pages_sync"}
_LOCK = {"rwsem_down_read_slowpath", "rwsem_down_write_slowpath", "down_read", "down_write",
         "down_read_killable", "down_write_killable", "__mutex_lock", "mutex_lock", "__mutex_lock_slowpath",
         "lock_mm_and_find_vma", "mmap_read_lock_killable", "schedule_preempt_disabled", "osq_lock"}
_FAULT = {"clear_page_erms", "clear_page_rep", "clear_page_orig", "clear_page", "clear_huge_page",
          "folio_zero_user", "clear_user_highpage", "clear_highpage", "do_anonymous_page",
          "do_huge_pmd_anonymous_page", "vma_alloc_folio", "alloc_anon_folio", "__alloc_pages",
          "alloc_pages_mpol", "do_pte_missing", "do_fault", "do_cow_fault", "do_read_fault", "shmem_fault",
          "shmem_get_folio_gfp", "filemap_fault", "__handle_mm_fault", "handle_mm_fault", "faultin_page",
          "os_alloc_mem", "nv_alloc_system_pages", "nv_alloc_pages"}
_PIN = {"__get_user_pages", "pin_user_pages", "pin_user_pages_fast", "__gup_longterm_locked",
        "populate_vma_page_range", "__mm_populate", "os_lock_user_pages", "follow_page_mask",
        "gup_fast_fallback", "try_grab_folio", "do_mlock", "__x64_sys_mlock", "mlock_fixup"}
_ORDER = (("swap-in", _SWAP), ("compaction", _COMPACT), ("migration", _MIGRATE), ("lock wait", _LOCK),
          ("fault-in/zeroing", _FAULT), ("cpu", _PIN))


def stack_bound(frames: list[str]) -> tuple[str | None, str | None]:
    """(bound, the frame that says so) from one stack, innermost first; generic waits are skipped."""
    for frame in frames:
        if frame in _GENERIC:
            continue
        for bound, names in _ORDER:
            if frame in names:
                return bound, frame
    return None, (frames[0] if frames else None)


def _busy_threads(sample: dict) -> list[dict]:
    out = []
    for proc in sample.get("procs", {}).values():
        for th in proc.get("threads", {}).values():
            frames = th.get("frames") or []
            if th.get("state") == "D" or any(f in _PIN or f in _SWAP for f in frames):
                out.append(th)
    return out


def progress_signals(sample: dict, counter: str) -> tuple:
    """What must move for the run to count as progressing."""
    vm = sample.get("vm", {})
    procs = sample.get("procs", {}).values()
    return (vm.get(counter, 0), vm.get("pswpin", 0), vm.get("pswpout", 0),
            sum(p.get("vm_swap") or 0 for p in procs), sum(p.get("vm_rss") or 0 for p in procs))


def classify(window: list[dict], counter: str, last_frames: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """Name the bound over a window of samples (oldest first). last_frames: the latest stack seen
    for each thread, for samples that carry none (stacks may be sampled less often)."""
    if len(window) < 2:
        return {"bound": "unknown", "reason": "not enough samples yet"}
    first, last = window[0], window[-1]
    dt = max(1e-6, last["t"] - first["t"])

    def delta(key: str) -> int:
        return last.get("vm", {}).get(key, 0) - first.get("vm", {}).get(key, 0)

    swapin_rate = delta("pswpin") / dt
    progress = delta(counter)
    swap_now = sum(p.get("vm_swap") or 0 for p in last.get("procs", {}).values())
    swap_then = sum(p.get("vm_swap") or 0 for p in first.get("procs", {}).values())
    stack_votes: dict[str, int] = {}
    detail = None
    for sample in window[-2:]:
        threads = _busy_threads(sample)
        for th in threads:
            frames = th.get("frames") or (last_frames or {}).get(th.get("tid"), [])
            bound, frame = stack_bound(frames)
            if bound:
                stack_votes[bound] = stack_votes.get(bound, 0) + 1
                detail = detail or f"{frame} in the stack"
            elif frame:
                detail = detail or f"waiting in {frame}"
    by_stack = max(stack_votes, key=stack_votes.get) if stack_votes else None
    counters = {"pswpin_per_s": round(swapin_rate, 1), "progress_pages": progress,
                "compact_stall": delta("compact_stall"), "pgmigrate_success": delta("pgmigrate_success"),
                "thp_fault_alloc": delta("thp_fault_alloc"), "pgfault_per_s": round(delta("pgfault") / dt, 1)}
    if by_stack == "swap-in" or (swapin_rate > 100 and swap_now < swap_then):
        return {"bound": "swap-in", "reason": f"swap-in {swapin_rate:,.0f} pages/s" +
                (f", {detail}" if detail else ""), "counters": counters}
    if by_stack == "compaction" or counters["compact_stall"] > 0:
        return {"bound": "compaction", "reason": f"{counters['compact_stall']} direct compaction stalls" +
                (f", {detail}" if detail else ""), "counters": counters}
    if by_stack == "migration" or (counters["pgmigrate_success"] > 0 and delta("nr_foll_pin_released") > 0):
        return {"bound": "migration", "reason": f"{counters['pgmigrate_success']} pages migrated" +
                (f", {detail}" if detail else ""), "counters": counters}
    if by_stack == "lock wait":
        return {"bound": "lock wait", "reason": detail, "counters": counters}
    if by_stack == "fault-in/zeroing" or (progress > 0 and (counters["thp_fault_alloc"] > 0
                                                              or counters["pgfault_per_s"] > 20000)):
        return {"bound": "fault-in/zeroing", "reason": detail or f"{counters['pgfault_per_s']:,.0f} faults/s",
                "counters": counters}
    if by_stack == "cpu" or progress > 0:
        return {"bound": "cpu", "reason": "walking resident pages" + (f", {detail}" if detail else ""),
                "counters": counters}
    return {"bound": "unknown", "reason": detail or "no stack or counter points anywhere", "counters": counters}


def estimate_eta(window: list[dict], counter: str, done_pages: int, expected_pages: int,
                 clean_pages_s: float | None = None) -> dict[str, Any]:
    """Seconds left. Pages still in swap come back at the swap-in rate; the resident rest pins at
    this node's clean rate (calibrated), which is far faster. Without swap: the remaining pages at
    the rate of the window."""
    if len(window) < 2:
        return {"eta_s": None, "rate_pages_s": None}
    first, last = window[0], window[-1]
    dt = max(1e-6, last["t"] - first["t"])
    rate = (last.get("vm", {}).get(counter, 0) - first.get("vm", {}).get(counter, 0)) / dt
    swapin_rate = (last.get("vm", {}).get("pswpin", 0) - first.get("vm", {}).get("pswpin", 0)) / dt
    swap_pages = sum(p.get("vm_swap") or 0 for p in last.get("procs", {}).values()) // PAGE
    remaining = max(0, expected_pages - done_pages)
    eta = None
    if swap_pages > 0 and swapin_rate > 0:
        swapped = min(swap_pages, remaining)
        resident = remaining - swapped
        eta = swapped / swapin_rate + (resident / clean_pages_s if clean_pages_s else 0.0)
    elif rate > 0:
        eta = remaining / rate
    return {"eta_s": eta, "rate_pages_s": rate, "swapin_pages_s": swapin_rate, "swap_pages_left": swap_pages}
