"""Memory checks: headroom (catalog 8, 12, 16), swap (1), pressure, memlock."""
from __future__ import annotations

from ..units import PAGE_SIZE, format_bytes, format_duration, parse_size
from . import FAIL, PASS, SKIP, WARN, Context, Verdict, register

# 16 B of driver page table per 4 KiB page, kvzalloc'd in kernel memory per registration
# (open-gpu-kernel-modules nv.c); it comes out of MemAvailable like the region does.
DRIVER_TABLE_BYTES_PER_PAGE = 16


def margin_bytes(ctx: Context) -> int:
    text = ctx.plan.margin.strip()
    if text.endswith("%"):
        return int(ctx.meminfo.total_bytes * float(text[:-1]) / 100)
    return parse_size(text)


@register("headroom", "Memory headroom for the plan", needs=("meminfo",), catalog=(8, 12, 16))
def headroom(ctx: Context) -> Verdict:
    m, plan = ctx.meminfo, ctx.plan
    if m.available_bytes is None:
        return Verdict(SKIP, "MemAvailable is missing (kernel < 3.14)")
    margin = margin_bytes(ctx)
    cg = ctx.cgroup
    charged = plan.method in ("register", "mlock")  # cudaHostAlloc pages are not charged (catalog 12)
    cg_headroom = cg.headroom_bytes if (cg is not None and charged) else None
    ev = {
        "mem_total_bytes": m.total_bytes, "mem_available_bytes": m.available_bytes,
        "margin_bytes": margin, "margin": plan.margin,
        "cgroup": None if cg is None else {
            "version": cg.version, "path": cg.path, "limit_bytes": cg.limit_bytes, "limit_dir": cg.limit_dir,
            "usage_bytes": cg.usage_bytes, "headroom_bytes": cg.headroom_bytes, "charged_for_method": charged},
        "mlocked_bytes": m.mlocked_bytes,
        "note": "Mlocked and VmLck do not count pages pinned by the NVIDIA driver (catalog 16): "
                "after launch, watch MemAvailable, never locked memory, to see the table.",
    }
    binding_name, binding = "MemAvailable", m.available_bytes
    if cg_headroom is not None and cg_headroom < binding:
        binding_name, binding = f"cgroup v{cg.version} {cg.limit_dir} (limit {format_bytes(cg.limit_bytes)} - usage {format_bytes(cg.usage_bytes)})", cg_headroom
    ev.update(binding=binding_name, binding_bytes=binding)
    if not plan.size_bytes:
        room = max(0, binding - margin)
        return Verdict(PASS, f"{format_bytes(room)} can be pinned now leaving a {format_bytes(margin)} margin "
                             f"({binding_name} {format_bytes(binding)})", evidence=ev)
    need = plan.total_bytes
    table = plan.total_bytes // PAGE_SIZE * DRIVER_TABLE_BYTES_PER_PAGE if plan.method == "register" else 0
    reserve = plan.reserve_bytes * plan.ranks
    need_all = need + table + reserve
    ev.update(need_bytes=need, driver_table_bytes=table, reserve_bytes=reserve, need_with_tables_bytes=need_all)
    per_rank_fit = max(0, (binding - margin) // plan.ranks - (table + reserve) // plan.ranks)
    extra = f" + {format_bytes(reserve)} reserved" if reserve else ""
    head = f"need {format_bytes(need_all)} ({plan.describe()}{extra}) against {binding_name} {format_bytes(binding)}"
    if need_all > binding:
        remedy = (f"free {format_bytes(need_all + margin - binding)} or shrink the plan: at most "
                  f"{format_bytes(per_rank_fit)} per rank fits with the margin")
        if cg_headroom is not None and binding == cg_headroom:
            remedy += f"; or raise memory.max/limit of {cg.limit_dir}"
        return Verdict(FAIL, head + ": it does not fit; the region would be swapped out or OOM-killed", remedy, ev)
    if need_all + margin > binding:
        return Verdict(WARN, head + f": fits, but leaves {format_bytes(binding - need_all)}, under the "
                                    f"{format_bytes(margin)} margin",
                       f"free memory first or use at most {format_bytes(per_rank_fit)} per rank", ev)
    return Verdict(PASS, head + f": leaves {format_bytes(binding - need_all)}", evidence=ev)


@register("swap", "Swap in use and swap-in rate", needs=("meminfo",), catalog=(1,))
def swap(ctx: Context) -> Verdict:
    m = ctx.meminfo
    swaps = ctx.swaps or []
    swappiness = ctx.vm.get("swappiness")
    used = m.swap_used_bytes or 0
    total = m.swap_total_bytes or 0
    ev = {"swap_total_bytes": total, "swap_used_bytes": used, "swappiness": swappiness,
          "devices": [s.__dict__ for s in swaps], "pswpin_since_boot": (ctx.vmstat or {}).get("pswpin")}
    if not total:
        return Verdict(PASS, "no swap configured: no part of the region can be swapped out "
                             "(past the headroom the OOM killer acts instead)", evidence=ev)
    sample = ctx.swapin
    ev["swapin_sample"] = sample
    if not used:
        return Verdict(PASS, f"{format_bytes(total)} of swap, none in use; swappiness {swappiness}", evidence=ev)
    rate = sample.get("pages_per_s")
    exposed = min(used, ctx.plan.size_bytes) if ctx.plan.size_bytes else used
    head = f"{format_bytes(used)} of {format_bytes(total)} swap in use, swappiness {swappiness}"
    remedy = ("touch and pin the region right after allocating it; keep it out of swap "
              "(memory.swap.max=0 for the launcher's cgroup, or vm.swappiness=0), or swapoff when there is room; "
              "cudaHostAlloc pages are never swapped")
    if rate:
        cost = exposed / PAGE_SIZE / rate
        ev.update(estimated_pin_s=cost, exposed_bytes=exposed)
        return Verdict(WARN, f"{head}; swap-in now {rate:,.0f} pages/s: a region with "
                             f"{format_bytes(exposed)} in swap would take {format_duration(cost)} to pin "
                             "(pinning faults swapped pages back one 4 KiB page at a time)", remedy, ev)
    if not sample.get("sampled"):
        return Verdict(WARN, f"{head}; swap-in rate not sampled ({sample.get('reason')})", remedy, ev)
    return Verdict(PASS, f"{head}; no swap-in during the {sample['window_s']:.1f} s sample", evidence=ev)


@register("psi", "Memory pressure now (PSI)", needs=("psi",))
def pressure(ctx: Context) -> Verdict:
    p = ctx.psi
    some = p.get("some", {}).get("avg10", 0.0)
    full = p.get("full", {}).get("avg10", 0.0)
    ev = {"psi": p}
    head = f"memory pressure some avg10={some:.2f}%, full avg10={full:.2f}%"
    remedy = "wait for the pressure to pass or find what is reclaiming (PSI rises when tasks wait for memory)"
    if full >= 10:
        return Verdict(FAIL, head + ": tasks are fully stalled on memory; a pin now will crawl", remedy, ev)
    if some >= 5 or full >= 1:
        return Verdict(WARN, head + ": reclaim is active; faulting and pinning will be slower", remedy, ev)
    return Verdict(PASS, head, evidence=ev)


@register("memlock", "Locked-memory limit (RLIMIT_MEMLOCK)", needs=("memlock",), catalog=(16,))
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

