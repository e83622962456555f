"""The failure catalog: every known way pinning host memory for a GPU fails or stalls, in one place.

Each entry says what preflight predicts from node facts (`condition`), how the failure looks
while it happens (CUDA errors by enum name, errno names, and the names of the watch bounds
that show it), the remedy, and the primary source the rule rests on. The preflight checks
decide with these conditions and the boundary rules below; repro's failed-pin diagnosis
(`diagnose_failed_pin`) reads the same rules, so the two cannot drift apart.

Corrected from MISSION.md where measurement said so (H200, open driver 580.159.04, kernel
6.18, cgroup v2): cudaHostAlloc IS charged to the cgroup, as shmem (12); it shows as
Shmem/RssShmem and both methods show in pins outstanding (16); the driver's tables cost 48 B
per 4 KiB page for both methods (DRIVER_BYTES_PER_PAGE).

>>> [e.id for e in for_bound("swap-in")], [e.id for e in for_bound("driver-lock")]
([1], [7])
>>> pin_cap_6_11("6.11.3"), pin_cap_6_11("6.11.0-1003-nvidia"), pin_cap_6_11("6.11.10"), pin_cap_6_11("6.12.1")
('upstream', 'distribution', None, None)
"""
from __future__ import annotations

import errno as _errno
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .kernel import parse_release

__all__ = ["Entry", "Facts", "ENTRIES", "BOUNDS", "entry", "for_bound", "for_check", "Diagnosis",
           "diagnose_failed_pin", "PinContext", "driver_uses_longterm", "pin_cap_6_11", "PIN_CAP_6_11_PAGES",
           "shared_file_refused", "per_call_page_limit", "PER_CALL_PAGE_LIMIT", "pools_apply",
           "registration_unnecessary", "DRIVER_BYTES_PER_PAGE", "CUDA_ERROR_CODES", "cuda_error_name",
           "LONGTERM_DRIVER", "FIX_6_11", "ALLOWED_SHARED_FS"]

# -- measured constants ---------------------------------------------------------------------
# The driver's own memory per pinned page, both methods: VmallocUsed rose 48.2 MiB for a touched
# 4 GiB cudaHostAlloc and 192.6 MiB for a 16 GiB cudaHostRegister (1,048,576 and 4,194,304
# pages: 48.2 and 48.1 B per page) on the H200 (open 580.159.04, kernel 6.18), each in a fresh
# process, against the process's own baseline; bench/gpu_pin_accounting.sh re-measures it with a
# control arm. Part of it is the page table nvos_create_alloc() kvzallocs since 580.65.06
# (struct nvidia_pte_t: 16 B per page), part the os_lock_user_pages array (8 B per page).
# Scaled to the node's page size: it is per page, whatever the page's size.
DRIVER_BYTES_PER_PAGE = 48

