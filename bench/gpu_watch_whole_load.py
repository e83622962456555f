"""`hostpin watch --pid` on a whole PyTorch load, on the GPU machine (bench/gpu_watch_whole_load.sh).

  a  Tensor.pin_memory() of a 16 GiB tensor with 3 GiB of it in swap (cgroup v2 memory.reclaim
     swappiness=200, SwapCached driven to ~0; swap reads throttled by io.max rbps 48 MB/s for the
     process's cgroup): a watch attached 3 s in must name the pinned allocation and the copy's
     swap-in (copy-from-swap), an ETA within 10% at 20% of the copy, and end when the copy does
     (--quiet-after after it)
  b  the same with a cold file-backed tensor (torch.from_file of a 4 GiB file, page cache
     dropped, reads throttled to 200 MB/s): the copy is a file-read phase
  c  torch.cuda.cudart().cudaHostRegister of a swapped 16 GiB tensor (3 GiB in swap), watched with
     and without --size: the VmSwap-based ETA at 20% within 10%. The target says how much of its
     VmSwap was left when the call returned (swap the register never read: the hypothesis for
     issue 18's 17%-late first ETA), and the node's SwapCached and pswpin around it

Each case cleans up after itself; the watches' run directories (timeline.jsonl: replay fixtures)
go to --runs. `--target MODE` is the torch process itself (run by this script).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GiB = 1 << 30
T0 = time.monotonic()
BUDGET_S = 400
HP = [sys.executable, "-m", "repro.cli"]


def log(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


def status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def meminfo() -> dict[str, int]:
    return {l.split(":")[0]: int(l.split()[1]) * 1024 for l in Path("/proc/meminfo").read_text().splitlines()}


def vmstat(key: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, v = line.split()
        if k == key:
            return int(v)
    return 0


# -- the torch process ------------------------------------------------------------------------

def target(mode: str, size: int, path: str | None, joins: list[str]) -> int:
    for procs in joins:
        Path(procs).write_text("0")
    import torch
    torch.zeros(1, device="cuda")  # the CUDA context first: the watch must see only the load
    if mode == "file":
        t = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    else:
        t = torch.empty(size, dtype=torch.uint8)
        t.fill_(0x5A)  # every page written (zero pages skip swap)
    print(f"ready {status()['VmRSS']}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    s0 = status()
    t0 = time.monotonic()
    if mode == "register":
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
        ok = int(err) == 0 if not isinstance(err, tuple) else int(err[0]) == 0
    else:
        p = t.pin_memory()
        ok = p.is_pinned()
    took = time.monotonic() - t0
    s1 = status()
    print(f"pinned {took:.3f} ok={ok} vmswap_before={s0.get('VmSwap', 0)} vmswap_after={s1.get('VmSwap', 0)}",
          flush=True)
    sys.stdin.readline()
    if mode == "register":
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    return 0


# -- the driver -------------------------------------------------------------------------------

class Proc:
    def __init__(self, argv: list[str]):
        self.p = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)

    def expect(self, word: str, timeout: float) -> str:
        import select
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([self.p.stdout], [], [], 1.0)
            if ready:
                line = self.p.stdout.readline().strip()
                if line.startswith(word):
                    return line
                if not line and self.p.poll() is not None:
                    break
        raise RuntimeError(f"target never said {word!r} (exit {self.p.poll()}): "
                           f"{(self.p.stderr.read() or '')[-800:] if self.p.poll() is not None else ''}")

    def say(self, word: str) -> None:
        self.p.stdin.write(word + "\n")
        self.p.stdin.flush()

    def stop(self) -> None:
        if self.p.poll() is None:
            try:
                self.say("quit")
                self.p.wait(timeout=60)
            except Exception:
                self.p.kill()
                self.p.wait()


def push_to_swap(cg, pid: int, want: int) -> dict:
    """memory.reclaim swappiness=200 until the target's VmSwap holds `want` bytes, then until
    SwapCached is ~0 (pages left in the swap cache come back without a read)."""
    rec = cg.memory_dir / "memory.reclaim"
    steps = 0
    while status(pid).get("VmSwap", 0) < want - (64 << 20) and steps < 40:
        need = want - status(pid).get("VmSwap", 0)
        try:
            rec.write_text(f"{max(need, 64 << 20)} swappiness=200")
        except OSError:
            pass
        steps += 1
    for _ in range(20):
        cached = meminfo().get("SwapCached", 0)
        if cached < (32 << 20):
            break
        try:
            rec.write_text(f"{cached} swappiness=200")
        except OSError:
            pass
    return {"vmswap": status(pid).get("VmSwap", 0), "swapcached": meminfo().get("SwapCached", 0), "steps": steps}


def watch(runs: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    f = runs / f"{name}.json"
    w = subprocess.Popen([*HP, "watch", "--out", str(runs), "--json-file", str(f), *args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return w, f


def collect(w: subprocess.Popen, f: Path, timeout: float) -> dict:
    try:
        w.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        w.terminate()
        w.communicate(timeout=30)
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"no JSON file (rc {w.returncode}): {exc}"}
    res["_rc"], res["_ended_at"] = w.returncode, time.monotonic()
    return res


def phases_text(res: dict) -> str:
    if "error" in res:
        return f"    {res['error']}"
    out = [f"    rc {res.get('_rc')} outcome {res.get('outcome')} watched {res.get('watched_s')} s"]
    for p in res.get("phases") or []:
        e20 = p.get("eta_at_20pct") or {}
        e1 = p.get("eta_first") or {}
        out.append(f"    - {p.get('kind')} pin={p.get('pin')} {p.get('outcome')} {p.get('seconds')} s bound "
                   f"{p.get('bound')} catalog {p.get('catalog')} done {p.get('pct')}% size {p.get('size_bytes')} "
                   f"({p.get('size_from')}); ETA@20% {e20.get('predicted_total_s')} s err {p.get('eta_error')}; "
                   f"first ETA {e1.get('predicted_total_s')} s at {e1.get('at_s')} s [{e1.get('basis')}] err "
                   f"{p.get('eta_first_error')}; swapped_in {(p.get('figures') or {}).get('swapped_in_bytes')} "
                   f"read {(p.get('figures') or {}).get('read_bytes')}")
    out.append(f"    verdict: {res.get('verdict')}")
    return "\n".join(out)


def run_case(name: str, mode: str, size: int, swap_bytes: int, rate: int, runs: Path, watches: list[list[str]],
             summary: list[str], path: str | None = None, attach_after: float = 3.0) -> None:
    from repro.cgroups import PREFIX, RunCgroup, block_device_for, file_device
    from repro.swapfile import active_swaps
    cg = RunCgroup(f"{PREFIX}wl-{name}-{os.getpid()}").create(want_io=True)
    t = None
    try:
        joins = [a for j in cg.join_files() for a in ("--join", j)]
        argv = [sys.executable, str(Path(__file__).resolve()), "--target", mode, "--size", str(size), *joins]
        if path:
            argv += ["--path", path]
        t = Proc(argv)
        t.expect("ready", 120)
        pushed = push_to_swap(cg, t.p.pid, swap_bytes) if swap_bytes else {}
        if path:
            from repro.filecache import evict
            pushed["evict"] = evict(path)
        devices = {block_device_for(d) for d in active_swaps()} if swap_bytes else {file_device(path)}
        for dev in devices:
            cg.throttle_reads(dev, rate)
        pswpin0 = vmstat("pswpin")
        log(f"{name}: pushed {pushed}; throttled {devices} at {rate / 1e6:.0f} MB/s")
        t0 = time.monotonic()
        t.say("go")
        time.sleep(attach_after)  # attached a few seconds in, as an operator would
        ws = [watch(runs, f"{name}-{i}", "--pid", str(t.p.pid), *extra) for i, extra in enumerate(watches)]
        line = t.expect("pinned", max(30, left() - 20))
        call_end = time.monotonic() - t0
        results = [collect(w, f, max(30, left() - 10)) for w, f in ws]
        summary.append(f"{name}: call {line.split()[1]} s by the target's clock ({line}); pswpin "
                       f"{vmstat('pswpin') - pswpin0:,} pages; pushed {pushed}")
        for extra, res in zip(watches, results):
            ended = res.get("_ended_at", time.monotonic()) - t0
            last = max(res.get("phases") or [{}], key=lambda p: (p.get("started_s") or 0) + (p.get("seconds") or 0))
            last_end = attach_after + (last.get("started_s") or 0) + (last.get("seconds") or 0)
            summary.append(f"  watch {' '.join(extra) or '(no --size)'}: ended {ended - call_end:+.1f} s after the "
                           f"call returned; its last phase ({last.get('kind')}) ended {last_end - call_end:+.1f} s "
                           "after the call returned")
            summary.append(phases_text(res))
    except Exception as exc:
        summary.append(f"{name}: FAILED {exc}")
        traceback.print_exc()
    finally:
        if t is not None:
            t.stop()
        problems = cg.remove()
        if problems:
            summary.append(f"{name}: cleanup problems {problems}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--size", type=int, default=16 * GiB)
    ap.add_argument("--path")
    ap.add_argument("--join", action="append", default=[])
    ap.add_argument("--runs", type=Path)
    ap.add_argument("--summary", type=Path)
    o = ap.parse_args()
    if o.target:
        return target(o.target, o.size, o.path, o.join)
    from repro.swapfile import SwapFile
    o.runs.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    swap = SwapFile("/var/tmp", 8 * GiB).create()
    data = Path("/var/tmp") / f"hostpin-wl-{os.getpid()}.bin"
    try:
        log("swap file ready")
        run_case("a-pin-memory-swap", "pin_memory", 16 * GiB, 3 * GiB, 48_000_000, o.runs, [[]], summary)
        log("case a done")
        if left() > 120:
            with open(data, "wb") as fh:
                chunk = b"\x5a" * (64 << 20)
                for _ in range(64):  # 4 GiB with data on disk
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            run_case("b-pin-memory-file", "file", 4 * GiB, 0, 200_000_000, o.runs, [[]], summary, path=str(data),
                     attach_after=0.5)  # its 4 GiB allocation takes ~1.6 s: the watch must see it end
            data.unlink(missing_ok=True)
            log("case b done")
        if left() > 100:
            run_case("c-register-swap", "register", 16 * GiB, 3 * GiB, 48_000_000, o.runs,
                     [["--size", "16GiB"], []], summary)
            log("case c done")
        else:
            summary.append(f"c: skipped, {left():.0f} s left")
    finally:
        data.unlink(missing_ok=True)
        problems = swap.remove()
        if problems:
            summary.append(f"swap cleanup problems {problems}")
        text = "\n".join(summary)
        print("\n== summary ==\n" + text, flush=True)
        if o.summary:
            o.summary.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
