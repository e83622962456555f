"""CUDA facts through cuda.bindings, always in a child process with a timeout.

This module owns the binding calls that observe (`probe`) and the naming of CUDA errors
(`error_name`). A hung or missing driver must never hang or crash the caller, so the parent
only ever runs `python -m diag.cuda probe` under a timeout and reads its JSON.

Result `status` values: ok, no_bindings, no_driver, no_device, driver_too_old, error, timeout.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

__all__ = ["probe_in_child", "ProbeRun", "probe", "error_name", "child_env", "ATTRIBUTES", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 15.0

ATTRIBUTES = (
    "HOST_REGISTER_SUPPORTED",
    "READ_ONLY_HOST_REGISTER_SUPPORTED",
    "PAGEABLE_MEMORY_ACCESS",
    "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
    "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
    "INTEGRATED",
    "HOST_NUMA_ID",  # CUDA 12.2+
    "CAN_MAP_HOST_MEMORY",
    "GPU_DIRECT_RDMA_SUPPORTED",
    "ASYNC_ENGINE_COUNT",
)


def error_name(err: Any) -> str:
    """'cudaErrorInvalidValue (1)' or 'CUDA_ERROR_NO_DEVICE (100)' for a runtime or driver enum."""
    name = getattr(err, "name", None) or str(err)
    try:
        code = int(err)
    except (TypeError, ValueError):
        code = getattr(err, "value", "?")
    return f"{name} ({code})"


def _pci_numa_node(bdf: str) -> int | None:
    try:
        with open(f"/sys/bus/pci/devices/{bdf.lower()}/numa_node") as fh:
            value = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def probe() -> dict[str, Any]:
    """Runs in the child. Never raises: every failure is a status with a message."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}  # seconds per step, since the probe began: where a slow probe spends it
    out: dict[str, Any] = {"status": "error", "message": None, "devices": [], "driver_version": None,
                           "bindings_version": None, "bindings_cuda_version": None, "timings_s": timings}

    def mark(step: str) -> None:
        timings[step] = round(time.monotonic() - t0, 4)

    try:
        import cuda.bindings
        from cuda.bindings import driver
        mark("import_bindings")
    except ImportError as exc:
        out.update(status="no_bindings",
                   message=f"cuda-bindings is not installed ({exc}); pip install cuda-bindings")
        return out
    out["bindings_version"] = getattr(cuda.bindings, "__version__", None)
    out["bindings_cuda_version"] = getattr(driver, "CUDA_VERSION", None)
    try:
        (err,) = driver.cuInit(0)
        mark("cuInit")
    except Exception as exc:  # cuda.pathfinder raises when libcuda.so.1 cannot be found
        out.update(status="no_driver", message="no NVIDIA driver: libcuda.so.1 could not be loaded",
                   detail=f"{type(exc).__name__}: {exc}")
        return out
    if err != driver.CUresult.CUDA_SUCCESS:
        status = {"CUDA_ERROR_NO_DEVICE": "no_device", "CUDA_ERROR_STUB_LIBRARY": "no_driver",
                  "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "driver_too_old"}.get(getattr(err, "name", ""), "error")
        out.update(status=status, message=f"cuInit failed: {error_name(err)}")
        return out
    err, version = driver.cuDriverGetVersion()
    out["driver_version"] = int(version) if err == driver.CUresult.CUDA_SUCCESS else None
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS:
        out.update(message=f"cuDeviceGetCount failed: {error_name(err)}")
        return out
    for index in range(count):
        dev_info: dict[str, Any] = {"index": index, "attributes": {}}
        err, dev = driver.cuDeviceGet(index)
        if err != driver.CUresult.CUDA_SUCCESS:
            dev_info["error"] = f"cuDeviceGet: {error_name(err)}"
            out["devices"].append(dev_info)
            continue
        err, name = driver.cuDeviceGetName(256, dev)
        dev_info["name"] = name.split(b"\0", 1)[0].decode() if err == driver.CUresult.CUDA_SUCCESS else None
        err, total = driver.cuDeviceTotalMem(dev)
        dev_info["total_mem_bytes"] = int(total) if err == driver.CUresult.CUDA_SUCCESS else None
        err, bus = driver.cuDeviceGetPCIBusId(32, dev)
        bdf = bus.split(b"\0", 1)[0].decode().lower() if err == driver.CUresult.CUDA_SUCCESS else None
        dev_info["pci_bus_id"] = bdf
        dev_info["pci_numa_node"] = _pci_numa_node(bdf) if bdf else None
        for attr in ATTRIBUTES:
            enum = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{attr}", None)
            if enum is None:
                dev_info["attributes"][attr] = None  # older bindings lack it
                continue
            try:
                err, value = driver.cuDeviceGetAttribute(enum, dev)
            except Exception:  # an attribute the driver predates
                err, value = None, None
            dev_info["attributes"][attr] = int(value) if err == driver.CUresult.CUDA_SUCCESS else None
        out["devices"].append(dev_info)
    mark("devices")
    major_driver = (out["driver_version"] or 0) // 1000
    major_bindings = (out["bindings_cuda_version"] or 0) // 1000
    if major_driver and major_bindings and major_driver < major_bindings:
        out.update(status="driver_too_old",
                   message=f"the driver supports CUDA {major_driver}.x but cuda-bindings is built for "
                           f"{major_bindings}.x; install cuda-bindings=={major_driver}.* or update the driver")
        return out
    if count == 0:
        out.update(status="no_device", message="the driver sees no CUDA device")
        return out
    from .gpuprocs import nvml_processes
    out["gpu_processes"] = nvml_processes()  # co-tenants (catalog 7), read here: NVML may hang like CUDA
    mark("nvml")
    out.update(status="ok", message=f"{count} device(s), CUDA driver API {out['driver_version']}")
    return out


STATUSES = ("ok", "no_bindings", "no_driver", "no_device", "driver_too_old", "error", "timeout")


def _garbled(result: Any) -> str | None:
    """What makes a probe's output unusable, or None: the parent never reads a damaged result as ok."""
    if result is None:
        return "no JSON on stdout"
    if not isinstance(result, dict):
        return f"a {type(result).__name__}, not an object"
    if result.get("status") not in STATUSES:
        return f"status {result.get('status')!r}"
    if not isinstance(result.get("devices"), list):
        return "no device list"
    if result["status"] == "ok" and (not result["devices"] or not all(
            isinstance(d, dict) and isinstance(d.get("attributes"), dict) for d in result["devices"])):
        return "status ok without devices and their attributes"
    return None


def child_env() -> dict[str, str]:
    """The environment for a hostpin child interpreter (`python -m diag... / repro...`): this
    checkout first on the path, whether hostpin is installed or run from the source tree."""
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def probe_in_child(timeout: float = DEFAULT_TIMEOUT_S, started=None) -> dict[str, Any]:
    """Run probe() in a fresh interpreter; a hang becomes status 'timeout', never a hang here.
    started(proc) is called with the child as soon as it runs (ProbeRun kills it from there)."""
    import subprocess  # the parent's alone: the child, which imports this module too, never needs it
    env = child_env()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "diag.cuda", "probe"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    if started is not None:
        started(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        return {"status": "timeout", "duration_s": round(time.monotonic() - t0, 3),
                "message": f"the CUDA probe did not answer within {timeout:g} s (a hung driver?); killed",
                "stdout": (stdout or b"").decode(errors="replace"),
                "stderr": (stderr or b"").decode(errors="replace"), "devices": [], "returncode": None}
    duration = round(time.monotonic() - t0, 3)
    proc.stdout, proc.stderr = stdout, stderr  # read below as subprocess.run's result was
    try:
        result = json.loads(proc.stdout.decode(errors="replace") or "null")
    except json.JSONDecodeError:
        result = None
    problem = _garbled(result)
    if problem:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
        result = {"status": "error", "devices": [],
                  "message": f"the CUDA probe exited {proc.returncode} without a usable result ({problem})"
                             + (f": {tail[0][:200]}" if tail else ""),
                  "stdout": proc.stdout.decode(errors="replace")[:2000]}
    result["duration_s"] = duration
    result["returncode"] = proc.returncode
    result["stderr"] = proc.stderr.decode(errors="replace")[-4000:]
    return result


class ProbeRun:
    """The probe's child, started now in a thread of its own so that it runs while the caller reads
    /proc (or imports the checks): `box["result"]` once the thread ends; cancel() kills the child
    (a command that fails before it needs the probe leaves no child behind)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S):
        self.box: dict[str, Any] = {"started": time.time()}
        self._proc = None
        self._cancelled = threading.Event()
        self.thread = threading.Thread(target=self._work, args=(timeout,), name="cuda-probe", daemon=True)
        self.thread.start()

    def _work(self, timeout: float) -> None:
        self.box["result"] = probe_in_child(timeout, started=self._started)

    def _started(self, proc) -> None:
        self._proc = proc
        if self._cancelled.is_set():
            proc.kill()

    def cancel(self) -> None:
        self._cancelled.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()


if __name__ == "__main__":
    if sys.argv[1:] == ["probe"]:
        sys.stdout.write(json.dumps(probe()) + "\n")
        sys.exit(0)
    sys.stderr.write("usage: python -m diag.cuda probe\n")
    sys.exit(2)
