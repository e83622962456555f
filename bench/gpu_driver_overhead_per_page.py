#!/usr/bin/env python3
"""Re-measure on the GPU machine what the catalog's constants rest on, each arm in a fresh child
cgroup and a fresh process, with control arms:

- the driver's own memory per pinned page (VmallocUsed) for cudaHostAlloc (4 GiB, touched) and
  cudaHostRegister (16 GiB, prefaulted anonymous memory);
- how each method is charged to the cgroup (memory.current; memory.stat shmem, anon, file, kernel,
  pagetables, vmalloc), plus /proc/meminfo Shmem and Mapped, the process's RssShmem, VmLck and VmPin,
  and pins outstanding (nr_foll_pin_acquired - nr_foll_pin_released);
- controls: a CUDA context alone (what the context costs), and the same 16 GiB anonymous region
  touched but not registered (what the region costs without the driver).

Every figure is a delta against the arm's own baseline, read by the child itself right before the
step (after the context exists; for register, after the region is touched). Usage on the GPU
machine (root, cgroup v2):

    python3 bench/gpu_driver_overhead_per_page.py --out $OUT/measure.json [--repeat 3]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GiB = 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- the child: one arm, one process ---------------------------------------------------------
def _cgroup_dir() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def _kv(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def reading() -> dict:
    mem = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            mem[name] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    vm = _kv(Path("/proc/vmstat").read_text())
    st = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssShmem", "RssFile", "VmLck", "VmPin"):
            st[name] = int(rest.split()[0]) * 1024
    cg = _cgroup_dir()
    cgroup = {}
    if cg and (cg / "memory.current").exists():
        cgroup["memory.current"] = int((cg / "memory.current").read_text())
        stat = _kv((cg / "memory.stat").read_text())
        cgroup.update({f"stat.{k}": stat.get(k) for k in ("anon", "file", "kernel", "kernel_stack", "pagetables",
                                                         "shmem", "file_mapped", "vmalloc", "percpu", "sock")})
    return {"t": time.monotonic(), "VmallocUsed": mem.get("VmallocUsed"), "Shmem": mem.get("Shmem"),
            "Mapped": mem.get("Mapped"), "MemAvailable": mem.get("MemAvailable"),
            "pins_outstanding_pages": vm.get("nr_foll_pin_acquired", 0) - vm.get("nr_foll_pin_released", 0),
            **st, **cgroup}


def delta(a: dict, b: dict) -> dict:
    return {k: (b[k] - a[k]) if isinstance(b.get(k), int) and isinstance(a.get(k), int) else None
            for k in b if k != "t"}


def child(arm: str, size: int) -> None:
    from cuda.bindings import runtime as rt

    def ok(ret, what):
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            raise RuntimeError(f"{what}: {getattr(err, 'name', err)} ({int(err)})")
        return ret[1] if isinstance(ret, tuple) and len(ret) > 1 else None

    out: dict = {"arm": arm, "size": size, "page_size": PAGE, "pid": os.getpid()}
    ok(rt.cudaSetDevice(0), "cudaSetDevice")
    ok(rt.cudaFree(0), "cudaFree(0)")
    out["after_context"] = reading()
    if arm == "context":
        time.sleep(1.0)
        out["held"] = delta(out["after_context"], reading())
    elif arm == "hostalloc":
        base = reading()
        t0 = time.monotonic()
        ptr = int(ok(rt.cudaHostAlloc(size, 0), "cudaHostAlloc"))
        ctypes.memset(ptr, 1, size)  # touched
        out["seconds"] = time.monotonic() - t0
        out["held"] = delta(base, reading())
        ok(rt.cudaFreeHost(ptr), "cudaFreeHost")
        time.sleep(0.5)
        out["after_free"] = delta(base, reading())
    elif arm in ("register", "anon"):
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
        ctypes.memset(addr, 1, size)  # prefault: the region's own cost is in the baseline
        base = reading()
        out["region_touched"] = delta(out["after_context"], base)
        if arm == "register":
            t0 = time.monotonic()
            ok(rt.cudaHostRegister(addr, size, 0), "cudaHostRegister")
            out["seconds"] = time.monotonic() - t0
        else:
            time.sleep(0.5)
        out["held"] = delta(base, reading())
        if arm == "register":
            ok(rt.cudaHostUnregister(addr), "cudaHostUnregister")
            time.sleep(0.5)
            out["after_free"] = delta(base, reading())
    sys.stdout.write(json.dumps(out) + "\n")


# -- the parent: arms in fresh cgroups, repeated, summarised -----------------------------------------
def run_arm(arm: str, size: int, n: int) -> dict:
    from repro.cgroups import RunCgroup
    cg = RunCgroup(f"hostpin-i9-{arm}-{n}-{os.getpid()}").create()
    join = cg.join_files()

    def preexec() -> None:
        for path in join:
            with open(path, "w") as fh:
                fh.write("0")
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", arm, str(size)], capture_output=True, text=True,
                              timeout=300, preexec_fn=preexec, cwd=REPO)
        if proc.returncode != 0 or not proc.stdout.strip():
            return {"arm": arm, "error": (proc.stderr or proc.stdout)[-1500:], "returncode": proc.returncode}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["cgroup"] = str(cg.memory_dir)
        return result
    finally:
        problems = cg.remove()
        if problems:
            print(f"cleanup: {problems}", file=sys.stderr)


def summarise(runs: list[dict]) -> dict:
    out = {}
    for arm in ("context", "anon", "register", "hostalloc"):
        done = [r for r in runs if r.get("arm") == arm and "held" in r]
        if not done:
            continue
        size = done[0]["size"]
        pages = size // PAGE
        held = {k: statistics.median([r["held"][k] for r in done if r["held"].get(k) is not None])
                for k in done[0]["held"] if any(r["held"].get(k) is not None for r in done)}
        s = {"runs": len(done), "size": size, "pages": pages, "held_median": held,
             "vmalloc_bytes_per_page": round(held.get("VmallocUsed", 0) / pages, 2) if pages else None,
             "cgroup_extra_bytes_per_page": round((held.get("memory.current", 0) - (size if arm == "hostalloc" else 0))
                                                  / pages, 2) if pages and "memory.current" in held else None,
             "pins_outstanding_pages": held.get("pins_outstanding_pages")}
        if "after_free" in done[0]:
            s["after_free_median"] = {k: statistics.median([r["after_free"][k] for r in done
                                                            if r["after_free"].get(k) is not None])
                                      for k in done[0]["after_free"] if done[0]["after_free"].get(k) is not None}
        if "seconds" in done[0]:
            s["seconds"] = [round(r["seconds"], 3) for r in done]
        out[arm] = s
    return out


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hostalloc-size", type=int, default=4 * GiB)
    ap.add_argument("--register-size", type=int, default=16 * GiB)
    opts = ap.parse_args()
    plan = [("context", 0)] * 2 + [("anon", opts.register_size)] * 2 + \
        [("register", opts.register_size), ("hostalloc", opts.hostalloc_size)] * opts.repeat
    runs = []
    for n, (arm, size) in enumerate(plan):
        t0 = time.monotonic()
        r = run_arm(arm, size, n)
        runs.append(r)
        held = r.get("held") or {}
        print(f"{arm:9s} {size / GiB:5.1f} GiB  {time.monotonic() - t0:5.1f} s  VmallocUsed "
              f"{(held.get('VmallocUsed') or 0) / 2**20:+8.1f} MiB  memory.current "
              f"{(held.get('memory.current') or 0) / 2**20:+9.1f} MiB  shmem {(held.get('stat.shmem') or 0) / 2**20:+8.1f}"
              f"  anon {(held.get('stat.anon') or 0) / 2**20:+8.1f}  pins {held.get('pins_outstanding_pages')}"
              + (f"  ERROR {r['error'][-300:]}" if r.get("error") else ""), flush=True)
    summary = summarise(runs)
    Path(opts.out).write_text(json.dumps({"page_size": PAGE, "summary": summary, "runs": runs}, indent=1))
    for arm, s in summary.items():
        print(f"== {arm}: VmallocUsed {s['vmalloc_bytes_per_page']} B/page, cgroup beyond the region "
              f"{s['cgroup_extra_bytes_per_page']} B/page, pins outstanding {s['pins_outstanding_pages']} pages")
    return 0 if summary else 1


if __name__ == "__main__":
    sys.exit(main())
