"""`hostpin watch` on real processes it did not start, with the real kernel: a region put into
swap for real (a swap file and a memory cgroup), reads from the swap device or the file's disk
throttled for the target's cgroup; the target is tests/pin_target.py, which uses nothing of
hostpin. Root is needed for swap, cgroups and kernel stacks; skipped with the reason otherwise."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag import process
from diag.evidence import load_manifest, verify_manifest
from repro.cgroups import PREFIX as CG_PREFIX, CgroupError, RunCgroup, block_device_for, cgroup_layout, file_device
from repro.filecache import evict
from repro.swapfile import SwapFile, active_swaps

from conftest import IS_ROOT, REPO, hostpin

TARGET = Path(__file__).parent / "pin_target.py"
RATE = 16_000_000  # 16 MB/s: ~3,900 pages/s, the order of the paper's slow node (2,800)


def _usable() -> str | None:
    if not IS_ROOT:
        return "swap files, cgroups and kernel stacks need root"
    try:
        layout = cgroup_layout()
    except CgroupError as exc:
        return str(exc)
    return "no blkio controller" if layout["version"] == 1 and not layout["io"] else None


needs_node = pytest.mark.skipif(_usable() is not None, reason=f"{_usable()}")


class Target:
    """tests/pin_target.py in a throttled cgroup of its own, maybe under a wrapper (argv prefix)."""

    def __init__(self, cg: RunCgroup, *args: str, wrapper: tuple[str, ...] = ()):
        joins = [a for path in cg.join_files() for a in ("--join", path)]
        self.proc = subprocess.Popen([*wrapper, sys.executable, str(TARGET), *args, *joins], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.cg = cg

    def expect(self, word: str) -> str:
        line = self.proc.stdout.readline().strip()
        assert line.startswith(word), (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        return line

    def say(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()


@pytest.fixture
def node():
    """A 1 GiB swap file and a cgroup for the target (memory + blkio/io); removed afterwards."""
    swap = SwapFile("/var/tmp", 1 << 30).create()
    cg = None
    started: list[Target] = []
    try:
        cg = RunCgroup(f"{CG_PREFIX}test-watch-{os.getpid()}").create(want_io=True)

        def start(*args: str, wrapper: tuple[str, ...] = ()) -> Target:
            target = Target(cg, *args, wrapper=wrapper)
            started.append(target)
            return target

        yield cg, start
    finally:
        for t in started:
            if t.proc.poll() is None:
                t.proc.kill()
                t.proc.wait(timeout=30)
        if cg is not None:
            assert cg.remove() == []
        assert swap.remove() == []


def _swap_out_and_throttle(cg: RunCgroup) -> None:
    cg.drop_swap_cache()  # the pages written to swap leave the swap cache: each must be read back
    for disk in {block_device_for(dev) for dev in active_swaps()}:
        cg.throttle_reads(disk, RATE)


def _watch(tmp_path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "repro.cli", "watch", "--out", str(tmp_path / "runs"), *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_node
def test_watch_pid_names_swap_in_and_predicts_the_end(node, tmp_path):
    """A 256 MiB region, 192 MiB of it in swap, swap-in at 16 MB/s, mlocked by a process hostpin
    did not start; two watches attach while it pins: one with --size, one without."""
    cg, start = node
    target = start("--size", "256MiB", "--swap-out", "192MiB", "--thp")
    swapped = int(target.expect("paged").split()[1])
    _swap_out_and_throttle(cg)
    target.say("go")
    time.sleep(0.3)  # attach in the middle of the pin, as an operator would
    with_size = _watch(tmp_path, "--pid", str(target.proc.pid), "--size", "256MiB", "--json")
    without = _watch(tmp_path, "--pid", str(target.proc.pid), "--json")
    took = float(target.expect("pinned").split()[1])
    results = []
    for w in (with_size, without):  # each ends by itself when it sees the pin return
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        assert "Traceback" not in err
        results.append(json.loads(out))
    target.say("quit")
    assert target.proc.wait(timeout=30) == 0  # never signalled, stopped or slowed into failure
    a, b = results
    assert swapped >= 150 << 20 and 6 < took < 40
    assert a["schema"] == "hostpin.watch" and a["outcome"] == "completed" and a["bound"] == "swap-in"
    ph = a["phases"][0]
    assert ph["kind"] == "mlock" and ph["seen_start"] is False and ph["size_from"] == "--size"
    assert ph["started_s"] + ph["first_bound_at_s"] <= 2.0, ph  # named within 2 s of attaching
    assert ph["eta_at_20pct"] is not None and abs(ph["eta_error"]) <= 0.25, ph
    assert "still in swap" in ph["eta_at_20pct"]["basis"]
    assert ph["catalog"] == 1 and "do_swap_page" in ph["bound_reason"]
    assert "swap" in a["verdict"] and a["remedy"]
    # without --size: the bound and an ETA from what the process shows (VmSwap, mlock's length)
    pb = b["phases"][0]
    assert pb["bound"] == "swap-in" and pb["size_from"] == "mlock length"
    assert pb["eta_first"] is not None and "still in swap" in pb["eta_first"]["basis"]
    assert abs(pb["eta_first_error"]) <= 0.25, pb
    # the evidence: a run directory with its manifest, the timeline, the stacks, the result
    run = Path(a["run_dir"])
    assert verify_manifest(run) == []
    kinds = {e["path"]: e["kind"] for e in load_manifest(run)["entries"]}
    assert kinds["timeline.jsonl"] == "timeline" and kinds["stacks-start.txt"] == "stacks"
    assert f"### tid {target.proc.pid} state " in (run / "stacks-start.txt").read_text()  # a snapshot: R or D
    lines = (run / "timeline.jsonl").read_text().splitlines()
    assert len(lines) >= 10 and json.loads(lines[3])["progress"]["bound"] == "swap-in"
    assert a["watcher"]["cpu_pct_of_core"] < 5.0
    report = hostpin("report", str(run), "--format", "text", "--no-picture")
    assert report.returncode == 0 and "swap-in" in report.stdout
    assert "Kernel stack" in report.stdout and "do_swap_page" in report.stdout.split("Kernel stack", 1)[1]


@needs_node
def test_watch_command_heartbeats_and_passes_the_exit_code(node, tmp_path):
    """The launcher form around the same kind of process, pinning with mlockall (no length in
    the call: the heartbeat's ETA comes from VmSwap alone)."""
    cg, start = node
    wrapper = (sys.executable, "-m", "repro.cli", "watch", "--heartbeat", "1", "--out", str(tmp_path / "runs"), "--")
    target = start("--size", "256MiB", "--swap-out", "192MiB", "--thp", "--method", "mlockall", "--exit-code", "7",
                   wrapper=wrapper)
    target.expect("paged")
    _swap_out_and_throttle(cg)
    target.say("go")
    target.expect("pinned")
    target.say("quit")
    out, err = target.proc.communicate(timeout=60)
    assert target.proc.returncode == 7, err
    beats = [line for line in err.splitlines() if line.startswith("hostpin: pid") and " pinning" in line]
    assert len(beats) >= 3, err
    # a beat that falls after the swap emptied (the pin about to return) says so instead of an ETA
    during = [b for b in beats[1:] if "nothing left in swap" not in b]
    assert len(during) >= 2 and all("bound swap-in" in b and "still in swap" in b and "ETA" in b for b in during), \
        "\n".join(beats)
    assert not any(" at -" in b for b in beats), "\n".join(beats)  # never a negative rate
    run = Path(err.strip().splitlines()[-1].rsplit("evidence: ", 1)[1].rstrip(")"))
    result = json.loads((run / "result.json").read_text())
    assert result["mode"] == "command" and result["command_exit"]["returncode"] == 7 and result["exit_code"] == 7
    ph = next(p for p in result["phases"] if p["kind"] == "mlock")  # a sample may catch the populate before it
    assert ph["bound"] == "swap-in" and ph["seen_start"] is True and ph["outcome"] == "completed"
    # mlockall also faults in the rest of the process first, so its first seconds run slower:
    # the ETA's accuracy is the --pid test's; here it must be there, from VmSwap
    assert ph["size_bytes"] is None and "still in swap" in ph["eta_first"]["basis"], ph
    assert verify_manifest(run) == []


def _killed_mid_pin(target: Target, after: float, reap_after: float, sig=signal.SIGTERM) -> float:
    """Kill the target `after` seconds into its throttled mlock (192 MiB at 16 MB/s: 12 s);
    it stays a zombie for `reap_after` s, as under a launcher that reaps it later. Returns the
    seconds from the call to the reap: once in a CI run the kernel took over 20 s to end a task
    killed inside a throttled swap-in (it dies when the fault it waits on lets it)."""
    t0 = time.monotonic()
    time.sleep(after)
    target.proc.send_signal(sig)
    time.sleep(reap_after)
    assert target.proc.wait(timeout=90) == -sig
    return time.monotonic() - t0


@needs_node
def test_watch_pid_a_target_killed_inside_the_pin_exited(node, tmp_path):
    """Killed 3 s into the pin, reaped by its parent 3 s later: the pin did not complete; the
    percent is the one last seen alive (a zombie's status has no VmSwap: it read as 100%)."""
    cg, start = node
    target = start("--size", "256MiB", "--swap-out", "192MiB", "--thp")
    target.expect("paged")
    _swap_out_and_throttle(cg)
    target.say("go")
    time.sleep(0.3)
    w = _watch(tmp_path, "--pid", str(target.proc.pid), "--size", "256MiB", "--json")
    reaped = _killed_mid_pin(target, 3.0, 3.0)
    out, err = w.communicate(timeout=30)
    assert w.returncode == 1, err
    a = json.loads(out)
    ph = a["phases"][0]
    assert a["outcome"] == "exited" and ph["outcome"] == "exited", a["verdict"]
    assert ph["pct"] is not None and 5 < ph["pct"] < 80, ph
    assert ph.get("eta_error") is None and "exited inside the pin" in a["verdict"], a["verdict"]
    # it ended when the process died, not when its parent reaped it (3 s after the kill, or at
    # once when the kernel took longer than that to end it)
    assert a["watched_s"] < (3.0 + 3.0 + 1.5 if reaped < 3.0 + 3.0 + 0.5 else reaped + 1.5), (a["watched_s"], reaped)


@needs_node
def test_watch_command_a_target_killed_inside_the_pin_exited(node, tmp_path):
    """The launcher form: SIGTERM to hostpin 3 s into CMD's pin is passed on and kills CMD (rc
    143); SIGKILL straight to CMD: rc 137. Neither pin completed."""
    cg, start = node
    for sig in (signal.SIGTERM, signal.SIGKILL):
        wrapper = (sys.executable, "-m", "repro.cli", "watch", "--heartbeat", "2", "--out", str(tmp_path / "runs"),
                   "--")
        target = start("--size", "256MiB", "--swap-out", "192MiB", "--thp", wrapper=wrapper)
        target.expect("paged")
        _swap_out_and_throttle(cg)
        target.say("go")
        time.sleep(3.0)
        if sig == signal.SIGTERM:
            target.proc.send_signal(sig)
        else:
            kids = subprocess.run(["pgrep", "-P", str(target.proc.pid)], capture_output=True, text=True).stdout.split()
            assert len(kids) == 1, kids
            os.kill(int(kids[0]), sig)
        out, err = target.proc.communicate(timeout=90)  # a task killed in a throttled swap-in may take a while
        assert target.proc.returncode == 128 + sig, err
        run = Path(err.strip().splitlines()[-1].rsplit("evidence: ", 1)[1].rstrip(")"))
        result = json.loads((run / "result.json").read_text())
        ph = next(p for p in result["phases"] if p["kind"] == "mlock")  # a sample may catch the populate too
        assert ph["outcome"] == "exited", (sig, result["verdict"])
        assert ph["pct"] is None or ph["pct"] < 80, ph  # mlock's length gives the size
        assert ph.get("eta_error") is None and "exited inside the pin" in result["verdict"], result["verdict"]
        assert " pinned " not in result["verdict"], result["verdict"]


@needs_node
def test_file_read_is_named(node, tmp_path):
    """A 256 MiB file with data on disk, its page cache dropped, reads throttled to 16 MB/s:
    `repro register --read-rate` pins it; then (held out: another size, a process hostpin did not
    start) `watch --pid` on an independent mlock of a 96 MiB file."""
    path = Path("/var/tmp") / f"hostpin-test-file-{os.getpid()}.bin"
    try:
        with open(path, "wb") as fh:
            for _ in range(256):
                fh.write(b"\x5a" * (1 << 20))
        r = hostpin("repro", "register", "--json", "--out", str(tmp_path / "runs"), "--size", "256MiB", "--method",
                    "mlock", "--source", f"file:{path}", "--no-prefault", "--read-rate", "16MB/s", timeout=120)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["bound"] == "file-read" and res["outcome"] == "slow", res["verdict"]
        assert res["file_cache"]["cached_after"] < 0.05 and res["throttle"]["devices"] == [file_device(str(path))]
        assert res["pin_figures"]["read_bytes"] >= 200 << 20 and 10 < res["seconds"] < 40
        assert "read from" in res["verdict"] and res["first_bound_at_s"] <= 2.0
        # the reason quotes the phase's rate, not the throttle's initial burst of the first window
        read_rate = float(res["bound_reason"].split("it reads ", 1)[1].split(" MiB/s")[0])
        assert 13.0 <= read_rate <= 17.5 and res["bound_reason"] == res["bound_evidence"], res["bound_reason"]
        assert all(step["ok"] for step in res["cleanup"])
        # held out
        cg, start = node
        evict(str(path))
        cg.throttle_reads(file_device(str(path)), RATE)
        target = start("--size", "96MiB", "--source", f"file:{path}")
        target.expect("paged")
        target.say("go")
        time.sleep(0.3)
        w = _watch(tmp_path, "--pid", str(target.proc.pid), "--json")
        target.expect("pinned")
        out, err = w.communicate(timeout=60)
        target.say("quit")
        assert w.returncode == 0, err
        a = json.loads(out)
        ph = a["phases"][0]
        assert ph["bound"] == "file-read" and "filemap_fault" in ph["bound_reason"], ph
        assert ph["figures"]["read_bytes"] >= 48 << 20 and ph["size_from"] == "mlock length"
    finally:
        path.unlink(missing_ok=True)


def test_watch_command_passes_signals_and_exit_codes(tmp_path):
    handler = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
               "print('ready', flush=True)\ntime.sleep(30)\n")
    for code, expected in ((handler, 42), ("import time\nprint('ready', flush=True)\ntime.sleep(30)\n", 128 + 15)):
        p = subprocess.Popen([sys.executable, "-m", "repro.cli", "watch", "--out", str(tmp_path), "--",
                              sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == expected, err
        assert "no pin phase was seen" in err and "Traceback" not in err
        run = Path(err.strip().rsplit("evidence: ", 1)[1].rstrip(")"))
        result = json.loads((run / "result.json").read_text())
        assert result["command_exit"]["signals_passed"] == ["SIGTERM"]
    r = hostpin("watch", "--out", str(tmp_path), "--", "/nonexistent/serve")
    assert r.returncode == 127 and "command not found" in r.stderr


def test_watch_usage_and_nothing_to_watch(tmp_path):
    r = hostpin("watch", "--out", str(tmp_path))
    assert r.returncode == 2 and "either --pid" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = hostpin("watch", "--pid", "1", "--out", str(tmp_path), "--", "true")
    assert r.returncode == 2
    r = hostpin("watch", "--pid", "4194304", "--json", "--out", str(tmp_path))  # above pid_max's ceiling
    assert r.returncode == 3 and json.loads(r.stdout)["outcome"] == "gone"


def _zombie() -> subprocess.Popen:
    """A child that has exited and that this test has not reaped yet."""
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process.read_task_state(z.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.read_task_state(z.pid) == "Z"
    return z


def test_watch_a_zombie_ends_at_once(tmp_path):
    """A zombie's /proc/PID stays until its parent reaps it: nothing in it can pin."""
    z = _zombie()
    try:
        t0 = time.monotonic()
        r = hostpin("watch", "--pid", str(z.pid), "--json", "--out", str(tmp_path), timeout=15)
        took = time.monotonic() - t0
    finally:
        z.wait()
    res = json.loads(r.stdout)
    assert r.returncode == 3 and res["outcome"] == "gone", res
    assert "has exited" in res["verdict"] and "zombie" in res["verdict"] and took < 10


def _kernel_thread() -> int | None:
    for entry in sorted(os.listdir("/proc"), key=lambda e: (len(e), e)):
        if entry.isdigit():
            st = process.read_task_stat(int(entry))
            if st is not None and st.kernel_thread:
                return int(entry)
    return None


@pytest.mark.skipif(_kernel_thread() is None, reason="no kernel thread visible in this pid namespace")
def test_watch_a_kernel_thread_says_it_cannot_pin(tmp_path):
    pid = _kernel_thread()  # kthreadd, pid 2, on a host
    r = hostpin("watch", "--pid", str(pid), "--json", "--out", str(tmp_path), timeout=15)
    res = json.loads(r.stdout)
    assert r.returncode == 3 and res["outcome"] == "gone", res
    assert "kernel thread" in res["verdict"] and "cannot pin" in res["verdict"]
    r = hostpin("watch", "--pid", str(pid), "--out", str(tmp_path), timeout=15)  # the terminal form too
    assert r.returncode == 3 and "kernel thread" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.skipif(not IS_ROOT, reason="what root is refused")
def test_watch_says_why_root_cannot_read(tmp_path):
    """As root, /proc/1/io and /proc/1/stack may still be refused (ptrace access checks, kernel
    lockdown, a container's pid 1): the note must not say root is missing."""
    r = hostpin("watch", "--pid", "1", "--deadline", "1", "--json", "--out", str(tmp_path), timeout=30)
    res = json.loads(r.stdout)
    assert r.returncode == 1 and res["outcome"] == "no-pin"
    refused = [p for p in ("io", "stack") if not os.access(f"/proc/1/{p}", os.R_OK) or not _readable(f"/proc/1/{p}")]
    for what in refused:
        assert what in res["unreadable"], res["unreadable"]
    for what, why in res["unreadable"].items():
        assert "needs root" not in why, (what, why)


def _readable(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        return True
    except OSError:
        return False


def test_watch_a_process_that_does_not_pin(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = hostpin("watch", "--pid", str(sleeper.pid), "--deadline", "1", "--json", "--out", str(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    res = json.loads(r.stdout)
    assert r.returncode == 1 and res["outcome"] == "no-pin" and "no pin phase seen" in res["verdict"]
    assert verify_manifest(res["run_dir"]) == []


def test_the_sampler_never_reads_what_takes_the_mmap_lock():
    """Every path the sampler opens on a live multi-threaded process, seen by an audit hook; smaps
    (which takes the mmap lock a pin holds) only when a process's per-VMA swap is asked for, and
    then only in the reader's own thread."""
    from diag.watch.sampler import Sampler
    opened: list[str] = []
    by: list[str] = []
    active = [True]

    import threading

    def hook(event, args):
        if active[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            opened.append(os.fsdecode(args[0]))
            by.append(threading.current_thread().name)

    sys.addaudithook(hook)
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]\n"
                              "time.sleep(30)\n"])
    try:
        time.sleep(0.3)
        sampler = Sampler()
        for i in range(3):
            s = sampler.sample(i * 0.5, [child.pid], {child.pid: {child.pid}})
        plain = len(opened)
        for i in range(3, 6):
            r = sampler.sample(i * 0.5, [child.pid], {child.pid: {child.pid}}, regions={child.pid: True})
            reading = reading if i > 3 else r["procs"][child.pid].get("smaps_swap")
    finally:
        active[0] = False
        child.kill()
        child.wait()
    assert len(s["procs"][child.pid]["threads"]) == 4
    asked = [(p, who) for p, who in zip(opened[plain:], by[plain:]) if p.endswith("/smaps")]
    assert asked and {who for _, who in asked} == {"hostpin-smaps"}, asked
    assert reading is not None and reading["vma_count"] > 10 and r["regions"] == "smaps", reading
    del opened[plain:]
    mine = [p for p in opened if f"/{child.pid}/" in p]
    assert any(p.endswith("/status") for p in mine) and any(p.endswith("/stat") for p in mine)
    assert not [p for p in mine if p.rsplit("/", 1)[1] in ("maps", "smaps", "smaps_rollup", "cmdline", "environ",
                                                           "mem", "pagemap", "numa_maps")]


def test_a_smaps_read_that_does_not_return_never_holds_the_sampler(monkeypatch):
    """The edge case, faked: a read of smaps queued behind the mmap lock a pin holds (the driver's
    register holds it for the whole call; a writer waiting in another thread queues every reader
    behind it). The sample goes on within the wait (50 ms), says how long the read has waited, and
    starts no second read; the reading lands in the sample after it returns."""
    from diag.watch import smaps as smaps_mod
    from diag.watch.sampler import Sampler
    release = __import__("threading").Event()
    real = smaps_mod.read_bounded

    def stuck(path, limit):
        if str(path).endswith("/smaps"):
            release.wait(10)
        return real(path, limit)

    monkeypatch.setattr(smaps_mod, "read_bounded", stuck)
    sampler, pid = Sampler(), os.getpid()
    t0 = time.monotonic()
    first = sampler.sample(0.0, [pid], regions={pid: True})
    second = sampler.sample(0.6, [pid], regions={pid: True})
    took = time.monotonic() - t0
    assert took < 0.5 and "smaps_swap" not in first["procs"][pid], took
    assert second["procs"][pid]["smaps_swap"] == {"waiting_s": 0.6} and len(sampler.smaps.reads) == 1
    release.set()
    sampler.smaps.reads[pid].done.wait(5)
    third = sampler.sample(1.2, [pid], regions={pid: True})
    assert third["procs"][pid]["smaps_swap"]["t"] == 0.0 and "vmas" in third["procs"][pid]["smaps_swap"]


@needs_node
def test_watch_pid_follows_the_load_after_the_pin(node, tmp_path):
    """A process hostpin did not start mlocks 128 MiB (all of it in swap), then reads 192 MiB of
    its own memory back from swap in user space (Tensor.pin_memory()'s copy, on the CPU), swap-in
    at 16 MB/s: ~8.4 s of pin, ~12.6 s of copy. `watch --pid` gives both phases with their bounds
    and ends once the process is quiet; `--until pin` ends at the pin's return. The pin's ETA
    counts only the swap the pin can read: the process's VmSwap also holds the 192 MiB the copy
    reads later (counted as the pin's, its ETA was 25% late with mlock's length, 2.5x without)."""
    cg, start = node
    target = start("--size", "128MiB", "--swap-out", "128MiB", "--then-read", "192MiB")
    target.expect("paged")
    _swap_out_and_throttle(cg)
    whole = _watch(tmp_path, "--pid", str(target.proc.pid), "--json")
    first = _watch(tmp_path, "--pid", str(target.proc.pid), "--until", "pin", "--json")
    time.sleep(1.0)  # both attached and sampling before the pin starts
    t0 = time.monotonic()
    target.say("go")
    pinned = float(target.expect("pinned").split()[1])
    out1, err1 = first.communicate(timeout=60)
    read_s = float(target.expect("read").split()[1])
    read_end = time.monotonic() - t0
    out, err = whole.communicate(timeout=90)
    ended = time.monotonic() - t0
    target.say("quit")
    assert target.proc.wait(timeout=30) == 0
    assert whole.returncode == 0 and first.returncode == 0, (err, err1)
    assert "Traceback" not in err + err1
    a, b = json.loads(out), json.loads(out1)
    assert 5 < pinned < 25 and 8 < read_s < 40, (pinned, read_s)
    # --until pin: one phase, today's end
    assert [p["kind"] for p in b["phases"]] == ["mlock"] and b["outcome"] == "completed" and b["until"] == "pin"
    # the whole load: the pin, then the copy from swap, each with its bound and catalog entry
    kinds = [(p["kind"], p["pin"], p["bound"], p["catalog"], p["outcome"]) for p in a["phases"]]
    seen = [(p["kind"], p["started_s"], p["seconds"], p["figures"].get("swapped_in_bytes")) for p in a["phases"]]
    assert kinds == [("mlock", True, "swap-in", 1, "completed"), ("copy-from-swap", False, "swap-in", 19, "completed")], \
        seen
    pin, copy = a["phases"]
    assert copy["words"] == "swap-in in the process's own faults, not a pin" and "not a pin" in a["verdict"]
    # its evidence: the process's own VmSwap falling (a stack caught in do_swap_page, when one was)
    assert "its VmSwap falls" in copy["bound_reason"] and copy["figures"]["swapped_in_bytes"] >= 150 << 20
    assert abs(copy["seconds"] - read_s) <= 1.5, (copy["seconds"], read_s)
    assert copy["eta_at_20pct"] is not None and abs(copy["eta_error"]) <= 0.15, copy
    assert pin["eta_first"] is not None and abs(pin["eta_first_error"]) <= 0.15, pin["eta_first"]
    # quiet for --quiet-after (5 s) after the copy: then it ends, not before and not much later
    assert a["outcome"] == "completed" and a["quiet_after_s"] == 5.0
    assert read_end + 4.0 <= ended <= read_end + 9.0, (read_end, ended)


def test_watch_command_json_file_leaves_cmd_output_alone(tmp_path):
    """`watch --json-file F -- CMD`: stdout is CMD's alone (hostpin's JSON would break a launcher
    that parses it), CMD's stderr lines are all there, CMD's exit code comes back, and F parses."""
    code = ("import sys\nfor i in range(200):\n    print(f'out {i}', flush=True)\n"
            "    print(f'err {i}', file=sys.stderr, flush=True)\nsys.exit(5)\n")
    f = tmp_path / "result.json"
    r = hostpin("watch", "--out", str(tmp_path / "runs"), "--json-file", str(f), "--", sys.executable, "-c", code)
    assert r.returncode == 5, r.stderr
    assert r.stdout == "".join(f"out {i}\n" for i in range(200))
    assert [line for line in r.stderr.splitlines() if line.startswith("err ")] == [f"err {i}" for i in range(200)]
    assert all(line.startswith(("err ", "hostpin: ")) for line in r.stderr.splitlines()), r.stderr
    doc = json.loads(f.read_text())
    assert doc["schema"] == "hostpin.watch" and doc["mode"] == "command" and doc["exit_code"] == 5
    assert doc["command_exit"]["returncode"] == 5 and not list(tmp_path.glob(".result.json.*"))  # no temp left
    # --json alone would mix into CMD's stdout: refused in one line, CMD not run
    r = hostpin("watch", "--out", str(tmp_path / "runs"), "--json", "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 2 and "--json-file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "ran" not in r.stdout


def test_json_file_is_atomic_and_never_follows_a_link(tmp_path):
    """--json-file follows the output-path rules of -o (issue 19): a link at PATH is neither followed
    nor replaced (exit 2, its target left alone); a regular file there is replaced whole; a directory
    at PATH, or a PATH whose directory does not exist, is a bad command line."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    r = hostpin("watch", "--pid", "1", "--out", str(tmp_path / "runs"), "--json-file", str(link))
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    assert victim.read_text() == "keep me\n" and link.is_symlink()
    out = tmp_path / "out.json"
    out.write_text("an older document that is longer than the new one will ever be " * 200)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = hostpin("watch", "--pid", str(sleeper.pid), "--deadline", "1", "--out", str(tmp_path / "runs"),
                    "--json-file", str(out))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 1 and "no pin" in r.stdout, r.stderr
    assert json.loads(out.read_text())["outcome"] == "no-pin"
    for bad in (tmp_path, tmp_path / "missing" / "x.json"):
        r = hostpin("watch", "--pid", "1", "--out", str(tmp_path / "runs"), "--json-file", str(bad))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr, r.stderr
    # every command with --json has it: compare (a bad run) writes its error document
    f = tmp_path / "cmp.json"
    r = hostpin("compare", str(tmp_path / "nope1"), str(tmp_path / "nope2"), "--json-file", str(f))
    assert r.returncode in (2, 3)
    for cmd in (["preflight"], ["snapshot"], ["bundle"], ["compare"], ["repro", "register"], ["repro", "staging"],
                ["repro", "cleanup"], ["watch"]):
        assert "--json-file" in hostpin(*cmd, "--help").stdout, cmd


@needs_node
def test_watch_eta_counts_the_swap_of_the_region_not_all_of_vmswap(node, tmp_path):
    """A process hostpin did not start keeps 64 MiB of its memory in swap that no phase reads (as
    a torch process keeps its own and CUDA's), faults 192 MiB of swapped memory in with
    MADV_POPULATE_READ (a pin-path call whose length hostpin does not read, like the driver's
    register without --size), then reads 128 MiB of its swapped memory in user space; swap-in at
    16 MB/s. Counted from the whole VmSwap, each ETA is late by the swap its phase does not read
    (the code before this test, with 128 MiB beside 160 MiB: the populate's first ETA +150%, no
    ETA at 20%); from the region's swap (smaps: the VMAs being drained) each is within 10% at its
    first ETA and at 20% of its work, and its basis names the region."""
    cg, start = node
    target = start("--size", "192MiB", "--swap-out", "192MiB", "--method", "populate", "--then-read", "128MiB",
                   "--keep-swapped", "64MiB", "--guard")  # three VMAs (smaps tells VMAs apart, not pages)
    swapped = int(target.expect("paged").split()[1])
    _swap_out_and_throttle(cg)
    watch = _watch(tmp_path, "--pid", str(target.proc.pid), "--json")
    time.sleep(1.0)  # attached and sampling before the populate starts
    target.say("go")
    pinned = float(target.expect("pinned").split()[1])
    read_s = float(target.expect("read").split()[1])
    out, err = watch.communicate(timeout=90)
    target.say("quit")
    assert target.proc.wait(timeout=30) == 0
    assert watch.returncode == 0 and "Traceback" not in err, err
    res = json.loads(out)
    assert swapped >= 360 << 20 and 8 < pinned < 30 and 5 < read_s < 25, (swapped, pinned, read_s)
    kinds = [(p["kind"], p["bound"], p["outcome"]) for p in res["phases"]]
    assert kinds == [("populate", "swap-in", "completed"), ("copy-from-swap", "swap-in", "completed")], kinds
    for ph in res["phases"]:
        first, at20 = ph["eta_first"], ph["eta_at_20pct"]
        assert first is not None and at20 is not None, (ph["kind"], first, at20)
        assert "of the region still in swap (smaps" in first["basis"], first
        assert abs(ph["eta_first_error"]) <= 0.10 and abs(ph["eta_error"]) <= 0.10, (ph["kind"], first, at20,
                                                                                    ph["seconds"])
        assert 20.0 <= at20["work_pct"] < 50.0, at20
    # outside each phase's region: what it did not read (the populate: the copy's 128 MiB and the 64 MiB
    # no phase reads; the copy: those 64 MiB), which its ETA did not count
    pin, copy = res["phases"]
    assert (187 << 20) <= pin["figures"]["swap_outside_region_bytes"] <= (198 << 20), pin["figures"]
    assert (60 << 20) <= copy["figures"]["swap_outside_region_bytes"] <= (68 << 20), copy["figures"]
    assert any("did not count it" in n for n in copy["notes"]), copy["notes"]
    # the per-region swap is in the timeline, for a replay
    lines = [json.loads(line) for line in (Path(res["run_dir"]) / "timeline.jsonl").read_text().splitlines()]
    readings = [p["smaps_swap"] for s in lines for p in s["procs"].values() if "vmas" in p.get("smaps_swap", {})]
    assert len(readings) >= 4 and all(r["ms"] < 100 for r in readings), [r.get("ms") for r in readings]
    assert res["watcher"]["smaps_reads"] == len(readings)
