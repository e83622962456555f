"""Kernel, driver and device checks: kernel rules (4, 9), driver rules (3, 11), device
capabilities (9), IOMMU (13), NUMA placement (14), hung-task settings (6)."""
from __future__ import annotations

from ..kernel import parse_release
from ..nvidia import version_str
from ..units import GiB, format_bytes, format_duration
from . import FAIL, PASS, SKIP, WARN, Context, Verdict, register

PIN_CAP_6_11 = 2 * GiB          # 6.11: FOLL_LONGTERM pins above 2 GiB fail (fixed by 94efde1d1539)
PER_CALL_LIMIT = 512 * GiB      # driver >= 580.65.06: one registration/allocation of 2^39 B or more fails
SAFE_CHUNK = 64 * GiB           # what vLLM settled on (#51080/#51081)


@register("kernel", "Kernel release rules for long-term pins", needs=("release",), catalog=(4, 9))
def kernel_rules(ctx: Context) -> Verdict:
    rel = parse_release(ctx.release)
    plan = ctx.plan
    ev = {"release": ctx.release, "parsed": rel, "per_call_bytes": plan.per_call_bytes}
    if rel is None:
        return Verdict(SKIP, f"cannot parse kernel release {ctx.release!r}", evidence=ev)
    head = f"Linux {ctx.release}"
    if rel[:2] == (6, 11) and plan.uses_gpu and plan.per_call_bytes and plan.per_call_bytes > PIN_CAP_6_11:
        return Verdict(FAIL, f"{head}: 6.11 fails long-term pins above 2 GiB (a folio array too large for "
                             f"kmalloc) and this plan pins {format_bytes(plan.per_call_bytes)} per call (catalog 4)",
                       "run a kernel >= 6.12 (or a 6.11 build with 94efde1d1539 'mm/gup: avoid an unnecessary "
                       "allocation call for FOLL_LONGTERM cases'), or register in chunks of <= 2 GiB; "
                       "--skip kernel if your build has the fix", ev)
    if (rel >= (6, 5) and plan.method == "register" and plan.source == "file" and plan.map == "shared"
            and not plan.readonly):
        return Verdict(FAIL, f"{head}: >= 6.5 refuses writable long-term pins of shared file mappings; "
                             "cudaHostRegister of this MAP_SHARED file region fails at once with "
                             "cudaErrorInvalidValue (1) (catalog 9)",
                       "register with cudaHostRegisterReadOnly (read-only tables), map it MAP_PRIVATE, "
                       "or copy the table into anonymous or /dev/shm memory", ev)
    if rel < (5, 7):
        return Verdict(WARN, f"{head}: before 5.7 there is no FOLL_PIN accounting (nr_foll_pin_acquired), "
                             "so pin progress cannot be watched", "use a kernel >= 5.7 for investigations", ev)
    return Verdict(PASS, f"{head}: no known long-term pin rule applies to this plan", evidence=ev)


@register("driver", "NVIDIA kernel module and version rules", catalog=(3, 11))
def driver_rules(ctx: Context) -> Verdict:
    nv = ctx.nvidia
    plan = ctx.plan
    if not nv.loaded:
        ev = {"loaded": False}
        if not plan.uses_gpu:
            return Verdict(SKIP, "no NVIDIA kernel module (not needed for --method mlock)", evidence=ev)
        return Verdict(FAIL, f"no NVIDIA driver: {ctx.root.display('proc/driver/nvidia/version')} is absent, "
                             f"the kernel module is not loaded; --method {plan.method} needs it",
                       "load the driver (modprobe nvidia; check dmesg for NVRM errors) or run on a GPU node", ev)
    v = nv.version.version or ()
    flavour = {True: "open", False: "proprietary", None: "unknown"}[nv.version.open_module]
    params = nv.params
    ev = {"loaded": True, "version": version_str(v), "flavour": flavour, "text": nv.version.text,
          "InitializeSystemMemoryAllocations": params.get("InitializeSystemMemoryAllocations"),
          "EnableSystemMemoryPools": params.get("EnableSystemMemoryPools"),
          "gpus": nv.gpus, "per_call_bytes": plan.per_call_bytes}
    head = f"{flavour} module {version_str(v)}"
    if v and v >= (580, 65, 6) and plan.uses_gpu and plan.per_call_bytes and plan.per_call_bytes >= PER_CALL_LIMIT:
        return Verdict(FAIL, f"{head}: a single {'registration' if plan.method == 'register' else 'cudaHostAlloc'} "
                             f"of {format_bytes(plan.per_call_bytes)} (>= 512 GiB) fails with "
                             "cudaErrorMemoryAllocation (2) after the whole pin (catalog 3)",
                       f"pin in chunks of <= {format_bytes(SAFE_CHUNK)} (--chunk 64GiB)", ev)
    notes = []
    pools = params.get("EnableSystemMemoryPools")
    if v and v >= (590, 44) and pools not in ("0",):
        notes.append("system memory pools keep freed pages: MemAvailable does not come back after a free "
                     "(catalog 11)")
    if params.get("InitializeSystemMemoryAllocations") == "1" and plan.method == "hostalloc":
        notes.append("the driver zeroes every page cudaHostAlloc gets (InitializeSystemMemoryAllocations=1); "
                     "measured on an H200 host: 47 GiB in 18.6 s")
    if notes:
        status = WARN if any("pools" in n for n in notes) else PASS
        return Verdict(status, f"{head}: " + "; ".join(notes),
                       "NVreg_EnableSystemMemoryPools=0 to return freed pages" if status == WARN else None, ev)
    return Verdict(PASS, f"{head}: no known version rule applies to this plan", evidence=ev)


