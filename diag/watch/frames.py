"""Kernel stack frames: what a thread is waiting on, and whether it is inside a pin.

A stack is a list of frames, innermost first, as diag.process.parse_stack gives them; frames
of a module may carry it (`os_lock_user_pages [nvidia]`, as %pB prints them). Names are
compared after normalisation: compiler suffixes (`.isra.0`, `.constprop.0`, `.part.0`,
`.cold`) and the allocation-profiling suffix `_noprof` (6.10+: `alloc_pages_mpol_noprof`)
are dropped.

The innermost frame that means something decides, skipping generic waits (`schedule`,
`folio_wait_bit_common`, the block layer), with corrections from frames further out: an
allocation or a copy under a migration is the migration (`copy_page` under
`migrate_longterm_unpinnable_folios`), under IOMMU mapping the IOMMU's; page migration inside
compaction is compaction (`migrate_folio` under `compact_zone`); and a lock wait is named by
the code that took the lock: the mm's mmap_lock (`down_read` under `os_lock_user_pages` or
get_user_pages) is a lock wait, a lock the NVIDIA driver's own code takes is the driver's lock
(`down_write` under `os_acquire_rwlock_write`), one taken in IOMMU mapping or reclaim is that.

>>> stack_bound(["folio_wait_bit_common", "filemap_fault", "__do_fault", "do_fault", "__get_user_pages"])
('file-read', 'filemap_fault')
>>> stack_bound(["migrate_folio", "move_to_new_folio", "migrate_pages", "compact_zone", "try_to_compact_pages"])
('compaction', 'migrate_folio under compact_zone')
>>> stack_bound(["rwsem_down_read_slowpath", "down_read", "os_lock_user_pages [nvidia]"])
('lock wait', 'down_read under os_lock_user_pages (the mmap_lock)')
"""
from __future__ import annotations

import re

from .. import catalog

__all__ = ["BOUNDS", "normalize", "module_of", "is_nvidia", "stack_bound", "in_pin_path", "pin_kind", "frame_module"]

BOUNDS = catalog.BOUNDS + ("unknown",)  # the catalog names the bounds; "unknown" is no bound of its own

_SUFFIX = re.compile(r"(\.(constprop|isra|part|cold|lto_priv|llvm)(\.\d+)?)+$")

