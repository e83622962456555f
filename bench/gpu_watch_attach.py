"""On the GPU machine: `hostpin watch` on processes hostpin did not start, and the
file-read case through `repro register --read-rate`. Run by bench/gpu_watch_attach.sh (root, one
GPU, cgroup v2); every case is independent, cleans up after itself, and prints one summary.

  A  an independent cuda-bindings process registers a 16 GiB THP region with 4 GiB of it in
     swap (swap-in throttled so the pin takes about a minute); two `hostpin watch --pid`
     attach while it pins: with --size 16GiB, and without (a register call carries no size:
     the ETA must come from the process's VmSwap)
  B  a 16 GiB file with data on disk, MAP_PRIVATE, page cache dropped, registered without
     prefault by `repro register --source file: --read-rate`; a `hostpin watch --pid` also
     attaches to repro's child
  C  a 47 GiB cudaHostAlloc by an independent process under `hostpin watch -- CMD` (heartbeats,
     exit code), and a `hostpin watch --pid` on it: progress from its RssShmem
  D  (if time is left) a prefaulted 47 GiB THP register under repro, sampled every 0.2 s: what
     the stacks show while the driver maps the pages (IOMMU? its lock?)

`--cpu-check` runs the same cases here without a GPU: mlock instead of the CUDA calls, the CI
machine's sizes (A: 256 MiB with 192 MiB in swap at 16 MB/s; B: a 256 MiB file at 16 MB/s).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from repro.cgroups import PREFIX, RunCgroup, block_device_for  # noqa: E402
from repro.swapfile import SwapFile, active_swaps  # noqa: E402

TARGET = REPO / "tests" / "pin_target.py"
HP = [sys.executable, "-m", "repro.cli"]
T0 = time.monotonic()
# the GPU run; --cpu-check runs the same plumbing here with mlock and small sizes (no GPU)
GPU = {"a_method": "register", "a_size": "16GiB", "a_swap": "4GiB", "a_rate": 72_000_000, "swap_file": 6 << 30,
       "b_method": "register", "b_gib": 16, "b_rate": "280MB/s", "c_method": "hostalloc", "c_size": "47GiB",
       "d_method": "register", "d_size": "47GiB"}
CPU = {"a_method": "mlock", "a_size": "256MiB", "a_swap": "192MiB", "a_rate": 16_000_000, "swap_file": 1 << 30,
       "b_method": "mlock", "b_gib": 0.25, "b_rate": "16MB/s", "c_method": "mlock", "c_size": "256MiB",
       "d_method": "mlock", "d_size": "1GiB"}
CFG = GPU
BUDGET_S = 390  # no case starts late: the whole script must end within 8 minutes


def log(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {text}", flush=True)


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


class Target:
    def __init__(self, args: list[str], joins: list[str] = (), wrapper: list[str] = ()):
        argv = [*wrapper, sys.executable, str(TARGET), *args, *[a for j in joins for a in ("--join", j)]]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def expect(self, word: str, timeout: float) -> str:
        import select
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline().strip()
                if line.startswith(word):
                    return line
                if not line and self.proc.poll() is not None:
                    break
        raise RuntimeError(f"target never said {word!r} (exit {self.proc.poll()}): {self._err()}")

    def _err(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return (self.proc.stderr.read() or "")[-800:]

    def say(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.say("quit")
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                out.append(int(entry))
        except (OSError, IndexError):
            continue
    return out


def watch(runs: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*HP, "watch", "--out", str(runs), "--json", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(w: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = w.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        w.terminate()
        out, err = w.communicate(timeout=30)
    try:
        res = json.loads(out)
    except ValueError:
        return {"error": f"no JSON (rc {w.returncode}): {err[-600:]}"}
    res["_rc"] = w.returncode
    return res


def phase_line(label: str, res: dict) -> str:
    if "error" in res:
        return f"  {label}: {res['error']}"
    ph = max(res.get("phases") or [{}], key=lambda p: p.get("seconds") or 0)
    e20, e1 = ph.get("eta_at_20pct") or {}, ph.get("eta_first") or {}
    return (f"  {label}: rc {res.get('_rc')} outcome {res.get('outcome')}; phase {ph.get('kind')} "
            f"{ph.get('seconds')} s seen_start={ph.get('seen_start')} bound {ph.get('bound')} "
            f"{ph.get('bound_counts')} named after {ph.get('first_bound_at_s')} s; done {ph.get('pct')}% "
            f"basis {ph.get('progress_basis')} rate {ph.get('rate_pages_s')} pages/s; ETA@20% "
            f"{e20.get('predicted_total_s')} s (err {ph.get('eta_error')}) first ETA {e1.get('predicted_total_s')} s "
            f"at {e1.get('at_s')} s [{e1.get('basis')}] (err {ph.get('eta_first_error')}); catalog {ph.get('catalog')};"
            f" figures {ph.get('figures')}; shared {ph.get('shared_counters')}; cost {(res.get('watcher') or {}).get('cpu_pct_of_core')}%"
            f"\n    reason: {ph.get('bound_reason')}\n    verdict: {res.get('verdict')}")


def case_a(runs: Path) -> list[str]:
    """register 16 GiB, 4 GiB of it in swap, swap-in throttled: two watches on a process we did not start."""
    swap = SwapFile("/var/tmp", CFG["swap_file"]).create()
    cg = target = None
    try:
        cg = RunCgroup(f"{PREFIX}i10-a-{os.getpid()}").create(want_io=True)
        target = Target(["--method", CFG["a_method"], "--size", CFG["a_size"], "--swap-out", CFG["a_swap"], "--thp"],
                        cg.join_files())
        paged = int(target.expect("paged", 240).split()[1])
        log(f"A: target {target.proc.pid} has {paged >> 20} MiB in swap (MADV_PAGEOUT); dropping the swap cache")
        drop = cg.drop_swap_cache()
        rate = CFG["a_rate"]  # 4 GiB at ~17,500 pages/s: about a minute
        for disk in {block_device_for(dev) for dev in active_swaps()}:
            cg.throttle_reads(disk, rate)
        target.say("go")
        time.sleep(1.0)
        w_size = watch(runs, "--pid", str(target.proc.pid), "--size", CFG["a_size"], "--deadline", "240")
        w_none = watch(runs, "--pid", str(target.proc.pid), "--deadline", "240")
        took = float(target.expect("pinned", 260).split()[1])
        a, b = collect(w_size, 120), collect(w_none, 120)
        return [f"A {CFG['a_method']} {CFG['a_size']}, {paged >> 20} MiB in swap, swap-in limited to {rate / 1e6:.0f} MB/s: the pin "
                f"took {took:.1f} s (target's own clock); swap cache drop {drop}",
                phase_line(f"watch --pid --size {CFG['a_size']}", a), phase_line("watch --pid (no size)", b)]
    finally:
        if target:
            target.stop()
        if cg:
            cg.remove()
        swap.remove()


def case_b(runs: Path) -> list[str]:
    """16 GiB private file mapping, page cache dropped, read throttled, registered by repro."""
    path = Path("/var/tmp/hostpin-i10-16g.bin")
    try:
        t = time.monotonic()
        chunk = b"\x5a" * (64 << 20)
        with open(path, "wb") as fh:
            for _ in range(int(CFG["b_gib"] * 16)):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        wrote = CFG["b_gib"] / (time.monotonic() - t)
        log(f"B: wrote {path} at {wrote:.2f} GiB/s")
        rate = CFG["b_rate"]  # 16 GiB in about a minute, if the disk reads that fast
        r = subprocess.Popen([*HP, "repro", "register", "--json", "--out", str(runs), "--size", f"{int(CFG['b_gib'] * 1024)}MiB",
                              "--method", CFG["b_method"], "--source", f"file:{path}", "--map", "private", "--no-prefault", "--read-rate", rate,
                              "--deadline", "200"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        child = None
        end = time.monotonic() + 120
        while time.monotonic() < end and child is None and r.poll() is None:
            for ev in glob.glob(str(runs / "*repro-register*" / "events.jsonl")):
                text = Path(ev).read_text()
                if '"pin_start"' in text:
                    child = json.loads(text.splitlines()[0])["pid"]
            time.sleep(0.2)
        w = watch(runs, "--pid", str(child), "--deadline", "220") if child else None
        out, err = r.communicate(timeout=300)
        res = json.loads(out) if out.strip().startswith("{") else {"verdict": err[-600:]}
        lines = [f"B file {CFG['b_gib']} GiB private, page cache dropped, --read-rate {rate}: repro {res.get('outcome')} "
                 f"bound {res.get('bound')} {res.get('bound_counts')} in {res.get('seconds')} s, named after "
                 f"{res.get('first_bound_at_s')} s, ETA at 20% err {res.get('eta_error')}, file cache "
                 f"{res.get('file_cache')}, figures {res.get('pin_figures')}, watchdog "
                 f"{(res.get('watchdog') or {}).get('watchdog_cpu_pct_of_core')}%",
                 f"    reason: {res.get('bound_evidence')}", f"    verdict: {res.get('verdict')}"]
        lines.append(phase_line("watch --pid on repro's child", collect(w, 60)) if w else "  watch: child never pinned")
        return lines
    finally:
        path.unlink(missing_ok=True)


def case_c(runs: Path) -> list[str]:
    """47 GiB cudaHostAlloc under the launcher form, and a --pid watch beside it."""
    wrapper = [*HP, "watch", "--heartbeat", "2", "--size", CFG["c_size"], "--out", str(runs), "--json", "--"]
    target = Target(["--method", CFG["c_method"], "--size", CFG["c_size"]], wrapper=wrapper)
    try:
        target.expect("paged", 120)
        kids = children_of(target.proc.pid)
        target.say("go")
        time.sleep(1.0)
        w = watch(runs, "--pid", str(kids[0]), "--size", CFG["c_size"], "--deadline", "120") if kids else None
        took = float(target.expect("pinned", 180).split()[1])
        pid_res = collect(w, 30) if w else {"error": "the target's pid was not found"}
        target.say("quit")
        out, err = target.proc.communicate(timeout=120)
        beats = [line for line in err.splitlines() if line.startswith("hostpin: pid") and " pinning" in line]
        res = json.loads(out[out.index("{"):]) if "{" in out else {"error": err[-600:]}
        res["_rc"] = target.proc.returncode
        return [f"C {CFG['c_method']} {CFG['c_size']}: {took:.1f} s (target's clock); launcher exit {target.proc.returncode}; "
                f"{len(beats)} heartbeats, e.g.: {beats[len(beats) // 2] if beats else '(none)'}",
                phase_line("watch -- CMD", res), phase_line("watch --pid", pid_res)]
    finally:
        target.stop()


def case_d(runs: Path) -> list[str]:
    """Prefaulted 47 GiB THP register under repro at 0.2 s: the driver phase's stacks."""
    r = subprocess.run([*HP, "repro", "register", "--json", "--out", str(runs), "--size", CFG["d_size"],
                        "--method", CFG["d_method"], "--thp",
                        "--interval", "0.2", "--deadline", "150"], cwd=REPO, capture_output=True, text=True,
                       timeout=240)
    res = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {"verdict": r.stderr[-600:]}
    frames = {}
    for line in Path(res.get("run_dir", "/nonexistent"), "timeline.jsonl").read_text().splitlines() \
            if res.get("run_dir") else []:
        s = json.loads(line)
        if s.get("phase") != "pin":
            continue
        for p in s["procs"].values():
            for th in p["threads"].values():
                if th.get("frames"):
                    frames[" <- ".join(th["frames"][:8])] = frames.get(" <- ".join(th["frames"][:8]), 0) + 1
    top = sorted(frames.items(), key=lambda kv: -kv[1])[:6]
    return [f"D {CFG['d_method']} {CFG['d_size']} THP prefaulted: {res.get('outcome')} in {res.get('seconds')} s, bound "
            f"{res.get('bound')} {res.get('bound_counts')}; verdict: {res.get('verdict')}"] + \
        [f"    {n} x {f}" for f, n in top]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--summary", type=Path, required=True)
    ap.add_argument("--cpu-check", action="store_true", help="the same plumbing with mlock and small sizes, no GPU")
    o = ap.parse_args()
    global CFG
    CFG = CPU if o.cpu_check else GPU
    o.runs.mkdir(parents=True, exist_ok=True)
    summary = []
    for name, fn, need in (("A", case_a, 150), ("B", case_b, 170), ("C", case_c, 70), ("D", case_d, 50)):
        if left() < need:
            summary.append(f"{name}: skipped, {left():.0f} s of the budget left")
            continue
        log(f"case {name} starts")
        try:
            lines = fn(o.runs)
        except Exception as exc:
            lines = [f"{name} FAILED: {type(exc).__name__}: {exc}", traceback.format_exc()[-1500:]]
        summary += lines
        for line in lines:
            log(line)
        o.summary.write_text("\n".join(summary) + "\n")
    left_behind = [s for s in active_swaps() if "hostpin" in s] + \
        [d for d in glob.glob("/sys/fs/cgroup/hostpin-*")] + glob.glob("/var/tmp/hostpin-*")
    summary.append(f"left behind: {left_behind or 'nothing'}")
    o.summary.write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
