"""Page allocator checks: huge-page supply and THP policy (catalog 2), zones (5).

Free blocks of the THP order are not the only source of huge pages. A THP fault that finds none
reclaims and compacts; whether that is cheap depends on why there are none: a lack of free
memory (clean page cache is reclaimed, which is what reclaim is for) or fragmentation of the
free memory there is (the kernel's extfrag index towards 1, past vm.extfrag_threshold, where
compaction_suitable() sends the fault into direct compaction). Memory counted in MemFree that
the buddy allocator does not hold yet (deferred_init=lazy, unaccepted memory) is handed over in
whole max-order blocks. Only fragmentation, or a plan beyond all of these, warns.
"""
from __future__ import annotations

from .. import catalog
from ..buddyinfo import fragmentation_index, free_bytes_at_or_above, unusable_free_index
from ..units import GiB, format_bytes
from . import PASS, SKIP, WARN, Context, Verdict, never, register

THP_ABSENT = "no transparent huge page support in this kernel (CONFIG_TRANSPARENT_HUGEPAGE=n)"


def thp_region(ctx: Context) -> bool:
    """Will the plan's region be backed by huge pages? hostalloc: the driver allocates, no."""
    t = ctx.thp
    if ctx.plan.method == "hostalloc" or not t.available or t.enabled == "never":
        return False
    if ctx.plan.source == "shm":
        return t.shmem_enabled in ("always", "within_size", "advise", "force")
    if ctx.plan.source == "file":
        return False
    if ctx.plan.thp is not None:
        return ctx.plan.thp
    return t.enabled in ("always", "madvise")


def _clean_file_bytes(raw: dict) -> int:
    """Page cache that reclaim can drop at once: the file LRUs less dirty and writeback pages."""
    file_lru = (raw.get("Active(file)") or 0) + (raw.get("Inactive(file)") or 0)
    return max(0, file_lru - (raw.get("Dirty") or 0) - (raw.get("Writeback") or 0))


def supply(ctx: Context) -> dict:
    """Huge pages the node can give a region, by source, at the node's THP order."""
    order, page = ctx.thp_order, ctx.page_size
    zones = ctx.buddyinfo or []
    per_zone = [{"node": z.node, "zone": z.zone, "free_bytes": z.free_bytes,
                 "free_huge_bytes": free_bytes_at_or_above(z.counts, order, page),
                 "unusable_index": unusable_free_index(z.counts, order),
                 "extfrag_index": fragmentation_index(z.counts, order)} for z in zones]
    buddy_free = sum(z["free_bytes"] for z in per_zone)
    free_huge = sum(z["free_huge_bytes"] for z in per_zone)
    mem_free = ctx.meminfo.free_bytes or 0
    outside = max(0, mem_free - buddy_free)
    if outside < GiB:  # per-CPU lists and the moment between two reads: not memory held back
        outside = 0
    # the zone user memory comes from first: Normal (then DMA32); else the zone with most free memory
    main = next((z for z in per_zone if z["zone"] == "Normal" and z["free_bytes"]), None) or max(
        per_zone, key=lambda z: z["free_bytes"], default=None)
    threshold = ctx.vm.get("extfrag_threshold")
    threshold = 500 if threshold is None else threshold
    index = main["extfrag_index"] if main else None
    return {"order": order, "page_size": page, "huge_page_bytes": page << order, "zones": per_zone,
            "buddy_free_bytes": buddy_free, "free_huge_bytes": free_huge, "mem_free_bytes": mem_free,
            "outside_buddy_bytes": outside, "clean_page_cache_bytes": _clean_file_bytes(ctx.meminfo.raw),
            "zone": main["zone"] if main else None, "extfrag_index": index, "extfrag_threshold": threshold,
            "unusable_index": main["unusable_index"] if main else None,
            "unusable_index_node": round(1 - free_huge / buddy_free, 3) if buddy_free else None,
            "fragmented": index is not None and index * 1000 > threshold}


