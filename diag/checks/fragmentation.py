"""Page allocator checks: order-9 fragmentation and THP policy (catalog 2), zones (5)."""
from __future__ import annotations

from ..buddyinfo import THP_ORDER, fragmentation_index, free_bytes_at_or_above, unusable_free_index
from ..units import GiB, format_bytes
from . import PASS, SKIP, WARN, Context, Verdict, register


def thp_region(ctx: Context) -> bool:
    """Will the plan's region be backed by huge pages? hostalloc: the driver allocates, no."""
    if ctx.plan.method == "hostalloc" or not ctx.thp.available or ctx.thp.enabled == "never":
        return False
    if ctx.plan.thp is not None:
        return ctx.plan.thp
    return ctx.thp.enabled in ("always", "madvise")


@register("fragmentation", "Free huge-page-sized blocks (order >= 9)", needs=("buddyinfo",), catalog=(2,))
def fragmentation(ctx: Context) -> Verdict:
    zones = ctx.buddyinfo
    per_zone = [{"node": z.node, "zone": z.zone, "free_bytes": z.free_bytes,
                 "free_order9_bytes": free_bytes_at_or_above(z.counts, THP_ORDER),
                 "unusable_index_order9": unusable_free_index(z.counts, THP_ORDER),
                 "fragmentation_index_order9": fragmentation_index(z.counts, THP_ORDER)} for z in zones]
    free_o9 = sum(z["free_order9_bytes"] for z in per_zone)
    free_all = sum(z["free_bytes"] for z in per_zone)
    vm = ctx.vmstat or {}
    counters = {k: vm.get(k) for k in ("compact_stall", "compact_fail", "compact_success", "thp_fault_alloc",
                                       "thp_fault_fallback", "thp_collapse_alloc_failed")}
    # user allocations come from Normal first (then fall back to DMA32): report that zone's index
    normal = next((z for z in per_zone if z["zone"] == "Normal"), None) or max(
        per_zone, key=lambda z: z["free_bytes"], default=None)
    ev = {"zones": per_zone, "free_order9_bytes": free_o9, "free_bytes": free_all, "counters_since_boot": counters}
    notes = []
    if ctx.meminfo and ctx.meminfo.free_bytes and free_all < 0.5 * ctx.meminfo.free_bytes:
        # seen on VMs whose memory is onlined or initialised on demand (deferred_init, hotplug)
        notes.append(f"the buddy allocator holds {format_bytes(free_all)} of MemFree "
                     f"{format_bytes(ctx.meminfo.free_bytes)}: memory is onlined or initialised on demand")
    fallback, alloc = counters["thp_fault_fallback"] or 0, counters["thp_fault_alloc"] or 0
    if fallback + alloc >= 1000 and fallback > 0.2 * (fallback + alloc):
        notes.append(f"{fallback:,} of {fallback + alloc:,} THP faults since boot fell back to 4 KiB pages")
    ev["notes"] = notes
    index = normal["unusable_index_order9"] if normal else None
    head = (f"{format_bytes(free_o9)} free in order >= 9 blocks; unusable index at order 9 "
            f"{index:.3f} ({normal['zone']})" if normal else f"{format_bytes(free_o9)} free in order >= 9 blocks")
    tail = ("; " + "; ".join(notes)) if notes else ""
    if not thp_region(ctx) or not ctx.plan.size_bytes:
        why = "no size given" if not ctx.plan.size_bytes else "the region will not use huge pages"
        return Verdict(PASS, f"{head} ({why}){tail}", evidence=ev)
    need = ctx.plan.total_bytes
    ev["need_bytes"] = need
    if need > free_o9:
        defrag = ctx.thp.defrag
        how = ("faults will stall in direct compaction" if defrag in ("always", "madvise", "defer+madvise")
               else "faults will fall back to 4 KiB pages (defrag=%s)" % defrag)
        return Verdict(WARN, f"{head}; the THP region needs {format_bytes(need)}: {how}{tail}",
                       "prefault the region before pinning (hostpin repro register --prefault shows the cost), "
                       "compact ahead of time (echo 1 > /proc/sys/vm/compact_memory), or use cudaHostAlloc", ev)
    if index is not None and index > 0.5:
        return Verdict(WARN, f"{head}: more than half the free memory is in blocks too small for huge pages{tail}",
                       "compact ahead of time (echo 1 > /proc/sys/vm/compact_memory)", ev)
    return Verdict(PASS, f"{head}; covers the {format_bytes(need)} THP region{tail}", evidence=ev)


