"""Kernel, driver and device checks: kernel rules (4, 9), driver rules (3, 11), device
capabilities (9), IOMMU (13), NUMA placement (14), hung-task settings (6).

Every boundary comes from diag/catalog.py, which names its primary source."""
from __future__ import annotations

import os

from .. import catalog
from ..cgroup import parse_mountinfo
from ..facts import ABSENT, NOT_CAPTURED, OK, UNREADABLE
from ..kernel import parse_release
from ..nvidia import version_str
from ..placement import rank_device
from ..units import format_bytes, format_duration
from . import ERROR, FAIL, PASS, SKIP, WARN, Context, Verdict, never, register

SAFE_CHUNK = 64 << 30           # what vLLM settled on (#51080/#51081)


def _gpu_plan(plan) -> bool:
    return plan.uses_gpu


def longterm(ctx: Context) -> bool | None:
    """Whether the node's driver pins with FOLL_LONGTERM (x86, >= 550.67); None when unknown."""
    nv = ctx.nvidia
    version = nv.version.version if nv.loaded and nv.version else None
    arch = (nv.version.arch if nv.loaded and nv.version else None) or ctx.machine
    return catalog.driver_uses_longterm(version, arch)


def file_system(ctx: Context, path: str | None) -> tuple[str | None, bool, str]:
    """(fstype, dax, how it was found) of the table's file, from this root's mountinfo."""
    if not path:
        return None, False, "no --file given"
    text = ctx.root.read_text("proc/self/mountinfo")
    if text is None:
        return None, False, "mountinfo not readable"
    target = os.path.realpath(path) if ctx.root.live else os.path.normpath(path)
    best = None
    for m in parse_mountinfo(text):
        mp = m["mount_point"]
        if target == mp or target.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) > len(best["mount_point"]):
                best = m
    if best is None:
        return None, False, "no mount holds it"
    opts = best["super_options"].split(",")
    dax = "dax" in opts or "dax=always" in opts
    return best["fstype"], dax, f"mounted at {best['mount_point']} ({best['fstype']}{', dax' if dax else ''})"


def catalog_facts(ctx: Context) -> catalog.Facts:
    nv = ctx.nvidia
    plan = ctx.plan
    fs, dax, _ = file_system(ctx, plan.file) if plan.source == "file" else (None, False, "")
    return catalog.Facts(
        release=ctx.release, machine=(nv.version.arch if nv.loaded and nv.version else None) or ctx.machine,
        page_size=ctx.page_size, driver_loaded=nv.loaded,
        driver_version=nv.version.version if nv.loaded and nv.version else None,
        driver_open=nv.version.open_module if nv.loaded and nv.version else None, driver_params=dict(nv.params),
        method=plan.method, per_call_bytes=plan.per_call_bytes, source=plan.source, map=plan.map,
        readonly=plan.readonly, file_fs=fs, file_dax=dax)


@register("kernel", "Kernel release rules for long-term pins", needs=("release",), catalog=(4, 9),
          can_fail=_gpu_plan)
