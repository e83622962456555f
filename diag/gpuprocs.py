"""Who else holds the GPUs and pinned memory on this node (catalog 7).

GPU processes come from NVML, read in the CUDA probe's child process (diag.cuda) through the
binding cuda-python ships (`cuda.bindings.nvml`, public since cuda-bindings 13.2 / 12.9.6;
`cuda.bindings._nvml` before, as an experiment), or `pynvml` (nvidia-ml-py) when that is what
is installed; without any of them, from `nvidia-smi --query-compute-apps`. Other pinners show
as pins outstanding (nr_foll_pin_acquired - nr_foll_pin_released, system-wide, in pages) and
as processes with VmPin or VmLck (/proc/PID/status, which does not take the mmap lock).

>>> parse_compute_apps("pid, process_name, used_gpu_memory [MiB], gpu_bus_id\\n4242, python3, 1024 MiB, 00000000:00:06.0\\n")
[{'pid': 4242, 'name': 'python3', 'used_gpu_memory_bytes': 1073741824, 'gpu': '0000:00:06.0'}]
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from .parsing import ParsedList, to_int
from .process import parse_status

__all__ = ["nvml_processes", "smi_processes", "parse_compute_apps", "pinning_processes", "SMI_QUERY"]

SMI_QUERY = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id", "--format=csv"]


def _bus_id(raw: Any) -> str | None:
    text = raw.decode(errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw or "")
    text = text.split("\0", 1)[0].strip().lower()
    if not text:
        return None
    parts = text.split(":")
    if len(parts) == 3 and len(parts[0]) == 8:  # NVML prints a 32-bit domain: 00000000:00:06.0
        text = f"{parts[0][-4:]}:{parts[1]}:{parts[2]}"
    return text


def nvml_processes() -> dict[str, Any]:
    """Runs in the probe's child. {'source', 'processes': [...]} or {'source', 'error'}; never raises."""
    nvml, source = None, None
    for name in ("cuda.bindings.nvml", "cuda.bindings._nvml"):
        try:
            nvml = __import__(name, fromlist=["init_v2"])
            source = name
            break
        except ImportError:
            continue
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return {"source": None, "error": "no NVML binding (cuda-bindings >= 13.2 or nvidia-ml-py)"}
        return _pynvml_processes(pynvml)
    try:
        nvml.init_v2()
    except Exception as exc:  # the library cannot be loaded: no driver
        return {"source": source, "error": f"NVML init failed: {type(exc).__name__}: {exc}"}
    out: list[dict] = []
    try:
        for index in range(nvml.device_get_count_v2()):
            handle = nvml.device_get_handle_by_index_v2(index)
            try:
                bus = _bus_id(nvml.device_get_pci_info_v3(handle).bus_id)
            except Exception:
                bus = None
            procs = nvml.device_get_compute_running_processes_v3(handle)
            for i in range(len(procs)):
                item = procs[i]
                used = int(item.used_gpu_memory)
                out.append({"pid": int(item.pid), "name": _comm(int(item.pid)),
                            "used_gpu_memory_bytes": None if used >= (1 << 63) else used, "gpu": bus, "index": index})
    except Exception as exc:
        return {"source": source, "error": f"NVML query failed: {type(exc).__name__}: {exc}", "processes": out}
    finally:
        try:
            nvml.shutdown()
        except Exception:
            pass
    return {"source": source, "processes": out}


def _pynvml_processes(pynvml) -> dict[str, Any]:
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return {"source": "pynvml", "error": f"NVML init failed: {exc}"}
    out = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus = _bus_id(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out.append({"pid": int(p.pid), "name": _comm(int(p.pid)), "used_gpu_memory_bytes": p.usedGpuMemory,
                            "gpu": bus, "index": index})
    except Exception as exc:
        return {"source": "pynvml", "error": f"NVML query failed: {exc}", "processes": out}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return {"source": "pynvml", "processes": out}


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def parse_compute_apps(text: str) -> ParsedList:
    """nvidia-smi --query-compute-apps=pid,process_name,used_memory[,gpu_bus_id] --format=csv (with
    its header, or noheader); a damaged row is named in `.bad`."""
    out = ParsedList()
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not line.strip() or cells[0] == "pid" or line.startswith("No running"):
            continue
        pid = to_int(cells[0]) if cells else None
        if pid is None or len(cells) < 3:
            out.bad.append(line.strip()[:80])
            continue
        mem_parts = cells[2].split()
        mem = to_int(mem_parts[0]) if mem_parts else None
        scale = 1 << 20 if len(mem_parts) < 2 or mem_parts[1] == "MiB" else None
        out.append({"pid": pid, "name": cells[1] or None,
                    "used_gpu_memory_bytes": mem * scale if mem is not None and scale else None,
                    "gpu": _bus_id(cells[3]) if len(cells) > 3 else None})
    return out


def smi_processes(timeout: float = 10.0) -> dict[str, Any]:
    """Live: nvidia-smi's query, when NVML through a binding was not available."""
    try:
        proc = subprocess.run(SMI_QUERY, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return {"source": "nvidia-smi", "error": "nvidia-smi is not installed"}
    except subprocess.TimeoutExpired:
        return {"source": "nvidia-smi", "error": f"nvidia-smi did not answer within {timeout:g} s"}
    if proc.returncode != 0:
        return {"source": "nvidia-smi", "error": f"nvidia-smi exited {proc.returncode}: {proc.stderr.strip()[:200]}"}
    rows = parse_compute_apps(proc.stdout)
    return {"source": "nvidia-smi", "processes": list(rows), "bad": rows.bad}


def pinning_processes(exclude: set[int] = frozenset(), limit: int = 10) -> list[dict]:
    """Live: processes with locked (VmLck) or long-term pinned (VmPin) memory, most first."""
    out = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid in exclude:
            continue
        try:
            st = parse_status(Path(f"/proc/{pid}/status").read_text(errors="replace"))
        except OSError:
            continue
        held = (st.vm_pin_bytes or 0) + (st.vm_lck_bytes or 0)
        if held:
            out.append({"pid": pid, "name": st.name, "vm_lck_bytes": st.vm_lck_bytes, "vm_pin_bytes": st.vm_pin_bytes,
                        "rss_shmem_bytes": st.rss_shmem_bytes})
    return sorted(out, key=lambda p: -((p["vm_pin_bytes"] or 0) + (p["vm_lck_bytes"] or 0)))[:limit]