# frames that say only "waiting" or "doing I/O": the reason is further out
_GENERIC = {
    "schedule", "__schedule", "io_schedule", "io_schedule_timeout", "schedule_timeout", "schedule_preempt_disabled",
    "preempt_schedule", "preempt_schedule_common", "__cond_resched", "folio_wait_bit_common", "folio_wait_bit",
    "folio_wait_bit_killable", "folio_wait_locked", "__folio_lock", "__folio_lock_killable", "__folio_lock_or_retry",
    "wait_on_page_bit_common", "__lock_page", "__lock_page_or_retry", "__lock_page_killable", "bit_wait_io",
    "asm_exc_page_fault", "exc_page_fault", "do_user_addr_fault", "submit_bio", "submit_bio_noacct",
    "submit_bio_noacct_nocheck", "__submit_bio", "blk_mq_submit_bio", "blk_throtl_bio", "__blk_throtl_bio",
    "rq_qos_wait", "wbt_wait", "__rq_qos_throttle", "blk_start_plug", "blk_finish_plug", "__blk_flush_plug",
}
_SWAP = {
    "do_swap_page", "swap_read_folio", "swap_readpage", "swapin_readahead", "swap_cluster_readahead",
    "swap_vma_readahead", "__read_swap_cache_async", "read_swap_cache_async", "swap_read_folio_bdev_sync",
    "swap_read_folio_bdev_async", "swap_read_folio_fs", "swap_read_folio_zeromap", "swapin_folio",
    "swap_cache_get_folio", "zswap_load", "zswap_decompress", "shmem_swapin_folio", "shmem_swapin_cluster",
    "shmem_swapin", "swap_read_unplug",
}
_FILE_READ = {
    "filemap_fault", "filemap_read_folio", "filemap_read", "filemap_get_pages", "filemap_update_page",
    "filemap_create_folio", "page_cache_ra_unbounded", "page_cache_ra_order", "page_cache_sync_ra",
    "page_cache_async_ra", "page_cache_sync_readahead", "page_cache_async_readahead", "do_sync_mmap_readahead",
    "do_async_mmap_readahead", "read_pages", "ondemand_readahead", "force_page_cache_ra", "ext4_mpage_readpages",
    "ext4_readahead", "ext4_read_folio", "xfs_vm_readahead", "xfs_vm_read_folio", "iomap_readahead",
    "iomap_read_folio", "mpage_readahead", "mpage_read_folio", "btrfs_readahead", "btrfs_read_folio",
    "nfs_readahead", "fuse_readahead",
}
_COMPACT = {
    "try_to_compact_pages", "compact_zone", "compact_zone_order", "compact_node", "__alloc_pages_direct_compact",
    "isolate_migratepages", "isolate_migratepages_block", "isolate_freepages", "isolate_freepages_block",
    "fast_isolate_freepages", "compaction_alloc", "compaction_free", "kcompactd", "kcompactd_do_work",
}
_MIGRATE = {
    "migrate_pages", "migrate_pages_batch", "migrate_pages_sync", "migrate_folio", "migrate_folio_extra",
    "__migrate_folio", "move_to_new_folio", "migrate_folio_move", "migrate_folio_unmap", "folio_migrate_mapping",
    "migrate_longterm_unpinnable_folios", "migrate_longterm_unpinnable_pages", "check_and_migrate_movable_pages",
    "check_and_migrate_movable_folios", "check_and_migrate_movable_pages_or_folios",  # the last: 6.12
    "collect_longterm_unpinnable_folios", "alloc_migration_target",
}
_RECLAIM = {
    "try_to_free_pages", "try_to_free_mem_cgroup_pages", "do_try_to_free_pages", "__alloc_pages_direct_reclaim",
    "__perform_reclaim", "mem_cgroup_handle_over_high", "reclaim_high", "lru_gen_shrink_lruvec",
    "lru_gen_shrink_node", "try_to_shrink_lruvec", "evict_folios", "isolate_folios", "scan_folios",
    "reclaim_folio_list", "reclaim_pages", "pageout", "swap_writepage", "swap_writeout",
}
_LOCK = {
    "rwsem_down_read_slowpath", "rwsem_down_write_slowpath", "down_read", "down_write", "down_read_killable",
    "down_write_killable", "down_read_interruptible", "__down", "__down_common", "__down_interruptible",
    "__down_killable", "__down_timeout", "down", "down_interruptible", "down_killable", "down_timeout",
    "__mutex_lock", "mutex_lock", "mutex_lock_killable", "mutex_lock_interruptible", "__mutex_lock_slowpath",
    "__mutex_lock_killable_slowpath", "__mutex_lock_interruptible_slowpath", "lock_mm_and_find_vma",
    "mmap_read_lock_killable", "mmap_write_lock_killable", "osq_lock", "percpu_down_write", "rt_mutex_slowlock",
}
# frames that take the mm's mmap_lock around a pin or a fault: a lock wait under them is the
# mmap_lock convoy, even where the caller is the driver's (os_lock_user_pages: mmap_read_lock,
# then pin_user_pages)
_MM_LOCK = {
    "lock_mm_and_find_vma", "mmap_read_lock", "mmap_read_lock_killable", "mmap_write_lock",
    "mmap_write_lock_killable", "get_mmap_lock_carefully", "mmap_read_trylock", "os_lock_user_pages",
    "__get_user_pages", "__get_user_pages_locked", "get_user_pages_unlocked", "pin_user_pages_unlocked",
    "__gup_longterm_locked", "get_user_pages_remote", "pin_user_pages_remote", "get_user_pages", "pin_user_pages",
    "get_user_pages_fast", "pin_user_pages_fast", "gup_fast_fallback", "internal_get_user_pages_fast",
    "__mm_populate", "populate_vma_page_range", "faultin_page_range", "madvise_populate", "do_madvise",
    "do_mlock", "apply_mlockall_flags", "do_user_addr_fault",
    "__x64_sys_mlock", "__x64_sys_mlock2", "__x64_sys_mlockall", "__arm64_sys_mlock", "__arm64_sys_mlock2",
    "__arm64_sys_mlockall", "__do_sys_mlockall", "vm_mmap_pgoff", "__x64_sys_munmap", "__vm_munmap",
}
# frames of the migration an allocation or a copy serves (not compaction's: those decide alone)
_MIGRATE_CALLERS = {
    "migrate_pages", "migrate_pages_batch", "migrate_pages_sync", "migrate_folio", "migrate_folio_extra",
    "__migrate_folio", "move_to_new_folio", "migrate_folio_move", "migrate_folio_unmap", "alloc_migration_target",
    "migrate_longterm_unpinnable_folios", "migrate_longterm_unpinnable_pages", "check_and_migrate_movable_pages",
    "check_and_migrate_movable_folios", "check_and_migrate_movable_pages_or_folios", "migrate_misplaced_folio",
    "migrate_misplaced_page",
}
_FAULT = {
    "clear_page_erms", "clear_page_rep", "clear_page_orig", "clear_page", "clear_huge_page", "clear_gigantic_page",
    "folio_zero_user", "process_huge_page", "clear_user_highpage", "clear_highpage", "clear_user_page",
    "do_anonymous_page", "do_huge_pmd_anonymous_page", "vma_alloc_anon_folio_pmd", "vma_alloc_folio",
    "alloc_anon_folio", "__alloc_pages", "alloc_pages", "alloc_pages_mpol", "folio_alloc", "__folio_alloc",
    "folio_alloc_mpol", "get_page_from_freelist", "rmqueue", "rmqueue_bulk", "__alloc_pages_slowpath",
    "__alloc_frozen_pages", "alloc_frozen_pages", "prep_new_page", "post_alloc_hook", "kernel_init_pages",
    "do_pte_missing", "do_fault", "do_cow_fault", "do_read_fault", "do_shared_fault", "shmem_fault",
    "shmem_get_folio_gfp", "shmem_alloc_and_add_folio", "shmem_alloc_folio", "filemap_map_pages", "wp_page_copy",
    "do_wp_page", "copy_mc_user_highpage", "copy_user_highpage", "__wp_page_copy_user", "copy_page",
    "__handle_mm_fault", "handle_mm_fault", "faultin_page", "charge_memcg", "__mem_cgroup_charge",
    "mem_cgroup_charge", "memcg1_commit_charge", "memcg1_check_events",
    "nv_alloc_system_pages", "nv_alloc_pages", "nv_alloc_contig_pages", "nv_alloc_coherent_pages",
}
_PIN = {
    "__get_user_pages", "__get_user_pages_locked", "pin_user_pages", "pin_user_pages_fast", "pin_user_pages_remote",
    "pin_user_pages_unlocked", "get_user_pages", "get_user_pages_fast", "get_user_pages_remote",
    "__gup_longterm_locked", "populate_vma_page_range", "__mm_populate", "faultin_page_range", "os_lock_user_pages",
    "follow_page_mask", "follow_page_pte", "follow_pmd_mask", "follow_p4d_mask", "follow_pud_mask",
    "gup_fast_fallback", "gup_fast", "internal_get_user_pages_fast", "try_grab_folio", "try_grab_folio_fast",
    "try_grab_page", "do_mlock", "__x64_sys_mlock", "__x64_sys_mlock2", "__arm64_sys_mlock", "__arm64_sys_mlock2",
    "__x64_sys_mlockall", "__arm64_sys_mlockall", "apply_vma_lock_flags", "apply_mlockall_flags", "mlock_fixup",
    "mlock_folio", "mlock_pte_range", "mlock_vma_pages_range",
}
# the driver's own allocations and pins: a thread in these is in a pin phase
_DRIVER_PIN = {"os_lock_user_pages", "nv_alloc_system_pages", "nv_alloc_pages", "nv_alloc_contig_pages",
               "RmCreateOsDescriptor", "osCreateOsDescriptorFromPageArray", "nv_dma_map_pages", "nv_dma_map_sgt"}
