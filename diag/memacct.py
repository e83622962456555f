"""Memory accounting: what holds free pages out of MemAvailable, and where used memory sits.

`MemTotal - MemAvailable` moves on its own. On 6.x kernels these are the known reasons, each
read here from the kernel's own counters (sources named where they are used):

- per-CPU free lists (pagesets): a freed page parked on a CPU's list is not in NR_FREE_PAGES,
  so neither MemFree nor MemAvailable counts it (mm/page_alloc.c free_unref_page ->
  free_pcppages_bulk; mm/show_mem.c show_free_areas prints them apart as free_pcp). Since 6.7
  the lists' high mark tunes itself between high_min and high_max and decays by a fifth per
  vmstat interval (mm/page_alloc.c decay_pcp_high, called from mm/vmstat.c
  refresh_cpu_vm_stats), so they grow and shrink by hundreds of MiB with no one allocating.
  /proc/zoneinfo prints every CPU's `count:` (mm/vmstat.c zoneinfo_show_print). Corrected.
- watermark boost: MemAvailable subtracts min(page cache / 2, low watermark) and the same for
  reclaimable slab (mm/show_mem.c si_mem_available), and the low watermark includes
  zone->watermark_boost (include/linux/mmzone.h low_wmark_pages), which fragmentation events
  raise and kswapd clears. Corrected: the part of those two cuts that the boost adds.
- per-CPU counter deltas: NR_FREE_PAGES and the LRU counters are folded from per-CPU diffs of
  up to `vm stats threshold` pages each, once per vm.stat_interval (mm/vmstat.c
  refresh_cpu_vm_stats). Reported as a bound; a caller that may act can fold them first
  through /proc/sys/vm/stat_refresh (root; repro does, diag never writes or triggers it).
- free page reporting (virtio-balloon REPORTING): a pass isolates free blocks of order
  >= page_reporting_order from the buddy lists while the host takes them back, 2 s after a
  large free (mm/page_reporting.c page_reporting_cycle, PAGE_REPORTING_DELAY), so MemFree
  dips by up to 64 MiB upstream (128 MiB seen on the CI VM) for tens of milliseconds.
  Reported (whether it is active, and the counters a patched kernel exposes); a reading taken
  during a pass is caught by settling.
- deferred split THPs: a partly unmapped huge page stays whole on the split queue until a
  shrinker splits it (mm/huge_memory.c deferred_split_folio), held but in no process's RSS.
  Reported: nr_anon_partially_mapped per mTHP size (6.11+), thp_deferred_split_page.
- lazily freed pages (MADV_FREE): still mapped and in RSS, but moved to the inactive file
  list (mm/swap.c lru_lazyfree), so MemAvailable already counts them as free. Reported:
  pglazyfree / pglazyfreed, and LazyFree in a process's smaps (the caller's).
- unaccepted memory (confidential VMs) is counted in NR_FREE_PAGES both before and after it is
  accepted (mm/page_alloc.c __free_unaccepted, try_to_accept_memory_one): not a confounder.
- memory-cgroup charge batching: up to MEMCG_CHARGE_BATCH (64) pages per CPU are charged
  ahead (mm/memcontrol.c consume_stock), so memory.current moves in such steps.
- free pages in high-atomic reserves stay in NR_FREE_PAGES; only the watermark checks discount
  them (mm/page_alloc.c __zone_watermark_unusable_free): not a confounder of MemAvailable.
- on the CI VM's kernel (6.18.44-fc, patched page reporting) /proc/vmstat nr_free_pages stays
  gigabytes below MemFree: reported pages are kept outside that counter. Readings therefore take
  MemTotal, MemFree and MemAvailable from /proc/meminfo only.

One `reading()` is a plain dict (JSON as it is): the figures above, /proc/meminfo's VmallocUsed,
Shmem, Unevictable, SUnreclaim and the other kernel users, pins outstanding
(nr_foll_pin_acquired - nr_foll_pin_released) and the memory cgroup's current and stat.
`corrected_in_use()` turns it into in-use bytes without the confounders.

>>> z = parse_pagesets("Node 0, zone   Normal\\n  pages free     10\\n        boost    2\\n        low      70\\n"
...                     "  pagesets\\n    cpu: 0\\n              count:    31\\n              high:     60\\n"
...                     "  vm stats threshold: 10\\n    cpu: 1\\n              count:    1\\n")
>>> z[0]["count"], z[0]["cpus"], z[0]["boost"], z[0]["low"], z[0]["stat_threshold"]
(32, 2, 2, 70, 10)
"""
from __future__ import annotations

