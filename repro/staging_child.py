"""The staging-memory child: `python -m repro.staging_child SPEC_JSON`, one fresh process per repeat.

It creates a CUDA context, then runs bursts of concurrent copies from pageable and from pinned
host buffers. Around every step it records the system-wide memory counters (several samples),
its own RSS and the RSS of each kind of mapping (anonymous, the driver's /dev/nvidia* files,
shared memory, other files). It prints one JSON document on stdout at the end, and one JSON
line per step on stderr as it goes (the parent keeps both).

Traps it avoids: glibc keeping freed chunks (buffers are mmap'd, malloc_trim after each burst),
zero pages (buffers are filled), and a growing MemTotal (in use = MemTotal - MemAvailable).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import mmap
import os
import statistics
import sys
import threading
import time

from diag.meminfo import parse_meminfo
from diag.rootfs import read_bounded

from .cudapin import Cuda

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.malloc_trim.argtypes = [ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.memset.restype = ctypes.c_void_p

_MEM_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Shmem", "Mapped", "AnonPages", "SUnreclaim",
             "KernelStack", "PageTables", "SecPageTables", "Unevictable", "Mlocked", "VmallocUsed")


def log(step: str, **fields) -> None:
    sys.stderr.write(json.dumps({"step": step, "t": time.time(), **fields}) + "\n")
    sys.stderr.flush()


def meminfo() -> dict[str, int]:
    raw = parse_meminfo(read_bounded("/proc/meminfo", 1 << 20).decode()).raw
    return {k: raw[k] for k in _MEM_KEYS if k in raw}


def rss_by_mapping() -> dict[str, int]:
    """Rss of this process by kind of mapping, from /proc/self/smaps (bytes)."""
    out = {"anon": 0, "nvidia": 0, "shmem": 0, "file": 0, "other": 0}
    kind = "other"
    with open("/proc/self/smaps") as fh:
        for line in fh:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split()
                path = parts[5] if len(parts) > 5 else ""
                if not path or path.startswith("[anon") or path in ("[heap]", "[stack]"):
                    kind = "anon"
                elif path.startswith("/dev/nvidia"):
                    kind = "nvidia"
                elif path.startswith(("/dev/shm", "/memfd:", "/SYSV")):
                    kind = "shmem"
                elif path.startswith("/"):
                    kind = "file"
                else:
                    kind = "other"
            elif first == "Rss:":
                out[kind] += int(line.split()[1]) * 1024
    out["total"] = sum(v for k, v in out.items())
    return out


def snapshot(samples: int, gap: float) -> dict:
    """Several readings: the median of in-use, its spread, and the process's side."""
    gc.collect()
    libc.malloc_trim(0)
    readings = []
    for i in range(samples):
        if i:
            time.sleep(gap)
        readings.append(meminfo())
    in_use = [r["MemTotal"] - r["MemAvailable"] for r in readings]
    last = readings[-1]
    return {"in_use_bytes": int(statistics.median(in_use)), "in_use_spread_bytes": max(in_use) - min(in_use),
            "mem_total_bytes": last["MemTotal"], "meminfo": last, "rss": rss_by_mapping()}


def run(spec: dict) -> dict:
    size, threads = spec["bytes"], spec["threads"]
    per = -(-size // threads)
    per = -(-per // 4096) * 4096
    samples, gap = spec.get("samples", 5), spec.get("sample_gap_s", 0.05)
    directions = ["h2d", "d2h"] if spec["direction"] == "both" else [spec["direction"]]
    out: dict = {"spec": spec, "pid": os.getpid(), "steps": []}
    before_ctx = snapshot(samples, gap)
    t0 = time.monotonic()
    cuda = Cuda(spec.get("device", 0))
    rt = cuda.rt
    out["context_s"] = time.monotonic() - t0
    dev_bufs = [cuda.call("cudaMalloc", rt.cudaMalloc(per)) for _ in range(threads)]
    # the baseline, twice, some time apart: their difference is part of the noise estimate
    base1 = snapshot(samples, gap)
    time.sleep(spec.get("settle_s", 0.3))
    base2 = snapshot(samples, gap)
    out["before_context"] = before_ctx
    out["baseline"] = base2
    out["baseline_drift_bytes"] = base2["in_use_bytes"] - base1["in_use_bytes"]
    log("baseline", in_use=base2["in_use_bytes"], drift=out["baseline_drift_bytes"])
    kinds = {"h2d": rt.cudaMemcpyKind.cudaMemcpyHostToDevice, "d2h": rt.cudaMemcpyKind.cudaMemcpyDeviceToHost}
    previous = base2
    for index, side in enumerate(spec["sequence"]):
        host = []
        if side == "pageable":
            maps = [mmap.mmap(-1, per, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(threads)]
            ptrs = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in maps]
            host = maps
        else:
            ptrs = [int(cuda.call("cudaHostAlloc", rt.cudaHostAlloc(per, 0))) for _ in range(threads)]
        for p in ptrs:
            libc.memset(p, 0x5A, per)
        step = {"index": index, "side": side, "throughput": {}}
        for direction in directions:
            errors = []

            def copy(i: int) -> None:
                try:
                    if direction == "h2d":
                        cuda.call("cudaMemcpy", rt.cudaMemcpy(dev_bufs[i], ptrs[i], per, kinds[direction]))
                    else:
                        cuda.call("cudaMemcpy", rt.cudaMemcpy(ptrs[i], dev_bufs[i], per, kinds[direction]))
                except Exception as exc:
                    errors.append(str(exc))

            workers = [threading.Thread(target=copy, args=(i,)) for i in range(threads)]
            t0 = time.monotonic()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            cuda.call("cudaDeviceSynchronize", rt.cudaDeviceSynchronize())
            seconds = time.monotonic() - t0
            if errors:
                raise RuntimeError(f"copy failed: {errors[0]}")
            step["throughput"][direction] = {"seconds": seconds, "gb_s": per * threads / seconds / 1e9}
        # free the sources, trim the allocator, then measure what stayed
        if side == "pageable":
            del ptrs
            for m in host:
                m.close()
        else:
            for p in ptrs:
                cuda.call("cudaFreeHost", rt.cudaFreeHost(p))
        after = snapshot(samples, gap)
        step["after"] = after
        step["delta_in_use_bytes"] = after["in_use_bytes"] - previous["in_use_bytes"]
        step["delta_rss_bytes"] = after["rss"]["total"] - previous["rss"]["total"]
        out["steps"].append(step)
        log("burst", index=index, side=side, delta=step["delta_in_use_bytes"], rss=step["delta_rss_bytes"],
            throughput={k: round(v["gb_s"], 2) for k, v in step["throughput"].items()})
        previous = after
    hold = []
    for i in range(int(spec.get("hold_s", 0))):
        time.sleep(1.0)
        s = snapshot(samples, gap)
        hold.append({"t": i + 1, "in_use_bytes": s["in_use_bytes"], "rss_total": s["rss"]["total"]})
    out["hold"] = hold
    for b in dev_bufs:
        cuda.call("cudaFree", rt.cudaFree(b))
    cuda.call("cudaDeviceReset", rt.cudaDeviceReset())
    out["after_reset"] = snapshot(samples, gap)
    log("reset", in_use=out["after_reset"]["in_use_bytes"])
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
