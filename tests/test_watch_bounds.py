"""The bound classifier, the tracker and the phase detector of diag.watch, replayed on recorded
timelines (real runs on the H200 and the CI machine) and on constructed ones (each says so,
with where its frames and counters come from)."""
from __future__ import annotations

import json

import pytest

from diag.process import parse_stack
from diag.watch.bounds import classify, estimate_eta
from diag.watch.book import PhaseBook
from diag.watch.frames import in_pin_path, is_nvidia, normalize, pin_kind, stack_bound
from diag.watch.phases import PhaseDetector
from diag.watch.tracker import Tracker

from conftest import FIXTURES, REFERENCE

GiB = 1 << 30

# -- frames -------------------------------------------------------------------------------------


@pytest.mark.parametrize("frames, bound", [
    # the H200 reference capture: the driver's pin waiting on a swapped page
    (["__folio_lock_or_retry", "do_swap_page", "__handle_mm_fault", "handle_mm_fault", "__get_user_pages",
      "__gup_longterm_locked", "pin_user_pages", "os_lock_user_pages [nvidia]"], "swap-in"),
    # CI machine, 6.18, mlock of a private file mapping whose page cache was dropped (recorded below)
    (["folio_wait_bit_common", "filemap_fault", "__do_fault", "do_fault", "__handle_mm_fault", "handle_mm_fault",
      "__get_user_pages", "populate_vma_page_range", "__mm_populate", "do_mlock"], "file-read"),
    (["page_cache_ra_unbounded", "filemap_fault", "__do_fault"], "file-read"),
    # zswap: the page comes from the compressed pool, not the disk (mm/zswap.c, mm/page_io.c)
    (["zswap_decompress", "zswap_load", "swap_read_folio", "do_swap_page", "__handle_mm_fault"], "swap-in"),
    # shmem (a /dev/shm or memfd table) coming back from swap: no do_swap_page (mm/shmem.c)
    (["folio_wait_bit_common", "shmem_swapin_folio", "shmem_get_folio_gfp", "shmem_fault", "__do_fault",
      "do_fault", "__handle_mm_fault", "handle_mm_fault", "__get_user_pages"], "swap-in"),
    # memcg and direct reclaim (mm/vmscan.c), formerly read as fault-in
    (["shrink_folio_list", "shrink_inactive_list", "shrink_lruvec", "shrink_node", "do_try_to_free_pages",
      "try_to_free_mem_cgroup_pages", "try_charge_memcg", "__mem_cgroup_charge", "do_anonymous_page",
      "__handle_mm_fault", "handle_mm_fault", "__get_user_pages"], "reclaim"),
    (["shrink_lruvec", "shrink_node", "do_try_to_free_pages", "try_to_free_pages",
      "__alloc_pages_direct_reclaim", "__alloc_pages_slowpath.constprop.0", "__alloc_pages_noprof"], "reclaim"),
    # 6.10+ allocation profiling names
    (["clear_page_erms", "folio_zero_user", "vma_alloc_anon_folio_pmd", "do_huge_pmd_anonymous_page"],
     "fault-in/zeroing"),
    (["get_page_from_freelist", "__alloc_pages_noprof", "alloc_pages_mpol_noprof", "vma_alloc_folio_noprof",
      "do_anonymous_page"], "fault-in/zeroing"),
    # 6.12's name for the long-term pin's migration (mm/gup.c)
    (["migrate_pages", "migrate_longterm_unpinnable_folios", "check_and_migrate_movable_pages_or_folios",
      "__gup_longterm_locked", "pin_user_pages"], "migration"),
    # compaction migrates pages too: its innermost frames are migration's
    (["migrate_folio", "move_to_new_folio", "migrate_pages_batch", "migrate_pages", "compact_zone",
      "compact_zone_order", "try_to_compact_pages", "__alloc_pages_direct_compact"], "compaction"),
    # IOMMU mapping under the driver (drivers/iommu/dma-iommu.c; nv-dma.c)
    (["__iommu_map", "iommu_map_sg", "iommu_dma_map_sg", "__dma_map_sg_attrs", "dma_map_sg_attrs",
      "nv_map_dma_map_scatterlist [nvidia]", "nv_dma_map_pages [nvidia]"], "iommu"),
    (["viommu_sync_req", "viommu_map_pages", "__iommu_map", "iommu_map_sg", "iommu_dma_map_sg"], "iommu"),
    # the driver's RM lock: os_acquire_rwlock_write is down_write (kernel-open/nvidia/os-interface.c)
    (["rwsem_down_write_slowpath", "down_write", "os_acquire_rwlock_write [nvidia]",
      "portSyncRwLockAcquireWrite [nvidia]", "rmapiLockAcquire [nvidia]"], "driver-lock"),
    (["__down_common", "__down", "down", "os_acquire_semaphore"], "driver-lock"),  # no module tag: by name
    # the H200 2-rank run: innermost is the driver's own lock call
    (["os_acquire_mutex", "portSyncSemaphoreAcquire", "_rmGpuLocksAcquire.isra.0", "rmGpuGroupLockAcquire"],
     "driver-lock"),
    # a kernel lock with no driver above it stays a lock wait (the mmap_lock convoy)
    (["rwsem_down_read_slowpath", "down_read", "lock_mm_and_find_vma", "do_user_addr_fault"], "lock wait"),
    # the driver mapping pages after the pin (H200, swap32 run)
    (["nvGpuOpsGetExternalAllocPtesOrPhysAddrs", "nvUvmInterfaceGetExternalAllocPtes",
      "map_rm_pt_range.constprop.0", "uvm_map_external_allocation_on_gpu"], "driver"),
    (["__get_user_pages", "pin_user_pages"], "cpu"),
    # the long-term pin's migration sampled in its copy or in the target's allocation (mm/migrate.c)
    (["copy_page", "folio_copy", "__migrate_folio", "migrate_folio", "move_to_new_folio", "migrate_pages_batch",
      "migrate_pages", "migrate_longterm_unpinnable_folios", "check_and_migrate_movable_pages_or_folios",
      "__gup_longterm_locked", "pin_user_pages"], "migration"),
    (["get_page_from_freelist", "__alloc_pages_noprof", "alloc_migration_target", "migrate_pages_batch",
      "migrate_pages", "migrate_longterm_unpinnable_folios", "__gup_longterm_locked"], "migration"),
    # ... and the same under compaction
    (["copy_page", "folio_copy", "migrate_folio", "move_to_new_folio", "migrate_pages_batch", "migrate_pages",
      "compact_zone", "try_to_compact_pages", "__alloc_pages_direct_compact"], "compaction"),
    (["get_page_from_freelist", "__alloc_pages_noprof", "compaction_alloc", "migrate_pages", "compact_zone"],
     "compaction"),
    # the mmap_lock taken by the driver's pin (os_lock_user_pages: mmap_read_lock, pin_user_pages) is the
    # mm's convoy, not the driver's lock
    (["rwsem_down_read_slowpath", "down_read", "os_lock_user_pages [nvidia]", "RmCreateOsDescriptor [nvidia]"],
     "lock wait"),
    (["rwsem_down_read_slowpath", "down_read_killable", "__get_user_pages_locked", "pin_user_pages_remote",
      "nv_foo [nvidia]"], "lock wait"),
    # IOMMU: its page tables allocated while mapping, its own mutex
    (["get_page_from_freelist", "__alloc_pages_noprof", "iommu_alloc_pages_node", "intel_iommu_map_pages",
      "__iommu_map", "iommu_map_sg", "iommu_dma_map_sg", "dma_map_sg_attrs", "nv_dma_map_pages [nvidia]"],
     "iommu"),
    (["__mutex_lock", "mutex_lock", "iommu_dma_map_sg", "dma_map_sg_attrs", "nv_dma_map_pages [nvidia]"], "iommu"),
    # a lock taken inside reclaim is reclaim's
    (["rwsem_down_read_slowpath", "down_read", "shrink_folio_list", "shrink_inactive_list", "shrink_lruvec",
      "try_to_free_pages"], "reclaim"),
])
def test_stack_names_the_bound(frames, bound):
    assert stack_bound(frames)[0] == bound


def test_frames_that_say_nothing():
    assert stack_bound(["anon_pipe_read", "vfs_read", "ksys_read"]) == (None, "anon_pipe_read")
    assert stack_bound([]) == (None, None)
    assert not is_nvidia("nvme_queue_rq") and is_nvidia("nv_dma_map_pages") and is_nvidia("RmIoctl")
    assert is_nvidia("uvm_ioctl [nvidia_uvm]") and not is_nvidia("rmqueue_bulk")
    assert normalize("blk_attempt_bio_merge.part.0") == "blk_attempt_bio_merge"


def test_pin_path_and_kind():
    reference = parse_stack(next(s["k597"] for s in json.loads((REFERENCE / "swap-stall-timeline.json").read_text())
                                 if "k597" in s and "do_swap_page" in s["k597"]))
    assert in_pin_path(reference) and pin_kind(reference) == "register"
    assert pin_kind(["folio_wait_bit_common", "do_swap_page", "__get_user_pages", "populate_vma_page_range",
                     "__mm_populate", "__x64_sys_mlockall"]) == "mlock"
    # the CI machine's 6.18 kernel: mlockall inlined into __do_sys_mlockall
    assert pin_kind(["do_swap_page", "__get_user_pages", "populate_vma_page_range", "__mm_populate",
                     "__do_sys_mlockall", "do_syscall_64"]) == "mlock"
    assert pin_kind(["folio_zero_user", "__get_user_pages", "faultin_page_range", "madvise_do_behavior"]) == "populate"
    assert pin_kind(["clear_page_erms", "nv_alloc_system_pages [nvidia]", "nv_alloc_pages [nvidia]"]) == "hostalloc"
    assert not in_pin_path(["anon_pipe_read", "vfs_read"])
    # munlock walks mlock_fixup too: the undo of a pin is not a pin
    assert not in_pin_path(["mlock_folio_batch", "mlock_vma_pages_range", "mlock_fixup", "apply_vma_lock_flags",
                            "__x64_sys_munlock", "do_syscall_64"])