# -- boundary rules, each from a primary source ---------------------------------------------
# NVIDIA open-gpu-kernel-modules kernel-open/nvidia/os-mlock.c, os_lock_user_pages():
# 'gup_flags |= FOLL_LONGTERM' under '#if defined(NVCPU_FAMILY_X86) && defined(NV_FOLL_LONGTERM_PRESENT)',
# first in tag 550.67 (commit 3bf16b890, 2024-03-19); absent in every earlier tag (550.54.15 and older).
LONGTERM_DRIVER = (550, 67)
# linux mm/gup.c: 53ba78de064b ("mm/gup: introduce check_and_migrate_movable_folios()", 6.11-rc1)
# kmalloc_array()s a folio pointer per pinned page for FOLL_LONGTERM pins; past KMALLOC_MAX_SIZE
# (4 MiB = 524,288 pointers on x86-64 with 4 KiB pages, MAX_PAGE_ORDER 10) it fails with -ENOMEM
# after the pages were pinned, and __gup_longterm_locked() returned without unpinning them (the
# leak "mm/gup: stop leaking pinned pages in low memory conditions" fixed). Fixed by 94efde1d1539
# ("mm/gup: avoid an unnecessary allocation call for FOLL_LONGTERM cases", John Hubbard), posted
# for linux-stable 6.11.y on 2024-11-17: upstream 6.11.0-6.11.9 have the bug, 6.11.10 and 6.12 not.
PIN_CAP_6_11_PAGES = 524_288
FIX_6_11 = (6, 11, 10)
# linux mm/gup.c writable_file_mapping_allowed() / check_vma_flags() ("mm/gup: disallow
# FOLL_LONGTERM GUP-nonfast writing to file-backed mappings", Lorenzo Stoakes, merged for 6.5):
# a writable FOLL_PIN|FOLL_LONGTERM pin of a shared file mapping whose file system needs dirty
# tracking fails (-EFAULT); shmem (tmpfs), hugetlbfs and ramfs need none and are allowed.
# check_vma_flags() also refuses every FOLL_LONGTERM pin of an fsdax mapping (-EOPNOTSUPP),
# read-only included.
SHARED_FILE_RULE = (6, 5)
ALLOWED_SHARED_FS = ("tmpfs", "hugetlbfs", "ramfs", "shmem")
# open-gpu-kernel-modules kernel-open/nvidia/nv.c nvos_create_alloc(): since 580.65.06 (tag;
# 575.64.05 still kept an array of pointers) the page table is one kvzalloc() of
# num_pages * sizeof(nvidia_pte_t) = 16 B per page, and kvmalloc refuses more than INT_MAX bytes
# (linux mm/util.c, "Don't even allow crazy sizes", since 5.14): 2^27 = 134,217,728 pages per call
# or more fail with "NVRM: failed to allocate page table", after the pin (registration) or at the
# allocation (cudaHostAlloc). That is 512 GiB with 4 KiB pages, 8 TiB with 64 KiB pages.
PER_CALL_DRIVER = (580, 65, 6)
PER_CALL_PAGE_LIMIT = 1 << 27
KVMALLOC_INT_MAX_KERNEL = (5, 14)
# open-gpu-kernel-modules kernel-open/nvidia/nv-reg.h NVreg_EnableSystemMemoryPools (tag 590.44.01):
# "only supported by OpenRM driver", default 0x211 (pools for 4 KiB, 64 KiB and 2 MiB pages:
# bit = page size >> 12); nv-vm.c registers a shrinker per pool ("nv-sysmem-alloc-node-%d-order-%u"),
# so pooled pages go back to the kernel under memory pressure.
POOLS_DRIVER = (590, 44)
POOLS_DEFAULT = 0x211

# CUDA runtime error enums the catalog names (cuda.bindings.runtime.cudaError_t; a test checks
# every name and number against the binding).
CUDA_ERROR_CODES = {
    "cudaErrorInvalidValue": 1, "cudaErrorMemoryAllocation": 2, "cudaErrorHostMemoryAlreadyRegistered": 712,
    "cudaErrorHostMemoryNotRegistered": 713, "cudaErrorNotSupported": 801,
}

BOUNDS = ("swap-in", "file-read", "fault-in/zeroing", "compaction", "migration", "reclaim", "iommu",
          "driver-lock", "lock wait", "driver", "cpu")
# bounds that are no failure of their own: a table read from disk goes at the disk's speed, and a
# pin that is busy on the CPU is doing the work it should
_UNCATALOGUED_BOUNDS = {"file-read": "the region's file pages are read from disk during the pin (not in "
                                     "the page cache): it goes at the disk's read speed; pre-read the file",
                        "cpu": "the pin is busy on the CPU walking and pinning pages: no known failure"}