@register("fragmentation", "Huge pages the node can supply for a THP region",
          needs=("buddyinfo", "meminfo", "thp", "page_size"), catalog=(2,), can_fail=never, can_warn=lambda plan: plan.method != "hostalloc", absent={"thp": THP_ABSENT})
def fragmentation(ctx: Context) -> Verdict:
    s = supply(ctx)
    vm = ctx.vmstat or {}
    counters = {k: vm.get(k) for k in ("compact_stall", "compact_fail", "compact_success", "thp_fault_alloc",
                                       "thp_fault_fallback", "thp_collapse_alloc_failed")}
    ev = dict(s, counters_since_boot=counters, notes=[])
    hp = format_bytes(s["huge_page_bytes"])
    head = (f"{format_bytes(s['free_huge_bytes'])} free in {hp} blocks (order >= {s['order']}) of the "
            f"{format_bytes(s['buddy_free_bytes'])} the buddy allocator holds")
    if s["outside_buddy_bytes"]:
        cmd = ctx.cmdline or {}
        why = ("deferred_init=lazy on the cmdline" if "deferred_init" in cmd else
               "unaccepted memory" if ctx.meminfo.raw.get("Unaccepted") else "memory initialised on demand")
        ev["notes"].append(f"{format_bytes(s['outside_buddy_bytes'])} of MemFree {format_bytes(s['mem_free_bytes'])} "
                           f"is not in the buddy allocator yet ({why}): it is handed over in whole blocks, "
                           "not fragmented")
        head += f"; {format_bytes(s['outside_buddy_bytes'])} more of MemFree is not in it yet ({why})"
    fallback, alloc = counters["thp_fault_fallback"] or 0, counters["thp_fault_alloc"] or 0
    if fallback + alloc >= 1000 and fallback > 0.2 * (fallback + alloc):
        ev["notes"].append(f"{fallback:,} of {fallback + alloc:,} THP faults since boot fell back to base pages")
    if s["extfrag_index"] is not None:
        head += f"; extfrag index {s['extfrag_index']:.3f} ({s['zone']}, threshold {s['extfrag_threshold'] / 1000:.3f})"
    if not ctx.plan.size_bytes or not thp_region(ctx):
        why = "no size given" if not ctx.plan.size_bytes else "the region will not use huge pages"
        return Verdict(PASS, f"{head} ({why})", evidence=ev)
    need = ctx.plan.total_bytes
    now = s["free_huge_bytes"] + s["outside_buddy_bytes"]
    ev.update(need_bytes=need, supply_now_bytes=now)
    facts = catalog.Facts(thp_region=True, need_bytes=need, huge_supply_bytes=now, fragmented=s["fragmented"])
    if need <= now:
        return Verdict(PASS, f"{head}: covers the {format_bytes(need)} THP region", evidence=ev)
    short = need - now
    defrag = ctx.thp.defrag
    stalls = defrag in ("always", "madvise", "defer+madvise")
    remedy = ("prefault the region before pinning (a pin that faults it does so under mmap_lock), compact "
              "ahead of time (echo 1 > /proc/sys/vm/compact_memory), or use cudaHostAlloc")
    if catalog.entry(2).condition(facts):
        how = ("faults stall in direct compaction" if stalls
               else f"faults fall back to base pages (defrag={defrag})")
        return Verdict(WARN, f"{head}: {format_bytes(short)} of the {format_bytes(need)} THP region must come from "
                             f"fragmented free memory: {how}", remedy, ev, predicted=[2])
    if short <= s["clean_page_cache_bytes"]:
        return Verdict(PASS, f"{head}: the other {format_bytes(short)} of the {format_bytes(need)} THP region comes "
                             f"from reclaiming clean page cache ({format_bytes(s['clean_page_cache_bytes'])}), "
                             "not from fragmented memory", evidence=ev)
    return Verdict(WARN, f"{head}: the {format_bytes(need)} THP region is {format_bytes(short)} beyond free huge "
                         f"blocks and clean page cache ({format_bytes(s['clean_page_cache_bytes'])}): faults reclaim "
                         f"anonymous memory or fall back to base pages (defrag={defrag})", remedy, ev)