# -- constructed windows ------------------------------------------------------------------------

def constructed(frames=None, n=3, dt=0.5, vm=None, proc=None, state="D", mem=None):
    """n samples dt apart. vm/mem: {name: per-second rate} (system-wide); proc: {field: (start,
    per-second)} of pid 1; frames: thread 1's stack in every sample."""
    out = []
    for i in range(n):
        t = i * dt
        p = {k: int(v0 + rate * t) for k, (v0, rate) in (proc or {}).items()}
        p["threads"] = {1: {"tid": 1, "state": state, "frames": frames}}
        out.append({"t": t, "vm": {k: int(r * t) for k, r in (vm or {}).items()},
                    "mem": {k: int((1 << 30) + r * t) for k, r in (mem or {}).items()}, "procs": {1: p}})
    return out


def test_zswap_loads_are_swap_in_without_a_stack():
    """Constructed: zswap serves the pages (zswpin rises, pswpin does not); no root, no stack."""
    w = constructed(vm={"zswpin": 20000}, proc={"vm_swap": (8 * GiB, -20000 * 4096), "vm_rss": (GiB, 20000 * 4096)})
    c = classify(w)
    assert c["bound"] == "swap-in" and "zswap 20,000" in c["reason"]


def test_file_read_from_counters_when_there_is_no_stack():
    """Constructed from the CI measurement: read_bytes rises 16 MB/s, no swap-in, RSS grows."""
    w = constructed(proc={"read_bytes": (0, 16e6), "vm_rss": (GiB, 16e6), "vm_swap": (0, 0)},
                    vm={"pgpgin": 16e6 / 1024}, mem={"Cached": 16e6})
    c = classify(w)
    assert c["bound"] == "file-read" and "from disk" in c["reason"]


def test_stack_evidence_comes_before_all_pages_pinned():
    """Constructed: every page is pinned, the call has not returned, and the stack shows IOMMU
    mapping (or a lock wait): the stack decides; with a stack that says nothing, it is 'driver'."""
    iommu = ["iommu_dma_map_sg", "dma_map_sg_attrs", "nv_dma_map_pages [nvidia]"]
    assert classify(constructed(iommu), all_pinned=True)["bound"] == "iommu"
    lock = ["rwsem_down_write_slowpath", "down_write", "os_acquire_rwlock_write [nvidia]"]
    assert classify(constructed(lock), all_pinned=True)["bound"] == "driver-lock"
    assert classify(constructed(["ioctl_fn_that_names_nothing"]), all_pinned=True)["bound"] == "driver"


def test_another_process_moving_a_shared_counter_is_said():
    """Constructed: the system swaps in 9,000 pages/s, this process 1,000."""
    w = constructed(["do_swap_page", "__handle_mm_fault"], vm={"pswpin": 9000},
                    proc={"vm_swap": (GiB, -1000 * 4096), "vm_rss": (GiB, 1000 * 4096)})
    c = classify(w)
    assert c["bound"] == "swap-in" and any("another process" in n for n in c["shared"])


def test_pins_outstanding_ignore_short_term_pins():
    """Constructed: a neighbour's O_DIRECT reads take and drop 1M pins/s; this pin adds 1,000/s.
    Counting acquired alone would reach 100% of 1 GiB in 0.3 s."""
    w = constructed(["__get_user_pages", "pin_user_pages"], n=5,
                    vm={"nr_foll_pin_acquired": 1_001_000, "nr_foll_pin_released": 1_000_000})
    tr = Tracker(size_bytes=GiB, basis="pins", pids={1})
    tr.begin(w[0])
    for s in w[1:]:
        prog = tr.update(s)
    assert prog["pinned_pages"] == 2000 and prog["pct"] < 1.0


def test_hostalloc_progress_is_the_process_rss_shmem():
    """Constructed from the H200 measurement (+4,096 MiB RssShmem for 4 GiB): a neighbour takes
    MemAvailable down meanwhile; progress follows this process's RssShmem only."""
    w = constructed(["clear_page_erms", "nv_alloc_system_pages [nvidia]"], n=5,
                    proc={"rss_shmem": (0, 2 * GiB), "vm_rss": (100 << 20, 2 * GiB)},
                    mem={"MemAvailable": -8 * GiB})
    tr = Tracker(size_bytes=4 * GiB, pids={1})
    tr.begin(w[0])
    for s in w[1:]:
        prog = tr.update(s)
    assert prog["basis"] == "shmem" and prog["pct"] == pytest.approx(100.0 * 4 * GiB / (4 * GiB) / 1, rel=0.01)
    assert prog["bound"] == "fault-in/zeroing" and prog["eta_s"] is not None


# -- recorded timelines -------------------------------------------------------------------------

PIN_PID = "p597"       # the registering process in the H200 reference capture
PIN_START_S = 74.8     # the last sample before nr_foll_pin_acquired moved
PIN_END_S = 100.4      # the first sample with all 8,388,608 pages pinned


def _reference():
    out = []
    for s in json.loads((REFERENCE / "swap-stall-timeline.json").read_text()):
        procs = {}
        if PIN_PID in s:
            state, rss, swap, wchan = s[PIN_PID]
            frames = parse_stack(s["k597"]) if "k597" in s else None
            procs[597] = {"state": state.split()[1], "vm_rss": int(rss.split()[1]) * 1024,
                          "vm_swap": int(swap.split()[1]) * 1024,
                          "threads": {597: {"tid": 597, "state": state.split()[1], "wchan": wchan, "frames": frames}}}
        out.append({"t": s["t"], "vm": s["d"], "procs": procs})
    return out


@pytest.mark.parametrize("size", [32 * GiB, None], ids=["with-size", "without-size"])
def test_reference_swap_stall_replays(size):
    """The real 32 GiB swap-bound registration: swap-in named within 5 s and kept; the ETA at
    20% (with the size) or the first ETA (without: the pages still in VmSwap at the swap-in
    rate) within 25% of the real end."""
    samples = [s for s in _reference() if PIN_START_S - 1e-6 <= s["t"] <= PIN_END_S + 1e-6]
    tr = Tracker(size_bytes=size, basis="pins" if size else "auto", pids={597})
    tr.begin(samples[0])
    for s in samples[1:]:
        tr.update(s, in_call=s["t"] < PIN_END_S)  # the last sample has every page pinned: the call ends
    tr.end(samples[-1])
    summary = tr.summary()
    actual = PIN_END_S - PIN_START_S
    assert summary["bound"] == "swap-in" and set(summary["bound_counts"]) == {"swap-in"}
    assert summary["first_bound_at_s"] <= 5.0
    eta = summary["eta_at_20pct"] if size else summary["eta_first"]
    assert eta is not None and "still in swap" in eta["basis"]
    assert abs(eta["predicted_total_s"] - actual) / actual <= 0.25, eta


def _recorded(run):
    result = json.loads((run / "result.json").read_text())
    samples = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    return result, samples


def _replay_recorded(result, samples, method, seconds):
    """Feed a recorded pin phase through a tracker as repro's supervisor would now."""
    pin = [s for s in samples if s.get("phase") == "pin"]
    before = [s for s in samples if s["t"] < pin[0]["t"]]
    base = before[-1] if before else pin[0]
    cal = result.get("calibration") or {}
    clean = cal["bytes"] / 4096 / cal["seconds"] if cal.get("seconds") else None
    tr = Tracker(size_bytes=result["expected_pages"] * 4096, basis="vm:hostpin_progress_pages",
                 pids=set(pin[0]["procs"]), clean_pages_s=clean)
    tr.begin(base)
    for s in pin:
        tr.update(s, in_call=s["t"] <= base["t"] + seconds + 0.5)
    return tr.summary()


# every recorded pin timeline, with its bound then and now; the one change is explained
RECORDED = [
    ("h200-repro-swap32", "register", "swap-in", "swap-in"),
    ("ci-repro-swap-mlock", "mlock", "swap-in", "swap-in"),
    ("h200-repro-swap32-throttled", "register", "swap-in", "swap-in"),
    # was "driver" (every page pinned, the call not returned). The recorded stacks of both ranks
    # are os_acquire_mutex under rmGpuGroupLockAcquire and os_acquire_rwlock_write under
    # rmapiLockAcquire: the ranks queued on the driver's RM lock (catalog 7). Stack evidence now
    # comes before the all-pinned rule, so the bound is named for what the stacks show.
    ("h200-repro-ranks2", "register", "driver", "driver-lock"),
    ("h200-repro-matrix16/cases/register-thpon-pfoff", "register", "fault-in/zeroing", "fault-in/zeroing"),
    ("h200-repro-matrix16/cases/register-thpoff-pfoff", "register", "fault-in/zeroing", "fault-in/zeroing"),
    ("h200-repro-matrix16/cases/mlock-thpon-pfoff", "mlock", "fault-in/zeroing", "fault-in/zeroing"),
    ("h200-repro-matrix16/cases/mlock-thpoff-pfoff", "mlock", "fault-in/zeroing", "fault-in/zeroing"),
    ("h200-repro-matrix16/cases/hostalloc-thpna-pfoff", "hostalloc", "fault-in/zeroing", "fault-in/zeroing"),
    ("ci-repro-file-read", "mlock", "file-read", "file-read"),  # recorded with this change (--read-rate)
    # recorded with this change: a MAP_SHARED /dev/shm region, 192 MiB in swap: shmem_swapin_folio,
    # and the process's VmSwap does not show it (the swap belongs to the shmem file)
    ("ci-repro-shmem-swapin", "mlock", "swap-in", "swap-in"),
]