@dataclass
class Facts:
    """What a catalog condition looks at: the node (from the readings) and the plan."""
    release: str | None = None
    machine: str | None = None          # the driver's or the node's architecture (x86_64, aarch64)
    page_size: int = 4096
    driver_loaded: bool | None = None
    driver_version: tuple[int, ...] | None = None
    driver_open: bool | None = None
    driver_params: dict[str, str] = field(default_factory=dict)
    method: str = "register"
    per_call_bytes: int | None = None
    source: str = "anon"
    map: str = "private"
    readonly: bool = False
    file_fs: str | None = None          # file system of a file-backed region (tmpfs, ext4, xfs, ...)
    file_dax: bool = False
    need_bytes: int | None = None       # the plan with tables and reserve
    available_bytes: int | None = None  # MemAvailable - margin
    cgroup_headroom_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_threshold_bytes: int | None = None
    thp_region: bool = False
    huge_supply_bytes: int | None = None  # free huge blocks plus memory not yet in the buddy allocator
    fragmented: bool | None = None        # extfrag index above vm.extfrag_threshold
    movable_bytes: int = 0
    cma_bytes: int = 0
    hotplug_movable: bool = False
    hung_task_panic: bool = False
    gpu_cotenants: int = 0
    pins_outstanding_bytes: int | None = None
    allocator: str = "cuda"               # torch: the plan pins through PyTorch's caching host allocator
    torch_rounding_bytes: int | None = None  # what PyTorch pins beyond the request, per rank (diag.torchalloc)
    iommu_translated: bool | None = None
    remote_numa: bool | None = None
    pageable_access: int | None = None
    host_page_tables: int | None = None

    @property
    def per_call_pages(self) -> int | None:
        return -(-self.per_call_bytes // self.page_size) if self.per_call_bytes else None

    @property
    def uses_gpu(self) -> bool:
        return self.method in ("register", "hostalloc")


# NVCPU_FAMILY_X86 in the driver's build; the others are families it builds for without FOLL_LONGTERM
X86_ARCHES = ("x86_64", "x86", "i686", "i386", "amd64")
OTHER_ARCHES = ("aarch64", "arm64", "ppc64le", "ppc64", "riscv64")


# -- the rules ------------------------------------------------------------------------------
def driver_uses_longterm(version: tuple[int, ...] | None, arch: str | None) -> bool | None:
    """Does this driver pin with FOLL_LONGTERM? x86 builds from 550.67 on; never on arm64.
    An architecture it cannot name (a damaged banner) is unknown, never 'no'."""
    if arch and arch not in X86_ARCHES:
        return False if arch in OTHER_ARCHES else None
    if not version:
        return None
    return tuple(version) >= LONGTERM_DRIVER if arch else (None if tuple(version) >= LONGTERM_DRIVER else False)


def pin_cap_6_11(release: str | None) -> str | None:
    """'upstream' (6.11.0-6.11.9 as released: the bug is there), 'distribution' (a 6.11 build whose
    suffix does not tell whether the fix was backported), or None (not affected)."""
    rel = parse_release(release or "")
    if rel is None or rel[:2] != (6, 11) or rel >= FIX_6_11:
        return None
    suffix = re.sub(r"^\d+\.\d+(\.\d+)?", "", release.strip())
    # 6.11-rcN is upstream too: the cap came in during the 6.11 merge window
    return "upstream" if re.fullmatch(r"(-rc\d+)?\+?", suffix) else "distribution"


def shared_file_refused(f: Facts) -> str | None:
    """Why a long-term pin of this file mapping is refused, or None."""
    if f.source not in ("file", "shm"):
        return None
    if f.file_dax:
        return "fsdax"
    rel = parse_release(f.release or "")
    fs = "tmpfs" if f.source == "shm" else f.file_fs
    if f.map == "shared" and not f.readonly and rel is not None and rel >= SHARED_FILE_RULE \
            and (fs or "unknown") not in ALLOWED_SHARED_FS:
        return "writable-shared"
    return None


def per_call_page_limit(f: Facts) -> bool:
    """True when one call is at or past the driver's page-table limit (2^27 pages)."""
    if not f.uses_gpu or not f.driver_version or tuple(f.driver_version) < PER_CALL_DRIVER:
        return False
    rel = parse_release(f.release or "")
    if rel is not None and rel < KVMALLOC_INT_MAX_KERNEL:
        return False
    return bool(f.per_call_pages and f.per_call_pages >= PER_CALL_PAGE_LIMIT)


def pools_apply(f: Facts) -> bool:
    """Driver system-memory pools hold this plan's freed pages (open module, hostalloc, the
    pool for the node's page size enabled)."""
    if f.method != "hostalloc" or not f.driver_open or not f.driver_version:
        return False
    if tuple(f.driver_version) < POOLS_DRIVER:
        return False
    raw = f.driver_params.get("EnableSystemMemoryPools")
    value = POOLS_DEFAULT if raw in (None, "") else _int(raw)
    if value is None:
        return True  # damaged parameter: assume the default is on
    return bool(value & (f.page_size >> 12))


def registration_unnecessary(pageable_access: int | None, host_page_tables: int | None) -> bool:
    """The GPU reads pageable memory through the host's own page tables (ATS): registering is
    unnecessary. With PAGEABLE_MEMORY_ACCESS through HMM (host page tables 0) the GPU faults
    and migrates pages, and registration still pays off."""
    return pageable_access == 1 and host_page_tables == 1


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip(), 0)
    except (TypeError, ValueError):
        return None