import re
from typing import Any

from .cgroup import read_cgroup_memory
from .meminfo import parse_meminfo
from .rootfs import Root
from .units import PAGE_SIZE
from .vmstat import parse_vmstat

__all__ = ["parse_pagesets", "pageset_totals", "boost_effect_pages", "reading", "corrections", "corrected_in_use",
           "in_use", "memcg_dir", "MEMINFO_KEYS", "KERNEL_KEYS", "VMSTAT_KEYS", "page_reporting_active"]

# /proc/meminfo fields a reading keeps (bytes)
MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Shmem", "Unevictable", "Mlocked", "SUnreclaim",
                "SReclaimable", "KernelStack", "PageTables", "SecPageTables", "Percpu", "VmallocUsed", "AnonPages",
                "Unaccepted")
# the kernel's own memory in /proc/meminfo: what "kernel" means in an attribution (vmalloc apart)
KERNEL_KEYS = ("SUnreclaim", "KernelStack", "PageTables", "SecPageTables", "Percpu")
# /proc/vmstat counters a reading keeps (pages or events)
VMSTAT_KEYS = ("nr_foll_pin_acquired", "nr_foll_pin_released", "nr_active_file", "nr_inactive_file",
               "nr_slab_reclaimable", "nr_kernel_misc_reclaimable", "nr_free_pages", "thp_deferred_split_page",
               "pglazyfree", "pglazyfreed", "nr_iommu_pages", "nr_balloon_pages")

_ZONE_RE = re.compile(r"^Node\s+(\d+),\s*zone\s+(\S+)")
_PAGESET_FIELDS = ("count", "high", "batch", "high_min", "high_max")


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_pagesets(text: str) -> list[dict[str, Any]]:
    """Per zone of /proc/zoneinfo: the sums over CPUs of the pagesets' count/high/high_min/high_max
    (pages), the CPUs listed, the vm stats threshold (largest of the CPUs'), boost and low
    watermark. Lines it cannot read are skipped; a field a kernel does not print stays None
    (high_min/high_max: 6.7+)."""
    zones: list[dict[str, Any]] = []
    zone: dict[str, Any] | None = None
    in_pagesets = False
    for line in text.splitlines():
        m = _ZONE_RE.match(line)
        if m:
            zone = {"node": int(m.group(1)), "zone": m.group(2), "cpus": 0, "boost": None, "low": None,
                    "stat_threshold": None, **{k: None for k in _PAGESET_FIELDS}}
            zones.append(zone)
            in_pagesets = False
            continue
        if zone is None:
            continue
        parts = line.replace(":", " ").split()
        if not parts:
            continue
        if parts[0] == "pagesets":
            in_pagesets = True
        elif in_pagesets and parts[0] == "cpu":
            zone["cpus"] += 1
        elif in_pagesets and parts[0] in _PAGESET_FIELDS and len(parts) == 2 and _int(parts[1]) is not None:
            zone[parts[0]] = (zone[parts[0]] or 0) + int(parts[1])
        elif in_pagesets and parts[:3] == ["vm", "stats", "threshold"] and len(parts) == 4 and _int(parts[3]) is not None:
            zone["stat_threshold"] = max(zone["stat_threshold"] or 0, int(parts[3]))
        elif not in_pagesets and parts[0] in ("boost", "low") and len(parts) == 2 and _int(parts[1]) is not None:
            zone[parts[0]] = int(parts[1])
    return zones


