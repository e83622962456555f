"""CUDA pinning calls for the child: cudaHostRegister / cudaHostAlloc and their undo.

Runs only in the pinning child, never in the watchdog. Every call goes through `_call`,
which names the error (diag.cuda.error_name), clears the sticky error, and raises CudaError.
"""
from __future__ import annotations

from diag.cuda import error_name

__all__ = ["CudaError", "Cuda", "REGISTER_FLAGS", "device_count"]

REGISTER_FLAGS = {"default": 0, "portable": 1, "mapped": 2, "readonly": 8}  # cudaHostRegister*


class CudaError(RuntimeError):
    def __init__(self, call: str, err):
        self.call = call
        self.code = int(err)
        self.name = error_name(err)
        super().__init__(f"{call}: {self.name}")


def device_count() -> int:
    """The CUDA devices this process sees (CUDA_VISIBLE_DEVICES counts)."""
    from cuda.bindings import runtime
    err, count = runtime.cudaGetDeviceCount()
    if err != runtime.cudaError_t.cudaSuccess:
        runtime.cudaGetLastError()
        raise CudaError("cudaGetDeviceCount", err)
    return int(count)


class Cuda:
    """A CUDA context on one device, created up front so pin timings exclude it."""

    def __init__(self, device: int = 0):
        from cuda.bindings import runtime
        self.rt = runtime
        self.call("cudaSetDevice", runtime.cudaSetDevice(device))
        self.call("cudaFree(0)", runtime.cudaFree(0))  # create the context now

    def call(self, name: str, result):
        err = result[0] if isinstance(result, tuple) else result
        if err != self.rt.cudaError_t.cudaSuccess:
            self.rt.cudaGetLastError()  # clear the sticky error so later calls are not poisoned
            raise CudaError(name, err)
        return result[1] if isinstance(result, tuple) and len(result) > 1 else None

    def register(self, addr: int, size: int, flags: str = "default") -> None:
        self.call("cudaHostRegister", self.rt.cudaHostRegister(addr, size, REGISTER_FLAGS[flags]))

    def unregister(self, addr: int) -> None:
        self.call("cudaHostUnregister", self.rt.cudaHostUnregister(addr))

    def host_alloc(self, size: int) -> int:
        return int(self.call("cudaHostAlloc", self.rt.cudaHostAlloc(size, 0)))

    def free_host(self, ptr: int) -> None:
        self.call("cudaFreeHost", self.rt.cudaFreeHost(ptr))