def _longterm(f: Facts) -> bool | None:
    return driver_uses_longterm(f.driver_version, f.machine)


# -- entries ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    id: int
    title: str
    predicts: str                       # the node condition preflight predicts, in words
    check: str | None                   # the preflight check that evaluates it
    signature: str                      # how it looks while it happens
    cuda_errors: tuple[str, ...]
    errnos: tuple[str, ...]
    bounds: tuple[str, ...]
    remedy: str
    source: str
    condition: Callable[[Facts], bool | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("id", "title", "predicts", "check", "signature", "cuda_errors", "errnos",
                                              "bounds", "remedy", "source")}


def _gt(a, b) -> bool | None:
    return None if a is None or b is None else a > b


ENTRIES: tuple[Entry, ...] = (
    Entry(1, "swap-in stall",
          "swap in use beyond a small threshold, or a plan that cannot fit without swapping",
          "swap", "stack do_swap_page under pin_user_pages; pswpin rising; pin rate = swap-in rate", (), (),
          ("swap-in",),
          "MADV_WILLNEED on the region before pinning (reads swapped pages back in bulk); memory.swap.max=0 "
          "for the launcher's cgroup so the region is never swapped out; swapoff when there is room",
          "measured: 32 GiB region with 12.8 GiB in swap registered at swap-in speed on the H200 "
          "(shared/reference/h200-2026-11-30); mm/memory.c do_swap_page",
          lambda f: (f.swap_used_bytes or 0) > (f.swap_threshold_bytes or 0)
          or bool(_gt(f.need_bytes, f.available_bytes))),
    Entry(2, "fault-in / compaction",
          "a huge-page region larger than the huge pages the node can supply without compacting "
          "fragmented memory", "fragmentation",
          "compact_stall, thp_fault_fallback rising; stack try_to_compact_pages", (), (),
          ("fault-in/zeroing", "compaction"),
          "prefault the region before pinning; compact ahead of time (echo 1 > /proc/sys/vm/compact_memory); "
          "or cudaHostAlloc", "mm/vmstat.c fragmentation indices; mm/compaction.c compaction_suitable "
          "(vm.extfrag_threshold)",
          lambda f: bool(f.thp_region and f.fragmented and _gt(f.need_bytes, f.huge_supply_bytes))),
    Entry(3, "512 GiB per call",
          "driver >= 580.65.06 and one call of 2^27 pages or more (512 GiB with 4 KiB pages)", "driver",
          "cudaErrorMemoryAllocation after the whole pin; dmesg 'NVRM: failed to allocate page table'",
          ("cudaErrorMemoryAllocation",), (), ("driver",),
          "pin in chunks of at most 64 GiB (the launcher's calls; --chunk 64GiB)",
          "open-gpu-kernel-modules nv.c nvos_create_alloc (580.65.06: kvzalloc of 16 B per page); linux "
          "mm/util.c kvmalloc INT_MAX; vLLM #51080/#51081", per_call_page_limit),
    Entry(4, "6.11 long-term pin cap",
          "kernel 6.11.0-6.11.9 (upstream) or a 6.11 distribution build, a driver that pins with "
          "FOLL_LONGTERM, and one call above 2 GiB (524,288 pages)", "kernel",
          "cudaErrorInvalidValue above 2 GiB per call; the pages pinned before the failure stay pinned "
          "until reboot", ("cudaErrorInvalidValue",), ("ENOMEM",), (),
          "a kernel >= 6.11.10 or 6.12, or pin in calls of at most 2 GiB",
          "linux 53ba78de064b (bug), 94efde1d1539 (fix, 6.11.10); open-gpu-kernel-modules os-mlock.c",
          lambda f: bool(f.uses_gpu and pin_cap_6_11(f.release) and _longterm(f) is not False
                         and f.per_call_pages and f.per_call_pages > PIN_CAP_6_11_PAGES)),
    Entry(5, "movable/CMA migration",
          "populated ZONE_MOVABLE, CMA, or hot-added memory onlined movable", "zones",
          "pgmigrate_* rising, nr_foll_pin_released rising during the call", (), (), ("migration",),
          "allocate the region from normal zones (numactl --membind), online hot-added memory as online_kernel",
          "linux mm/gup.c check_and_migrate_movable_pages; folio_is_longterm_pinnable",
          lambda f: bool(f.movable_bytes or f.cma_bytes >= (1 << 30) or f.hotplug_movable)),
    Entry(6, "mmap_lock convoy",
          "hung_task_panic=1 (a long pin holds mmap_lock; other threads wait in D state)", "hung_task",
          "other threads in rwsem slowpath; reading the pinner's smaps/maps hangs", (), (), ("lock wait",),
          "kernel.hung_task_panic=0 on nodes that pin large regions, or pin in chunks",
          "kernel/hung_task.c; mm/gup.c holds mmap_read_lock for the whole call",
          lambda f: f.hung_task_panic),
    Entry(7, "node-wide driver lock",
          "other processes holding the GPUs, or other pinners with pages pinned", "cotenants",
          "concurrent pinners each far slower (2 x 47 GiB: 5-6 s each against 1 s alone on the H200)", (), (),
          ("driver-lock", "driver"),
          "pin one rank at a time, or start ranks after the others have pinned",
          "measured on the H200 (reference README: two processes registering 47 GiB at once); "
          "TensorRT-LLM #17773", lambda f: f.gpu_cotenants > 0),
    Entry(8, "headroom",
          "the plan (with the driver's tables and the reserve) beyond MemAvailable less the margin",
          "headroom", "OOM kill (the child dies by SIGKILL), swap-out of the region",
          ("cudaErrorMemoryAllocation",), ("ENOMEM", "EAGAIN"), ("reclaim",),
          "free memory or shrink the plan", "linux Documentation/filesystems/proc.rst (MemAvailable)",
          lambda f: _gt(f.need_bytes, f.available_bytes)),
    Entry(9, "read-only / shared file mapping",
          "a writable long-term pin of a MAP_SHARED file on a file system that needs dirty tracking "
          "(kernel >= 6.5), any long-term pin of fsdax, or read-only registration unsupported", "kernel",
          "cudaErrorInvalidValue at once (EFAULT in the kernel), cudaErrorNotSupported for the read-only flag",
          ("cudaErrorInvalidValue", "cudaErrorNotSupported"), ("EFAULT", "EOPNOTSUPP"), (),
          "register with cudaHostRegisterReadOnly, map the file MAP_PRIVATE, or copy the table to /dev/shm",
          "linux mm/gup.c writable_file_mapping_allowed, check_vma_flags (6.5); measured on the H200: 2 GiB "
          "MAP_SHARED file, cudaErrorInvalidValue; read-only flag succeeds; vllm-omni #6240",
          lambda f: bool(f.uses_gpu and _longterm(f) is not False and shared_file_refused(f))),
    Entry(10, "double registration", "not predictable from the node: overlapping ranges in the launcher",
          None, "the second call fails at once", ("cudaErrorHostMemoryAlreadyRegistered",), (), (),
          "register each range once (cudaHostUnregister before registering it again)",
          "CUDA runtime API cudaHostRegister; measured on the H200 (712 for the same 64 MiB twice)", None),
    Entry(11, "page-pool hoarding",
          "open driver >= 590.44 with system-memory pools on, for cudaHostAlloc", "driver",
          "MemAvailable does not come back after cudaFreeHost (pooled pages are reclaimable by the shrinker)",
          (), (), (), "NVreg_EnableSystemMemoryPools=0 to return freed pages at once",
          "open-gpu-kernel-modules nv-reg.h NVreg_EnableSystemMemoryPools, nv-vm.c shrinker (590.44.01)",
          pools_apply),
    Entry(12, "container limit",
          "the plan beyond the cgroup's limit less its working set (every method is charged: registered "
          "pages as the region's own, cudaHostAlloc pages as shmem)", "headroom",
          "memory.events oom_kill; the child dies by SIGKILL", ("cudaErrorMemoryAllocation",), ("ENOMEM",),
          ("reclaim",), "raise the cgroup's memory limit, or shrink the plan",
          "measured on the H200: a touched 4 GiB cudaHostAlloc raised memory.current by 4,113 MiB "
          "(memory.stat shmem +4,096 MiB); linux Documentation/admin-guide/cgroup-v2.rst",
          lambda f: _gt(f.need_bytes, f.cgroup_headroom_bytes)),
    Entry(13, "IOMMU cost", "the GPUs' IOMMU domain translates DMA (DMA, DMA-FQ)", "iommu",
          "stack iommu_dma_map_sg; slow unregister", (), (), ("iommu",), "boot with iommu=pt",
          "linux drivers/iommu/dma-iommu.c; the reference H200 runs a Translated domain",
          lambda f: f.iommu_translated),
    Entry(14, "remote NUMA", "ranks sharing a GPU's NUMA node need more than that node has free", "numa",
          "numa_miss rising", (), (), (), "bind each rank to its GPU's node and free memory there",
          "linux Documentation/admin-guide/mm/numa_memory_policy.rst", lambda f: f.remote_numa),
    Entry(15, "staging pool", "not predictable from the node: pageable copies leave driver staging memory",
          None, "in use higher after copies beyond a control arm, RSS unchanged", (), (), (),
          "measure it (hostpin repro staging) and reserve it per rank (--reserve)",
          "seed fast-load-doc; on the H200 0-1 MiB once per-CPU free lists are counted", None),
    Entry(16, "invisible pins",
          "always: driver-pinned memory is not in VmLck/Mlocked (cudaHostAlloc shows as Shmem/RssShmem; "
          "both methods show in pins outstanding)", "headroom",
          "VmLck 0 while MemAvailable fell; nr_foll_pin_acquired - nr_foll_pin_released rose", (), (), (),
          "watch MemAvailable and pins outstanding, never locked memory",
          "measured on the H200: VmLck/VmPin 0 for every registered or cudaHostAlloc'd byte; Shmem, Mapped, "
          "RssShmem and pins outstanding +4,096 MiB for a 4 GiB cudaHostAlloc", lambda f: f.uses_gpu),
    Entry(17, "read-only pin of a cold private file mapping",
          "cudaHostRegisterReadOnly of a MAP_PRIVATE file mapping whose pages are not in the page cache "
          "(seen on kernel 6.18.44 with open driver 580.159.04; other versions not measured)", "kernel",
          "the registering thread runs in the kernel (R, no readable stack) faulting ~1.3M pages a second for "
          "minutes while nothing is read, allocated or pinned: a fault loop", (), (), ("fault-in/zeroing",),
          "register the MAP_PRIVATE mapping with default flags (its writes are private copies: the file is never "
          "written; measured: 4 GiB cold in 3.0 s), or read the file into the page cache first (vmtouch -t, or cat "
          "FILE > /dev/null; measured warm: 2 GiB read-only in 1.2 s)",
          "measured on the H200 (6.18.44, 580.159.04): 4 GiB and 16 GiB cold files, read-only flag, with and without a "
          "read throttle, 1% pinned in 30 s and 0% in 200 s (tests/fixtures/h200-repro-file-throttled, "
          "bench/gpu_watch_stuck.py); a hypothesis about this kernel and driver until measured elsewhere",
          lambda f: bool(f.uses_gpu and f.method == "register" and f.source == "file" and f.map == "private"
                         and f.readonly)),
    Entry(18, "allocator rounding",
          "a plan pinned through PyTorch (--allocator torch) whose request is not a power of two: PyTorch's caching "
          "host allocator asks the driver for the next power of two (from 1.11), up to twice the request, and keeps "
          "a freed block pinned in its cache", "headroom",
          "RssShmem (cudaHostAlloc) or RssAnon and pins outstanding (pinned_use_cuda_host_register) grow past the "
          "request; memory.events oom_kill for a plan the raw size fits", ("cudaErrorMemoryAllocation",), (), (),
          "plan with --allocator torch; ask for a power of two, or pin the exact size outside the cache "
          "(cudaHostAlloc, or mmap + torch.cuda.cudart().cudaHostRegister), or from PyTorch 2.13 "
          "pinned_max_round_threshold_mb below the size; torch._C._host_emptyCache() returns freed blocks",
          "aten/src/ATen/core/CachingHostAllocator.h CachingHostAllocatorImpl::allocate (c10::llvm::PowerOf2Ceil), "
          "aten/src/ATen/cuda/CachingHostAllocator.cpp allocate_host_memory / allocWithCudaHostRegister, "
          "c10/cuda/CUDAAllocatorConfig.cpp (the rules by version: diag/torchalloc.py plan_request); measured on the "
          "H200 (torch 2.11): torch.empty(47 GiB, pin_memory=True) grew RssShmem by 63.1 GiB, two 47.2 GiB ranks "
          "OOM-killed in a 110 GiB cgroup; pytorch#95823, #150517",
          lambda f: bool(f.allocator == "torch" and (f.torch_rounding_bytes or 0) > 0)),
)