@pytest.mark.parametrize("name, method, then, now", RECORDED, ids=[r[0].split("/")[-1] for r in RECORDED])
def test_recorded_timelines_keep_their_bounds(name, method, then, now):
    run = FIXTURES / name
    if "/cases/" in name:
        top = json.loads((FIXTURES / name.split("/cases/")[0] / "result.json").read_text())
        row = next(r for r in top["rows"] if r["case"] == name.rsplit("/", 1)[1])
        result = {"expected_pages": top["size"] // 4096, "calibration": None, "bound": row["bound"],
                  "seconds": row["seconds"]}
        samples = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    else:
        result, samples = _recorded(run)
    assert result["bound"] == then
    seconds = result.get("seconds") or max(r.get("seconds") or 0 for r in result.get("ranks", [{}]))
    summary = _replay_recorded(result, samples, method, seconds)
    assert summary["bound"] == now, summary
    if now in ("swap-in", "file-read"):
        assert summary["first_bound_at_s"] <= 5.0


@pytest.mark.parametrize("name", ["h200-repro-swap32", "ci-repro-swap-mlock", "ci-repro-file-read",
                                  "ci-repro-shmem-swapin"])
def test_recorded_runs_eta_at_20_percent(name):
    result, samples = _recorded(FIXTURES / name)
    summary = _replay_recorded(result, samples, result["options"]["method"], result["seconds"])
    eta = summary["eta_at_20pct"]
    assert eta is not None
    assert abs(eta["predicted_total_s"] - result["seconds"]) / result["seconds"] <= 0.25, eta


def test_recorded_throttled_run_was_killed_with_evidence():
    run = FIXTURES / "h200-repro-swap32-throttled"
    result = json.loads((run / "result.json").read_text())
    assert result["outcome"] == "killed" and result["stopped"]["reason"] == "deadline"
    stacks = (run / result["kill"]["stacks"]).read_text()
    assert "do_swap_page" in stacks and "os_lock_user_pages" in stacks  # the driver's pin, in swap-in
    # the ETA at the kill agrees with the physics of the throttle: pages left / 16 MB/s
    progress = result["stopped"]["progress"]
    physics = progress["swap_pages_left"] * 4096 / 16e6
    assert abs(progress["eta_s"] - physics) / physics < 0.1


# -- phases -------------------------------------------------------------------------------------

def _thread(t, state, frames=None, syscall=None, length=None):
    th = {"tid": 7, "state": state, "frames": frames, "comm": "python"}
    if syscall:
        th["syscall"] = syscall
    if length:
        th["syscall_len"] = length
    return {"t": t, "vm": {}, "procs": {7: {"name": "python", "vm_rss": 0, "threads": {7: th}}}}


def test_phase_detector_follows_one_pin():
    """Constructed from the CI machine's live stacks: idle, an mlock (a running thread's stack is
    often cut short: it keeps the phase), back asleep twice = returned at the first."""
    det = PhaseDetector()
    idle = ["anon_pipe_read", "vfs_read", "ksys_read"]
    pin = ["folio_wait_bit_common", "do_swap_page", "__get_user_pages", "__mm_populate", "do_mlock"]
    seq = [_thread(0.0, "S", idle, "read"), _thread(0.5, "D", pin, "mlock", 256 << 20),
           _thread(1.0, "R", ["charge_memcg"], "running"), _thread(1.5, "D", pin, "mlock"),
           _thread(2.0, "S", idle, "read"), _thread(2.5, "S", idle, "read")]
    events = [det.update(s) for s in seq]
    assert [len(s) for s, _ in events] == [0, 1, 0, 0, 0, 0]
    assert [len(e) for _, e in events] == [0, 0, 0, 0, 0, 1]
    phase = events[-1][1][0]
    assert (phase.kind, phase.size_hint, phase.started_t, phase.ended_t, phase.end_reason, phase.seen_start) == \
        ("mlock", 256 << 20, 0.5, 2.0, "returned", True)


def test_phase_detector_splits_prefault_then_mlock():
    """A prefault (MADV_POPULATE_WRITE) straight into mlock, never seen outside: two phases."""
    det = PhaseDetector()
    pre = ["folio_zero_user", "__get_user_pages", "faultin_page_range", "madvise_do_behavior"]
    pin = ["do_swap_page", "__get_user_pages", "__mm_populate", "do_mlock"]
    det.update(_thread(0.0, "R", pre, "madvise"))
    started, ended = det.update(_thread(0.5, "D", pin, "mlock"))
    assert [p.kind for p in ended] == ["populate"] and [p.kind for p in started] == ["mlock"]


def test_phase_book_keeps_both_phases_of_prefault_then_mlock():
    """A thread that goes from MADV_POPULATE to mlock between two samples: the book closes the
    first phase's tracker and opens the second's (it used to close the new one at once)."""
    book = PhaseBook()
    pre = ["folio_zero_user", "__get_user_pages", "faultin_page_range", "madvise_do_behavior"]
    pin = ["do_swap_page", "__get_user_pages", "__mm_populate", "do_mlock"]
    book.update(_thread(0.0, "S", ["anon_pipe_read"], "read"))
    book.update(_thread(0.5, "R", pre, "madvise"))
    book.update(_thread(1.0, "D", pin, "mlock", 64 << 20))
    book.update(_thread(1.5, "D", pin, "mlock", 64 << 20))
    assert [ph.kind for ph, _ in book.closed] == ["populate"] and book.closed[0][0].end_reason == "returned"
    (ph, tr), = book.open.values()
    assert ph.kind == "mlock" and ph.ended_t is None and tr.samples[-1]["t"] == 1.5


def _pinning(t: float, swap: int, state: str = "D") -> dict:
    """A 256 MiB mlock whose VmSwap drains (the swap-in bound's progress)."""
    th = {"tid": 7, "state": state, "syscall": "mlock", "syscall_len": 256 << 20, "minflt": 0, "majflt": 0,
          "frames": ["folio_wait_bit_common", "do_swap_page", "__get_user_pages", "__mm_populate", "do_mlock"]}
    return {"t": t, "vm": {}, "mem": {}, "procs": {7: {"name": "python", "state": state, "vm_rss": (256 << 20) - swap,
                                                       "vm_swap": swap, "threads": {7: th}}}}


@pytest.mark.parametrize("how, outcome", [
    ({"state": "zombie", "threads": 1, "signal": 15}, "exited"),   # SIGTERM inside the pin
    ({"state": "exiting", "threads": 1, "signal": 9}, "exited"),   # SIGKILL pending, memory going
    (None, "unknown"),                                             # vanished between samples, nothing known
    ({"state": "zombie", "threads": 1, "exit": 0}, "completed"),   # exit() from user space: it had returned
])
def test_a_process_that_dies_inside_the_pin_exited(how, outcome):
    """Constructed: the pin at 50%, then the process dies. The sampler leaves a dying or zombie
    process out of a sample (its status has no VmSwap: 'all in'); a recorded zombie (state Z,
    VmSwap 0) is no progress either. Killed: exited at the last percent seen alive."""
    book = PhaseBook()
    before = _pinning(0.0, 192 << 20, state="S")
    before["procs"][7]["threads"][7].update(frames=["anon_pipe_read"], syscall="read")
    seq = [before]
    seq += [_pinning(0.5 * i, (192 << 20) - i * (16 << 20)) for i in range(1, 5)]  # 128 MiB in: 50%
    gone = {"t": 3.5, "vm": {}, "mem": {}, "procs": {}}
    if how is not None:
        gone["ended"] = {7: how}
    for s in seq + [gone, dict(gone, t=4.0)]:
        book.update(s)
    r, = book.results()
    assert r.outcome == outcome and r.pct == pytest.approx(50.0), (r.outcome, r.pct)
    assert ("outcome unknown" in " ".join(r.notes)) == (outcome == "unknown")
    assert outcome == "completed" or r.eta_error is None
    # a recorded timeline's zombie (before the sampler left them out): never read as 100%
    book = PhaseBook()
    zombie = _pinning(3.5, 0, state="Z")
    zombie["procs"][7].update(vm_rss=None, vm_swap=None)
    zombie["procs"][7]["threads"][7].update(state="Z", frames=[], syscall=None)
    for s in seq + [zombie, dict(gone, t=4.0)]:
        book.update(s)
    r, = book.results()
    assert r.outcome == "exited" and r.pct == pytest.approx(50.0), (r.outcome, r.pct)


def test_phase_book_without_a_size_uses_the_mlock_length():
    book = PhaseBook()
    pin = ["do_swap_page", "__get_user_pages", "__mm_populate", "do_mlock"]
    book.update(_thread(0.0, "S", ["anon_pipe_read"], "read"))
    book.update(_thread(0.5, "D", pin, "mlock", 64 << 20))
    (ph, tr), = book.open.values()
    assert tr.expected == (64 << 20) // 4096 and ph.size_hint == 64 << 20


def test_shmem_swap_in_is_not_in_vmswap():
    """The recorded shmem run: the bound comes from the stack and the process's RssShmem and
    disk reads, not from VmSwap (which stays ~0), and no 'another process' note is made."""
    result, samples = _recorded(FIXTURES / "ci-repro-shmem-swapin")
    summary = _replay_recorded(result, samples, "mlock", result["seconds"])
    assert summary["bound_frame"] == "shmem_swapin_folio" and "RssShmem grows" in summary["bound_reason"]
    assert summary["shared_counters"] == []
    assert max(p.get("vm_swap") or 0 for s in samples for p in s["procs"].values() if s["phase"] == "pin") < 1 << 20