@register("thp", "Transparent huge page policy", needs=("thp",), catalog=(2,))
def thp_policy(ctx: Context) -> Verdict:
    t = ctx.thp
    ev = {"enabled": t.enabled, "defrag": t.defrag, "khugepaged_defrag": t.khugepaged_defrag,
          "shmem_enabled": t.shmem_enabled, "pmd_size_bytes": t.pmd_size_bytes}
    if not t.available:
        return Verdict(SKIP, "no transparent huge page support in this kernel (CONFIG_TRANSPARENT_HUGEPAGE=n)",
                       evidence=ev)
    head = f"enabled={t.enabled} defrag={t.defrag} khugepaged/defrag={t.khugepaged_defrag}"
    if ctx.plan.method == "hostalloc":
        return Verdict(PASS, f"{head}: not used by cudaHostAlloc (the driver allocates the pages)", evidence=ev)
    if ctx.plan.thp and t.enabled == "never":
        return Verdict(WARN, f"{head}: huge pages were asked for but are disabled; 4 KiB pages register "
                             "slower (measured on an H200 host: 28.6 GiB/s against 45 GiB/s for 47 GiB)",
                       "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled and madvise(MADV_HUGEPAGE)", ev)
    if t.defrag == "always" and thp_region(ctx):
        return Verdict(WARN, f"{head}: every huge-page fault compacts directly; on fragmented memory "
                             "faulting the region stalls (catalog 2)",
                       "echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag, and prefault the "
                       "region before pinning", ev)
    if thp_region(ctx) and t.shmem_enabled in ("never", "deny") and ctx.plan.source == "shm":
        return Verdict(PASS, f"{head}: a /dev/shm region gets 4 KiB pages (shmem_enabled={t.shmem_enabled})",
                       evidence=ev)
    return Verdict(PASS, head, evidence=ev)


@register("zones", "Movable zone, CMA and memory hotplug policy", catalog=(5,))
def zones(ctx: Context) -> Verdict:
    zoneinfo = ctx.zoneinfo or []
    movable = [z for z in zoneinfo if z.zone == "Movable" and (z.managed_pages or 0) > 0]
    movable_bytes = sum(z.managed_bytes for z in movable)
    cma = (ctx.meminfo.cma_total_bytes or 0) if ctx.meminfo else 0
    hp = ctx.hotplug
    ev = {"movable_managed_bytes": movable_bytes, "cma_total_bytes": cma,
          "hotplug": hp.__dict__, "zones": [{"node": z.node, "zone": z.zone, "managed_pages": z.managed_pages,
                                             "cma_pages": z.cma_pages} for z in zoneinfo]}
    problems = []
    if movable_bytes:
        problems.append(f"{format_bytes(movable_bytes)} in ZONE_MOVABLE")
    if cma >= GiB:
        problems.append(f"{format_bytes(cma)} of CMA")
    if hp.hot_added_goes_movable:
        problems.append(f"hot-added memory is onlined movable (auto_online_blocks={hp.auto_online_blocks}, "
                        f"online_policy={hp.online_policy}, memhp_default_state={hp.memhp_default_state})")
    if hp.movable_on_cmdline:
        problems.append("cmdline " + " ".join(hp.movable_on_cmdline))
    if problems:
        return Verdict(WARN, "; ".join(problems) + ": long-term pins first migrate such pages out, "
                             "which is slow and retried on failure (catalog 5)",
                       "allocate the region from normal zones (numactl --membind to a node without movable "
                       "memory), online hot-added memory as online_kernel, or drop movablecore/movable_node", ev)
    where = f"hot-added memory: auto_online_blocks={hp.auto_online_blocks}" + (
        f", memhp_default_state={hp.memhp_default_state}" if hp.memhp_default_state else "")
    movable_text = ("no populated Movable zone" if ctx.zoneinfo is not None
                    else f"Movable zone unknown ({ctx.why_missing('zoneinfo')})")
    return Verdict(PASS, f"{movable_text}, CMA {format_bytes(cma)}; {where}", evidence=ev)