_DMA = {"dma_map_sg_attrs", "__dma_map_sg_attrs", "dma_map_sgtable", "dma_direct_map_sg", "dma_map_page_attrs",
        "dma_unmap_sg_attrs", "dma_direct_unmap_sg", "swiotlb_map", "swiotlb_tbl_map_single"}
_IOMMU = re.compile(r"^_*(iommu_|viommu_|intel_iommu|amd_iommu|arm_smmu|qi_submit_sync|alloc_iova|iova_|"
                    r"domain_flush|iommu_dma)")
_RECLAIM_PREFIX = ("shrink_",)
# where reclaim is entered from: a memory cgroup's limit or memory.high (mm/memcontrol.c), or the
# node's page allocator (mm/page_alloc.c __alloc_pages_direct_reclaim)
_RECLAIM_ENTRIES = ("try_to_free_mem_cgroup_pages", "mem_cgroup_handle_over_high", "try_to_free_pages")
# NVIDIA frames by name, for stacks recorded without the module tag: camelCase RM/UVM calls
# and the os_*/nv_* interface layer; kernel functions are snake_case (nvme_* is not nv_*)
_MLOCK_CALL = re.compile(r"^__(x64|arm64|ia32|do)_sys_mlock(2|all)?$")  # __do_sys_mlockall on 6.18
_MUNLOCK_CALL = re.compile(r"^__(x64|arm64|ia32|do)_sys_munlock(all)?$")
_NVIDIA_NAME = re.compile(r"^_*(nv[A-Z_]|nvidia_|os_|[rR]m[A-Z]|rmapi|uvm_|port[A-Z]|server[A-Z]|dupMemory|memdesc|"
                          r"kgmmu|kbus|gpumgr|osCreate|osAlloc|osLock)")