_BY_ID = {e.id: e for e in ENTRIES}


def entry(entry_id: int) -> Entry:
    return _BY_ID[entry_id]


def for_bound(name: str) -> tuple[Entry, ...]:
    """The entries a watch bound shows live. ValueError for a name that is no bound."""
    if name not in BOUNDS:
        raise ValueError(f"{name!r} is not a watch bound; one of {', '.join(BOUNDS)}")
    return tuple(e for e in ENTRIES if name in e.bounds)


def bound_note(name: str) -> str | None:
    """What a bound with no catalog entry means ('file-read', 'cpu')."""
    return _UNCATALOGUED_BOUNDS.get(name)


def for_check(check_id: str) -> tuple[Entry, ...]:
    return tuple(e for e in ENTRIES if e.check == check_id)


def cuda_error_name(name: str | None, code: int | None) -> str | None:
    """'cudaErrorInvalidValue' from 'cudaErrorInvalidValue (1)' or from the code alone."""
    if name:
        enum = str(name).split(" (", 1)[0].strip()
        if enum:
            return enum
    if code is None:
        return None
    return next((n for n, c in CUDA_ERROR_CODES.items() if c == code), None)


# -- failed-pin diagnosis ---------------------------------------------------------------------
@dataclass
class PinContext:
    """What a failed pin's diagnosis needs besides the error: the plan and the node it ran on."""
    method: str = "register"
    register_flags: str = "default"
    source: str = "anon"                 # anon | shm | file (a 'file:PATH' source is file)
    map: str = "private"
    per_call_bytes: int | None = None
    page_size: int = 4096
    release: str | None = None
    driver_version: tuple[int, ...] | None = None
    machine: str | None = None
    file_fs: str | None = None
    oom_kills: int | None = None         # the cgroup's memory.events oom_kill delta, when known

    def facts(self) -> Facts:
        return Facts(release=self.release, machine=self.machine, page_size=self.page_size,
                     driver_version=self.driver_version, method=self.method, per_call_bytes=self.per_call_bytes,
                     source="file" if self.source.startswith("file") else self.source, map=self.map,
                     readonly=self.register_flags == "readonly", file_fs=self.file_fs)