@pytest.mark.parametrize("mapped_as_it_goes", [True, False], ids=["RssShmem", "node-Shmem"])
def test_a_driver_allocation_is_seen_without_a_stack(mapped_as_it_goes):
    """Constructed from the H200's 16 GiB cudaHostAlloc timeline (h200-repro-matrix16/cases/
    hostalloc-thpna-pfoff: the thread R with an empty stack and wchan 0 for 7.6 s while the
    node's Shmem grew 2 GiB/s), with the per-thread times this sampler now reads: all of the
    interval in the kernel, RssShmem growing (or, if the driver maps the pages into the process
    only at the end, the node's Shmem alone). Then back in user space: the phase ends."""
    det, book = PhaseDetector(), PhaseBook(size_bytes=16 * GiB)

    def sample(t, state, stime, utime, shmem, frames=None):
        th = {"tid": 9, "state": state, "frames": frames if frames is not None else [], "stime": stime,
              "utime": utime, "comm": "python"}
        own = shmem if mapped_as_it_goes or t >= 4.5 else 0
        return {"t": t, "vm": {}, "mem": {"Shmem": (1 << 30) + shmem},
                "procs": {9: {"name": "python", "rss_shmem": own, "vm_rss": own, "threads": {9: th}}}}

    seq = [sample(0.0, "S", 10, 50, 0, ["anon_pipe_read"])]
    seq += [sample(0.5 * i, "R", 10 + 50 * i, 50, i * (1 << 30)) for i in range(1, 9)]
    seq += [sample(4.5, "R", 410, 95, 8 << 30), sample(5.0, "R", 410, 140, 8 << 30)]  # user space again
    events = [det.update(s) for s in seq]
    for s in seq:
        book.update(s)
    assert [len(st) for st, _ in events].index(1) == 1 and events[1][0][0].kind == "hostalloc"
    ended = [e for _, e in events if e]
    assert ended and ended[0][0].end_reason == "returned" and ended[0][0].ended_t == 4.5
    (ph, tr), = book.closed
    assert tr.summary()["bound"] == "fault-in/zeroing"
    assert tr.summary()["progress_basis"] == ("shmem" if mapped_as_it_goes else "node-shmem")
    assert tr.summary()["pinned_pages"] == (8 << 30) // 4096


def test_a_pin_stuck_faulting_on_the_h200_is_seen_and_stalls():
    """Recorded on the H200 (bench/gpu_watch_attach.sh case B): cudaHostRegister of a 16 GiB MAP_PRIVATE
    file with its page cache dropped and reads throttled to 280 MB/s. The registering thread ran
    in the kernel for 200 s (R: no stack, no system call readable), faulting ~840k times a second,
    while nothing was read, RSS stayed flat and pins outstanding did not move. The watch of that
    process (h200-watch-file-throttled) saw no pin phase then; replayed now, the thread's kernel
    time and fault rate are a pin phase, and nothing that counts as progress moves: a stall."""
    result, samples = _recorded(FIXTURES / "h200-watch-file-throttled")
    assert result["outcome"] == "no-pin"  # what the watch said at the time
    pid = str(result["pid"])
    det = PhaseDetector()
    started = [ph for s in samples for ph in det.update(s)[0]]
    assert [(ph.pid, ph.tid) for ph in started][:1] == [(int(pid), int(pid))]
    book = PhaseBook(size_bytes=16 * GiB)
    for s in samples:
        book.update(s)
    (ph, tr), = list(book.open.values()) + book.closed
    assert ph.tid == int(pid) and tr.stalled_for(samples[-1]["t"]) >= 120.0
    c = classify(samples[200:205], None, None, {pid})
    assert c["bound"] == "fault-in/zeroing" and "faulted again and again" in c["reason"], c["reason"]


def test_the_stuck_registration_is_a_stall_for_repro_too():
    """The same pin under repro's supervisor (h200-repro-file-throttled, killed at its 200 s
    deadline): with faults no longer counted as progress, no progress for 120 s is a stall."""
    result, samples = _recorded(FIXTURES / "h200-repro-file-throttled")
    pin = [s for s in samples if s.get("phase") == "pin"]
    tr = Tracker(size_bytes=16 * GiB, basis="pins", pids=set(pin[0]["procs"]))
    tr.begin(pin[0], seen_start=True)
    for s in pin[1:]:
        tr.update(s)
    assert result["outcome"] == "killed" and tr.stalled_for(pin[-1]["t"]) >= 120.0


def test_a_pin_ends_where_its_undo_begins_h200_hostalloc():
    """Recorded on the H200 (bench/gpu_watch_attach.sh case C, 2026-12-01): `hostpin watch -- CMD` around
    a 47 GiB cudaHostAlloc that took 19.3 s by the target's own clock, then cudaFreeHost. The thread
    stayed in the kernel through the free, so the watch of the day ran the phase on to 24.0 s and
    said "pinned 47 GiB ... allocated and zeroed -1.5 GiB", done 0%. Replayed now: the free (its
    RssShmem falling GiB a second, pins outstanding dropping) is the undo, not the pin; the phase
    ends when the thread was first seen outside, with all 47 GiB done."""
    result, samples = _recorded(FIXTURES / "h200-watch-hostalloc-launcher")
    assert result["phases"][0]["seconds"] == 24.0 and result["phases"][0]["pct"] == 0.0  # what it said then
    book = PhaseBook(size_bytes=47 * GiB)
    for s in samples:
        book.update(s)
    (r,) = book.results()
    assert r.kind == "hostalloc" and r.outcome == "completed" and r.pct == 100.0
    assert 17.5 <= r.seconds <= 20.0, r.seconds  # the target's clock said 19.3 s
    assert r.figures["shmem_growth_bytes"] > 40 * GiB and r.rate_pages_s > 500_000
    assert r.eta_error is not None and abs(r.eta_error) <= 0.25


def test_a_registration_that_unregisters_and_exits_returned_h200_file():
    """Recorded on the H200 the same day (case B): `watch --pid` on repro's child registering a 16 GiB
    private file read at 280 MB/s; it unregistered (pins outstanding back to below where they began)
    and exited between two samples. The watch of the day said "exited inside the pin ... at
    -1,821,874 pages/s". Replayed: the pin returned when the pins were let go, at ~68k pages/s."""
    result, samples = _recorded(FIXTURES / "h200-watch-file-register")
    assert result["phases"][0]["outcome"] == "exited"  # what it said then
    book = PhaseBook()
    for s in samples:
        book.update(s)
    (r,) = book.results()
    assert r.outcome == "completed" and r.bound == "file-read" and 60.0 <= r.seconds <= 62.5
    assert 60_000 <= r.rate_pages_s <= 75_000, r.rate_pages_s  # 16 GiB in ~61.8 s is 67.9k pages/s


def test_a_neighbour_letting_go_of_fewer_pins_is_no_undo():
    """The undo needs pins outstanding back below half of what the phase added: a neighbour's
    unregister of a few pages while a pin runs with an unreadable stack does not end it."""
    det = PhaseDetector()

    def sample(t, pins, shmem):
        th = {"tid": 9, "state": "R", "frames": [], "stime": int(t * 100), "utime": 0, "comm": "python"}
        return {"t": t, "vm": {"nr_foll_pin_acquired": pins, "nr_foll_pin_released": 0}, "mem": {"Shmem": shmem},
                "procs": {9: {"name": "python", "rss_shmem": shmem, "vm_rss": shmem, "threads": {9: th}}}}

    seq = [sample(0.5 * i, 300_000 * i, i << 30) for i in range(0, 6)]          # allocating 2 GiB/s
    seq += [sample(3.0, 1_400_000, 6 << 30), sample(3.5, 1_500_000, 7 << 30)]   # a neighbour let 100k go
    ended = [e for s in seq for e in det.update(s)[1]]
    assert not ended and len(det.active) == 1


# -- issue 20's first hour ------------------------------------------------------------------------

def _shared_mlock(t: float, shmem: int, call=None, length=None) -> dict:
    """Constructed from the first-hour report: a 4 GiB mlock of MAP_SHARED|MAP_ANONYMOUS memory
    on the CI machine (no GPU), 9.9 s, RssShmem growing ~410 MiB/s; the thread runs in the kernel
    (R: no stack) and /proc/PID/syscall reads 'running' until a sample catches it stopped in mlock."""
    th = {"tid": 7, "state": "R", "frames": [], "stime": int(t * 100), "utime": 0, "minflt": 0, "majflt": 0,
          "comm": "python", "syscall": call or "running"}
    if length:
        th["syscall_len"] = length
    return {"t": t, "vm": {}, "mem": {"Shmem": shmem}, "procs": {7: {"name": "python", "state": "R", "vm_rss": shmem,
                                                                     "rss_shmem": shmem, "threads": {7: th}}}}


@pytest.mark.parametrize("nvidia", [False, True], ids=["no-driver", "driver-loaded"])
def test_a_guessed_kind_is_refined_not_split(nvidia):
    from diag.watch.render import phase_verdict
    seq = [_shared_mlock(0.0, 0)]
    seq[0]["procs"][7]["threads"][7].update(state="S", frames=["do_select"], syscall="read", stime=0)
    seq += [_shared_mlock(0.5 * i, i * (205 << 20)) for i in range(1, 10)]
    seq += [_shared_mlock(5.0 + 0.5 * i, (2050 << 20) + i * (205 << 20), call="mlock", length=4 << 30)
            for i in range(0, 10)]
    done = (4 << 30)
    out = dict(_shared_mlock(10.0, done), t=10.0)
    out["procs"][7]["threads"][7].update(state="S", frames=["do_select"], syscall="read", stime=1000, utime=0)
    book = PhaseBook(nvidia=nvidia)
    for s in seq + [out, dict(out, t=10.5)]:
        book.update(s)
    (r,) = book.results()  # one phase, not two of 5 s
    assert r.kind == "mlock" and r.outcome == "completed" and 9.0 <= r.seconds <= 10.5, (r.kind, r.seconds)
    assert "driver" not in phase_verdict(r), phase_verdict(r)
    # before the call was readable the kind was a guess; with no NVIDIA driver loaded, never the driver's
    det = PhaseDetector(nvidia=nvidia)
    first = [ph for s in seq[:3] for ph in det.update(s)[0]]
    assert [ph.kind for ph in first] == (["hostalloc"] if nvidia else [None]) and first[0].guessed