_DRIVER_LOCK = re.compile(r"^_*(os_(cond_)?acquire_(mutex|semaphore|rwlock_read|rwlock_write|spinlock)|"
                          r"portSync\w*Acquire\w*|rmapiLockAcquire\w*|_?rm\w*Locks?Acquire\w*)$")


def normalize(frame: str) -> str:
    """>>> normalize("_rmGpuLocksAcquire.isra.0 [nvidia]"), normalize("alloc_pages_mpol_noprof")
    ('_rmGpuLocksAcquire', 'alloc_pages_mpol')
    """
    name = frame.split(" ", 1)[0]
    name = _SUFFIX.sub("", name)
    return name[:-len("_noprof")] if name.endswith("_noprof") else name


def module_of(frame: str) -> str | None:
    """'os_lock_user_pages [nvidia]' -> 'nvidia'."""
    if frame.endswith("]") and " [" in frame:
        return frame.rsplit(" [", 1)[1][:-1]
    return None


def frame_module(line: str) -> str | None:
    """The module a raw /proc/PID/stack line names: '[<0>] os_lock_user_pages+0x9/0x40 [nvidia]'."""
    line = line.strip()
    if line.endswith("]") and " [" in line:
        return line.rsplit(" [", 1)[1][:-1]
    return None


def is_nvidia(frame: str) -> bool:
    module = module_of(frame)
    if module is not None:
        return module.startswith("nvidia")
    return bool(_NVIDIA_NAME.match(normalize(frame)))


def _bound_of(name: str, frame: str) -> str | None:
    if name in _SWAP:
        return "swap-in"
    if name in _FILE_READ:
        return "file-read"
    if name in _COMPACT:
        return "compaction"
    if name in _MIGRATE:
        return "migration"
    if name in _RECLAIM or name.startswith(_RECLAIM_PREFIX):
        return "reclaim"
    if _IOMMU.match(name):
        return "iommu"
    if name in _LOCK:
        return "lock wait"
    if name in _FAULT:
        return "fault-in/zeroing"
    if name in _PIN:
        return "cpu"
    if is_nvidia(frame):
        return "driver-lock" if _DRIVER_LOCK.match(name) else "driver"
    if name in _DMA:
        return "driver"
    return None


