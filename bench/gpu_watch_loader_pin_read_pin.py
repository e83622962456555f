"""`hostpin watch --pid` on a loader that pins, reads and pins again (bench/gpu_watch_loader_pin_read_pin.sh).

One torch process on the GPU machine, watched from before its first step (no --size, --until
quiet): it holds three 2 GiB CPU tensors A, S and B, every page written; S alone is paged out
to a swap file (MADV_PAGEOUT on its range, then the cgroup's swap cache reclaimed so that each
page must be read back from the disk) and swap reads are throttled to 48 MB/s (io.max rbps of
the process's own cgroup). On "go" it runs, by its own clock:

    1  A.pin_memory()          a pinned allocation of 2 GiB, then a copy from resident memory
    2  S.sum()                 2 GiB of its swapped memory read back at the throttle (~45 s)
    3  B.pin_memory()          the second pinned allocation

The watch should give, in order, a pin (hostalloc) for 1, a copy-from-swap (not a pin, catalog
19) for 2 with an ETA at 20% near its end, a pin for 3, and end --quiet-after (5 s) after the
last step. The summary puts each step (the target's clock, moved onto the watch's by the two
start times) beside the phases; the watch's run directory and the target's own figures
(target.json) go to --runs: a future replay fixture.

`--cpu-check` runs the same driver on a machine without a GPU (the CI machine): the pins are
mlock of 64 MiB anonymous buffers and the read is 128 MiB at 16 MB/s, through the same cgroup,
swap file, throttle, watch and summary.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import mmap
import os
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_watch_whole_load import REPO, Proc, collect, meminfo, phases_text, status, vmstat, watch  # noqa: E402

sys.path.insert(0, str(REPO))

GiB, MiB = 1 << 30, 1 << 20
MADV_PAGEOUT = 21
T0 = time.monotonic()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def log(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


def page_out(addr: int, size: int) -> int:
    """MADV_PAGEOUT on the whole pages of [addr, addr + size): 0, or the errno."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = (addr + page - 1) // page * page
    end = (addr + size) // page * page
    rc = _libc.madvise(start, end - start, MADV_PAGEOUT)
    return 0 if rc == 0 else ctypes.get_errno()


# -- the loader -------------------------------------------------------------------------------

