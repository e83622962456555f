"""The pinning child: `python -m repro.pinner SPEC_JSON`.

It maps a region, waits for the watchdog's commands, and reports every step as one JSON line
on the events pipe (the fd number is spec["events_fd"]). Commands arrive on stdin, one word per line:

    prefault   touch every page (the watchdog may have put a memory limit on us first)
    pin        pin the region (mlock / cudaHostRegister / cudaHostAlloc), in chunks
    quit       undo the pin, free everything, exit

The child asks the kernel to SIGKILL it if the watchdog dies (PR_SET_PDEATHSIG), so it can
never outlive the run that started it.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import traceback

from diag.placement import rank_device

from .region import (Region, make_uffd_region, map_region, mlock_range, munlock_range, prefault)

_events = None


def emit(event: str, **fields) -> None:
    fields.update(event=event, t=time.time(), pid=os.getpid())
    _events.write(json.dumps(fields) + "\n")
    _events.flush()


def _pdeathsig() -> None:
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before we got here
        os._exit(1)


class Pinner:
    def __init__(self, spec: dict):
        self.spec = spec
        self.size = spec["size"]
        self.method = spec["method"]
        self.chunk = spec.get("chunk") or self.size
        self.cuda = None
        self.region: Region | None = None
        self.host_ptr: int | None = None
        self.pinned: list[tuple[int, int]] = []  # (addr, size) pinned so far, for the undo
        self.torch_call = spec.get("torch_call") if spec.get("allocator") == "torch" else None
        self.torch = None
        self.tensors: list = []   # PyTorch's pinned tensors, held until the undo
        self.device: int | None = None  # the CUDA device this rank uses (None: --method mlock opens none)

    # -- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        spec = self.spec
        if self.torch_call:
            t0 = time.monotonic()
            import torch  # the launcher's interpreter (--python); the parent checked that it imports
            torch.cuda.init()
            count = torch.cuda.device_count()
            self.device = self.choose_device(count)
            torch.cuda.set_device(self.device)
            self.torch = torch
            emit("cuda_ready", seconds=time.monotonic() - t0, torch_version=torch.__version__, device=self.device,
                 device_count=count)
        elif self.method in ("register", "hostalloc"):
            from .cudapin import Cuda, device_count
            t0 = time.monotonic()
            count = device_count()
            self.device = self.choose_device(count)
            self.cuda = Cuda(self.device)
            emit("cuda_ready", seconds=time.monotonic() - t0, device=self.device, device_count=count)
        calibration = self.calibrate() if spec.get("calibrate") else None
        if self.method != "hostalloc" or self.torch_call == "pin_memory":
            writable = spec.get("register_flags") != "readonly"
            if spec["source"] == "uffd":
                self.region = make_uffd_region(self.size)
            else:
                self.region = map_region(self.size, spec["source"], spec["map"], writable=writable, thp=spec.get("thp"))
        emit("ready", calibration=calibration, addr=self.region.addr if self.region else None)

    def choose_device(self, count: int) -> int:
        """This rank's CUDA device (diag.placement: the --devices given, else rank i -> GPU i of the
        `count` this process sees). One the process does not see is NoSuchDevice."""
        device = rank_device(self.spec.get("rank", 0), count, self.spec.get("devices"))
        self.device = device
        if not 0 <= device < count:
            raise NoSuchDevice(self.spec.get("rank", 0), device, count)
        return device

    def calibrate(self) -> dict:
        """This node's clean rate: a small prefaulted region pinned and unpinned the same way."""
        size = min(self.size, self.spec.get("calibrate_bytes", 256 << 20))
        t0 = time.monotonic()
        if self.method == "hostalloc":
            ptr = self.cuda.host_alloc(size)
            seconds = time.monotonic() - t0
            self.cuda.free_host(ptr)
            return {"bytes": size, "seconds": seconds}
        region = map_region(size, "anon", "private", writable=True, thp=self.spec.get("thp"))
        try:
            prefault(region, threads=self.spec.get("prefault_threads", 8))
            t0 = time.monotonic()
            if self.method == "mlock":
                mlock_range(region.addr, size)
                seconds = time.monotonic() - t0
                munlock_range(region.addr, size)
            else:
                self.cuda.register(region.addr, size, "default")
                seconds = time.monotonic() - t0
                self.cuda.unregister(region.addr)
        finally:
            region.close()
        return {"bytes": size, "seconds": seconds}

    # -- phases ------------------------------------------------------------------------------
    def do_prefault(self) -> None:
        if self.region is None:
            emit("prefault_done", skipped="cudaHostAlloc allocates its own pages")
            return
        emit("prefault_start")
        result = prefault(self.region, threads=self.spec.get("prefault_threads", 8),
                          piece=self.spec.get("prefault_piece", 256 << 20))
        emit("prefault_done", **result)

    def do_pageout(self, amount: int) -> None:
        """MADV_PAGEOUT on the first `amount` bytes: written to swap (they stay in the swap
        cache until the watchdog reclaims that too)."""
        from .region import MADV_PAGEOUT, libc
        import ctypes as _c
        emit("pageout_start", bytes=amount)
        t0 = time.monotonic()
        off, piece = 0, 64 << 20
        while off < amount:
            size = min(piece, amount - off)
            if libc.madvise(self.region.addr + off, size, MADV_PAGEOUT) != 0:
                err = _c.get_errno()
                emit("error", command="pageout", error=f"madvise(MADV_PAGEOUT): {os.strerror(err)} (kernel >= 5.4)")
                return
            off += size
        emit("pageout_done", bytes=amount, seconds=time.monotonic() - t0)

    def do_pin(self) -> None:
        emit("pin_start", chunk=self.chunk)
        t_start = time.monotonic()
        chunks = []
        offset = 0
        try:
            while offset < self.size:
                piece = min(self.chunk, self.size - offset)
                t0 = time.monotonic()
                if self.torch_call:
                    self.torch_pin(offset, piece)
                elif self.method == "mlock":
                    mlock_range(self.region.addr + offset, piece)
                    self.pinned.append((self.region.addr + offset, piece))
                elif self.method == "register":
                    self.cuda.register(self.region.addr + offset, piece, self.spec.get("register_flags", "default"))
                    self.pinned.append((self.region.addr + offset, piece))
                else:
                    ptr = self.cuda.host_alloc(piece)
                    self.pinned.append((ptr, piece))
                chunks.append({"offset": offset, "bytes": piece, "seconds": time.monotonic() - t0})
                emit("chunk_done", **chunks[-1])
                offset += piece
            if self.spec.get("register_twice") and self.method == "register":
                self.cuda.register(self.region.addr, min(self.chunk, self.size), self.spec.get("register_flags", "default"))
        except Exception as exc:
            emit("pin_failed", seconds=time.monotonic() - t_start, **_describe(exc), chunks=chunks)
            return
        emit("pin_done", seconds=time.monotonic() - t_start, chunks=chunks, **self.torch_stats())

    # -- PyTorch (--allocator torch) -----------------------------------------------------------
    def _region_tensor(self, offset: int, piece: int):
        buf = (ctypes.c_uint8 * piece).from_address(self.region.addr + offset)
        return self.torch.frombuffer(buf, dtype=self.torch.uint8)

    def torch_pin(self, offset: int, piece: int) -> None:
        torch = self.torch
        if self.torch_call == "empty":
            self.tensors.append(torch.empty(piece, dtype=torch.uint8, pin_memory=True))
        elif self.torch_call == "pin_memory":
            # a pinned buffer from the caching host allocator, then a copy that reads the source
            self.tensors.append(self._region_tensor(offset, piece).pin_memory())
        else:
            t = self._region_tensor(offset, piece)
            flags = {"default": 0, "portable": 1, "mapped": 2, "readonly": 8}[self.spec.get("register_flags", "default")]
            err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), piece, flags)
            code = int(getattr(err, "value", err))
            if code:
                raise TorchCudaError("cudaHostRegister", code, str(err))
            self.tensors.append(t)
            self.pinned.append((t.data_ptr(), piece))

    def torch_stats(self) -> dict:
        """What PyTorch's caching host allocator reports holding (reserved = what it pinned)."""
        if self.torch is None or self.torch_call == "register":
            return {}
        out = {"torch_version": self.torch.__version__}
        try:
            stats = self.torch.cuda.host_memory_stats()
            out["torch_host_reserved_bytes"] = stats.get("reserved_bytes.current")
            out["torch_host_allocated_bytes"] = stats.get("allocated_bytes.current")
        except Exception as exc:  # older releases have no host_memory_stats
            out["torch_host_stats_error"] = f"{type(exc).__name__}: {exc}"
        return out

    def torch_undo(self) -> list[str]:
        errors = []
        if self.torch_call == "register":
            for addr, _ in reversed(self.pinned):
                err = self.torch.cuda.cudart().cudaHostUnregister(addr)
                if int(getattr(err, "value", err)):
                    errors.append(f"cudaHostUnregister: {err}")
        self.pinned.clear()
        self.tensors.clear()
        empty = getattr(self.torch._C, "_host_emptyCache", None)
        if empty is not None:  # the freed blocks stay pinned in the cache until this
            empty()
        return errors

    def undo(self) -> None:
        t0 = time.monotonic()
        errors = []
        if self.torch is not None:
            errors = self.torch_undo()
        for addr, size in reversed(self.pinned):
            try:
                if self.method == "mlock":
                    munlock_range(addr, size)
                elif self.method == "register":
                    self.cuda.unregister(addr)
                else:
                    self.cuda.free_host(addr)
            except Exception as exc:
                errors.append(str(exc))
        self.pinned.clear()
        if self.region is not None:
            self.region.close()
            self.region = None
        emit("unpin_done", seconds=time.monotonic() - t0, errors=errors)


