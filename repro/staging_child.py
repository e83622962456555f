"""The staging-memory child: `python -m repro.staging_child SPEC_JSON`, one fresh process per repeat.

It runs bursts of concurrent copies in the order the spec gives, each burst one of three sides:
- pageable: cudaMemcpy from (or to) freshly mapped pageable buffers;
- pinned: the same from cudaHostAlloc buffers;
- control: the same bursts as memcpy between pageable buffers, no CUDA: the destination
  buffers stand where the device buffers stand, allocated once before the baseline.
After every burst the sources are freed and the allocator trimmed, then the memory accounting
settles (repro.settle: per-CPU lists, watermark boost, cgroup, pins, ...) and the process's RSS
by kind of mapping is read. One JSON document goes to stdout at the end, one JSON line per
step to stderr as it goes (the parent keeps both).

CUDA is imported only when a CUDA side is in the sequence: a control-only run never loads it
(the output says whether it was loaded).

Traps it avoids: glibc keeping freed chunks (buffers are mmap'd, malloc_trim after each burst),
zero pages (buffers are filled), a growing MemTotal (in use = MemTotal - MemAvailable).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import mmap
import os
import sys
import threading
import time

from diag.memacct import memcg_dir
from diag.rootfs import Root

from .settle import Settler

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.malloc_trim.argtypes = [ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.memset.restype = ctypes.c_void_p
libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
libc.memcpy.restype = ctypes.c_void_p

CUDA_SIDES = ("pageable", "pinned")


def log(step: str, **fields) -> None:
    sys.stderr.write(json.dumps({"step": step, "t": time.time(), **fields}) + "\n")
    sys.stderr.flush()


def snapshot(settler: Settler) -> dict:
    """The settled accounting and this process's RSS, after collecting and trimming."""
    gc.collect()
    libc.malloc_trim(0)
    return settler.settle()


def _mapped(size: int, count: int) -> tuple[list[mmap.mmap], list[int]]:
    maps = [mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(count)]
    return maps, [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in maps]


def _unmap(maps: list[mmap.mmap]) -> None:
    for m in maps:
        m.close()


def _concurrently(fn, count: int) -> float:
    """fn(i) on count threads at once; seconds until all returned. ctypes and cuda.bindings
    release the GIL during the call, so the copies do run in parallel."""
    errors: list[str] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except Exception as exc:  # the first error is raised below, with its name
            errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"copy failed: {errors[0]}")
    return seconds


def run(spec: dict) -> dict:
    size, threads = spec["bytes"], spec["threads"]
    per = -(-size // threads)
    per = -(-per // 4096) * 4096
    directions = ["h2d", "d2h"] if spec["direction"] == "both" else [spec["direction"]]
    sides = set(spec["sequence"])
    root = Root("/")
    settler = Settler(root, memcg_dir(root), tolerance=spec.get("settle_tolerance", 1 << 20),
                      max_s=spec.get("settle_max_s", 3.0), gap_s=spec.get("settle_gap_s", 0.15))
    out: dict = {"spec": spec, "pid": os.getpid(), "steps": [], "per_burst_bytes": per * threads}
    out["before_context"] = snapshot(settler)
    cuda = rt = None
    dev_bufs: list = []
    if sides & set(CUDA_SIDES):
        from .cudapin import Cuda
        t0 = time.monotonic()
        cuda = Cuda(spec.get("device", 0))
        rt = cuda.rt
        out["context_s"] = time.monotonic() - t0
        dev_bufs = [cuda.call("cudaMalloc", rt.cudaMalloc(per)) for _ in range(threads)]
    dst_maps: list[mmap.mmap] = []
    dst: list[int] = []
    if "control" in sides:
        # the control's stand-in for the device buffers: filled once, before the baseline
        dst_maps, dst = _mapped(per, threads)
        _concurrently(lambda i: libc.memset(dst[i], 0xA5, per), threads)
    # the baseline, twice, some time apart: their difference is reported as drift
    base1 = snapshot(settler)
    time.sleep(spec.get("settle_s", 0.3))
    base2 = snapshot(settler)
    out["baseline"] = base2
    out["baseline_first"] = base1
    log("baseline", settled=base2["settle"]["settled"], seconds=base2["settle"]["seconds"])
    for index, side in enumerate(spec["sequence"]):
        pinned: list[int] = []
        maps: list[mmap.mmap] = []
        if side == "pinned":
            ptrs = pinned = [int(cuda.call("cudaHostAlloc", rt.cudaHostAlloc(per, 0))) for _ in range(threads)]
        else:
            maps, ptrs = _mapped(per, threads)
        fill_s = _concurrently(lambda i: libc.memset(ptrs[i], 0x5A, per), threads)  # no zero pages
        step = {"index": index, "side": side, "throughput": {}, "fill_s": fill_s}
        for direction in directions:
            if side == "control":
                def copy(i: int, d=direction) -> None:
                    if d == "h2d":
                        libc.memcpy(dst[i], ptrs[i], per)
                    else:
                        libc.memcpy(ptrs[i], dst[i], per)
            else:
                kind = (rt.cudaMemcpyKind.cudaMemcpyHostToDevice if direction == "h2d"
                        else rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)

                def copy(i: int, d=direction, k=kind) -> None:
                    if d == "h2d":
                        cuda.call("cudaMemcpy", rt.cudaMemcpy(dev_bufs[i], ptrs[i], per, k))
                    else:
                        cuda.call("cudaMemcpy", rt.cudaMemcpy(ptrs[i], dev_bufs[i], per, k))
            seconds = _concurrently(copy, threads)
            if cuda is not None and side != "control":
                cuda.call("cudaDeviceSynchronize", rt.cudaDeviceSynchronize())
            step["throughput"][direction] = {"seconds": seconds, "gb_s": per * threads / seconds / 1e9}
        # free the sources, trim the allocator, then measure what stayed
        _unmap(maps)
        for p in pinned:
            cuda.call("cudaFreeHost", rt.cudaFreeHost(p))
        step["after"] = snapshot(settler)
        out["steps"].append(step)
        log("burst", index=index, side=side, settled=step["after"]["settle"]["settled"],
            settle_s=step["after"]["settle"]["seconds"],
            throughput={k: round(v["gb_s"], 2) for k, v in step["throughput"].items()})
    hold = []
    t_hold = time.monotonic()
    for i in range(int(spec.get("hold_s", 0))):
        time.sleep(max(0.0, t_hold + i + 1 - time.monotonic()))
        s = snapshot(settler)
        s["t"] = i + 1
        hold.append(s)
    out["hold"] = hold
    _unmap(dst_maps)
    if cuda is not None:
        for b in dev_bufs:
            cuda.call("cudaFree", rt.cudaFree(b))
        cuda.call("cudaDeviceReset", rt.cudaDeviceReset())
    out["teardown"] = "buffers freed, cudaDeviceReset" if cuda is not None else "buffers unmapped (no CUDA)"
    out["after_reset"] = snapshot(settler)
    out["cuda_loaded"] = any(name == "cuda" or name.startswith("cuda.") for name in sys.modules)
    log("reset", settled=out["after_reset"]["settle"]["settled"])
    return out


def main() -> int:
    spec = json.loads(sys.argv[1])
    try:
        result = run(spec)
    except Exception as exc:
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