def kernel_rules(ctx: Context) -> Verdict:
    rel = parse_release(ctx.release)
    plan = ctx.plan
    f = catalog_facts(ctx)
    lt = longterm(ctx)
    pages = f.per_call_pages
    ev = {"release": ctx.release, "parsed": rel, "per_call_bytes": plan.per_call_bytes, "per_call_pages": pages,
          "page_size": ctx.page_size, "driver_uses_foll_longterm": lt, "file_fs": f.file_fs, "file_dax": f.file_dax}
    head = f"Linux {ctx.release}"
    if not plan.uses_gpu:
        return Verdict(PASS, f"{head}: mlock does not pin long-term (no FOLL_LONGTERM): the 6.11 cap and the 6.5 "
                             "file rule do not apply", evidence=ev)
    if lt is False:
        why = ("this driver pins without FOLL_LONGTERM (only x86 builds from 550.67 on use it: open-gpu-kernel-"
               "modules os-mlock.c)")
        ev["not_applied"] = why
    lt_text = "" if lt else " (driver not known: assuming it pins with FOLL_LONGTERM, as x86 drivers >= 550.67 do)"
    cap = catalog.pin_cap_6_11(ctx.release)
    if cap and lt is not False and pages and pages > catalog.PIN_CAP_6_11_PAGES:
        what = (f"{head}: 6.11 before 6.11.10 fails a long-term pin of more than {catalog.PIN_CAP_6_11_PAGES:,} pages "
                f"(2 GiB) in one call, and this plan pins {pages:,} pages ({format_bytes(plan.per_call_bytes)}) per "
                f"call; a failed pin there leaves the pages it pinned pinned until reboot (catalog 4){lt_text}")
        remedy = ("run a kernel >= 6.11.10 or 6.12 (94efde1d1539 'mm/gup: avoid an unnecessary allocation call for "
                  "FOLL_LONGTERM cases'), or pin in calls of at most 2 GiB (--chunk 2GiB)")
        if cap == "upstream":
            return Verdict(FAIL, what, remedy, ev, predicted=[4])
        return Verdict(WARN, what.replace("6.11 before 6.11.10 fails", "a 6.11 distribution build, whose suffix does "
                                          "not tell whether the fix was backported, may fail"),
                       remedy + "; check your distribution's changelog for 94efde1d1539, then --skip kernel", ev,
                       predicted=[4])
    refused = catalog.shared_file_refused(f) if lt is not False else None
    if refused == "fsdax":
        return Verdict(FAIL, f"{head}: the table's file is on fsdax ({f.file_fs}, dax): long-term pins of fsdax "
                             "mappings are refused, read-only included (mm/gup.c check_vma_flags, -EOPNOTSUPP) "
                             "(catalog 9)", "copy the table to anonymous memory or /dev/shm before registering",
                       ev, predicted=[9])
    if refused == "writable-shared":
        fs_text = f.file_fs or "a disk file system (assumed: give --file PATH to check)"
        return Verdict(FAIL, f"{head}: >= 6.5 refuses writable long-term pins of shared file mappings on file "
                             f"systems that track dirty pages ({fs_text}); cudaHostRegister of this MAP_SHARED "
                             "region fails at once with cudaErrorInvalidValue (catalog 9)",
                       catalog.entry(9).remedy + " (tmpfs, hugetlbfs and ramfs files are allowed)", ev,
                       predicted=[9])
    if catalog.entry(17).condition(f):
        return Verdict(WARN, f"{head}: a read-only registration of a MAP_PRIVATE file whose pages are not in the "
                             "page cache spun in the kernel without pinning anything on an H200 node (6.18.44, "
                             "580.159.04; catalog 17, measured there, not yet elsewhere)",
                       catalog.entry(17).remedy, ev, predicted=[17])
    if rel is not None and rel < (5, 7):
        return Verdict(WARN, f"{head}: before 5.7 there is no FOLL_PIN accounting (nr_foll_pin_acquired), "
                             "so pin progress cannot be watched", "use a kernel >= 5.7 for investigations", ev)
    tail = f"; {ev['not_applied']}" if lt is False else ""
    return Verdict(PASS, f"{head}: no known long-term pin rule applies to this plan{tail}", evidence=ev)