class NoSuchDevice(RuntimeError):
    """The rank's device is not one this process sees: cudaSetDevice's cudaErrorInvalidDevice, named
    before it is called."""
    call, code, name = "cudaSetDevice", 101, "cudaErrorInvalidDevice (101)"  # diag.cuda.error_name's form

    def __init__(self, rank: int, device: int, count: int):
        seen = f"{count} CUDA device{'s' if count != 1 else ''}" + (
            f" ({', '.join(map(str, range(count)))})" if count else "")
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:  # the devices CUDA numbers are these only
            seen += f" under CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES'][:80]!r}"
        super().__init__(f"rank {rank} was given CUDA device {device}, and this node shows {seen}; give --devices "
                         "one of those per rank")


class TorchCudaError(RuntimeError):
    """A CUDA runtime call through torch.cuda.cudart() that did not return cudaSuccess."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"{call}: {name} ({code})")
        self.call, self.code, self.name = call, code, name.split(".")[-1]


def _describe(exc: BaseException) -> dict:
    from .region import LibcError
    out = {"error": str(exc), "type": type(exc).__name__}
    if hasattr(exc, "code") and hasattr(exc, "call"):  # CudaError
        out.update(call=exc.call, code=exc.code, name=exc.name)
    elif isinstance(exc, LibcError):
        import errno
        call = str(exc).split(" ", 1)[0].split(":", 1)[0] or "libc"  # 'mlock of ...', 'mmap of ...', 'madvise(...)'
        out.update(call=call, code=exc.errno, name=errno.errorcode.get(exc.errno, str(exc.errno)))
    return out


def main() -> int:
    global _events
    _pdeathsig()
    spec = json.loads(sys.argv[1])
    _events = os.fdopen(spec["events_fd"], "w", buffering=1)
    pinner = Pinner(spec)
    try:
        pinner.setup()
    except Exception as exc:
        emit("setup_failed", **_describe(exc), device=pinner.device, traceback=traceback.format_exc())
        return 1
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "prefault":
                pinner.do_prefault()
            elif command.startswith("pageout "):
                pinner.do_pageout(int(command.split()[1]))
            elif command == "pin":
                pinner.do_pin()
            elif command == "quit":
                break
        except Exception as exc:
            emit("error", command=command, **_describe(exc), traceback=traceback.format_exc())
    pinner.undo()
    emit("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
