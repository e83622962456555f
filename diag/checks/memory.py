"""Memory checks: headroom as the process that pins sees it (catalog 8, 12, 16), swap exposure (1),
pressure, memlock."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import catalog
from ..process import parse_status
from ..swap import RATE_PAGE_BYTES, swapin_rate
from ..units import GiB, MiB, format_bytes, format_duration, parse_size
from . import ERROR, FAIL, PASS, SKIP, WARN, Context, Verdict, register

# Memory the cgroup is charged beyond the region per pinned page, GPU methods: a touched 4 GiB
# cudaHostAlloc raised memory.current by 4,113 MiB on the H200 (580.159.04, kernel 6.18, fresh child
# cgroup): 17 MiB over 1,048,576 pages, mostly the mapping's page tables. The driver's own
# 48 B/page (catalog.DRIVER_BYTES_PER_PAGE) is vmalloc'd without __GFP_ACCOUNT and is not charged;
# it comes out of MemAvailable. bench/gpu_pin_accounting.sh re-measures both for both methods.
CGROUP_BYTES_PER_PAGE = 17

# Dirty and writeback page cache is reclaimable only once written: counted in the headroom at this
# assumed rate, which the verdict names with the time it takes. 100 MiB/s is below the baseline
# of a general-purpose cloud volume (AWS gp3 125 MiB/s) and far below any local NVMe, so a node's
# real disk writes at least this fast (the CI VM's virtio disk wrote 1 GiB, fsync'ed, at 100 MiB/s:
# the first step of bench/gpu_cgroup_pagecache_headroom.sh). A pin that must wait longer than
# WRITEBACK_WARN_S for it warns.
WRITEBACK_RATE = 100 * MiB
WRITEBACK_WARN_S = 10.0

# swap in use below this is noise (a few idle daemons' pages), above it the node has been pushing
# anonymous memory out and can push a new region out too
SWAP_IN_USE_THRESHOLD = 64 * MiB


def margin_for(plan_margin: str, total: int) -> int:
    """The margin: a percentage of the memory that binds (MemTotal, or the cgroup's limit) or a size."""
    text = plan_margin.strip()
    if text.endswith("%"):
        return int(total * float(text[:-1]) / 100)
    return parse_size(text)


@dataclass
class Need:
    region_bytes: int           # size x ranks
    node_bytes: int             # what MemAvailable must cover: region + driver tables + reserve
    cgroup_bytes: int           # what the cgroup is charged: region + page tables + reserve
    driver_table_bytes: int
    reserve_bytes: int
    pages: int                  # the region in the node's pages


def plan_need(ctx: Context) -> Need | None:
    plan = ctx.plan
    if not plan.size_bytes:
        return None
    pages = -(-plan.pinned_bytes // ctx.page_size) * plan.ranks
    tables = pages * catalog.DRIVER_BYTES_PER_PAGE if plan.uses_gpu else 0
    cg_extra = pages * CGROUP_BYTES_PER_PAGE if plan.uses_gpu else 0
    reserve = plan.reserve_bytes * plan.ranks
    total = plan.total_bytes
    return Need(total, total + tables + reserve, total + cg_extra + reserve, tables, reserve, pages)


@dataclass
class Room:
    """Where the plan's memory comes from, and how much is there."""
    binding: str                 # 'MemAvailable' or 'cgroup'
    binding_dir: str | None
    available_bytes: int         # at the binding level
    need_bytes: int | None       # the plan, as that level counts it
    margin_bytes: int
    node_available_bytes: int
    node_margin_bytes: int
    cgroup_headroom_bytes: int | None
    cgroup_margin_bytes: int | None
    high_headroom_bytes: int | None
    high_dir: str | None


def room(ctx: Context) -> Room:
    m, plan = ctx.meminfo, ctx.plan
    need = plan_need(ctx)
    node_margin = margin_for(plan.margin, m.total_bytes)
    cg = ctx.cgroup
    binding = cg.binding if cg is not None else None
    cg_room = binding.headroom_bytes if binding is not None else None
    cg_margin = margin_for(plan.margin, binding.limit_bytes) if binding is not None else None
    throttle = cg.throttling if cg is not None else None
    r = Room("MemAvailable", None, m.available_bytes, need.node_bytes if need else None, node_margin,
             m.available_bytes, node_margin, cg_room, cg_margin,
             throttle.high_headroom_bytes if throttle else None, throttle.dir if throttle else None)
    if cg_room is not None:
        # compare the room left after each level's own margin; the smaller binds
        node_left = m.available_bytes - node_margin - (need.node_bytes if need else 0)
        cg_left = cg_room - cg_margin - (need.cgroup_bytes if need else 0)
        if cg_left < node_left:
            r.binding, r.binding_dir, r.available_bytes = "cgroup", binding.dir, cg_room
            r.need_bytes, r.margin_bytes = (need.cgroup_bytes if need else None), cg_margin
    return r


def _cgroup_evidence(ctx: Context) -> dict | None:
    cg = ctx.cgroup
    if cg is None:
        return None
    return {"version": cg.version, "path": cg.path, "dir": cg.dir, "source": cg.source,
            "limit_bytes": cg.limit_bytes, "limit_dir": cg.limit_dir, "headroom_bytes": cg.headroom_bytes,
            "hierarchical_limit_bytes": cg.hierarchical_limit_bytes, "can_swap": cg.can_swap,
            "levels": [{"dir": lv.dir, "limit_bytes": lv.limit_bytes, "high_bytes": lv.high_bytes,
                        "usage_bytes": lv.usage_bytes, "inactive_file_bytes": lv.inactive_file_bytes,
                        "active_file_bytes": lv.active_file_bytes, "dirty_bytes": lv.dirty_bytes,
                        "writeback_bytes": lv.writeback_bytes, "anon_bytes": lv.anon_bytes,
                        "shmem_bytes": lv.shmem_bytes, "swappiness": lv.swappiness,
                        "working_set_bytes": lv.working_set_bytes, "headroom_bytes": lv.headroom_bytes,
                        "inferred": lv.inferred} for lv in cg.levels],
            "events": cg.events, "files_not_read": cg.missing[:20]}


@register("headroom", "Memory headroom for the plan, as the pinning process's cgroup sees it",
          needs=("meminfo", "cgroup"), catalog=(8, 12, 16, 18))
def headroom(ctx: Context) -> Verdict:
    m, plan = ctx.meminfo, ctx.plan
    if m.available_bytes is None or m.total_bytes is None:
        # no MemAvailable line (kernel < 3.14, or a runtime that rewrites meminfo) and no zoneinfo
        # watermarks to estimate it from as the kernel does: the node's headroom is not known
        lacking = [k for k in ("MemFree", "Active(file)", "Inactive(file)") if k not in m.raw]
        why = (f"{ctx.root.display('proc/meminfo')} has no {', '.join(lacking)} line" if lacking else
               f"{ctx.describe('zoneinfo')} does not give the zones' watermarks and lowmem reserves"
               if ctx.state("zoneinfo") != "ok" else
               f"{ctx.root.display('proc/zoneinfo')} lacks a zone's low, high, managed or protection line")
        return Verdict(ERROR, "MemAvailable is missing (kernel < 3.14, or a runtime that rewrites /proc/meminfo) and "
                              f"cannot be estimated as the kernel does: {why}",
                       "capture /proc/zoneinfo with /proc/meminfo (hostpin snapshot), or --skip headroom to accept "
                       "the gap", missing=[ctx.root.display("proc/meminfo")])
    r = room(ctx)
    need = plan_need(ctx)
    cg = ctx.cgroup
    ev = {
        "mem_total_bytes": m.total_bytes, "mem_available_bytes": m.available_bytes,
        "margin": plan.margin, "margin_bytes": r.margin_bytes, "node_margin_bytes": r.node_margin_bytes,
        "cgroup": _cgroup_evidence(ctx), "mlocked_bytes": m.mlocked_bytes,
        "binding": r.binding, "binding_dir": ctx.root.display(r.binding_dir) if r.binding_dir else None,
        "binding_bytes": r.available_bytes,
        "driver_bytes_per_page": catalog.DRIVER_BYTES_PER_PAGE, "page_size": ctx.page_size,
        "note": "Mlocked and VmLck do not count pages pinned by the NVIDIA driver (catalog 16): cudaHostAlloc "
                "pages show as Shmem/RssShmem, both methods in pins outstanding (nr_foll_pin_acquired - "
                "nr_foll_pin_released); after launch watch MemAvailable, never locked memory.",
    }
    estimated = m.available_estimate is not None
    if estimated:
        ev["mem_available_estimate"] = m.available_estimate
    where = (("MemAvailable (no MemAvailable line: " + m.available_estimate["source"] + ")"
              if estimated else "MemAvailable") if r.binding == "MemAvailable" else
             f"cgroup v{cg.version} {ctx.root.display(r.binding_dir)} (limit {format_bytes(cg.binding.limit_bytes)} - "
             f"working set {format_bytes(cg.binding.working_set_bytes)}, its page cache counted as reclaimable)")
    ev["binding_text"] = where
    reclaim = _cgroup_reclaim(ctx, need.cgroup_bytes if need else 0)
    ev["cgroup_reclaim"] = reclaim
    predicted = [16] if plan.uses_gpu else []
    if need is None:
        left = max(0, r.available_bytes - r.margin_bytes)
        return Verdict(PASS, f"{format_bytes(left)} can be pinned now leaving a {format_bytes(r.margin_bytes)} margin "
                             f"({where} {format_bytes(r.available_bytes)})", evidence=ev, predicted=predicted)
    ev.update(need_bytes=need.region_bytes, driver_table_bytes=need.driver_table_bytes, reserve_bytes=need.reserve_bytes,
              need_with_tables_bytes=need.node_bytes, need_cgroup_bytes=need.cgroup_bytes,
              cgroup_headroom_bytes=r.cgroup_headroom_bytes, throttling_headroom_bytes=r.high_headroom_bytes,
              throttling_dir=r.high_dir)
    facts = catalog.Facts(method=plan.method, need_bytes=need.node_bytes, available_bytes=m.available_bytes)
    if catalog.entry(8).condition(facts):
        predicted.append(8)
    if r.cgroup_headroom_bytes is not None and catalog.entry(12).condition(
            catalog.Facts(need_bytes=need.cgroup_bytes, cgroup_headroom_bytes=r.cgroup_headroom_bytes)):
        predicted.append(12)
    per_rank_fit = max(0, (r.available_bytes - r.margin_bytes) // plan.ranks
                       - (r.need_bytes - need.region_bytes) // plan.ranks)
    extra = f" + {format_bytes(need.reserve_bytes)} reserved" if need.reserve_bytes else ""
    head = (f"need {format_bytes(r.need_bytes)} ({plan.describe()}{extra}) against {where} "
            f"{format_bytes(r.available_bytes)}")
    if plan.torch:
        # catalog 18: what PyTorch asks the driver for, not what the launcher asked PyTorch for
        ev["torch"] = plan.torch
        head = (f"{format_bytes(plan.size_bytes)} asks PyTorch for {format_bytes(plan.pinned_bytes)} pinned: "
                f"{plan.ranks} x {format_bytes(plan.pinned_bytes)} (need {format_bytes(r.need_bytes)}{extra}) "
                f"against {where} {format_bytes(r.available_bytes)}")
        if catalog.entry(18).condition(catalog.Facts(allocator=plan.allocator,
                                                     torch_rounding_bytes=plan.pinned_bytes - plan.size_bytes)):
            predicted.append(18)
    if r.need_bytes > r.available_bytes:
        remedy = (f"free {format_bytes(r.need_bytes + r.margin_bytes - r.available_bytes)} or shrink the plan: at "
                  f"most {format_bytes(per_rank_fit)} per rank fits with the margin")
        if plan.torch:
            remedy += _torch_remedy(plan, per_rank_fit)
        if r.binding == "cgroup":
            remedy += (f"; or raise {'memory.max' if cg.version == 2 else 'memory.limit_in_bytes'} of "
                       f"{ctx.root.display(r.binding_dir)} (every method is charged there: registered pages as the region's own, "
                       "cudaHostAlloc pages as shmem)")
        fate = "the region would be swapped out or OOM-killed"
        if r.binding == "cgroup" and reclaim:
            short = r.need_bytes - r.available_bytes
            if reclaim["can_swap"] and reclaim["swappable_bytes"] >= short:
                pred = swap_prediction(ctx, short)
                ev["cgroup_swap_prediction"] = pred
                # measured on the CI VM (v1, a swap file, tests/test_cgroup_reclaim_live.py): of 3 pins past
                # the page cache, 2 were OOM-killed with 0.8-2 MiB swapped out (reclaim gave up while the
                # swap-out was in flight) and 1 completed with 161 MiB of the other process swapped out
                fate = (f"after all {format_bytes(reclaim['page_cache_bytes'])} of the cgroup's page cache, "
                        f"{format_bytes(short)} of its anonymous and shmem memory goes to swap (swap is allowed "
                        f"there), or the kernel OOM-kills when reclaim gives up before that swap-out completes; "
                        f"reading it back takes {format_duration(pred['predicted_pin_seconds'])} at "
                        f"{pred['rate_pages_per_s']:,.0f} pages/s ({pred['device_kind']})")
            else:
                fate = (f"after all {format_bytes(reclaim['page_cache_bytes'])} of the cgroup's page cache nothing "
                        "else can be reclaimed (" + ("it cannot swap: " + reclaim["no_swap_reason"]
                                                     if not reclaim["can_swap"] else
                                                     f"only {format_bytes(reclaim['swappable_bytes'])} could go to swap")
                        + "): the kernel OOM-kills in the cgroup")
        return Verdict(FAIL, head + f": it does not fit; {fate}", remedy, ev, predicted)
    evicts = ""
    if r.binding == "cgroup" and reclaim and reclaim["evicts_bytes"]:
        evicts = "; " + reclaim["text"]
    if r.need_bytes + r.margin_bytes > r.available_bytes:
        return Verdict(WARN, head + f": fits, but leaves {format_bytes(r.available_bytes - r.need_bytes)}, under the "
                                    f"{format_bytes(r.margin_bytes)} margin{evicts}",
                       f"free memory first or use at most {format_bytes(per_rank_fit)} per rank", ev, predicted)
    if r.high_headroom_bytes is not None and need.cgroup_bytes > r.high_headroom_bytes:
        return Verdict(WARN, head + f": fits under memory.max, but passes memory.high of {ctx.root.display(r.high_dir)} "
                                    f"({format_bytes(r.high_headroom_bytes)} left): throttling starts there, and "
                                    "faulting the region crawls through forced reclaim",
                       f"raise memory.high of {ctx.root.display(r.high_dir)} above the plan, or shrink the plan", ev, predicted)
    if r.binding == "cgroup" and reclaim and reclaim["writeback_seconds"] > WRITEBACK_WARN_S:
        return Verdict(WARN, head + f": fits{evicts}; the pin waits about "
                                    f"{format_duration(reclaim['writeback_seconds'])} for that writeback",
                       "sync the launcher's files before pinning (sync -f FILE), or shrink the plan", ev, predicted)
    return Verdict(PASS, head + f": leaves {format_bytes(r.available_bytes - r.need_bytes)}{evicts}", evidence=ev,
                   predicted=predicted)


def _torch_remedy(plan, per_rank_fit: int) -> str:
    """What fits through PyTorch: its requests are powers of two (catalog 18)."""
    from ..torchalloc import power_of_2_ceil
    largest = power_of_2_ceil(per_rank_fit + 1) >> 1 if per_rank_fit else 0
    fits = (f"a PyTorch request of at most {format_bytes(largest)} per rank pins no more than that" if largest
            else "no PyTorch request fits")
    text = f" ({fits}, since PyTorch pins the next power of two: a request just above one pins nearly twice it)"
    return text + ("; or pin the exact size outside PyTorch's cache (cudaHostAlloc, or mmap + cudaHostRegister, "
                   "as torch.cuda.cudart().cudaHostRegister does), or from PyTorch 2.13 "
                   "PYTORCH_CUDA_ALLOC_CONF=pinned_max_round_threshold_mb:N below the size")


def _cgroup_reclaim(ctx: Context, need: int) -> dict | None:
    """What the kernel reclaims in the binding cgroup to make room for `need` bytes: page cache
    first, clean at once and dirty once written (at WRITEBACK_RATE), active and inactive alike;
    then anonymous and shmem memory, where swap is allowed. None without a binding cgroup."""
    cg = ctx.cgroup
    lv = cg.binding if cg is not None else None
    if lv is None or lv.free_bytes is None:
        return None
    short = max(0, need - lv.free_bytes)
    cache = lv.file_lru_bytes
    evicts = min(short, cache)
    from_clean = min(evicts, lv.clean_cache_bytes)
    from_dirty = evicts - from_clean
    swappiness = lv.swappiness if lv.swappiness is not None else ctx.vm.get("swappiness")
    reasons = []
    if cg.version == 2 and lv.swap_limit_bytes == 0:
        reasons.append("memory.swap.max 0")
    if cg.version == 1 and lv.swap_limit_bytes is not None and lv.limit_bytes is not None \
            and lv.swap_limit_bytes <= lv.limit_bytes:
        reasons.append("memory.memsw.limit_in_bytes equals memory.limit_in_bytes")
    if swappiness == 0:  # mm/vmscan.c get_scan_count: cgroup reclaim with swappiness 0 scans file pages only
        reasons.append("swappiness 0 (the cgroup's own reclaim never swaps)")
    swap_free = ctx.meminfo.swap_free_bytes or 0
    if not swap_free:
        reasons.append("no free swap on the node")
    swap_room = swap_free
    if cg.version == 2 and lv.swap_limit_bytes is not None:
        swap_room = min(swap_room, max(0, lv.swap_limit_bytes - (lv.swap_usage_bytes or 0)))
    elif cg.version == 1 and lv.swap_limit_bytes is not None and lv.limit_bytes is not None:
        swap_room = min(swap_room, max(0, lv.swap_limit_bytes - lv.limit_bytes - (lv.swap_usage_bytes or 0)))
    active = lv.active_file_bytes or 0
    text = (f"evicts {format_bytes(evicts)} of the cgroup's {format_bytes(cache)} page cache, "
            f"{format_bytes(active)} of it active: the launcher may read it again")
    seconds = from_dirty / WRITEBACK_RATE
    if from_dirty:
        text += (f"; {format_bytes(from_dirty)} of that is dirty and is written back first, about "
                 f"{format_duration(seconds)} at an assumed {format_bytes(WRITEBACK_RATE)}/s")
    return {"dir": lv.dir, "free_bytes": lv.free_bytes, "page_cache_bytes": cache, "active_file_bytes": active,
            "inactive_file_bytes": lv.inactive_file_bytes, "clean_cache_bytes": lv.clean_cache_bytes,
            "dirty_cache_bytes": lv.dirty_cache_bytes, "evicts_bytes": evicts, "evicts_clean_bytes": from_clean,
            "evicts_dirty_bytes": from_dirty, "writeback_rate_bytes_per_s": WRITEBACK_RATE,
            "writeback_seconds": round(seconds, 3), "anon_bytes": lv.anon_bytes, "shmem_bytes": lv.shmem_bytes,
            "swappable_bytes": min(lv.swappable_bytes, swap_room) if not reasons else 0,
            "can_swap": not reasons, "no_swap_reason": "; ".join(reasons) or None, "swappiness": swappiness,
            "text": text}


def _swap_holders(limit: int = 5) -> list[dict]:
    """Live only: the processes with the most memory in swap (VmSwap, from /proc/PID/status,
    which does not take the mmap lock)."""
    out = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            st = parse_status(Path(f"/proc/{pid}/status").read_text(errors="replace"))
        except OSError:
            continue
        if st.vm_swap_bytes:
            out.append({"pid": int(pid), "name": st.name, "vm_swap_bytes": st.vm_swap_bytes})
    return sorted(out, key=lambda p: -p["vm_swap_bytes"])[:limit]


def _own_swap(ctx: Context) -> int | None:
    """Memory of the process (or cgroup) that will pin that is in swap now, when known."""
    if ctx.root.live and ctx.pid != "self":
        try:
            st = parse_status(Path(f"/proc/{ctx.pid}/status").read_text(errors="replace"))
        except OSError:
            return None
        return st.vm_swap_bytes or 0
    cg = ctx.cgroup
    if ctx.cgroup_path is not None and cg is not None and cg.levels:
        return cg.levels[0].swap_usage_bytes
    return None


def swap_prediction(ctx: Context, exposed_bytes: int) -> dict:
    """Seconds to pin exposed_bytes back from swap, at what the devices can deliver. The default
    rates were measured in 4 KiB pages per second; a node with larger pages is taken to move the
    same bytes per second (its swap entries are its own pages)."""
    media = ctx.swap_media
    pc = ctx.vm.get("page-cluster")
    pages = exposed_bytes // ctx.page_size
    zswapped = (ctx.meminfo.raw.get("Zswapped") or 0) if ctx.zswap_enabled else 0
    used = ctx.meminfo.swap_used_bytes or 0
    fast_fraction = min(1.0, zswapped / used) if used else 0.0
    if ctx.swap_rate_override:
        rate_bytes = ctx.swap_rate_override
        source = "--swap-in-rate"
        kind = "given"
        estimate = False
    else:
        # the slowest device in use sets the pace (pages of one region spread over all of them)
        used_media = [d["media"] for d, s in zip(media, ctx.swaps or []) if s.used_bytes] or [d["media"] for d in media]
        rates = [swapin_rate(k, pc) for k in (used_media or ["unknown"])]
        slow = min(rates, key=lambda x: x.pages_per_s)
        rate_bytes, source, kind, estimate = slow.pages_per_s * RATE_PAGE_BYTES, slow.source, slow.media, slow.estimate
        if pc is None:
            source += "; vm.page-cluster not known: the kernel's default 3 assumed"
    zrate_bytes = swapin_rate("zswap", pc).pages_per_s * RATE_PAGE_BYTES
    seconds = exposed_bytes * (1 - fast_fraction) / rate_bytes + exposed_bytes * fast_fraction / zrate_bytes
    return {"exposed_bytes": exposed_bytes, "exposed_pages": pages, "rate_pages_per_s": rate_bytes / ctx.page_size,
            "rate_bytes_per_s": rate_bytes, "device_kind": kind,
            "rate_source": source, "rate_is_estimate": estimate, "page_cluster": pc,
            "zswap_fraction": round(fast_fraction, 3), "predicted_pin_seconds": round(seconds, 3)}


@register("swap", "Swap exposure of the region and the cost of pinning it back", needs=("meminfo", "swaps"),
          uses=("vm", "cgroup"),
          catalog=(1,))
def swap(ctx: Context) -> Verdict:
    m, plan = ctx.meminfo, ctx.plan
    used = m.swap_used_bytes or 0
    total = m.swap_total_bytes or 0
    swappiness = ctx.vm.get("swappiness")
    ev = {"swap_total_bytes": total, "swap_used_bytes": used, "swappiness": swappiness,
          "threshold_bytes": SWAP_IN_USE_THRESHOLD, "devices": [s.__dict__ for s in (ctx.swaps or [])],
          "media": ctx.swap_media, "zswap_enabled": ctx.zswap_enabled,
          "pswpin_since_boot": (ctx.vmstat or {}).get("pswpin"), "predicted_pin_seconds": 0.0}
    if not total:
        return Verdict(PASS, "no swap configured: no part of the region can be swapped out "
                             "(past the headroom the OOM killer acts instead)", evidence=ev)
    sample = ctx.swapin
    ev["swapin_now"] = sample
    demand = sample.get("pages_per_s") or 0.0
    cg = ctx.cgroup
    # vm.swappiness 0 does not keep a region resident: global reclaim near OOM swaps whatever it is
    # (mm/vmscan.c, "mm: vmscan: disregard swappiness shortly before going OOM", 3.8); memory.swap.max=0
    # (v1: memsw equal to the limit) forbids it, and so does a v1 cgroup's own memory.swappiness 0 for
    # its own reclaim (get_scan_count: cgroup reclaim with swappiness 0 scans file pages only; measured
    # in tests/test_cgroup_reclaim_live.py)
    can_swap = cg is None or cg.can_swap is not False
    ev["can_swap"] = can_swap
    r = room(ctx)
    need = plan_need(ctx)
    region = plan.total_bytes or 0
    remedy_parts = ["MADV_WILLNEED on the region before pinning (madvise reads its swapped pages back in bulk, "
                    "not one fault at a time)",
                    "memory.swap.max=0 for the launcher's cgroup (v1: memory.memsw.limit_in_bytes equal to "
                    "memory.limit_in_bytes), so the region is never swapped out"]
    room_for_swapoff = r.node_available_bytes - r.node_margin_bytes - (need.node_bytes if need else 0)
    if used and room_for_swapoff > used:
        remedy_parts.append(f"swapoff now: {format_bytes(used)} in swap fits in the {format_bytes(room_for_swapoff)} "
                            "left after the plan")
    else:
        remedy_parts.append(f"swapoff only when there is room ({format_bytes(used)} in swap, "
                            f"{format_bytes(max(0, room_for_swapoff))} left after the plan)")
    remedy = "; ".join(remedy_parts)
    own = _own_swap(ctx)
    holders = _swap_holders() if ctx.root.live else []
    ev.update(own_swap_bytes=own, swap_holders=holders)
    # 1. the plan does not fit in memory: part of it goes to swap while it is faulted in
    if need is not None and can_swap and r.need_bytes > r.available_bytes:
        overflow = min(region, r.need_bytes - r.available_bytes)
        pred = swap_prediction(ctx, overflow)
        ev.update(pred)
        return Verdict(FAIL, f"the plan cannot fit without swapping: {format_bytes(overflow)} of it would go to swap "
                             f"({r.binding} {format_bytes(r.available_bytes)} for {format_bytes(r.need_bytes)}); "
                             f"pinning it back would take {format_duration(pred['predicted_pin_seconds'])} at "
                             f"{pred['rate_pages_per_s']:,.0f} pages/s ({pred['device_kind']})",
                       "shrink the plan or free memory first; " + remedy, ev, predicted=[1])
    # 2. swap already in use: pages of a new region can land there under the same pressure, and
    #    the pinning process's own swapped pages (--pid) will be read back by the pin
    own_part = min(region, own or 0) if region else (own or 0)
    pressure_part = min(max(0, region - own_part), max(0, used - (own or 0))) if region else 0
    exposed = own_part + pressure_part
    pred = swap_prediction(ctx, exposed)
    ev.update(pred, exposure={"own_bytes": own_part, "pressure_bytes": pressure_part})
    who = ("held by " + ", ".join(f"pid {h['pid']} ({h['name']}) {format_bytes(h['vm_swap_bytes'])}" for h in holders[:3])
           if holders else "holders not known (captured tree)" if not ctx.root.live else "held by no process now")
    head = f"{format_bytes(used)} of {format_bytes(total)} swap in use ({who}), swappiness {swappiness}"
    if own:
        head += f"; the pinning process has {format_bytes(own)} of its own in swap"
    if demand:
        head += f"; swap-in now {demand:,.0f} pages/s (other processes are reading pages back)"
    if used > SWAP_IN_USE_THRESHOLD or own:
        cost = (f"if {format_bytes(exposed)} of the plan lands in swap (the pressure that put "
                f"{format_bytes(used - (own or 0))} there"
                + (f", plus the pinning process's own {format_bytes(own_part)}" if own_part else "")
                + f"), pinning it back takes {format_duration(pred['predicted_pin_seconds'])} at "
                  f"{pred['rate_pages_per_s']:,.0f} pages/s ({pred['device_kind']}"
                + (", an estimate" if pred["rate_is_estimate"] else "") + ")") if exposed else \
               "no size given: the exposure of a plan is not predicted"
        if not can_swap:
            cost = ("this cgroup cannot swap (memory.swap.max 0, v1 memsw at the memory limit, or v1 "
                    "memory.swappiness 0): the region stays resident")
            return Verdict(PASS, f"{head}; {cost}", evidence=ev)
        return Verdict(WARN, f"{head}: {cost}", remedy, ev, predicted=[1])
    return Verdict(PASS, f"{head}: below the {format_bytes(SWAP_IN_USE_THRESHOLD)} threshold",
                   evidence=ev)  # swap-in demand alone, with this little in swap, is other processes' business


@register("psi", "Memory pressure now (PSI)", needs=("psi",))
def pressure(ctx: Context) -> Verdict:
    p = ctx.psi
    some = (p.get("some") or {}).get("avg10") or 0.0
    full = (p.get("full") or {}).get("avg10") or 0.0
    ev = {"psi": dict(p)}
    head = f"memory pressure some avg10={some:.2f}%, full avg10={full:.2f}%"
    remedy = "wait for the pressure to pass or find what is reclaiming (PSI rises when tasks wait for memory)"
    if full >= 10:
        return Verdict(FAIL, head + ": tasks are fully stalled on memory; a pin now will crawl", remedy, ev)
    if some >= 5 or full >= 1:
        return Verdict(WARN, head + ": reclaim is active; faulting and pinning will be slower", remedy, ev)
    return Verdict(PASS, head, evidence=ev)


@register("memlock", "Locked-memory limit (RLIMIT_MEMLOCK)", needs=("memlock",), catalog=(16,),
          can_fail=lambda plan: plan.method == "mlock", can_warn=lambda plan: False)
def memlock(ctx: Context) -> Verdict:
    soft, hard = ctx.memlock
    ev = {"soft_bytes": soft, "hard_bytes": hard, "cap_ipc_lock": ctx.has_cap_ipc_lock}
    lim = "unlimited" if soft is None else format_bytes(soft)
    if ctx.plan.method != "mlock":
        return Verdict(PASS, f"memlock {lim}: not charged by the driver's pins ({ctx.plan.method})", evidence=ev)
    if soft is None:
        return Verdict(PASS, "memlock unlimited", evidence=ev)
    if ctx.has_cap_ipc_lock:
        return Verdict(PASS, f"memlock {lim}, but CAP_IPC_LOCK lets this process lock past it", evidence=ev)
    need = ctx.plan.size_bytes or 0
    if need > soft:
        return Verdict(FAIL, f"memlock {lim} < {format_bytes(need)} per rank: mlock will fail with ENOMEM",
                       "raise it (ulimit -l unlimited, LimitMEMLOCK=infinity, or limits.conf memlock)", ev)
    return Verdict(PASS, f"memlock {lim} covers {format_bytes(need)} per rank", evidence=ev)
