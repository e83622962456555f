"""One PyTorch rank for bench/gpu_torch_pinned_rounding.sh: `python3 gpu_torch_rank.py BYTES HOLD_S`.

It does what a launcher does and nothing else: torch.empty(BYTES, dtype=torch.uint8, pin_memory=True),
then holds the tensor HOLD_S seconds so that every rank holds its block at once, then exits. It
prints one JSON line: its own RssAnon / RssShmem / VmRSS growth (from /proc/self/status, which it
may read: it is the pinner), pins outstanding (nr_foll_pin_acquired - nr_foll_pin_released in
/proc/vmstat, system-wide: a delta across concurrent ranks counts them all), what PyTorch's host
allocator says it reserved, and how long the call took. PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF
come from the environment, as a launcher's do. BYTES 0: only the CUDA context and torch (overhead).
"""
import json
import os
import sys
import time


def status() -> dict:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem", "VmRSS", "VmLck", "VmPin"):
                out[key] = int(value.split()[0]) * 1024
    return out


def pins() -> int:
    v = {}
    with open("/proc/vmstat") as fh:
        for line in fh:
            k, _, n = line.partition(" ")
            v[k] = int(n)
    return v.get("nr_foll_pin_acquired", 0) - v.get("nr_foll_pin_released", 0)


def main() -> int:
    size, hold = int(sys.argv[1]), float(sys.argv[2])
    t0 = time.monotonic()
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, as a rank has it before it pins
    ready = time.monotonic() - t0
    before, pins0 = status(), pins()
    t1 = time.monotonic()
    tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True) if size else None
    seconds = time.monotonic() - t1
    after, pins1 = status(), pins()
    stats = {}
    try:
        s = torch.cuda.host_memory_stats()
        stats = {"reserved_bytes": s.get("reserved_bytes.current"), "allocated_bytes": s.get("allocated_bytes.current"),
                 "num_host_alloc": s.get("num_host_alloc")}
    except Exception as exc:
        stats = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"pid": os.getpid(), "torch": torch.__version__, "bytes": size, "ready_s": round(ready, 2),
                      "alloc_s": round(seconds, 3), "pinned": tensor is not None and tensor.is_pinned(),
                      "grew": {k: after.get(k, 0) - before.get(k, 0) for k in after},
                      "pins_outstanding_delta_pages": pins1 - pins0, "host_stats": stats,
                      "conf": {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
                               if k in os.environ}}), flush=True)
    time.sleep(hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