def target(cpu: bool, pin_bytes: int, read_bytes: int, joins: list[str]) -> int:
    for procs in joins:
        Path(procs).write_text("0")
    if cpu:
        # private, as a tensor's memory is (mmap.mmap(-1, n) alone maps MAP_SHARED: shared memory, not in VmSwap)
        bufs = [mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for n in (pin_bytes, read_bytes, pin_bytes)]
        for m in bufs:
            for off in range(0, len(m), 64 * MiB):
                m[off:off + min(64 * MiB, len(m) - off)] = b"\x5a" * min(64 * MiB, len(m) - off)
        addr = [ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in bufs]

        def pin(i: int) -> bool:
            return _libc.mlock(addr[i], len(bufs[i])) == 0

        def read() -> int:
            return sum(bytes(bufs[1][off:off + 16 * MiB]).count(0x5A) for off in range(0, len(bufs[1]), 16 * MiB))
    else:
        import torch
        torch.zeros(1, device="cuda")  # the CUDA context first: the watch must see only the load
        ts = [torch.empty(n, dtype=torch.uint8) for n in (pin_bytes, read_bytes, pin_bytes)]
        for t in ts:
            t.fill_(0x5A)  # every page written (zero pages skip swap)
        addr = [t.data_ptr() for t in ts]
        bufs = ts
        kept = []

        def pin(i: int) -> bool:
            p = ts[i].pin_memory()
            kept.append(p)  # held: the second pin must not reuse the first one's block
            return p.is_pinned()

        def read() -> int:
            return int(ts[1].sum(dtype=torch.int64))
    err = page_out(addr[1], read_bytes)
    print(f"ready vmswap={status().get('VmSwap', 0)} pageout_errno={err}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    steps, s0 = [], status()
    wall0, t0 = time.time(), time.monotonic()
    for name, fn in (("pin1", lambda: pin(0)), ("read", read), ("pin2", lambda: pin(2))):
        a = time.monotonic()
        sw = status().get("VmSwap", 0)
        out = fn()
        b = time.monotonic()
        steps.append({"step": name, "start_s": round(a - t0, 3), "end_s": round(b - t0, 3),
                      "seconds": round(b - a, 3), "ok": bool(out), "vmswap_before": sw,
                      "vmswap_after": status().get("VmSwap", 0)})
    print("done " + json.dumps({"go_wall": wall0, "steps": steps, "vmswap_at_go": s0.get("VmSwap", 0),
                                "vmswap_at_end": status().get("VmSwap", 0)}), flush=True)
    sys.stdin.readline()
    return 0


# -- the driver -------------------------------------------------------------------------------

def _watch_started(run_dir: str | None) -> float | None:
    """The watch's clock zero as wall time: the start its manifest.jsonl records."""
    try:
        first = json.loads(Path(run_dir, "manifest.jsonl").read_text().splitlines()[0])
        return datetime.datetime.fromisoformat(first["run"]["started"]).timestamp()
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def compare(res: dict, done: dict) -> list[str]:
    """Each step of the target beside the phase of the watch that covers most of it."""
    started = _watch_started(res.get("run_dir"))
    if started is None:
        return ["    (no manifest: the steps cannot be put on the watch's clock)"]
    off = done["go_wall"] - started
    out = [f"    go at {off:.2f} s on the watch's clock"]
    phases = res.get("phases") or []
    for st in done["steps"]:
        a, b = off + st["start_s"], off + st["end_s"]

        def overlap(p: dict) -> float:
            s = p.get("started_s") or 0.0
            return max(0.0, min(b, s + (p.get("seconds") or 0.0)) - max(a, s))
        best = max(phases, key=overlap, default=None)
        if best is None or overlap(best) <= 0:
            out.append(f"    {st['step']}: {a:.2f}-{b:.2f} s ({st['seconds']:.2f} s, ok={st['ok']}): no phase")
            continue
        s = best.get("started_s") or 0.0
        e = s + (best.get("seconds") or 0.0)
        out.append(f"    {st['step']}: {a:.2f}-{b:.2f} s ({st['seconds']:.2f} s, ok={st['ok']}, VmSwap "
                   f"{st['vmswap_before'] // MiB}->{st['vmswap_after'] // MiB} MiB): phase {best.get('kind')} "
                   f"pin={best.get('pin')} {s:.2f}-{e:.2f} s, starts {s - a:+.2f} s, ends {e - b:+.2f} s, bound "
                   f"{best.get('bound')} catalog {best.get('catalog')}, ETA at 20% err {best.get('eta_error')}")
    last_end = off + done["steps"][-1]["end_s"]
    out.append(f"    the watch ended {(res.get('watched_s') or 0) - last_end:+.2f} s after the last step "
               f"(--quiet-after {res.get('quiet_after_s')}); phases: "
               + ", ".join(f"{p.get('kind')}{'' if p.get('pin') else ' (not a pin)'}" for p in phases))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["gpu", "cpu"])
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--pin-bytes", type=int)
    ap.add_argument("--read-bytes", type=int)
    ap.add_argument("--join", action="append", default=[])
    ap.add_argument("--runs", type=Path)
    ap.add_argument("--summary", type=Path)
    ap.add_argument("--budget", type=float, default=280.0)
    ap.add_argument("--pidfile", type=Path, help="where the driver writes its pid (the shell's cleanup names)")
    o = ap.parse_args()
    if o.target:
        return target(o.target == "cpu", o.pin_bytes, o.read_bytes, o.join)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # timeout(1): clean up on the way out
    if o.pidfile:
        o.pidfile.write_text(str(os.getpid()))
    from repro.cgroups import PREFIX, RunCgroup, block_device_for
    from repro.swapfile import SwapFile
    cpu = o.cpu_check
    pin_bytes, read_bytes = (64 * MiB, 128 * MiB) if cpu else (2 * GiB, 2 * GiB)
    rate = 16_000_000 if cpu else 48_000_000
    o.runs.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    swap = cg = t = None
    try:
        swap = SwapFile("/var/tmp", read_bytes + (512 * MiB if cpu else 2 * GiB)).create()
        cg = RunCgroup(f"{PREFIX}lpr-{os.getpid()}").create(want_io=True)
        log(f"swap file {swap.path} and cgroup {cg.name} ready")
        joins = [a for j in cg.join_files() for a in ("--join", j)]
        t = Proc([sys.executable, str(Path(__file__).resolve()), "--target", "cpu" if cpu else "gpu",
                  "--pin-bytes", str(pin_bytes), "--read-bytes", str(read_bytes), *joins])
        ready = t.expect("ready", 180)
        dropped = cg.drop_swap_cache()
        vmswap = status(t.p.pid).get("VmSwap", 0)
        dev = block_device_for(str(swap.path))
        cg.throttle_reads(dev, rate)
        log(f"{ready}; VmSwap {vmswap // MiB} MiB, SwapCached {meminfo().get('SwapCached', 0) // MiB} MiB after "
            f"{dropped}; swap reads throttled at {rate / 1e6:.0f} MB/s on {dev}")
        pswpin0 = vmstat("pswpin")
        w, f = watch(o.runs, "loader-0", "--pid", str(t.p.pid))
        time.sleep(2.0)  # the watch sampling before the first step
        t.say("go")
        line = t.expect("done", max(30.0, o.budget - (time.monotonic() - T0) - 40))
        done = json.loads(line.split(" ", 1)[1])
        res = collect(w, f, max(30.0, o.budget - (time.monotonic() - T0) - 10))
        (o.runs / "target.json").write_text(json.dumps(dict(done, pswpin_pages=vmstat("pswpin") - pswpin0,
                                                            vmswap_before_go=vmswap, rate_bytes_s=rate,
                                                            pin_bytes=pin_bytes, read_bytes=read_bytes), indent=1))
        summary.append(f"loader ({'cpu-check: mlock' if cpu else 'torch pin_memory'} {pin_bytes // MiB} MiB, read "
                       f"{read_bytes // MiB} MiB of swap at {rate / 1e6:.0f} MB/s, then {pin_bytes // MiB} MiB): VmSwap "
                       f"{vmswap // MiB} MiB before go; pswpin {vmstat('pswpin') - pswpin0:,} pages; target steps "
                       + ", ".join(f"{s['step']} {s['seconds']:.2f} s" for s in done["steps"]))
        summary.append(phases_text(res))
        if "error" not in res:
            summary += compare(res, done)
    except Exception as exc:
        summary.append(f"loader: FAILED {exc}")
        traceback.print_exc()
    finally:
        if t is not None:
            t.stop()
        for what, thing in (("cgroup", cg), ("swap", swap)):
            problems = thing.remove() if thing is not None else []
            if problems:
                summary.append(f"{what} cleanup problems {problems}")
        text = "\n".join(summary)
        print("\n== summary ==\n" + text, flush=True)
        if o.summary:
            o.summary.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