def pageset_totals(zones: list[dict[str, Any]]) -> dict[str, int | None]:
    """Over all zones: pages on per-CPU lists and their high marks, boost and low watermark
    (low includes the boost, as the kernel prints it), and the bound on per-CPU counter drift
    of one counter (sum over zones of CPUs x threshold). A field no zone printed is None."""
    def total(key: str) -> int | None:
        values = [z[key] for z in zones if z[key] is not None]
        return sum(values) if values else None

    drift = [z["cpus"] * z["stat_threshold"] for z in zones if z["stat_threshold"] is not None]
    return {"pcp_pages": total("count"), "pcp_high_pages": total("high"), "pcp_high_min_pages": total("high_min"),
            "pcp_high_max_pages": total("high_max"), "boost_pages": total("boost"), "low_pages": total("low"),
            "stat_drift_pages": sum(drift) if drift else None}


def boost_effect_pages(pagecache: int, reclaimable: int, low: int, boost: int) -> int:
    """Pages MemAvailable loses to the watermark boost (mm/show_mem.c si_mem_available cuts
    min(x / 2, low watermark) off page cache and off reclaimable kernel memory; low includes
    the boost).

    >>> boost_effect_pages(pagecache=100_000, reclaimable=20_000, low=7_000, boost=2_000)
    4000
    >>> boost_effect_pages(pagecache=100_000, reclaimable=20_000, low=7_000, boost=0)
    0
    """
    def cut(pages: int, wmark: int) -> int:
        return min(pages // 2, max(0, wmark))

    return (cut(pagecache, low) - cut(pagecache, low - boost)) + (cut(reclaimable, low) - cut(reclaimable, low - boost))


def memcg_dir(root: Root) -> tuple[int, str] | None:
    """(cgroup version, directory relative to root) of this process's memory cgroup, or None."""
    cg = read_cgroup_memory(root)
    return (cg.version, cg.dir) if cg is not None else None


def _memcg_figures(root: Root, version: int, d: str) -> dict[str, int | None]:
    """memory.current and the memory.stat fields that say where a charge sits (bytes). v1 has
    no vmalloc or percpu line; its kernel memory is memory.kmem.usage_in_bytes."""
    stat = parse_vmstat(root.read_fresh(f"{d}/memory.stat") or "")
    if version == 2:
        out = {"current": _int((root.read_fresh(f"{d}/memory.current") or "").strip())}
        out.update({k: stat.get(k) for k in ("anon", "shmem", "file", "kernel", "vmalloc", "percpu")})
        return out
    return {"current": _int((root.read_fresh(f"{d}/memory.usage_in_bytes") or "").strip()),
            "anon": stat.get("rss"), "shmem": stat.get("shmem"), "file": stat.get("cache"),
            "kernel": _int((root.read_fresh(f"{d}/memory.kmem.usage_in_bytes") or "").strip()),
            "vmalloc": None, "percpu": None}


_MTHP = "sys/kernel/mm/transparent_hugepage"
_REPORTING = "sys/module/page_reporting/parameters"


def _partially_mapped_bytes(root: Root) -> int | None:
    """Bytes of huge pages that wait, partly unmapped, on the deferred split queue: the sum over
    mTHP sizes of nr_anon_partially_mapped x size (6.11+; None before). An upper bound on what
    they hold that no process maps."""
    total = None
    for name in root.listdir(_MTHP):
        m = re.fullmatch(r"hugepages-(\d+)kB", name)
        if m:
            value = _int((root.read_fresh(f"{_MTHP}/{name}/stats/nr_anon_partially_mapped") or "").strip())
            if value is not None:
                total = (total or 0) + value * int(m.group(1)) * 1024
    return total


def _page_reporting(root: Root) -> dict[str, int]:
    """The numeric page_reporting module parameters (upstream: page_reporting_order; patched
    kernels add counters such as reported_kib and passes)."""
    out = {}
    for name in root.listdir(_REPORTING):
        value = _int((root.read_fresh(f"{_REPORTING}/{name}") or "").strip())
        if value is not None:
            out[name] = value
    return out


def page_reporting_active(root: Root) -> bool | None:
    """Whether a virtio-balloon device offers free page reporting (feature bit 5,
    VIRTIO_BALLOON_F_REPORTING) to its bound driver; None when no virtio bus is visible."""
    base = "sys/bus/virtio/devices"
    names = root.listdir(base)
    if not names:
        return None
    for name in names:
        if (root.read_fresh(f"{base}/{name}/device") or "").strip() == "0x0005":
            features = (root.read_fresh(f"{base}/{name}/features") or "").strip()
            if len(features) > 5 and features[5] == "1":
                return True
    return False


def reading(root: Root, cgroup: tuple[int, str] | None = None, page_size: int = PAGE_SIZE) -> dict[str, Any]:
    """One reading of everything above, read fresh (no evidence copy): meminfo, zoneinfo,
    vmstat, mTHP and page reporting counters, and the memory cgroup (version, dir) if given."""
    meminfo = parse_meminfo(root.read_fresh("proc/meminfo") or "").raw
    zones = parse_pagesets(root.read_fresh("proc/zoneinfo") or "")
    vmstat = parse_vmstat(root.read_fresh("proc/vmstat") or "")
    out: dict[str, Any] = {"page_size": page_size, "meminfo": {k: meminfo[k] for k in MEMINFO_KEYS if k in meminfo},
                           "vmstat": {k: vmstat[k] for k in VMSTAT_KEYS if k in vmstat}, **pageset_totals(zones)}
    out["thp_partially_mapped_bytes"] = _partially_mapped_bytes(root)
    out["page_reporting"] = _page_reporting(root)
    if cgroup is not None:
        out["cgroup"] = {"version": cgroup[0], **_memcg_figures(root, *cgroup)}
    return out


def in_use(r: dict[str, Any]) -> int | None:
    """MemTotal - MemAvailable (bytes), as every earlier hostpin figure was made."""
    m = r.get("meminfo") or {}
    if m.get("MemTotal") is None or m.get("MemAvailable") is None:
        return None
    return m["MemTotal"] - m["MemAvailable"]


def corrections(r: dict[str, Any]) -> dict[str, int | None]:
    """Bytes that in-use (MemTotal - MemAvailable) holds for the kernel's bookkeeping, by kind;
    None where the reading lacks what the correction needs."""
    size = r.get("page_size") or PAGE_SIZE
    pcp = r.get("pcp_pages")
    out: dict[str, int | None] = {"per_cpu_lists": pcp * size if pcp is not None else None}
    v = r.get("vmstat") or {}
    need = ("nr_active_file", "nr_inactive_file", "nr_slab_reclaimable")
    if r.get("boost_pages") is not None and r.get("low_pages") is not None and all(k in v for k in need):
        pages = boost_effect_pages(v["nr_active_file"] + v["nr_inactive_file"],
                                   v["nr_slab_reclaimable"] + v.get("nr_kernel_misc_reclaimable", 0),
                                   r["low_pages"], r["boost_pages"])
        out["watermark_boost"] = pages * size
    else:
        out["watermark_boost"] = None
    return out


def corrected_in_use(r: dict[str, Any]) -> int | None:
    """In use without the per-CPU free lists and the watermark boost's share (bytes); None when
    the reading has no per-CPU counts (then nothing can be corrected)."""
    raw = in_use(r)
    c = corrections(r)
    if raw is None or c["per_cpu_lists"] is None:
        return None
    return raw - c["per_cpu_lists"] - (c["watermark_boost"] or 0)