@register("device", "GPU capabilities for the pinning method", catalog=(9,))
def device(ctx: Context) -> Verdict:
    plan = ctx.plan
    if ctx.cuda is None:
        return Verdict(SKIP, ctx.cuda_skip_reason or "CUDA probe not run")
    status = ctx.cuda.get("status")
    ev = {"cuda": ctx.cuda}
    if status != "ok":
        msg = ctx.cuda.get("message") or status
        if not plan.uses_gpu:
            return Verdict(SKIP, f"{msg} (not needed for --method mlock)", evidence=ev)
        return Verdict(FAIL, f"CUDA: {msg}",
                       "install the NVIDIA driver and cuda-python matching it, and check that the GPU is visible "
                       "(nvidia-smi; CUDA_VISIBLE_DEVICES)", ev)
    fails, warns, parts = [], [], []
    for dev in ctx.cuda["devices"]:
        a = dev.get("attributes", {})
        label = f"GPU {dev['index']} {dev.get('name')}"
        if plan.method == "register" and a.get("HOST_REGISTER_SUPPORTED") == 0:
            fails.append(f"{label}: HOST_REGISTER_SUPPORTED=0, cudaHostRegister is not supported")
        if plan.method == "register" and plan.readonly and a.get("READ_ONLY_HOST_REGISTER_SUPPORTED") == 0:
            fails.append(f"{label}: READ_ONLY_HOST_REGISTER_SUPPORTED=0, cudaHostRegisterReadOnly fails "
                         "with cudaErrorNotSupported (801)")
        if a.get("PAGEABLE_MEMORY_ACCESS") == 1:
            how = "through the host page tables" if a.get("PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES") else "via HMM"
            warns.append(f"{label}: PAGEABLE_MEMORY_ACCESS=1: the GPU reads pageable memory {how}; "
                         "pinning is not needed to serve rows from the host mapping")
        parts.append(f"{label} (register {a.get('HOST_REGISTER_SUPPORTED')}, read-only "
                     f"{a.get('READ_ONLY_HOST_REGISTER_SUPPORTED')}, pageable access {a.get('PAGEABLE_MEMORY_ACCESS')}, "
                     f"integrated {a.get('INTEGRATED')})")
    if fails:
        return Verdict(FAIL, "; ".join(fails),
                       "use --method hostalloc (cudaHostAlloc) or a GPU/driver that supports registration", ev)
    if warns:
        return Verdict(WARN, "; ".join(warns), "on unified-memory systems skip registration and read the mapping "
                                               "directly (as DS4_EMBD_MMAP does)", ev)
    return Verdict(PASS, f"CUDA driver API {ctx.cuda.get('driver_version')}: " + "; ".join(parts), evidence=ev)


