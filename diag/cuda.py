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

__all__ = ["probe_in_child", "probe_argv_env", "ProbeRun", "start_early", "take_early", "cancel_early", "probe", "error_name", "child_env", "ATTRIBUTES", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 15.0
ANSWER_MAX = 1 << 20  # the probe's answer is under 1 KiB a GPU: past this, without its newline, it is not one

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


class _Nvml:
    """NVML's co-tenant reading (diag.gpuprocs), run in a thread of the child beside cuInit: the two
    libraries are independent, and NVML's init and queries took 0.12 s after cuInit's 0.19 s on the
    H200 when run one after the other. Its result is only used when the probe ends ok."""

    def __init__(self, t0: float, timings: dict[str, float]):
        self.result: dict[str, Any] | None = None
        self._t0, self._timings = t0, timings
        self.thread = threading.Thread(target=self._work, name="nvml", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            from .gpuprocs import nvml_processes
            self.result = nvml_processes()
        except Exception as exc:  # nvml_processes never raises; an import that fails still must not
            self.result = {"source": None, "error": f"NVML reading failed: {type(exc).__name__}: {exc}"}
        self._timings["nvml_done"] = round(time.monotonic() - self._t0, 4)

    def join(self) -> dict[str, Any]:
        self.thread.join()
        return self.result or {"source": None, "error": "NVML reading gave nothing"}


def probe(nvml: bool = True) -> dict[str, Any]:
    """Runs in the child. Never raises: every failure is a status with a message.
    nvml: read the GPU's co-tenants through NVML too (in a thread, beside cuInit)."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}  # seconds per step, since the probe began: where a slow probe spends it
    out: dict[str, Any] = {"status": "error", "message": None, "devices": [], "driver_version": None,
                           "bindings_version": None, "bindings_cuda_version": None, "timings_s": timings,
                           "began_at": round(time.time(), 4)}  # epoch: the parent aligns its own stamps to it

    def mark(step: str) -> None:
        timings[step] = round(time.monotonic() - t0, 4)

    # beside cuInit only where a driver is loaded: without one cuInit fails at once and NVML is never read
    reader = _Nvml(t0, timings) if nvml and os.path.exists("/proc/driver/nvidia/version") else None
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
    if nvml:  # co-tenants (catalog 7), read here: NVML may hang like CUDA
        if reader is not None:
            out["gpu_processes"] = reader.join()
        else:  # a driver without /proc/driver/nvidia (a container that hides it): read after cuInit, as before
            from .gpuprocs import nvml_processes
            out["gpu_processes"] = nvml_processes()
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


SYSPATH_VAR = "HOSTPIN_PROBE_SYSPATH"


def probe_argv_env() -> tuple[list[str], dict[str, str]]:
    """The probe child's command and environment. It starts without site (-S: no .pth files to
    read, 0.04 s less on the H200, where torch and its wheels install many) and is handed the
    parent's import path instead (HOSTPIN_PROBE_SYSPATH, appended after its standard library as site
    would); it still runs a sitecustomize found on that path, as site would."""
    env = child_env()
    env[SYSPATH_VAR] = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p))
    return [sys.executable, "-S", "-m", "diag.cuda", "probe"], env


def probe_in_child(timeout: float = DEFAULT_TIMEOUT_S, started=None) -> dict[str, Any]:
    """Run probe() in a fresh interpreter; a hang becomes status 'timeout', never a hang here.
    started(proc) is called with the child as soon as it runs (ProbeRun kills it from there).
    The result's `parent_at` holds the parent's epoch stamps (spawned, read): with the child's
    `began_at` and `timings_s` they say where the probe's wall time went."""
    spawned = time.time()
    import subprocess  # the parent's alone: the child, which imports this module too, never needs it
    argv, env = probe_argv_env()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            stdin=subprocess.DEVNULL)
    popen_returned = round(time.time(), 4)
    if started is not None:
        started(proc)
    line = _first_line(proc, t0 + timeout)
    if line is None:  # no answer in time
        proc.kill()
        stdout, stderr = proc.communicate()
        return {"status": "timeout", "duration_s": round(time.monotonic() - t0, 3),
                "parent_at": {"spawn": round(spawned, 4), "popen_returned": popen_returned,
                              "read": round(time.time(), 4)},
                "message": f"the CUDA probe did not answer within {timeout:g} s (a hung driver?); killed",
                "stdout": (stdout or b"").decode(errors="replace"),
                "stderr": (stderr or b"").decode(errors="replace"), "devices": [], "returncode": None}
    duration = round(time.monotonic() - t0, 3)
    parent_at = {"spawn": round(spawned, 4), "popen_returned": popen_returned, "read": round(time.time(), 4)}
    too_long = not line.endswith(b"\n") and len(line) > ANSWER_MAX
    if too_long:  # far more than any answer, and no end to it: not one; the child is stopped here
        proc.kill()
        stdout, stderr = line, proc.communicate()[1]
    elif line.endswith(b"\n"):
        # the answer is whole: the child's exit (the driver closing its files, 0.1 s on the H200) is
        # not waited for; a thread reaps it, and what it wrote to stderr so far is kept
        stdout, stderr = line, _available(proc.stderr)
        if not _REAPING:
            import atexit
            atexit.register(_kill_unreaped)
        _REAPING.add(proc)
        threading.Thread(target=_reap, args=(proc,), name="cuda-probe-reap", daemon=True).start()
    else:  # it ended without a whole line: its exit status and all of stderr say why
        try:
            rest, stderr = proc.communicate(timeout=max(1.0, t0 + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, stderr = proc.communicate()
        stdout = line + (rest or b"")
    proc.stdout, proc.stderr = stdout, stderr  # read below as subprocess.run's result was
    try:
        result = None if too_long else json.loads(proc.stdout.decode(errors="replace") or "null")
    except json.JSONDecodeError:
        result = None
    problem = _garbled(result)
    if too_long:
        problem = f"more than {ANSWER_MAX:,} bytes without a newline; killed"
    if problem:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
        result = {"status": "error", "devices": [],
                  "message": (f"the CUDA probe exited {proc.returncode}" if proc.poll() is not None
                              else "the CUDA probe answered") + f" without a usable result ({problem})"
                             + (f": {tail[0][:200]}" if tail else ""),
                  "stdout": proc.stdout.decode(errors="replace")[:2000]}
    result["duration_s"] = duration
    result["parent_at"] = parent_at
    result["returncode"] = proc.poll()  # None: still exiting after a whole answer (reaped apart)
    result["stderr"] = proc.stderr.decode(errors="replace")[-4000:]
    return result


def _first_line(proc, deadline: float) -> bytes | None:
    """What the child wrote to stdout up to its first newline or its end (EOF), or None if neither
    came by the deadline (time.monotonic()); past ANSWER_MAX bytes without a newline, those bytes."""
    import selectors
    fd = proc.stdout.fileno()
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return buf
            buf += chunk
            if b"\n" in chunk:
                return buf[:buf.index(b"\n") + 1]
            if len(buf) > ANSWER_MAX:
                return buf


def _available(pipe) -> bytes:
    """What is in a pipe now, without waiting (the child's stderr once its answer came)."""
    os.set_blocking(pipe.fileno(), False)
    out = b""
    try:
        while len(out) < 1 << 16:
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            out += chunk
    except BlockingIOError:
        pass
    return out


_REAPING: set = set()  # children that answered and are still exiting: killed when this process exits


def _reap(proc) -> None:
    try:
        proc.wait(timeout=DEFAULT_TIMEOUT_S)
    except Exception:
        proc.kill()
        proc.wait()
    finally:
        _REAPING.discard(proc)
        for pipe in (proc.stdout, proc.stderr):
            try:
                pipe.close()
            except (OSError, AttributeError):
                pass


def _kill_unreaped() -> None:
    """At exit: a child that answered but has not exited (a daemon reaper dies with this process,
    and `hostpin snapshot` left such a child running for ever) is killed. It is not waited for:
    one that is exiting is closing the driver's files (0.1 s on the H200, which waiting put back
    into every preflight: 0.40 -> 0.48 s); its parent after this one, init, reaps it."""
    for proc in list(_REAPING):
        try:
            if proc.poll() is None:
                proc.kill()
        except OSError:
            pass


class ProbeRun:
    """The probe's child, started now in a thread of its own so that it runs while the caller reads
    /proc (or imports the checks): `box["result"]` once the thread ends; cancel() kills the child
    (a command that fails before it needs the probe leaves no child behind)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S):
        self.box: dict[str, Any] = {"started": time.time()}
        self.timeout = timeout
        self.early = False  # started by the console command before click (start_early)
        self._proc = None
        self._cancelled = threading.Event()
        self.thread = threading.Thread(target=self._work, args=(timeout,), name="cuda-probe", daemon=True)
        self.thread.start()

    def _work(self, timeout: float) -> None:
        result = probe_in_child(timeout, started=self._started)
        if isinstance(result.get("parent_at"), dict):
            result["parent_at"]["early"] = self.early
        self.box["result"] = result

    def _started(self, proc) -> None:
        self._proc = proc
        if self._cancelled.is_set():
            proc.kill()

    def cancel(self) -> None:
        self._cancelled.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()


def _child_main() -> None:
    """`python -S -m diag.cuda probe`: the parent's import path after the standard library, then a
    sitecustomize if that path has one (what site would have done), then the probe. It ends with
    os._exit: an NVML thread still inside the library (a probe that ended early, without a driver)
    must not hold up the interpreter's shutdown."""
    extra = [p for p in os.environ.get(SYSPATH_VAR, "").split(os.pathsep) if p and p not in sys.path]
    sys.path.extend(extra)
    if "site" not in sys.modules:
        try:
            import sitecustomize  # noqa: F401
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
    result = probe()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


_EARLY: dict[str, Any] = {}
_NOT_EARLY = ("--no-cuda", "--help", "-h", "--root", "--cuda-timeout", "--config")


def start_early(argv: list[str]) -> None:
    """The console command calls this first, before click and the readers are imported (0.1 s
    and more of a command's start-up): `hostpin preflight ...` that will surely run the probe starts
    its child now, and preflight takes it (take_early). Surely: no --no-cuda, --root, --help,
    --cuda-timeout or --config, and no site file (one could say no_cuda). A command that ends
    without taking it (a bad option) kills the child at exit."""
    if not argv or argv[0] != "preflight" or any(a.split("=", 1)[0] in _NOT_EARLY for a in argv[1:]):
        return
    named = os.environ.get("HOSTPIN_CONFIG")  # diag.config's rule: this variable, else the default file
    if named is not None and named.strip().lower() != "none" or named is None and os.path.lexists(
            "/etc/hostpin/hostpin.toml"):
        return
    import atexit
    run = ProbeRun(DEFAULT_TIMEOUT_S)
    run.early = True
    _EARLY["run"] = run

    def _leave_no_child() -> None:
        if _EARLY.pop("run", None) is run:
            run.cancel()
            run.thread.join(2.0)

    atexit.register(_leave_no_child)


def take_early(timeout: float) -> "ProbeRun | None":
    """The child start_early started, if it runs with this timeout (else it is killed: None)."""
    run = _EARLY.pop("run", None)
    if run is not None and run.timeout != timeout:
        run.cancel()
        return None
    return run


def cancel_early() -> None:
    """A preflight that needs no probe after all kills the child start_early started."""
    run = _EARLY.pop("run", None)
    if run is not None:
        run.cancel()


if __name__ == "__main__":
    if sys.argv[1:] == ["probe"]:
        _child_main()
    sys.stderr.write("usage: python -m diag.cuda probe\n")
    sys.exit(2)