@register("driver", "NVIDIA kernel module and version rules", catalog=(3, 11), can_fail=_gpu_plan)
def driver_rules(ctx: Context) -> Verdict:
    plan = ctx.plan
    state = ctx.state("nvidia")
    if state in (NOT_CAPTURED, UNREADABLE):
        what = ctx.describe("nvidia")
        if plan.uses_gpu:
            return Verdict(ERROR, f"{state}: {what}; the driver decides this plan",
                           "capture it (hostpin snapshot) or --skip driver", missing=[what])
        return Verdict(SKIP, f"{state}: {what}", missing=[what])
    if state != OK and state != ABSENT:
        return Verdict(ERROR, f"damaged reading: {ctx.describe('nvidia')}", missing=[ctx.describe("nvidia")])
    nv = ctx.nvidia
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
    f = catalog_facts(ctx)
    ev = {"loaded": True, "version": version_str(v), "flavour": flavour, "arch": nv.version.arch,
          "text": nv.version.text, "InitializeSystemMemoryAllocations": params.get("InitializeSystemMemoryAllocations"),
          "EnableSystemMemoryPools": params.get("EnableSystemMemoryPools"), "gpus": nv.gpus,
          "per_call_bytes": plan.per_call_bytes, "per_call_pages": f.per_call_pages,
          "per_call_page_limit": catalog.PER_CALL_PAGE_LIMIT, "page_size": ctx.page_size,
          "driver_uses_foll_longterm": longterm(ctx)}
    head = f"{flavour} module {version_str(v)}"
    if catalog.per_call_page_limit(f) and ctx.page.assumed:
        return Verdict(ERROR, f"{head}: {format_bytes(plan.per_call_bytes)} per call reaches the limit of "
                              f"{catalog.PER_CALL_PAGE_LIMIT:,} pages only with 4 KiB pages, and this tree does not "
                              f"say its page size ({ctx.describe('page_size')})",
                       "capture the node with hostpin snapshot (it records the page size), or --skip driver",
                       ev, missing=[ctx.describe("page_size")])
    if catalog.per_call_page_limit(f):
        what = "registration" if plan.method == "register" else "cudaHostAlloc"
        return Verdict(FAIL, f"{head}: one {what} of {f.per_call_pages:,} pages ({format_bytes(plan.per_call_bytes)}) "
                             f"reaches the driver's limit of {catalog.PER_CALL_PAGE_LIMIT:,} pages per call (a 16 B "
                             "page-table entry per page, one kvzalloc capped at INT_MAX): it fails with "
                             "cudaErrorMemoryAllocation" + (" after the whole pin" if plan.method == "register" else "")
                       + " and dmesg 'NVRM: failed to allocate page table' (catalog 3)",
                       f"pin in chunks of <= {format_bytes(SAFE_CHUNK)} (--chunk 64GiB)", ev, predicted=[3])
    notes, predicted = [], []
    if catalog.pools_apply(f):
        predicted.append(11)
        notes.append("system-memory pools (open module >= 590.44) keep pages cudaFreeHost returns: MemAvailable "
                     "does not come back after a free, but the pooled pages are reclaimable by the pools' shrinker "
                     "(nv-sysmem-alloc-node-*), so they do not take memory from the next pin (catalog 11)")
    if params.get("InitializeSystemMemoryAllocations") == "1" and plan.method == "hostalloc":
        notes.append("the driver zeroes every page cudaHostAlloc gets (InitializeSystemMemoryAllocations=1); "
                     "measured on an H200 host: 47 GiB in 18.6 s")
    if notes:
        return Verdict(PASS, f"{head}: " + "; ".join(notes), evidence=ev, predicted=predicted)
    return Verdict(PASS, f"{head}: no known version rule applies to this plan", evidence=ev)


_NEEDED_ATTRS = ("HOST_REGISTER_SUPPORTED", "READ_ONLY_HOST_REGISTER_SUPPORTED", "PAGEABLE_MEMORY_ACCESS")


def _garbled(cuda: dict) -> str | None:
    """What is wrong with a probe result that says ok, or None."""
    devices = cuda.get("devices")
    if not isinstance(devices, list) or not devices:
        return "status ok but no devices listed"
    for dev in devices:
        if not isinstance(dev, dict) or not isinstance(dev.get("attributes"), dict):
            return "a device without attributes"
        for name in _NEEDED_ATTRS:
            value = dev["attributes"].get(name)
            if value is not None and not isinstance(value, int):
                return f"attribute {name}={value!r}"
    return None