@register("iommu", "IOMMU translation for the GPUs", catalog=(13,))
def iommu_mode(ctx: Context) -> Verdict:
    io = ctx.iommu
    ev = {"units": io.units, "group_types": io.group_types, "device_groups": io.device_groups, "cmdline": io.cmdline}
    if not io.enabled and not ctx.root.live and not ctx.root.exists("sys/kernel/iommu_groups"):
        return Verdict(SKIP, "IOMMU groups are not in this capture", evidence=ev)
    if not io.enabled:
        return Verdict(PASS, "no IOMMU groups: DMA addresses are physical, no mapping cost at registration",
                       evidence=ev)
    gpu_types = {bdf: io.type_for(bdf) for bdf in ctx.gpu_addresses}
    ev["gpu_domain_types"] = gpu_types
    translated = {b: t for b, t in gpu_types.items() if t and t.startswith("DMA")}
    if translated:
        names = ", ".join(f"{b} ({t})" for b, t in translated.items())
        return Verdict(WARN, f"GPU DMA is translated by the IOMMU: {names}: every pinned page is mapped at "
                             "registration and unmapped at unregistration (catalog 13)",
                       "boot with iommu=pt (or intel_iommu=on iommu=pt) so GPU DMA uses an identity domain", ev)
    kinds = sorted(set(t for t in gpu_types.values() if t)) or sorted(set(io.group_types.values()))
    return Verdict(PASS, f"IOMMU domains: {', '.join(kinds) or 'unknown'}" +
                   (f"; cmdline {io.cmdline}" if io.cmdline else ""), evidence=ev)


@register("numa", "NUMA placement of the GPUs against free memory", catalog=(14,))
def numa_placement(ctx: Context) -> Verdict:
    nodes = ctx.numa_nodes
    ev = {"nodes": [n.__dict__ for n in nodes]}
    if not nodes and not ctx.root.live:
        return Verdict(SKIP, "NUMA nodes are not in this capture", evidence=ev)
    if len(nodes) <= 1:
        return Verdict(PASS, f"{len(nodes) or 'no'} NUMA node{'s' if len(nodes) != 1 else ''}: placement cannot be remote",
                       evidence=ev)
    gpu_nodes = {}
    for dev in (ctx.cuda or {}).get("devices", []):
        if dev.get("pci_bus_id"):
            gpu_nodes[dev["pci_bus_id"]] = dev.get("pci_numa_node")
    if not gpu_nodes:
        from ..numa import read_pci_numa_node
        gpu_nodes = {bdf: read_pci_numa_node(ctx.root, bdf) for bdf in ctx.gpu_addresses}
    ev["gpu_nodes"] = gpu_nodes
    if not gpu_nodes:
        return Verdict(SKIP, f"{len(nodes)} NUMA nodes but no GPU found to place against", evidence=ev)
    free = {n.node: n.free_bytes or 0 for n in nodes}
    need = ctx.plan.size_bytes or 0
    short = [f"{bdf} on node {nd} ({format_bytes(free.get(nd, 0))} free)" for bdf, nd in gpu_nodes.items()
             if nd is not None and need and free.get(nd, 0) < need]
    if short:
        return Verdict(WARN, f"{format_bytes(need)} per rank does not fit on the GPU's node: " + "; ".join(short) +
                       ": the region will come from a remote node (catalog 14)",
                       "bind each rank to its GPU's node (numactl --cpunodebind=N --membind=N) and free memory there",
                       ev)
    return Verdict(PASS, "GPUs on nodes " + ", ".join(f"{b}->{n}" for b, n in gpu_nodes.items()) +
                   "; " + ", ".join(f"node {k}: {format_bytes(v)} free" for k, v in free.items()), evidence=ev)


@register("hung_task", "Hung-task detector settings", catalog=(6,))
def hung_task(ctx: Context) -> Verdict:
    h = ctx.hung_task
    timeout, panic = h.get("hung_task_timeout_secs"), h.get("hung_task_panic")
    ev = dict(h)
    ev["note"] = ("the detector does not flag a pin that sleeps once per page (the task is not continuously "
                  "in D state), so a 25-minute swap-in pin is silent in dmesg")
    if timeout is None and not ctx.root.live:
        return Verdict(SKIP, "hung_task sysctls are not in this capture", evidence=ev)
    if timeout is None:
        return Verdict(PASS, "no hung-task detector (CONFIG_DETECT_HUNG_TASK=n): a stalled pin is silent", evidence=ev)
    if timeout == 0:
        return Verdict(PASS, "hung-task detector off (timeout 0): a stalled pin is silent", evidence=ev)
    if panic:
        return Verdict(WARN, f"hung_task_panic=1 with a {format_duration(timeout)} timeout: a long pin holds the "
                             "mmap lock, the process's other threads wait on it in D state, and the detector "
                             "panics the node (catalog 6)",
                       "set kernel.hung_task_panic=0 on nodes that pin large regions, or pin in chunks", ev)
    return Verdict(PASS, f"timeout {format_duration(timeout)}, panic off; it does not flag a pin that sleeps "
                         "once per page, so a swap-in stall is silent", evidence=ev)
