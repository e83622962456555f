"""Co-tenants (catalog 7): other processes holding the GPUs, and other pinners on the node.

Two large pins at once queue in the driver (measured on the H200: two processes registering
47 GiB each took 5-6 s against 1 s alone), and other pinners' pages are pinned memory the
plan cannot have."""
from __future__ import annotations

import os

from .. import catalog
from ..gpuprocs import parse_compute_apps, pinning_processes, smi_processes
from ..units import GiB, format_bytes
from ..facts import ABSENT
from . import PASS, SKIP, WARN, Context, Verdict, never, register

PINS_OUTSTANDING_THRESHOLD = 1 * GiB  # pins held now beyond this: another pinner is at work


def gpu_processes(ctx: Context) -> dict:
    """{'source', 'processes'} or {'source', 'error'}: NVML from the probe, else nvidia-smi."""
    probe = (ctx.cuda or {}).get("gpu_processes") if isinstance(ctx.cuda, dict) else None
    if isinstance(probe, dict) and isinstance(probe.get("processes"), list) and not probe.get("error"):
        return probe
    if not ctx.nvidia.loaded and ctx.state("nvidia") == ABSENT:
        return {"source": "proc/driver/nvidia", "processes": [], "note": "no NVIDIA driver: no GPU co-tenants"}
    if ctx.root.live:
        smi = smi_processes()
        if probe and probe.get("error"):
            smi["nvml_error"] = probe["error"]
        return smi
    data = ctx.root.beside("commands/nvidia-smi-apps.txt", limit=1 << 20)
    text = data.decode(errors="replace") if data is not None else None
    if text is None:
        return {"source": None, "error": "GPU processes not captured (no NVML result in probes/cuda.json, "
                                         "no commands/nvidia-smi-apps.txt)"}
    rows = parse_compute_apps(text)
    return {"source": "commands/nvidia-smi-apps.txt", "processes": list(rows), "bad": rows.bad}


@register("cotenants", "Other processes on the GPUs, and other pinners", catalog=(7,), can_fail=never)
def cotenants(ctx: Context) -> Verdict:
    plan = ctx.plan
    vm = ctx.vmstat or {}
    acquired, released = vm.get("nr_foll_pin_acquired"), vm.get("nr_foll_pin_released")
    pins = (acquired - released) * ctx.page_size if acquired is not None and released is not None else None
    own = {os.getpid()}
    pinners = pinning_processes(exclude=own) if ctx.root.live else []
    gpu = gpu_processes(ctx) if plan.uses_gpu or ctx.nvidia.loaded else {"source": None, "error": "not needed"}
    others = [p for p in gpu.get("processes") or [] if p.get("pid") not in own]
    ev = {"gpu_processes": others, "gpu_processes_source": gpu.get("source"), "gpu_processes_error": gpu.get("error"),
          "pins_outstanding_bytes": pins, "pins_outstanding_threshold_bytes": PINS_OUTSTANDING_THRESHOLD,
          "pinning_processes": pinners}
    facts = catalog.Facts(gpu_cotenants=len(others) if plan.uses_gpu else 0, pins_outstanding_bytes=pins)
    parts, warn = [], False
    if others:
        warn = warn or bool(catalog.entry(7).condition(facts))
        parts.append(f"{len(others)} other process(es) on the GPUs: " + ", ".join(
            f"pid {p['pid']} ({p.get('name') or '?'}, {format_bytes(p.get('used_gpu_memory_bytes'))} GPU memory"
            f"{', ' + p['gpu'] if p.get('gpu') else ''})" for p in others[:5]))
    if pins is not None and pins > PINS_OUTSTANDING_THRESHOLD:
        warn = warn or plan.uses_gpu
        who = (": " + ", ".join(f"pid {p['pid']} ({p['name']}, VmPin {format_bytes(p['vm_pin_bytes'])}, VmLck "
                                f"{format_bytes(p['vm_lck_bytes'])})" for p in pinners[:3])) if pinners else \
            " (driver pins show in no process's VmPin or VmLck; see the GPU processes)"
        parts.append(f"{format_bytes(pins)} pinned now by other pinners (pins outstanding){who}")
    if not parts:
        where = (gpu["note"] if gpu.get("note") else
                 f"no other GPU process ({gpu.get('source')})" if gpu.get("source") and not gpu.get("error")
                 else f"GPU processes unknown ({gpu.get('error')})")
        pin_text = f"pins outstanding {format_bytes(pins)}" if pins is not None else "pins outstanding unknown"
        if gpu.get("error") and not ctx.root.live and plan.uses_gpu:
            return Verdict(SKIP, f"{where}; {pin_text}", evidence=ev, missing=[gpu["error"]])
        return Verdict(PASS, f"{where}; {pin_text}", evidence=ev)
    text = "; ".join(parts)
    if warn:
        return Verdict(WARN, text + ": large pins at once queue in the driver (measured on the H200: 2 x 47 GiB "
                                    "registered at once took 5-6 s each against 1 s alone) (catalog 7)",
                       catalog.entry(7).remedy, ev, predicted=[7])
    return Verdict(PASS, text, evidence=ev)