@register("thp", "Transparent huge page policy", needs=("thp",), catalog=(2,), can_fail=never,
          can_warn=lambda plan: plan.method != "hostalloc", absent={"thp": THP_ABSENT})
def thp_policy(ctx: Context) -> Verdict:
    t = ctx.thp
    ev = {"enabled": t.enabled, "defrag": t.defrag, "khugepaged_defrag": t.khugepaged_defrag,
          "shmem_enabled": t.shmem_enabled, "pmd_size_bytes": t.pmd_size_bytes, "page_size": ctx.page_size,
          "thp_order": ctx.thp_order}
    head = (f"enabled={t.enabled} defrag={t.defrag} khugepaged/defrag={t.khugepaged_defrag}, "
            f"{format_bytes(t.pmd_size_bytes)} huge pages over {format_bytes(ctx.page_size)} pages")
    if ctx.plan.method == "hostalloc":
        return Verdict(PASS, f"{head}: not used by cudaHostAlloc (the driver allocates the pages)", evidence=ev)
    if ctx.plan.thp and t.enabled == "never":
        return Verdict(WARN, f"{head}: huge pages were asked for but are disabled; base pages register "
                             "slower (measured on an H200 host: 28.6 GiB/s against 45 GiB/s for 47 GiB)",
                       "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled and madvise(MADV_HUGEPAGE)", ev)
    if t.defrag == "always" and thp_region(ctx):
        return Verdict(WARN, f"{head}: every huge-page fault compacts directly; on fragmented memory "
                             "faulting the region stalls (catalog 2)",
                       "echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag, and prefault the "
                       "region before pinning", ev, predicted=[2])
    if ctx.plan.source == "shm" and t.shmem_enabled in ("never", "deny"):
        return Verdict(PASS, f"{head}: a /dev/shm region gets base pages (shmem_enabled={t.shmem_enabled})",
                       evidence=ev)
    return Verdict(PASS, head, evidence=ev)


@register("zones", "Movable zone, CMA and memory hotplug policy", needs=("zoneinfo",), catalog=(5,),
          can_fail=never)
def zones(ctx: Context) -> Verdict:
    zoneinfo = ctx.zoneinfo or []
    movable = [z for z in zoneinfo if z.zone == "Movable" and (z.managed_pages or 0) > 0]
    movable_bytes = sum(z.managed_bytes for z in movable)
    cma = (ctx.meminfo.cma_total_bytes or 0) if ctx.meminfo else 0
    hp = ctx.hotplug
    ev = {"movable_managed_bytes": movable_bytes, "cma_total_bytes": cma, "page_size": ctx.page_size,
          "hotplug": hp.__dict__, "zones": [{"node": z.node, "zone": z.zone, "managed_pages": z.managed_pages,
                                             "cma_pages": z.cma_pages} for z in zoneinfo]}
    facts = catalog.Facts(movable_bytes=movable_bytes, cma_bytes=cma, hotplug_movable=hp.hot_added_goes_movable)
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
    if problems or catalog.entry(5).condition(facts):
        return Verdict(WARN, "; ".join(problems) + ": long-term pins first migrate such pages out, "
                             "which is slow and retried on failure (catalog 5)",
                       catalog.entry(5).remedy + ", or drop movablecore/movable_node", ev, predicted=[5])
    where = f"hot-added memory: auto_online_blocks={hp.auto_online_blocks}" + (
        f", memhp_default_state={hp.memhp_default_state}" if hp.memhp_default_state else "")
    return Verdict(PASS, f"no populated Movable zone, CMA {format_bytes(cma)}; {where}", evidence=ev)