def stack_bound(frames: list[str]) -> tuple[str | None, str | None]:
    """(bound, the frame that says so) from one stack, innermost first; (None, the innermost
    frame) when nothing in it means anything. Reclaim names the reclaim it serves (a cgroup's,
    try_to_free_mem_cgroup_pages; the node's, try_to_free_pages): its innermost frame is shrink_*
    for both, and the catalog entry differs (12 or 8)."""
    bound, frame = _stack_bound(frames)
    if bound == "reclaim" and frame:
        entry = next((n for n in map(normalize, frames) if n in _RECLAIM_ENTRIES), None)
        if entry and entry not in frame:
            frame = f"{frame} under {entry}"
    return bound, frame


def _stack_bound(frames: list[str]) -> tuple[str | None, str | None]:
    names = [normalize(f) for f in frames]
    for i, name in enumerate(names):
        if name in _GENERIC:
            continue
        bound = _bound_of(name, frames[i])
        if bound is None:
            continue
        outer = names[i + 1:]
        if bound == "fault-in/zeroing":
            # an allocation or a copy for a migration (the long-term pin moving pages out of
            # movable/CMA memory, compaction) is that migration's: the fault path is not in it
            migrate = next((f for f in outer if f in _MIGRATE_CALLERS), None)
            iommu = next((f for f in outer if _IOMMU.match(f)), None)
            if iommu:  # the IOMMU's page tables, allocated while it maps the pages
                return "iommu", f"{name} under {iommu}"
            if migrate:
                bound, name = "migration", f"{name} under {migrate}"
        if bound == "migration":
            compact = next((f for f in outer if f in _COMPACT), None)
            if compact:
                return "compaction", f"{name.split(' under ')[0]} under {compact}"
        if bound == "lock wait":
            return _lock_bound(names, frames, i)
        return bound, name
    return None, (names[0] if names else None)


def _lock_bound(names: list[str], frames: list[str], i: int) -> tuple[str, str]:
    """A lock wait is named by the code that takes the lock: the first frame out of the lock
    primitives. The mm's mmap_lock (taken by get_user_pages' callers, os_lock_user_pages among
    them, mlock, the fault path) is the convoy behind a pin ('lock wait', catalog 6); a lock taken
    by the NVIDIA driver's own code is its lock ('driver-lock'); one taken inside IOMMU mapping,
    reclaim, compaction or migration is part of that work."""
    for j in range(i + 1, len(names)):
        caller, name = names[j], names[j - 1]  # the caller, and the lock call it made
        if caller in _MM_LOCK:
            return "lock wait", f"{name} under {caller} (the mmap_lock)"
        if caller in _LOCK:
            continue
        outer = _bound_of(caller, frames[j])
        if outer in ("iommu", "reclaim", "compaction", "migration"):
            return outer, f"{name} under {caller}"
        if is_nvidia(frames[j]):
            return "driver-lock", f"{name} under {caller}"
        return "lock wait", f"{name} under {caller}"
    return "lock wait", names[-1]


def in_pin_path(frames: list[str]) -> bool:
    """Whether a thread with this stack is inside a pin: get_user_pages and its callers
    (pin_user_pages, mlock, MADV_POPULATE), or the driver's pin and page allocation."""
    names = list(map(normalize, frames))
    if any(_MUNLOCK_CALL.match(n) for n in names):  # munlock walks the same mlock_fixup: the undo, not a pin
        return False
    return any(n in _PIN or n in _DRIVER_PIN or _MLOCK_CALL.match(n) for n in names)


def pin_kind(frames: list[str]) -> str | None:
    """Which call: 'register' (the driver's pin_user_pages), 'hostalloc' (the driver allocates
    pages), 'mlock', 'populate' (MADV_POPULATE, MAP_POPULATE), or None."""
    names = set(map(normalize, frames))
    if "os_lock_user_pages" in names or "RmCreateOsDescriptor" in names:
        return "register"
    if names & {"nv_alloc_system_pages", "nv_alloc_pages", "nv_alloc_contig_pages"}:
        return "hostalloc"
    if names & {"do_mlock", "apply_mlockall_flags", "mlock_fixup"} or any(_MLOCK_CALL.match(n) for n in names):
        return "mlock"
    if names & {"faultin_page_range", "__mm_populate", "populate_vma_page_range"}:
        return "populate"
    if names & {"pin_user_pages", "pin_user_pages_fast", "__gup_longterm_locked"}:
        return "pin"
    return None