@dataclass
class Diagnosis:
    entry: int
    meaning: str

    def as_tuple(self) -> tuple[int, str]:
        return self.entry, self.meaning


def diagnose_failed_pin(failure: dict, ctx: PinContext) -> Diagnosis | None:
    """The catalog entry a failed pin matches. failure: {'call', 'code', 'name'} of a CUDA or libc
    call, or {'signal': 9} for a child that died. None when no entry explains it."""
    f = ctx.facts()
    call = str(failure.get("call") or "")
    code = failure.get("code")
    signal = failure.get("signal")
    if signal == 9:
        why = (f"the cgroup recorded {ctx.oom_kills} OOM kill(s)" if ctx.oom_kills else
               "killed by SIGKILL, which is what the OOM killer sends; dmesg says which")
        return Diagnosis(8, f"the child was killed: out of memory ({why})")
    if call.startswith("cuda"):
        enum = cuda_error_name(failure.get("name"), code)
        if enum == "cudaErrorHostMemoryAlreadyRegistered":
            return Diagnosis(10, "the range, or part of it, is already registered (double registration)")
        if enum == "cudaErrorNotSupported" and ctx.register_flags == "readonly":
            return Diagnosis(9, "read-only registration is not supported by this device/driver")
        if enum == "cudaErrorInvalidValue":
            refused = shared_file_refused(f)
            if refused == "fsdax":
                return Diagnosis(9, "a long-term pin of an fsdax mapping, which the kernel refuses even read-only")
            if refused == "writable-shared" or (f.source == "file" and f.map == "shared" and not f.readonly
                                                 and f.release is None):
                when = "" if f.release else " (kernel release not recorded: this holds from 6.5 on)"
                return Diagnosis(9, "a writable long-term pin of a MAP_SHARED file mapping, which the kernel "
                                    f"refuses since 6.5{when}; register it with --register-flags readonly or "
                                    "map it private")
            if pin_cap_6_11(f.release) and f.per_call_pages and f.per_call_pages > PIN_CAP_6_11_PAGES:
                return Diagnosis(4, "kernel 6.11 fails long-term pins above 2 GiB; the pages pinned before the "
                                    "failure stay pinned until reboot")
        if enum == "cudaErrorMemoryAllocation":
            if f.per_call_pages and f.per_call_pages >= PER_CALL_PAGE_LIMIT and (
                    not f.driver_version or tuple(f.driver_version) >= PER_CALL_DRIVER):
                return Diagnosis(3, f"one call of {f.per_call_pages:,} pages (>= 2^27) fails on driver >= "
                                    "580.65.06; pin in chunks of <= 64 GiB")
            if ctx.oom_kills:
                return Diagnosis(12, "the container's memory limit was reached")
            return Diagnosis(8, "out of memory for the pinned region or the driver's page tables")
    if call == "mlock":
        name = _errno.errorcode.get(code) if isinstance(code, int) else None
        if name == "ENOMEM":
            return Diagnosis(8, "RLIMIT_MEMLOCK is below the region, or memory ran out")
        if name == "EAGAIN":
            return Diagnosis(8, "some pages could not be locked (memory ran out)")
        if name == "EPERM":
            return None
    return None