def test_a_pin_that_vanished_between_samples_says_outcome_unknown():
    """Issue 20: repro's child pinned, unpinned and exited (reaped) within one 0.5 s sample, last
    seen at 97% with its ETA 0.5 s away: not "exited inside the pin", exit 1, but unknown."""
    from diag.watch.render import phase_verdict
    book = PhaseBook()
    before = _pinning(0.0, 192 << 20, state="S")
    before["procs"][7]["threads"][7].update(frames=["anon_pipe_read"], syscall="read")
    seq = [before] + [_pinning(0.5 * i, max(0, (192 << 20) - i * (31 << 20))) for i in range(1, 7)]
    for s in seq + [{"t": 3.5, "vm": {}, "mem": {}, "procs": {}}]:
        book.update(s)
    (r,) = book.results()
    text = phase_verdict(r)
    assert r.outcome == "unknown" and r.pct > 90 and r.eta_error is None, (r.outcome, r.pct)
    assert "exited; last seen in the pin at 9" in text and "outcome unknown" in text and "due to end" in text, text
    assert "exited inside the pin" not in text


@pytest.mark.parametrize("width", [200, 100, 80, 60, 40, 24])
def test_the_progress_line_fits_the_terminal(width):
    import io
    from diag.watch.render import ProgressLine
    prog = {"phase": "copy-from-swap", "pct": 42.5, "rate_pages_s": 11653, "eta_s": 3723.0,
            "bound": "fault-in/zeroing", "elapsed_s": 1234.5}
    for phase in ("pin", "copy-from-swap"):
        stream = io.StringIO()
        ProgressLine(stream, enabled=True, width=width)(dict(prog, phase=phase))
        line = stream.getvalue().split("\033[K", 1)[1]
        assert 0 < len(line) < width, (width, line)
        if width >= 100:
            assert "ETA" in line and "bound fault-in/zeroing" in line and "42.5%" in line
        if width >= 60:
            assert "ETA" in line


def test_the_pid_heartbeat_uses_the_nodes_page_size(capsys):
    """A 64 KiB-page arm64 node: 16,384 pages are 1 GiB, not 64 MiB."""
    import diag.cli  # noqa: F401  (diag.watch.cli is registered into diag's group: that module comes first)
    from diag.watch.cli import _Heartbeat
    beat = _Heartbeat(0.5, 4711, page=65536)
    beat({"phase": "pin", "expected_pages": 16384, "pct": 10.0, "swap_pages_left": 100, "elapsed_s": 1.0,
          "bound": "swap-in"})
    err = capsys.readouterr().err
    assert "pinning 1 GiB" in err, err
    beat({"phase": "pin", "expected_pages": 16384, "pct": 11.0, "elapsed_s": 0.1})  # a new phase: its elapsed restarts
    time_ok = capsys.readouterr().err
    assert time_ok == ""  # within --heartbeat of the last line: none yet, whatever the phase's own clock says


def _carried(samples):
    """A recorded timeline as the live watch saw it: the writer keeps a thread's frames only when
    they changed (diag/watch/timeline.py), so a thread whose stack was read (its line has wchan)
    and has no frames had its last ones."""
    last, out = {}, []
    for s in samples:
        procs = {}
        for pid, p in (s.get("procs") or {}).items():
            threads = {}
            for tid, th in (p.get("threads") or {}).items():
                if "frames" in th:
                    last[(pid, tid)] = th["frames"]
                elif "wchan" in th and (pid, tid) in last:
                    th = dict(th, frames=last[(pid, tid)])
                threads[tid] = th
            procs[pid] = dict(p, threads=threads)
        out.append(dict(s, procs=procs))
    return out


def _replay_load(samples, size_bytes=None):
    """A recorded `watch --pid` timeline fed step by step through the pin book and the load book,
    as diag.watch.attach does."""
    from diag.watch.load import LoadBook
    book, load = PhaseBook(size_bytes), LoadBook()
    for s in _carried(samples):
        _, ended = book.update(s)
        for ph in ended:
            tr = next(tr for p, tr in book.closed if p is ph)
            load.pin_ended(ph.pid, ph.ended_t, tr.expected * tr.page if tr.expected else None, ph.kind)
        load.update(s, pinning=book.pinning())
    return sorted(book.results() + load.results(), key=lambda r: r.started_s)


def test_recorded_load_after_a_pin_replays_ci():
    """Recorded on the CI machine (tests/test_watch.py's load test, 2026-12-01): a process mlocked
    128 MiB, all of it in swap, then read 192 MiB of its own swapped memory at 16 MB/s (the
    target's clock: pinned in 8.50 s, read in 12.6 s). Replayed: the pin and the copy, each swap-in
    bound, with ETAs at 20% within 15% of their own phase's end; the copy is no pin (catalog 19)."""
    result, samples = _recorded(FIXTURES / "ci-watch-load-swap")
    assert [p["kind"] for p in result["phases"]] == ["mlock", "copy-from-swap"]  # what the watch said
    pin, copy = _replay_load(samples)
    assert (pin.kind, pin.pin, pin.bound, pin.catalog, pin.outcome) == ("mlock", True, "swap-in", 1, "completed")
    assert (copy.kind, copy.pin, copy.bound, copy.catalog, copy.outcome) == \
        ("copy-from-swap", False, "swap-in", 19, "completed")
    assert 7.5 <= pin.seconds <= 9.5 and 11.5 <= copy.seconds <= 14.0, (pin.seconds, copy.seconds)
    assert copy.words == "swap-in in the process's own faults, not a pin"
    for ph in (pin, copy):
        assert ph.eta_at_20pct is not None and abs(ph.eta_error) <= 0.15, (ph.kind, ph.eta_at_20pct, ph.seconds)
    # the pin's ETA is not made from the 192 MiB the copy reads later (the process's VmSwap held both)
    assert pin.eta_first["predicted_total_s"] < 1.2 * pin.seconds, pin.eta_first
    # ... and says that the process kept memory in swap that the pin did not cover
    assert any("stayed in swap after the pin" in n for n in pin.notes), pin.notes


def _loading(t: float, swap: int, read: int, rss: int, frames=None) -> dict:
    th = {"tid": 9, "state": "D" if frames else "S", "frames": frames or ["do_select"], "minflt": 0, "majflt": 0,
          "comm": "python", "syscall": "read" if not frames else None}
    return {"t": t, "vm": {}, "mem": {}, "procs": {9: {"name": "python", "state": th["state"], "vm_rss": rss,
                                                       "vm_swap": swap, "read_bytes": read, "threads": {9: th}}}}


def test_load_phases_follow_the_work_of_a_process():
    """Constructed (the counters a loader shows between its pins, no stack needed): 3 s of VmSwap
    falling 16 MiB/s, then 3 s of read_bytes rising 32 MiB/s beyond it, then quiet. Two phases,
    each ended where its work stopped; quiet samples end the last one; the copy's ETA is its own."""
    from diag.watch.load import LoadBook
    book = LoadBook()
    seq = [_loading(0.0, 96 << 20, 0, 1 << 30)]
    for i in range(1, 7):  # copy from swap: VmSwap 96 -> 0 MiB... (stopped at 48 MiB left)
        seq.append(_loading(0.5 * i, (96 << 20) - i * (8 << 20), i * (8 << 20), (1 << 30) + i * (8 << 20)))
    base = seq[-1]["procs"][9]
    for i in range(1, 7):  # file reads: read_bytes beyond swap-in
        seq.append(_loading(3.0 + 0.5 * i, base["vm_swap"], base["read_bytes"] + i * (16 << 20), base["vm_rss"]))
    last = seq[-1]["procs"][9]
    for i in range(1, 5):
        seq.append(_loading(6.0 + 0.5 * i, last["vm_swap"], last["read_bytes"], last["vm_rss"]))
    for s in seq:
        book.update(s)
    copy, read = book.results()
    assert (copy.kind, copy.bound, copy.catalog, copy.outcome, copy.pin) == ("copy-from-swap", "swap-in", 19,
                                                                             "completed", False)
    assert (read.kind, read.bound, read.catalog, read.outcome) == ("file-read", "file-read", 19, "completed")
    assert copy.seconds == pytest.approx(3.0, abs=0.51) and read.seconds == pytest.approx(3.0, abs=0.51)
    assert read.seen_start and copy.seen_start and not read.notes, read.notes
    assert copy.eta_first is not None and "still in swap" in copy.eta_first["basis"]
    assert copy.figures["swapped_in_bytes"] == 48 << 20 and read.figures["read_bytes"] >= 90 << 20
    assert not book.open


def test_a_copy_running_between_its_faults_ends_the_pin_replays_ci():
    """Recorded on the CI machine (the same load test, another run): after its mlock returned the
    copying thread was R with no stack and /proc/PID/syscall 'running' in 18 of its samples, and in
    D inside a user-space fault (do_swap_page under asm_exc_page_fault) in the others, never twice
    in a row. Those samples once kept the pin open through the whole copy (mlock 11.0 s, then a
    copy of 1.0 s); a user-space fault is outside the pin, and a sample that cannot tell neither
    ends nor resumes it."""
    result, samples = _recorded(FIXTURES / "ci-watch-load-swap-running")
    running = [s for s in samples if s["progress"].get("phase") == "copy-from-swap"
               and any(th.get("syscall") == "running" for p in s["procs"].values() for th in p["threads"].values())]
    assert len(running) >= 10
    pin, copy = _replay_load(samples)
    # the live watch said mlock 9.0 s, copy 13.0 s (the replay carries a thread's frames where the
    # timeline left them out as unchanged, as the live watch had them)
    assert pin.kind == "mlock" and 8.5 <= pin.seconds <= 9.75, pin.seconds
    assert copy.kind == "copy-from-swap" and 12.5 <= copy.seconds <= 13.5, copy.seconds
    assert copy.figures["swapped_in_bytes"] >= 160 << 20


# -- the H200's whole torch loads (bench/gpu_watch_whole_load.sh, 2026-12-01) ----------------------