@register("device", "GPU capabilities for the pinning method", catalog=(9,), can_fail=_gpu_plan)
def device(ctx: Context) -> Verdict:
    plan = ctx.plan
    if ctx.cuda is None:
        if ctx.cuda_state in (NOT_CAPTURED, "damaged") and plan.uses_gpu:
            return Verdict(ERROR, f"{ctx.cuda_skip_reason}; the device's capabilities decide this plan",
                           "capture them (hostpin snapshot on the node), or --no-cuda / --skip device to accept the "
                           "gap", missing=[ctx.cuda_skip_reason or "CUDA facts"])
        return Verdict(SKIP, ctx.cuda_skip_reason or "CUDA probe not run")
    if not isinstance(ctx.cuda, dict):
        return Verdict(ERROR, "garbled CUDA probe result (not an object)", "run the probe again: python -m diag.cuda probe")
    status = ctx.cuda.get("status")
    ev = {"cuda": ctx.cuda}
    if status == "ok":
        garbled = _garbled(ctx.cuda)
        if garbled:
            return Verdict(ERROR, f"garbled CUDA probe result: {garbled}", "run the probe again: python -m diag.cuda "
                                  "probe, and report it", ev)
    if status != "ok":
        msg = ctx.cuda.get("message") or status
        if not plan.uses_gpu:
            return Verdict(SKIP, f"{msg} (not needed for --method mlock)", evidence=ev)
        return Verdict(FAIL, f"CUDA: {msg}",
                       "install the NVIDIA driver and cuda-bindings matching it (README: Installing it as a tool), and check "
                       "that the GPU is visible "
                       "(nvidia-smi; CUDA_VISIBLE_DEVICES)", ev)
    fails, warns, notes, parts = [], [], [], []
    for dev in ctx.cuda["devices"]:
        a = dev.get("attributes", {})
        label = f"GPU {dev.get('index')} {dev.get('name')}"
        if plan.method == "register" and a.get("HOST_REGISTER_SUPPORTED") == 0:
            fails.append(f"{label}: HOST_REGISTER_SUPPORTED=0, cudaHostRegister is not supported")
        if plan.method == "register" and plan.readonly and a.get("READ_ONLY_HOST_REGISTER_SUPPORTED") == 0:
            fails.append(f"{label}: READ_ONLY_HOST_REGISTER_SUPPORTED=0, cudaHostRegisterReadOnly fails "
                         "with cudaErrorNotSupported (801)")
        pma, hpt = a.get("PAGEABLE_MEMORY_ACCESS"), a.get("PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES")
        if catalog.registration_unnecessary(pma, hpt):
            warns.append(f"{label}: PAGEABLE_MEMORY_ACCESS=1 through the host's page tables "
                         "(PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES=1, ATS): registration is unnecessary, the GPU "
                         "reads the host mapping directly")
        elif pma == 1:
            notes.append(f"{label}: PAGEABLE_MEMORY_ACCESS=1 through HMM (host page tables 0): the GPU faults and "
                         "migrates pageable pages, so pinning still pays off")
        parts.append(f"{label} (register {a.get('HOST_REGISTER_SUPPORTED')}, read-only "
                     f"{a.get('READ_ONLY_HOST_REGISTER_SUPPORTED')}, pageable access {pma}, host page tables {hpt}, "
                     f"integrated {a.get('INTEGRATED')})")
    if fails:
        return Verdict(FAIL, "; ".join(fails),
                       "use --method hostalloc (cudaHostAlloc) or a GPU/driver that supports registration", ev,
                       predicted=[9])
    if warns and plan.method == "register":
        return Verdict(WARN, "; ".join(warns), "on such systems skip registration and read the mapping directly "
                                               "(as DS4_EMBD_MMAP does)", ev)
    tail = ("; " + "; ".join(notes + warns)) if notes or warns else ""
    return Verdict(PASS, f"CUDA driver API {ctx.cuda.get('driver_version')}: " + "; ".join(parts) + tail, evidence=ev)


@register("iommu", "IOMMU translation for the GPUs", needs=("iommu",), catalog=(13,), can_fail=never,
          absent={"iommu": "no IOMMU groups (DMA addresses are physical, no mapping cost at registration)"})
def iommu_mode(ctx: Context) -> Verdict:
    io = ctx.iommu
    ev = {"units": io.units, "group_types": io.group_types, "device_groups": io.device_groups, "cmdline": io.cmdline}
    if not io.enabled:
        return Verdict(PASS, "no IOMMU groups: DMA addresses are physical, no mapping cost at registration",
                       evidence=ev)
    gpu_types = {bdf: io.type_for(bdf) for bdf in ctx.gpu_addresses}
    ev["gpu_domain_types"] = gpu_types
    translated = {b: t for b, t in gpu_types.items() if t and t.startswith("DMA")}
    if translated and catalog.entry(13).condition(catalog.Facts(iommu_translated=True)):
        names = ", ".join(f"{b} ({t})" for b, t in translated.items())
        return Verdict(WARN, f"GPU DMA is translated by the IOMMU: {names}: every pinned page is mapped at "
                             "registration and unmapped at unregistration (catalog 13)",
                       "boot with iommu=pt (or intel_iommu=on iommu=pt) so GPU DMA uses an identity domain", ev,
                       predicted=[13])
    kinds = sorted(set(t for t in gpu_types.values() if t)) or sorted(set(io.group_types.values()))
    return Verdict(PASS, f"IOMMU domains: {', '.join(kinds) or 'unknown'}" +
                   (f"; cmdline {io.cmdline}" if io.cmdline else ""), evidence=ev)


@register("numa", "NUMA placement of the ranks against each node's free memory", needs=("numa_nodes",),
          catalog=(14,), can_fail=never, absent={"numa_nodes": "no NUMA nodes (CONFIG_NUMA=n): placement cannot be remote"})
def numa_placement(ctx: Context) -> Verdict:
    nodes = ctx.numa_nodes
    ev = {"nodes": [n.__dict__ for n in nodes], "zone_reclaim_mode": ctx.vm.get("zone_reclaim_mode")}
    if len(nodes) <= 1:
        return Verdict(PASS, f"{len(nodes) or 'no'} NUMA node{'s' if len(nodes) != 1 else ''}: placement cannot be remote",
                       evidence=ev)
    gpu_nodes: dict[str, int | None] = {}
    for dev in sorted((ctx.cuda or {}).get("devices", []) or [], key=lambda d: d.get("index", 0)):
        if dev.get("pci_bus_id"):
            gpu_nodes[dev["pci_bus_id"]] = dev.get("pci_numa_node")
    if not gpu_nodes:
        from ..numa import read_pci_numa_node
        gpu_nodes = {bdf: read_pci_numa_node(ctx.root, bdf) for bdf in ctx.gpu_addresses}
    ev["gpu_nodes"] = gpu_nodes
    if not gpu_nodes:
        return Verdict(SKIP, f"{len(nodes)} NUMA nodes but no GPU found to place against", evidence=ev)
    free = {n.node: n.free_bytes or 0 for n in nodes}
    size = ctx.plan.pinned_bytes or 0
    # rank i uses GPU i, wrapping past the last GPU (diag.placement, repro register's default too);
    # ranks sharing a node add up
    gpus = list(gpu_nodes.items())
    per_node: dict[int, list[int]] = {}
    for rank in range(ctx.plan.ranks):
        bdf, nd = gpus[rank_device(rank, len(gpus))]
        if nd is not None:
            per_node.setdefault(nd, []).append(rank)
    ev["ranks_per_node"] = {str(k): v for k, v in per_node.items()}
    short = [f"node {nd}: ranks {', '.join(map(str, ranks))} need {format_bytes(size * len(ranks))}, "
             f"{format_bytes(free.get(nd, 0))} free" for nd, ranks in per_node.items()
             if size and free.get(nd, 0) < size * len(ranks)]
    if short:
        return Verdict(WARN, "the ranks do not fit on their GPUs' nodes: " + "; ".join(short) +
                       ": the rest of the regions will come from a remote node (catalog 14)",
                       catalog.entry(14).remedy + " (numactl --cpunodebind=N --membind=N)", ev, predicted=[14])
    return Verdict(PASS, "GPUs on nodes " + ", ".join(f"{b}->{n}" for b, n in gpu_nodes.items()) +
                   "; " + ", ".join(f"node {k}: {format_bytes(v)} free" for k, v in free.items()), evidence=ev)


@register("hung_task", "Hung-task detector settings", needs=("hung_task",), catalog=(6,), can_fail=never,
          absent={"hung_task": "no hung-task detector (CONFIG_DETECT_HUNG_TASK=n): a stalled pin is silent"})
def hung_task(ctx: Context) -> Verdict:
    h = ctx.hung_task
    timeout, panic = h.get("hung_task_timeout_secs"), h.get("hung_task_panic")
    ev = dict(h)
    ev["note"] = ("the detector does not flag a pin that sleeps once per page (the task is not continuously "
                  "in D state), so a 25-minute swap-in pin is silent in dmesg")
    if timeout == 0:
        return Verdict(PASS, "hung-task detector off (timeout 0): a stalled pin is silent", evidence=ev)
    if catalog.entry(6).condition(catalog.Facts(hung_task_panic=bool(panic))):
        return Verdict(WARN, f"hung_task_panic=1 with a {format_duration(timeout)} timeout: a long pin holds the "
                             "mmap lock, the process's other threads wait on it in D state, and the detector "
                             "panics the node (catalog 6)", catalog.entry(6).remedy, ev, predicted=[6])
    return Verdict(PASS, f"timeout {format_duration(timeout)}, panic off; it does not flag a pin that sleeps "
                         "once per page, so a swap-in stall is silent", evidence=ev)