def _replay_watch(run, size_bytes=None, quiet_after=5.0):
    """A recorded `watch --pid` (--until quiet) replayed step by step as diag.watch.attach runs it:
    the pin book, the load book, the quiet end and the outcome with its exit code."""
    from diag.watch.attach import watch_outcome
    from diag.watch.load import LoadBook
    from diag.watch.render import watch_verdict
    from diag.watch.result import WatchResult
    result, samples = _recorded(run)
    book, load = PhaseBook(size_bytes), LoadBook()
    quiet_since, ended_at = 0.0, None
    for s in _carried(samples):
        started, ended = book.update(s)
        for ph in ended:
            tr = next(tr for p, tr in book.closed if p is ph)
            load.pin_ended(ph.pid, ph.ended_t, tr.expected * tr.page if tr.expected else None, ph.kind)
        lstarted, _ = load.update(s, pinning=book.pinning())
        if book.open or load.open or started or lstarted:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = s["t"]
        if quiet_since is not None and s["t"] - quiet_since >= quiet_after:
            ended_at = s["t"]
            break
    w = WatchResult(mode="pid", pid=result["pid"], name=result["name"], size_bytes=size_bytes, until="quiet",
                    quiet_after_s=quiet_after, ended_by="quiet" if ended_at is not None else "exited")
    w.phases = sorted(book.results() + load.results(), key=lambda r: r.started_s)
    w.outcome, w.exit_code = watch_outcome(w.ended_by, w.phases)
    w.verdict = watch_verdict(w)
    return result, w, ended_at


def _check_end(result, w, ended_at):
    """The replay ends where the live watch did: quiet 5 s after the last phase, exit 0."""
    assert (result["ended_by"], result["exit_code"]) == ("quiet", 0)  # what the live watch said
    # (watched_s is read after the last sample, when the result is written)
    assert ended_at is not None and 0 <= result["watched_s"] - ended_at <= 1.0, (ended_at, result["watched_s"])
    assert (w.outcome, w.exit_code) == ("completed", 0)
    last = max(w.phases, key=lambda p: p.started_s + p.seconds)
    # a load phase ends at the last sample that showed its work; the quiet clock starts at the first
    # quiet sample after it, one interval (0.5 s) later
    assert 5.0 <= ended_at - (last.started_s + last.seconds) <= 6.05
    assert w.verdict.endswith("Quiet for 5.00 s after that: the load is over."), w.verdict


def test_pin_memory_of_a_swapped_tensor_replays_h200():
    """Tensor.pin_memory() of 16 GiB with 3 GiB in swap read at 48 MB/s, watched from 3 s in (the
    target's clock: 71.7 s; 2.7 GiB back from swap, pswpin 710,288 pages). Two phases: the
    pinned allocation (a pin, the driver's zeroing, catalog 2) and the copy's swap-in (no pin,
    catalog 19) with its ETA at 20% within 10% of its end. Durations: the returns are known to a
    sample (0.5 s); the live watch said 6.5 s and 61.5 s; the two add up to the call's 71.7 s less
    the 3 s before the attach within 1 s."""
    result, w, ended_at = _replay_watch(FIXTURES / "h200-watch-pin-memory-swap")
    assert [(p["kind"], p["pin"]) for p in result["phases"]] == [("hostalloc", True), ("copy-from-swap", False)]
    pin, copy = w.phases
    assert (pin.kind, pin.pin, pin.bound, pin.catalog, pin.outcome) == ("hostalloc", True, "fault-in/zeroing", 2,
                                                                       "completed")
    assert (copy.kind, copy.pin, copy.bound, copy.catalog, copy.outcome) == ("copy-from-swap", False, "swap-in", 19,
                                                                            "completed")
    assert not pin.seen_start and copy.seen_start
    assert 6.5 <= pin.seconds <= 7.05 and 61.0 <= copy.seconds <= 62.0, (pin.seconds, copy.seconds)
    assert abs(copy.started_s + copy.seconds - (71.687 - 3.0)) <= 1.0
    # this timeline has no smaps readings (recorded before them): its ETA counts the whole VmSwap, of
    # which 296 MiB stayed in swap (10.7% of the 2.7 GiB the copy read): late by about that share
    assert copy.eta_at_20pct is not None and 0 <= copy.eta_error <= 0.12, copy.eta_error
    assert "the whole VmSwap" in copy.eta_at_20pct["basis"], copy.eta_at_20pct
    assert 2.6 * GiB <= copy.figures["swapped_in_bytes"] <= 2.75 * GiB  # 710,288 pages are 2.71 GiB
    pin_text, copy_text = w.verdict.split(" Then ")
    assert "not a pin" in copy_text and "not a pin" not in pin_text
    # the 16 GiB were seen as they were: 4.7 GiB already there at the attach, the rest allocated after it
    assert "after hostpin attached" in pin_text and "16 GiB at the return" in pin_text, pin_text
    _check_end(result, w, ended_at)


def test_pin_memory_of_a_cold_file_replays_h200_and_the_alloc_reads_no_file():
    """Tensor.pin_memory() of a 4 GiB tensor from a file with no page cache (reads at 200 MB/s),
    watched from 0.5 s in: the pinned allocation, then the copy reading the file (file-read, no
    pin, catalog 19). The live watch said the allocation was "bound file-read ... the pages were
    read from their file on disk during the pin; a private mapping's pages are then copied": the
    copy's first read (288 MiB) and its user-space fault showed in the sample where the
    allocation had just ended. A cudaHostAlloc reads no file: that read is the copy's, which reads
    the tensor's 4 GiB (read_bytes +4,096 MiB over the watch)."""
    result, w, ended_at = _replay_watch(FIXTURES / "h200-watch-pin-memory-file")
    assert result["phases"][0]["bound"] == "file-read"  # what the live watch said
    pin, read = w.phases
    assert (pin.kind, pin.pin, pin.bound, pin.catalog, pin.outcome) == ("hostalloc", True, "fault-in/zeroing", 2,
                                                                       "completed"), (pin.bound, pin.bound_counts)
    assert "file-read" not in pin.bound_counts and not pin.figures["read_bytes"], (pin.bound_counts, pin.figures)
    assert (read.kind, read.pin, read.bound, read.catalog, read.outcome) == ("file-read", False, "file-read", 19,
                                                                            "completed")
    # the allocation ended at the sample that first saw the thread in the copy's fault (1.526 s)
    assert abs(pin.started_s + pin.seconds - 1.526) <= 0.01 and 1.0 <= pin.seconds <= 1.55, pin.seconds
    assert 21.5 <= read.seconds <= 23.0 and read.figures["read_bytes"] == 4 * GiB, (read.seconds, read.figures)
    pin_text, read_text = w.verdict.split(" Then ")
    assert "file on disk" not in pin_text and "private mapping" not in pin_text, pin_text
    assert "the driver allocated and zeroed" in pin_text and "not a pin" in read_text
    assert "read 4 GiB from disk" in read_text, read_text
    _check_end(result, w, ended_at)


def test_a_swapped_register_replays_h200():
    """torch's cudaHostRegister of 16 GiB with 3 GiB in swap, watched with --size from 3 s in (the
    target's clock: 61.2 s; 296 MiB stayed in swap, memory the register did not read). One phase:
    the register, bound swap-in, catalog 1, done 98% of --size; no load phase after it (the
    process only waited for its parent then)."""
    result, w, ended_at = _replay_watch(FIXTURES / "h200-watch-register-swap", size_bytes=16 * GiB)
    (reg,) = w.phases
    assert (reg.kind, reg.pin, reg.bound, reg.catalog, reg.outcome) == ("register", True, "swap-in", 1, "completed")
    assert 57.5 <= reg.seconds <= 58.5 and abs(reg.started_s + reg.seconds - (61.238 - 3.0)) <= 1.0, reg.seconds
    assert 97.5 <= reg.pct <= 99.0 and reg.size_from == "--size", reg.pct
    assert "not a pin" not in w.verdict and "(catalog 1)" in w.verdict
    _check_end(result, w, ended_at)


def _steps_on_the_watch_clock(run):
    """The target's own steps (target.json: its monotonic clock from "go") moved onto the watch's
    clock by the two start times (the target's wall time at go, the run's start in manifest.jsonl),
    as bench/gpu_watch_loader_pin_read_pin.py put them beside the phases."""
    import datetime
    target = json.loads((run / "target.json").read_text())
    first = json.loads((run / "manifest.jsonl").read_text().splitlines()[0])
    off = target["go_wall"] - datetime.datetime.fromisoformat(first["run"]["started"]).timestamp()
    return off, {st["step"]: (off + st["start_s"], off + st["end_s"]) for st in target["steps"]}


def test_a_loader_that_pins_reads_and_pins_again_replays_h200():
    """A torch loader watched from 1.66 s before its first step (no --size): A.pin_memory() of
    2 GiB, S.sum() over 2 GiB of its swapped memory (reads at 48 MB/s), B.pin_memory() of 2 GiB.
    The live watch said three phases: a pin (the pinned allocation, catalog 2), the copy's
    swap-in (not a pin, catalog 19, its ETA at 20% -0.7%), a pin; quiet 5 s after the last, exit 0.

    pin1's allocation phase (2.52-3.52 s) is shorter than its step (1.66-4.05 s), and right: the
    process's RssShmem was 10 MiB at 2.025 s (as at go) and had all 2 GiB more by 3.525 s; 180 MiB
    of it were there at 2.525 s, where the phase starts (0.06 s of allocation at 2.7 GiB/s, in an
    interval 12% in the kernel: the sampling). The rest of the step read files: the main thread in
    filemap_fault under a user-space fault at 2.025 and 3.525 s, read_bytes +73 MB over the step
    (1.5 s at the throttle's 48 MB/s; see the fixture's README), and the copy from resident A
    into the pinned buffer ran in 15 worker threads (R at 4.025 s): it waits on nothing. The live
    watch saw the reads before the allocation (file-read from 1.525 s) and then dropped them as
    "the pin's own start", leaving 1.66-2.52 s without a phase; a pinned allocation reads no
    file, so they are a phase of their own, ended where the allocation began (2.525 s)."""
    run = FIXTURES / "h200-watch-loader-pin-read-pin"
    result, w, ended_at = _replay_watch(run)
    assert [(p["kind"], p["pin"]) for p in result["phases"]] == \
        [("hostalloc", True), ("copy-from-swap", False), ("hostalloc", True)]  # what the live watch said
    reads, pin1, copy, pin2 = w.phases
    assert (reads.kind, reads.pin, reads.bound, reads.catalog, reads.outcome) == ("file-read", False, "file-read", 19,
                                                                                 "completed")
    assert (reads.started_s, reads.started_s + reads.seconds) == (1.525, 2.525), (reads.started_s, reads.seconds)
    assert 32 << 20 <= reads.figures["read_bytes"] <= 48 << 20, reads.figures  # 39.8 MB in 1.525-2.525 s
    for pin in (pin1, pin2):
        assert (pin.kind, pin.pin, pin.bound, pin.catalog, pin.outcome) == ("hostalloc", True, "fault-in/zeroing", 2,
                                                                           "completed"), pin
    assert (copy.kind, copy.pin, copy.bound, copy.catalog, copy.outcome) == ("copy-from-swap", False, "swap-in", 19,
                                                                            "completed")
    # durations within a sample (0.5 s) of the live watch's 1.0, 45.5 and 1.5 s
    for ph, live in zip((pin1, copy, pin2), result["phases"]):
        assert abs(ph.seconds - live["seconds"]) <= 0.5 and abs(ph.started_s - live["started_s"]) <= 0.5, \
            (ph.kind, ph.started_s, ph.seconds, live["started_s"], live["seconds"])
    assert copy.eta_at_20pct is not None and copy.eta_error is not None and abs(copy.eta_error) <= 0.10, \
        (copy.eta_at_20pct, copy.eta_error)
    assert 1.95 * GiB <= copy.figures["swapped_in_bytes"] <= 2.05 * GiB  # pswpin 524,342 pages: 2.0 GiB
    assert not pin1.figures["read_bytes"] and not pin1.figures["swapped_in_bytes"]  # an allocation reads nothing
    texts = w.verdict.split(" Then ")
    assert len(texts) == 4 and [("not a pin" in t) for t in texts] == [True, False, True, False], w.verdict
    # both allocations began after hostpin attached (1.66 s before go), between two samples: the
    # live watch said "after hostpin attached (its RssShmem: 2 GiB at the attach ...)" of pin2,
    # begun 50 s after the attach
    for text, ph in ((texts[1], pin1), (texts[3], pin2)):
        assert not ph.seen_start and "attach" not in text and f"at {ph.started_s:.1f} s, where" in text, text
        assert not any("before hostpin attached" in n for n in ph.notes), ph.notes
        assert any("between two samples" in n for n in ph.notes), ph.notes
    assert "the driver allocated and zeroed 2 GiB (its RssShmem: 2 GiB at 50.0 s, where" in texts[3], texts[3]
    # each step beside the target's own clock: pin1 is the reads and the allocation, then the copy,
    # then pin2, each within about 1 s of its step's start and end; the copy ends at its last
    # swap-in (49.025 s), and the read step 1.17 s later: S.sum(dtype=int64) made a 16 GiB int64
    # copy of S (the copy's resident growth: 18 GiB, S's 2 GiB among it) and freed it at the end, RSS 26.3 -> 12.1 GB
    # by 50.025 s with the thread all in the kernel, which waits on no load
    off, steps = _steps_on_the_watch_clock(run)
    assert abs(off - 1.66) <= 0.01, off
    for (first, last), name, late in (((reads, pin1), "pin1", 1.0), ((copy, copy), "read", 1.25),
                                      ((pin2, pin2), "pin2", 1.0)):
        a, b = steps[name]
        assert abs(first.started_s - a) <= 1.0 and abs(last.started_s + last.seconds - b) <= late, \
            (name, a, b, first.started_s, last.started_s + last.seconds)
    _, samples = _recorded(run)
    at = {round(s["t"], 3): s["procs"]["481"] for s in samples}
    assert copy.started_s + copy.seconds == 49.025 and copy.figures["resident_growth_bytes"] >= 17 << 30
    assert at[49.025]["vm_rss"] - at[50.025]["vm_rss"] >= 13 << 30 and at[50.025]["vm_swap"] == at[49.025]["vm_swap"]
    # pin1's step beyond its allocation: the allocation lay between 2.025 and 3.525 s, files were read
    assert at[1.525]["rss_shmem"] == at[2.025]["rss_shmem"] == 10 << 20
    assert at[3.525]["rss_shmem"] == at[4.025]["rss_shmem"] == (10 << 20) + 2 * GiB
    assert at[2.525]["rss_shmem"] - at[2.025]["rss_shmem"] <= 256 << 20  # the phase's first sample missed this much
    for t in (2.025, 3.525):
        assert "filemap_fault" in at[t]["threads"]["481"]["frames"], t
    read = at[4.025]["read_bytes"] - at[1.525]["read_bytes"]
    assert 64 << 20 <= read <= 80 << 20 and at[4.025]["vm_swap"] >= at[1.525]["vm_swap"] - (1 << 20), read
    a, b = steps["pin1"]
    assert pin1.started_s - a >= 0.5 and b - (pin1.started_s + pin1.seconds) >= 0.25  # reads outside the allocation
    # the watch ended 5.48 s after the last step returned (--quiet-after 5)
    assert 5.0 <= result["watched_s"] - steps["pin2"][1] <= 6.0
    _check_end(result, w, ended_at)


def test_a_pinned_allocation_is_never_bound_by_the_reads_after_it():
    """The H200's cold-file pin_memory() timeline fed to one tracker through the sample after the
    copy began, as the watch of the day did (the phase ran on a sample): file-read then outnumbers
    the allocation's zeroing, but a hostalloc's bound is never its copy's; and where nothing else
    was seen, its words say a file was read while the driver allocated, not the register's
    "private mapping" (constructed: one PhaseResult with that bound)."""
    from diag.watch.render import phase_verdict
    from diag.watch.result import PhaseResult
    _, samples = _recorded(FIXTURES / "h200-watch-pin-memory-file")
    samples = _carried(samples)
    tr = Tracker(pids={561}, tids={561})
    tr.begin(samples[1], seen_start=False)  # where the watch of the day began it
    for s in samples[2:5]:  # 1.026 .. 2.026 s: the allocation ended by 1.526, the copy was reading
        tr.update(s, in_call=True)
    assert tr.bound_counts == {"fault-in/zeroing": 1, "file-read": 2}, tr.bound_counts
    assert tr.summary()["bound"] == "file-read"
    assert tr.summary(not_bounds=("swap-in", "file-read"))["bound"] == "fault-in/zeroing"
    r = PhaseResult(pid=561, tid=561, comm="python3", kind="hostalloc", started_s=0.0, seen_start=True,
                    outcome="completed", seconds=1.5, bound="file-read", figures={"read_bytes": 288 << 20,
                                                                                  "seconds": 1.5})
    text = phase_verdict(r)
    assert "read a file while the driver allocated" in text and "private mapping" not in text, text


def test_shared_memory_read_back_from_swap_is_named_replays_ci():
    """Recorded on the CI machine (tests/fixtures/ci-watch-load-shmem-swap): 128 MiB of MAP_SHARED
    memory read back from swap at 16 MB/s (8.34 s by the target's clock; pswpin 32,738 pages)
    between two mlocks too quick for a sample. The copy is one phase, bound swap-in, and says how
    much came back from its RssShmem: the live watch said "read 0 B back from swap" (shared
    memory's swap is not in VmSwap)."""
    result, w, ended_at = _replay_watch(FIXTURES / "ci-watch-load-shmem-swap")
    assert "read 0 B back from swap" in result["verdict"]  # what it said then
    (copy,) = w.phases
    assert (copy.kind, copy.pin, copy.bound, copy.catalog, copy.outcome) == ("copy-from-swap", False, "swap-in", 19,
                                                                            "completed")
    assert 8.0 <= copy.seconds <= 9.5, copy.seconds  # the target read for 8.34 s; the phase is known to a sample
    assert "read 128 MiB of its shared memory back from swap" in w.verdict and "0 B" not in w.verdict, w.verdict
    _check_end(result, w, ended_at)  # no pin left open: quiet, exit 0


# -- the region's swap and the swap-in rate (issue: ETAs that mean something) -----------------------

def _with_frames(samples):
    """The timeline as the sampler saw it: a thread's frames are written only when they change,
    and a reader keeps the last ones seen (a madvise's thread, whose call is no mlock, is told to
    be in the pin by its stack alone)."""
    last: dict = {}
    out = []
    for s in samples:
        procs = {}
        for pid, p in s["procs"].items():
            threads = {}
            for tid, th in p.get("threads", {}).items():
                if "frames" in th:
                    last[tid] = th["frames"]
                threads[tid] = dict(th, frames=last.get(tid)) if tid in last else th
            procs[pid] = dict(p, threads=threads)
        out.append(dict(s, procs=procs))
    return out


def _strip_regions(samples):
    """A timeline as a watch without smaps readings wrote it (before they were recorded)."""
    out = []
    for s in samples:
        s = dict(s, procs={pid: {k: v for k, v in p.items() if k != "smaps_swap"} for pid, p in s["procs"].items()})
        s.pop("regions", None)
        out.append(s)
    return out


def test_recorded_register_eta_is_at_the_swap_read_rate_replays_h200():
    """Recorded on the H200 (bench/gpu_watch_whole_load.sh case c, 2026-12-01): `watch --pid
    --size 16GiB` attached ~3.2 s into a PyTorch cudaHostRegister of a 16 GiB tensor, 3 GiB of the
    process in swap read at 48 MB/s (11,718 pages/s); 297 MiB of the process's swap was torch's and
    CUDA's own and stayed in swap (target.txt: vmswap_after 310,779,904). The watch said first
    ETA 78.3 s for a 58.0 s pin (+35%), and its "ETA at 20%" was that same first ETA, given at
    82% of --size. Its VmSwap fell 9,620 pages/s in the first window (swap readahead: SwapCached
    grew 43 -> 156 MiB) while the process read 11,720 pages/s from swap throughout. Replayed: the
    rate is the swap reads'; what is left of the error is the swap outside the tensor, which this
    timeline (no smaps readings) cannot tell apart, and the basis says so; the ETA at 20% is taken
    at 20% of the pages the pin had left when hostpin attached."""
    result, samples = _recorded(FIXTURES / "h200-watch-register-swap-eta")
    assert result["phases"][0]["eta_first_error"] == 0.3507  # what the watch said then
    for size in (16 * GiB, None):
        (ph,) = _replay_load(samples, size)
        assert (ph.kind, ph.bound, ph.outcome, ph.seconds) == ("register", "swap-in", "completed", 58.0)
        first = ph.eta_first
        assert first["at_s"] == 1.0 and "at 11,720 pages/s (its swap reads)" in first["basis"], first
        assert "the whole VmSwap: no per-region swap in the samples" in first["basis"], first
        outside_s = 310_779_904 / 4096 / 11_720  # the swap no phase read, at the rate: 6.5 s
        assert abs(first["predicted_total_s"] - ph.seconds - outside_s) <= 1.0, first
        assert 0.08 <= ph.eta_first_error <= 0.13, ph.eta_first_error
        if size:
            at20 = ph.eta_at_20pct
            assert 20.0 <= at20["work_pct"] < 21.0 and at20["pct"] > 85.0 and at20["at_s"] > 10.0, at20
            assert 0.08 <= ph.eta_error <= 0.16, ph.eta_error
        else:
            assert ph.eta_at_20pct is None  # no total, and no region to take one from


def test_recorded_register_eta_from_the_regions_swap_replays_h200():
    """The same H200 register (16 GiB tensor, 3 GiB of the process in swap at 48 MB/s, 297 MiB of it
    outside the tensor) watched again after the region work (bench/gpu_watch_eta_region_swap.sh,
    2026-12-02), its timeline holding the smaps readings. Replayed with and without --size: the
    basis is the region's swap, the outside 300 MiB is named, and both ETAs are within 2% of the
    58.0 s pin (the live watch: -0.12% and -0.11%). Taken out, the readings give the whole-VmSwap
    ETA, late by the outside swap (about 6.5 s of 58)."""
    result, samples = _recorded(FIXTURES / "h200-watch-register-swap-smaps")
    assert [round(p["eta_first_error"], 4) for p in result["phases"]] == [-0.0012]  # what the watch said
    readings = [p["smaps_swap"] for s in samples for p in s["procs"].values() if "vmas" in p.get("smaps_swap", {})]
    assert len(readings) >= 5 and max(r["vma_count"] for r in readings) >= 500  # torch + CUDA: 545 VMAs
    for size in (16 * GiB, None):
        (ph,) = _replay_load(samples, size)
        assert (ph.kind, ph.bound, ph.outcome) == ("register", "swap-in", "completed") and 57.5 <= ph.seconds <= 58.5
        assert "of the region still in swap (smaps, 1 VMA draining)" in ph.eta_first["basis"], ph.eta_first
        assert abs(ph.eta_first_error) <= 0.02 and abs(ph.eta_error) <= 0.02, (ph.eta_first_error, ph.eta_error)
        assert ph.eta_at_20pct["work_pct"] >= 20.0
        assert 280 << 20 <= ph.figures["swap_outside_region_bytes"] <= 320 << 20, ph.figures
    (old,) = _replay_load(_strip_regions(samples), None)
    assert "the whole VmSwap: no per-region swap in the samples" in old.eta_first["basis"]
    assert 0.07 <= old.eta_first_error <= 0.14, old.eta_first_error


def test_recorded_region_swap_replays_ci():
    """Recorded on the CI machine (tests/test_watch.py's region test, 2026-12-01): a process with
    64 MiB of swap that no phase reads faults 128 MiB in from swap with MADV_POPULATE_READ (no
    length hostpin reads), then reads 96 MiB back in user space, at 16 MB/s. The timeline keeps
    the smaps readings: replayed, each phase's first ETA and ETA at 20% of its work come from the
    region's swap and are within 10%; with the readings taken out (a timeline of an older watch),
    the same samples give ETAs from the whole VmSwap, which say so and are late by what the
    phase did not read."""
    result, samples = _recorded(FIXTURES / "ci-watch-eta-region-swap")
    samples = _with_frames(samples)
    readings = [p["smaps_swap"] for s in samples for p in s["procs"].values() if "vmas" in p.get("smaps_swap", {})]
    assert len(readings) >= 5 and max(len(r["vmas"]) for r in readings) >= 3
    pin, copy = _replay_load(samples)
    assert (pin.kind, copy.kind) == ("populate", "copy-from-swap")
    for ph in (pin, copy):
        assert "of the region still in swap (smaps, 1 VMA draining)" in ph.eta_first["basis"], ph.eta_first
        assert abs(ph.eta_first_error) <= 0.10 and abs(ph.eta_error) <= 0.10, (ph.kind, ph.eta_first, ph.seconds)
        assert ph.eta_at_20pct["work_pct"] >= 20.0
    assert 150 << 20 <= pin.figures["swap_outside_region_bytes"] <= 170 << 20
    old_pin, old_copy = _replay_load(_strip_regions(samples))
    for ph, late in ((old_pin, 1.0), (old_copy, 0.5)):  # 160 MiB beside 128; 64 MiB beside 96
        assert "the whole VmSwap: no per-region swap in the samples" in ph.eta_first["basis"], ph.eta_first
        assert ph.eta_first_error >= late * 0.8, (ph.kind, ph.eta_first_error)


def test_region_from_the_vmas_being_drained():
    """Constructed smaps readings (the edge cases, named): a VMA that lost a few pages to a stray
    fault is no drain; a region split in two between readings keeps its swap; the region's swap
    follows VmSwap between readings; a region named by mlock's range needs one reading."""
    from diag.watch.regions import RegionSwap
    MiB = 1 << 20

    def sample(t, vm_swap, vmas=None, th=None):
        p = {"vm_swap": vm_swap, "threads": {7: th or {"tid": 7, "state": "D"}}}
        if vmas is not None:
            p["smaps_swap"] = {"t": t, "ms": 1.0, "vm_swap": vm_swap, "vmas": vmas}
        return {"t": t, "regions": "smaps", "procs": {"7": p}}

    r = RegionSwap("7")
    r.feed(sample(0.0, 300 * MiB, [[0x1000_0000, 0x3000_0000, 200 * MiB], [0x5000_0000, 0x6000_0000, 100 * MiB]]))
    assert not r.known and r.seen_readings
    # 40 MiB out of the first VMA, which also split at 0x2000_0000; 64 KiB out of the other
    r.feed(sample(1.0, 260 * MiB - 64 * 1024, [[0x1000_0000, 0x2000_0000, 80 * MiB], [0x2000_0000, 0x3000_0000, 80 * MiB],
                                               [0x5000_0000, 0x6000_0000, 100 * MiB - 64 * 1024]]))
    assert r.ranges == [(0x1000_0000, 0x3000_0000)] and r.total0 == 200 * MiB
    assert r.left_bytes(260 * MiB - 64 * 1024) == 160 * MiB
    assert r.left_bytes(200 * MiB) == 100 * MiB + 64 * 1024  # 60 MiB more gone since the reading
    assert r.outside_bytes() == 100 * MiB - 64 * 1024
    named = RegionSwap("7", tids={7})
    th = {"tid": 7, "state": "D", "syscall": "mlock", "syscall_addr": 0x5000_0000, "syscall_len": 0x800_0000}
    named.feed(sample(0.0, 300 * MiB, [[0x1000_0000, 0x3000_0000, 200 * MiB], [0x5000_0000, 0x6000_0000, 100 * MiB]],
                      th))
    assert named.known and named.left_bytes(300 * MiB) == 50 * MiB and named.words() == "smaps, mlock's range"
    assert RegionSwap("7").left_bytes(1) is None


def test_a_smaps_reading_keeps_the_largest_vmas_and_damage_is_no_reading(tmp_path, monkeypatch):
    """Written smaps text (the edge cases, named): more swapped VMAs than a reading keeps (the
    largest are kept, the rest summed), and smaps whose Swap lines do not match its VMAs (damaged
    or cut) is an error in the sample, not a reading and not a crash."""
    from diag.watch import smaps
    monkeypatch.setattr(smaps, "KEEP_VMAS", 2)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "smaps").write_text("".join(f"{0x1000 * i:x}-{0x1000 * (i + 1):x} rw-p 0 0:0 0\nSwap: {4 * i} kB\n"
                                                  "VmFlags: rd\n" for i in range(1, 6)))
    (tmp_path / "7" / "status").write_text("Name:\tx\nVmSwap:\t60 kB\n")
    reader = smaps.SmapsSwap(str(tmp_path))
    got = reader.poll(7, 0.0)
    assert got["vmas"] == [[0x4000, 0x5000, 16 << 10], [0x5000, 0x6000, 20 << 10]] and got["vma_count"] == 5
    assert got["vmas_left_out"] == 3 and got["swap_left_out_bytes"] == 24 << 10 and got["vm_swap"] == 60 << 10
    assert reader.poll(7, 1.0) is None  # not due again before EVERY_S
    (tmp_path / "7" / "smaps").write_text("1000-2000 rw-p 0 0:0 0\nSwap: 4 kB\nVmFlags: rd\n2000-3000 rw-p 0 0:0 0\n")
    assert reader.poll(7, 0.95, urgent=True) == {"error": "smaps unreadable"} and reader.problems == {7: "smaps unreadable"}
