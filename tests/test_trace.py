"""`--trace`: the time budget from a recorded trace (tests/fixtures/ci-trace-swap-mlock: a real
`repro register --trace` of an 8 MiB mlock, 7 MiB of it in swap, reads throttled to 4 MB/s, on
this CI machine), and live on this kernel: a swap-bound mlock, a fault-in, a throttled file read,
nothing left in tracefs afterwards (also after SIGKILL, then `repro cleanup`)."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.trace import (CAUSES, Ledger, attach_budgets, budget_from_events, classify_stack, parse_lines, parse_text,
                        pick_pinner)
from diag.trace.tracefs import PREFIX, TRACEFS

from conftest import IS_ROOT, REPO, hostpin

FIX = Path(__file__).parent / "fixtures" / "ci-trace-swap-mlock"
PAGE = 4096
CLUSTER = 1 << 3   # /proc/sys/vm/page-cluster 3: swap readahead reads up to 8 pages a request


def _fixture():
    events = parse_text(gzip.decompress((FIX / "threads.txt.gz").read_bytes()).decode())
    events += parse_text(gzip.decompress((FIX / "devices.txt.gz").read_bytes()).decode())
    result = json.loads((FIX / "result.json").read_text())
    return events, result


def test_recorded_trace_gives_the_swap_in_budget():
    events, result = _fixture()
    ph = result["phases"][0]
    t0 = result["trace"]["t0_monotonic"]
    threads = [e for e in events if e.name != "block_rq_complete"]
    done = [e for e in events if e.name == "block_rq_complete"]
    b = budget_from_events(threads + done, ph["tid"], t0 + ph["started_s"], t0 + ph["started_s"] + ph["seconds"])
    wall = ph["seconds"]
    assert set(b["causes"]) == set(CAUSES)
    assert sum(b["causes"].values()) <= wall + 0.005  # each term rounded to 1 ms
    assert b["causes"]["io"] >= 0.9 * wall, b["causes"]
    assert b["causes"]["reclaim"] == b["causes"]["compaction"] == 0
    swapped_pages = result["swapped_out_bytes"][0] // PAGE
    # the pinner read back (one 4 KiB bio a page) most of what was in swap, a readahead cluster at most a request
    read_pages = b["io"]["bytes"] // PAGE
    assert 0.85 * swapped_pages <= read_pages <= swapped_pages, (b["io"], swapped_pages)
    assert read_pages / CLUSTER <= b["io"]["requests"] <= read_pages, (b["io"], swapped_pages)
    assert b["io"]["bios"] == pytest.approx(read_pages, rel=0.02)  # this recorded trace has one bio a page
    assert list(b["io"]["devices"]) == ["254:0"]
    rq = b["io"]["request_latency"]
    assert rq["count"] >= 0.9 * b["io"]["requests"] and rq["p50_ms"] <= rq["p99_ms"] <= rq["max_ms"]
    # the sleeps, not the requests, carry the throttle's wait (it holds bios before they are requests)
    assert b["io"]["sleep_latency"]["max_ms"] > 20 * rq["p50_ms"]
    # about the budget the run computed while it traced (that code counted the time from a wakeup to
    # the next sign of the thread on a CPU as part of the sleep: 0.028 s of 1.686 here)
    assert b["causes"]["io"] == pytest.approx(ph["time_budget"]["causes"]["io"], abs=0.05)
    assert b["explained"] == pytest.approx(ph["time_budget"]["explained"], abs=0.02)


def test_only_the_pinners_time_is_counted():
    events, result = _fixture()
    ph = result["phases"][0]
    t0 = result["trace"]["t0_monotonic"]
    other_tid = next(e.args["next"] for e in events if e.name == "sched_switch" and e.args["prev"] == ph["tid"])
    b = budget_from_events(events, other_tid, t0 + ph["started_s"], t0 + ph["started_s"] + ph["seconds"])
    assert b["io"]["requests"] == 0 and b["causes"]["io"] == 0


# an edge case written by hand (named so): one sleep on I/O, one inside memcg reclaim, one preemption
HAND = """\
  pin-7 [000] d..2. 100.000000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=D ==> next_comm=swapper/0 next_pid=0 next_prio=120
  pin-7 [000] d..2. 100.000001: <stack trace>
 => __schedule
 => io_schedule
 => folio_wait_bit_common
 => do_swap_page
  <idle>-0 [000] d.h1. 100.400000: sched_wakeup: comm=pin pid=7 prio=120 target_cpu=000
  <idle>-0 [000] d..2. 100.500000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=pin next_pid=7 next_prio=120
  pin-7 [000] ..... 100.600000: mm_vmscan_memcg_reclaim_begin: order=0 gfp_flags=GFP_KERNEL
  pin-7 [000] d..2. 100.700000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=D ==> next_comm=kworker next_pid=9 next_prio=120
  pin-7 [000] d..2. 100.700001: <stack trace>
 => __schedule
 => io_schedule
 => shrink_folio_list
 => try_to_free_mem_cgroup_pages
  kworker-9 [000] d..2. 100.900000: sched_switch: prev_comm=kworker prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=pin next_pid=7 next_prio=120
  pin-7 [000] ..... 101.000000: mm_vmscan_memcg_reclaim_end: nr_reclaimed=32
  pin-7 [000] d..2. 101.100000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=R+ ==> next_comm=other next_pid=11 next_prio=120
CPU:0 [LOST 3 EVENTS]
  other-11 [000] d..2. 101.300000: sched_switch: prev_comm=other prev_pid=11 prev_prio=120 prev_state=S ==> next_comm=pin next_pid=7 next_prio=120
  pin-7 [000] d..2. 101.500000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
  pin-7 [000] d..2. 101.500001: <stack trace>
 => __schedule
 => futex_wait
"""


def test_hand_written_edge_case_sleep_reclaim_preemption():
    events = parse_lines(HAND.splitlines())
    assert [e.name for e in events].count("stack") == 3 and any(e.name == "lost" for e in events)
    b = budget_from_events(events, 7, 100.0, 102.0)
    c = b["causes"]
    assert c["io"] == pytest.approx(0.5)          # switch-out 100.0 to switch-in 100.5 (woken at 100.4)
    assert c["reclaim"] == pytest.approx(0.4)     # 100.6 .. 101.0, on and off the CPU: reclaim's
    assert c["runqueue"] == pytest.approx(0.2)    # preempted 101.1 .. 101.3
    assert c["cpu"] == pytest.approx(0.1 + 0.1 + 0.2)
    assert c["other"] == pytest.approx(0.5)       # the futex sleep after 101.5: named by nothing known
    assert b["explained"] == pytest.approx(1.5 / 2.0, abs=1e-3)
    assert b["io"]["sleep_latency"]["count"] == 1 and b["io"]["sleep_latency"]["max_ms"] == pytest.approx(400)
    # half the phase: the bins' share at the edges
    half = budget_from_events(events, 7, 100.0, 101.0)
    assert half["causes"]["io"] == pytest.approx(0.5) and half["causes"]["reclaim"] == pytest.approx(0.4)


def test_classify_stack_orders_reclaim_before_io():
    assert classify_stack(["__schedule", "io_schedule", "folio_wait_bit_common", "do_swap_page"]) == "io"
    assert classify_stack(["__schedule", "io_schedule", "shrink_folio_list", "try_to_free_pages"]) == "reclaim"
    assert classify_stack(["__schedule", "rwsem_down_read_slowpath", "lock_mm_and_find_vma"]) == "lock_wait"
    assert classify_stack(["__schedule", "futex_wait"]) is None


def test_attach_budgets_fills_dicts_and_objects():
    events = parse_lines(HAND.splitlines())

    class Source:
        def budget(self, tid, start, end):
            return budget_from_events(events, tid, 100.0 + start, 100.0 + end) if tid == 7 else None

    result = {"phases": [{"tid": 7, "started_s": 0.0, "seconds": 2.0}, {"tid": 8, "started_s": 0.0, "seconds": 1.0},
                         {"tid": 7, "started_s": 0.0, "seconds": None}]}
    assert attach_budgets(result, Source()) == 1
    assert result["phases"][0]["time_budget"]["causes"]["io"] == pytest.approx(0.5)
    assert "time_budget" not in result["phases"][1] and "time_budget" not in result["phases"][2]
    assert attach_budgets(result, None) == 0


# -- live, on this kernel ------------------------------------------------------------------------
def _usable() -> str | None:
    if not IS_ROOT:
        return "tracefs needs root"
    if not TRACEFS.is_dir():
        return f"{TRACEFS} does not exist"
    return None


live = pytest.mark.skipif(_usable() is not None, reason=str(_usable()))


@pytest.fixture
def unmounted_tracefs():
    """tracefs unmounted first where nothing is in it (so the run under test mounts it), as it was after."""
    mounts = Path("/proc/self/mounts").read_text()
    was = any(line.split()[1:3] == [str(TRACEFS), "tracefs"] for line in mounts.splitlines())
    if was and not (TRACEFS / "instances").exists() or was and not os.listdir(TRACEFS / "instances"):
        subprocess.run(["umount", str(TRACEFS)], check=False)
    yield
    now = any(line.split()[1:3] == [str(TRACEFS), "tracefs"] for line in
              Path("/proc/self/mounts").read_text().splitlines())
    if was and not now:
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=False)
LOCK = "/tmp/hostpin-live.lock"


def _ours() -> list[str]:
    """hostpin instances on the node (tracefs may be unmounted: then there are none to see)."""
    base = TRACEFS / "instances"
    return sorted(p.name for p in base.iterdir() if p.name.startswith(PREFIX)) if base.is_dir() else []


def _register(tmp_path, *args: str) -> dict:
    r = hostpin("repro", "register", "--trace", "--json", "--out", str(tmp_path / "runs"), "--method", "mlock",
                "--no-calibrate", "--ignore-leftovers", *args, timeout=180)  # the machine is shared
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@live
def test_swap_bound_mlock_budget_is_io(tmp_path):
    """96 MiB, 92 MiB of it pushed into swap by a cgroup limit, swap reads throttled to 8 MB/s (12 s;
    the phase, as sampled, also holds up to an interval at each end outside the call)."""
    before = _ours()
    res = _register(tmp_path, "--size", "96MiB", "--swap-out", "92MiB", "--swap-in-rate", "8MB/s",
                    "--make-swap", "256MiB")
    b = res["time_budget"]
    assert b is not None, res["notes"]
    wall = b["wall_s"]
    assert b["causes"]["io"] >= 0.9 * wall, json.dumps(b["causes"])
    swapped_pages = res["swapped_out_bytes"][0] // PAGE
    read_pages = b["io"]["bytes"] // PAGE
    assert 0.85 * swapped_pages <= read_pages <= swapped_pages, (b["io"], swapped_pages)
    assert read_pages / CLUSTER <= b["io"]["requests"] <= read_pages, (b["io"], swapped_pages)
    assert b["dropped"] == 0 and "Trace: of the" in res["verdict"] and "io " in res["verdict"]
    t = res["trace"]
    assert t["cleanup_problems"] == [] and t["buffer_bytes"] > 0 and t["kept_bytes"] == t["raw_bytes"]
    run = Path(res["run_dir"])
    manifest = [json.loads(line) for line in (run / "manifest.jsonl").read_text().splitlines()]
    traces = [e for e in manifest if e.get("kind") == "trace"]
    assert sorted(e["path"] for e in traces) == ["trace/devices.txt", "trace/threads.txt"]
    assert all(e["size"] == (run / e["path"]).stat().st_size for e in traces)
    # the devices' instance keeps reads only (the swap-out's writes overran a CPU's ring on the H200)
    kinds = {e.args["rwbs"][:1] for e in parse_text((run / "trace" / "devices.txt").read_text())
             if e.name.startswith("block_rq")}
    assert kinds == {"R"}, kinds
    assert _ours() == before
    rep = hostpin("report", str(run), "--format", "text")
    assert rep.returncode == 0, rep.stderr
    table = rep.stdout.split("Time budget (--trace)", 1)[1]
    io_row = next(line for line in table.splitlines() if line.startswith("io "))
    assert float(io_row.split()[1]) == pytest.approx(b["causes"]["io"], abs=0.001)
    assert "read requests" in table and "the thread's I/O sleeps" in table


@live
def test_fault_in_budget_is_cpu(tmp_path):
    """256 MiB never touched: mlock faults and zeroes every page, no I/O."""
    res = _register(tmp_path, "--size", "256MiB", "--no-prefault")
    b = res["time_budget"]
    c = b["causes"]
    assert c["io"] <= 0.02 * b["wall_s"], c
    # on the CPU, or runnable and waiting for one on this shared 2-core machine
    assert c["cpu"] == max(v for k, v in c.items() if k != "runqueue"), c
    assert c["cpu"] + c["runqueue"] >= 0.8 * b["wall_s"], c
    assert b["io"]["requests"] == 0


@live
def test_file_read_budget_is_io_on_the_files_device(tmp_path):
    from repro.cgroups import file_device
    path = Path("/var/tmp") / f"hostpin-test-trace-{os.getpid()}.bin"
    try:
        with open(path, "wb") as fh:
            for _ in range(48):
                fh.write(b"\x5a" * (1 << 20))
        res = _register(tmp_path, "--size", "48MiB", "--source", f"file:{path}", "--no-prefault",
                        "--read-rate", "8MB/s")
        b = res["time_budget"]
        assert res["bound"] == "file-read"
        assert b["causes"]["io"] >= 0.8 * b["wall_s"], b["causes"]
        disk = file_device(str(path))
        # blk-throttle issues the held readahead from a kworker: the requests are the device's, over the phase
        assert b["io"]["basis"] == "device" and disk in b["io"]["devices"], b["io"]
        assert b["io"]["bytes"] >= 0.8 * (48 << 20) and b["io"]["request_latency"]["count"] > 0, b["io"]
    finally:
        path.unlink(missing_ok=True)


@live
def test_watch_pid_trace_and_sigkill_then_cleanup(tmp_path, unmounted_tracefs):
    """watch --pid --trace of a sleeping process: the instances exist while it watches; SIGKILL of
    hostpin leaves them (nothing can run), the leftovers check names them, `repro cleanup` removes them."""
    from diag.leftovers import find_leftovers
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    w = subprocess.Popen([sys.executable, "-m", "repro.cli", "watch", "--trace", "--out", str(tmp_path / "runs"),
                          "--pid", str(target.pid)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        mine = f"{PREFIX}{w.pid}-"
        t_end = time.monotonic() + 30
        # the two instances are made one after the other: wait for both (under load the second came later)
        while time.monotonic() < t_end and sum(n.startswith(mine) for n in _ours()) < 2:
            time.sleep(0.1)
        assert sorted(n for n in _ours() if n.startswith(mine)) == [f"{mine}0", f"{mine}1"]
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
        assert [n for n in _ours() if n.startswith(mine)] == [f"{mine}0", f"{mine}1"]
        stale = [x for x in find_leftovers() if x.kind == "trace" and x.pid == w.pid]
        assert len(stale) == 2 and not any(x.alive for x in stale)
        r = hostpin("repro", "cleanup", "--json", timeout=60)
        assert r.returncode == 0, r.stderr
        assert [n for n in _ours() if n.startswith(mine)] == []
        found = json.loads(r.stdout)["found"]
        assert any("tracefs instance" in row["description"] for row in found)
        # had it mounted tracefs (the mount's source names it), that mount is gone too
        if any(row["kind"] == "trace-mount" and row["pid"] == w.pid for row in found):
            assert f"{PREFIX}{w.pid} " not in Path("/proc/self/mounts").read_text()
    finally:
        target.kill()
        target.wait()
        if w.poll() is None:
            w.kill()
        from diag.trace import remove_instance
        for n in _ours():
            if n.startswith(f"{PREFIX}{w.pid}-"):
                remove_instance(TRACEFS / "instances" / n)
        # a failed assertion above must not leave the killed watch's tracefs mount to the next test (its
        # leftover makes every later repro refuse with exit 4): the cleanup removes whatever is left
        hostpin("repro", "cleanup", timeout=60)


@live
def test_watch_interrupted_removes_its_instances(tmp_path):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    w = subprocess.Popen([sys.executable, "-m", "repro.cli", "watch", "--trace", "--json", "--out",
                          str(tmp_path / "runs"), "--pid", str(target.pid)], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        mine = f"{PREFIX}{w.pid}-"
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and not any(n.startswith(mine) for n in _ours()):
            time.sleep(0.1)
        assert any(n.startswith(mine) for n in _ours())
        time.sleep(2.0)  # into the sampling loop (an interrupt during the setup has no result to print)
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=30)
        assert w.returncode == 130, err
        assert not any(n.startswith(mine) for n in _ours())
        data = json.loads(out)
        assert data["trace"]["cleanup_problems"] == [] and data["trace"]["instances"] == [f"{mine}0", f"{mine}1"]
    finally:
        target.kill()
        target.wait()


@pytest.mark.skipif(not IS_ROOT or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv")
def test_trace_without_root_is_refused_in_one_line(tmp_path):
    for args in (["watch", "--trace", "--pid", "1"], ["repro", "register", "--trace", "--size", "1MiB",
                                                      "--method", "mlock"]):
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "repro.cli", *args, "--out", str(tmp_path / "x")], cwd=REPO, capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, HOME=str(tmp_path)))
        assert r.returncode == 4, (r.stdout, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and "--trace needs root" in r.stderr, r.stderr


def test_a_sleep_past_the_stack_quota_takes_the_last_stacks_cause_and_is_counted_apart():
    """Hand-written (named so): the trigger takes STACKS_PER_S stacks a second; the second sleep has none."""
    text = """\
  pin-7 [000] d..2. 10.000000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=D ==> next_comm=swapper/0 next_pid=0 next_prio=120
  pin-7 [000] d..2. 10.000001: <stack trace>
 => io_schedule
 => do_swap_page
  <idle>-0 [000] d..2. 10.200000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=pin next_pid=7 next_prio=120
  pin-7 [000] d..2. 10.300000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=D ==> next_comm=swapper/0 next_pid=0 next_prio=120
  <idle>-0 [000] d.h1. 10.550000: sched_wakeup: comm=pin pid=7 prio=120 target_cpu=000
  <idle>-0 [000] d..2. 10.600000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=pin next_pid=7 next_prio=120
"""
    b = budget_from_events(parse_text(text), 7, 10.0, 10.6)
    assert b["causes"]["io"] == pytest.approx(0.5) and b["causes"]["cpu"] == pytest.approx(0.1)
    assert b["inferred_s"] == pytest.approx(0.3) and b["events"]["stack"] == 1


@pytest.mark.skipif(not IS_ROOT, reason="the root check comes first")
def test_without_tracefs_the_watch_samples_and_says_why(tmp_path, monkeypatch):
    """A kernel without tracing (no /sys/kernel/tracing): start_trace says so and gives no tracer."""
    from diag.trace import session
    from diag.watch.traced import start_trace
    monkeypatch.setattr(session, "TRACEFS", tmp_path / "no-tracing")
    notes: list[str] = []
    assert start_trace(None, [os.getpid()], time.monotonic(), notes) is None
    assert notes == [f"--trace: {tmp_path / 'no-tracing'} does not exist (a kernel without CONFIG_TRACING); "
                     "the bound is sampled only"]


@live
def test_watch_pid_trace_gives_the_phase_its_budget(tmp_path):
    """`watch --pid --trace` on tests/pin_target.py (a process hostpin did not start): 64 MiB, 56 MiB
    of it in swap, swap reads throttled to 8 MB/s for its cgroup; the phase gets a time_budget."""
    from repro.cgroups import PREFIX as CG_PREFIX, RunCgroup, block_device_for
    from repro.swapfile import SwapFile, active_swaps
    swap = SwapFile("/var/tmp", 256 << 20).create()
    cg = RunCgroup(f"{CG_PREFIX}test-trace-{os.getpid()}").create(want_io=True)
    target = None
    try:
        joins = [a for path in cg.join_files() for a in ("--join", path)]
        target = subprocess.Popen([sys.executable, str(Path(__file__).parent / "pin_target.py"), "--size", "64MiB",
                                   "--swap-out", "56MiB", "--thp", *joins], cwd=REPO, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert target.stdout.readline().startswith("paged")
        cg.drop_swap_cache()
        for disk in {block_device_for(dev) for dev in active_swaps()}:
            cg.throttle_reads(disk, 8_000_000)
        w = subprocess.Popen([sys.executable, "-m", "repro.cli", "watch", "--trace", "--json", "--out",
                              str(tmp_path / "runs"), "--pid", str(target.pid), "--size", "64MiB"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # attached and tracing before the pin starts
        target.stdin.write("go\n")
        target.stdin.flush()
        assert target.stdout.readline().startswith("pinned")
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        a = json.loads(out)
        ph = max(a["phases"], key=lambda p: p["seconds"] or 0)
        b = ph["time_budget"]
        assert ph["bound"] == "swap-in" and b["tid"] == ph["tid"]
        assert b["causes"]["io"] >= 0.8 * b["wall_s"], json.dumps(b["causes"])
        assert b["io"]["basis"] == "thread" and b["io"]["requests"] > 0
        assert "Trace: of the" in a["verdict"] and a["trace"]["cleanup_problems"] == []
        assert not any(n.startswith(f"{PREFIX}{w.pid}-") for n in _ours())
    finally:
        if target is not None and target.poll() is None:
            target.kill()
            target.wait(timeout=30)
        assert cg.remove() == []
        assert swap.remove() == []


H200_C = Path(__file__).parent / "fixtures" / "h200-trace-register-prefaulted"


def test_recorded_h200_prefaulted_register_budget_is_the_pinners_cpu_time_not_an_exited_helpers():
    """Recorded on the H200 (bench/gpu_trace_budget.sh case C): a prefaulted 47 GiB cudaHostRegister
    that took 2.13 s. The run then chose thread 2532, a prefault helper that had exited 3.6 s before
    the pin, and gave it 2.13 s of lock_wait inferred from its last stack (its phases[] as recorded).
    The pinner is the main thread, 2515, on a CPU the whole time (no event of it during the pin)."""
    result = json.loads((H200_C / "result.json").read_text())
    events = parse_text((H200_C / "trace" / "threads.txt").read_text())
    ph = result["phases"][0]
    assert ph["tid"] == 2532 and ph["time_budget"]["causes"]["lock_wait"] > 2  # what the old code said
    t0 = result["trace"]["t0_monotonic"]
    start, end = t0 + ph["started_s"], t0 + ph["started_s"] + ph["seconds"]
    tids = sorted({e.pid for e in events if e.pid > 0 and e.name == "sched_switch"
                   and e.args["prev"] == e.pid and e.args["prev"] >= ph["pid"]})
    assert 2515 in tids and 2532 in tids
    ledger = Ledger()
    ledger.watch(tids)
    ledger.feed_all(events)
    ledger.close(max(e.ts for e in events))
    budgets = {tid: ledger.budget(tid, start, end) for tid in tids}
    helper = budgets[2532]
    assert helper["covered_s"] == 0 and sum(helper["causes"].values()) == 0, helper  # it exited: no time after
    b = pick_pinner(budgets)
    assert b is budgets[2515]
    assert b["causes"]["cpu"] >= 0.9 * ph["seconds"], b["causes"]  # /proc: on a CPU for all of it
    assert b["inferred_s"] == 0


@live
def test_a_tracepoint_this_kernel_lacks_is_named_and_the_rest_still_traces(tmp_path, monkeypatch):
    """The kernel's own answer for an event it does not have (its events/ directory has no such
    entry): one pid-instance event added to the list under a name no kernel has. The tracer names it
    in a note and in events_missing, still records this process's scheduler events, and leaves no
    instance behind."""
    from diag.cliopts import open_run
    from diag.trace import session
    monkeypatch.setattr(session, "PID_EVENTS", session.PID_EVENTS + ("hostpin_none/no_such_event",))
    run = open_run(tmp_path / "runs", "trace-test")
    before = _ours()
    tracer = session.Tracer.start(run, [os.getpid()], time.monotonic())
    try:
        for _ in range(20):
            time.sleep(0.01)  # sleeps: scheduler switches of this thread
    finally:
        summary = tracer.stop()
    assert summary["events_missing"] == ["hostpin_none/no_such_event"]
    assert any("no hostpin_none/no_such_event tracepoint" in n for n in summary["notes"]), summary["notes"]
    assert "sched/sched_switch" in summary["events_enabled"] and summary["events"] >= 20
    assert _ours() == before and summary["cleanup_problems"] == []


@live
def test_a_required_tracepoint_missing_refuses_the_trace_and_leaves_nothing(tmp_path, monkeypatch):
    """The same kernel answer for a required event: no trace (TraceUnavailable, naming it), the watch
    would sample instead; the instance made before the check is removed."""
    from diag.cliopts import open_run
    from diag.trace import session
    from diag.watch.traced import start_trace
    monkeypatch.setattr(session, "REQUIRED", session.REQUIRED + ("hostpin_none/no_such_event",))
    run = open_run(tmp_path / "runs", "trace-test")
    before = _ours()
    notes: list[str] = []
    assert start_trace(run, [os.getpid()], time.monotonic(), notes) is None
    assert notes == ["--trace: this kernel has no hostpin_none/no_such_event tracepoint; the bound is sampled only"]
    assert _ours() == before


@live
def test_past_the_cap_the_trace_keeps_its_start_and_its_last_bytes(tmp_path, monkeypatch):
    """The raw trace is a head and a ring: with a cap of 4 KiB and a tail of 8 KiB (set small here),
    a trace of this process's sleeps keeps its first 4 KiB in trace/threads.txt and its last lines in
    trace/threads.tail.txt, after a line that counts the bytes between; both are in the manifest."""
    from diag.cliopts import open_run
    from diag.trace import session
    monkeypatch.setattr(session, "TAIL_BYTES", 8 << 10)
    run = open_run(tmp_path / "runs", "trace-test")
    tracer = session.Tracer.start(run, [os.getpid()], time.monotonic(), cap_bytes=4 << 10)
    try:
        for _ in range(600):
            time.sleep(0.001)
    finally:
        summary = tracer.stop()
    run.finish({"ok": True})
    head = (run.path / "trace" / "threads.txt").read_bytes()
    tail = (run.path / "trace" / "threads.tail.txt").read_bytes()
    assert len(head) == 4 << 10 and summary["raw_bytes"] > (4 << 10) + (8 << 10), summary["raw_bytes"]
    first, rest = tail.split(b"\n", 1)
    gap = int(first.split(b"the ")[2].split()[0])
    assert first.startswith(b"# hostpin: the trace's last ") and len(rest) <= 8 << 10
    threads_raw = summary["raw_bytes"] - (run.path / "trace" / "devices.txt").stat().st_size
    assert len(head) + gap + len(rest) == threads_raw
    assert len(parse_text(rest.splitlines()[0].decode())) == 1  # it starts at a line: a whole event
    assert "trace/threads.tail.txt" in summary["files"]
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert any(e["path"] == "trace/threads.tail.txt" and e["kind"] == "trace" for e in manifest["entries"])


def test_hand_written_edge_case_events_of_two_cpus_crossing_are_never_counted_twice():
    """Hand-written (named so): the pinner sleeps on I/O at 10.0, its switch back in is read at 10.5,
    and a later read of another CPU's ring gives a switch out at 10.2 (trace_pipe orders events by
    time within a read, not across reads). The thread's clock never goes back: 1.0 s of phase holds
    at most 1.0 s of causes (the code that set it to each switch's time counted 10.2-10.5 twice)."""
    text = """\
  pin-7 [000] d..2. 10.000000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=D ==> next_comm=swapper/0 next_pid=0 next_prio=120
  pin-7 [000] d..2. 10.000001: <stack trace>
 => io_schedule
 => do_swap_page
  kworker-9 [000] d..2. 10.500000: sched_switch: prev_comm=kworker prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=pin next_pid=7 next_prio=120
  pin-7 [001] d..2. 10.200000: sched_switch: prev_comm=pin prev_pid=7 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
  kworker-9 [001] d..2. 10.900000: sched_switch: prev_comm=kworker prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=pin next_pid=7 next_prio=120
"""
    b = budget_from_events(parse_text(text), 7, 10.0, 11.0)
    assert sum(b["causes"].values()) <= 1.0 + 1e-9, b["causes"]
    assert b["causes"]["io"] >= 0.5 and b["covered_s"] <= 1.0 + 1e-9


H200_A = Path(__file__).parent / "fixtures" / "h200-trace-swap-register-lost"


def test_recorded_h200_trace_with_lost_events_never_counts_more_than_the_phase():
    """Recorded on the H200 (bench/gpu_trace_budget.sh case A, 2026-12-02): a 2 GiB register, 1 GiB
    of it in swap read at 48 MB/s. The rings lost 46,328 events (LOST lines), and the run counted
    io 34.92 s in a 22.5 s phase (172% "measured", covered 38.8 s): its clock for the pinner had
    moved back (the edge case above). The file's own order does not reproduce the crossing the two
    reader threads saw live; replayed, the budget holds the phase's time once, io-bound, with the
    losses counted."""
    result = json.loads((H200_A / "result.json").read_text())
    ph = result["phases"][0]
    assert ph["time_budget"]["explained"] > 1.5  # what the run said then
    threads = parse_text(gzip.decompress((H200_A / "threads.txt.gz").read_bytes()).decode())
    devices = parse_text(gzip.decompress((H200_A / "devices.txt.gz").read_bytes()).decode())
    assert sum(e.args["n"] for e in threads + devices if e.name == "lost") == 46_328
    t0 = result["trace"]["t0_monotonic"]
    start, end = t0 + ph["started_s"], t0 + ph["started_s"] + ph["seconds"]
    ledger = Ledger()
    ledger.watch([ph["tid"]])
    ledger.feed_all(threads)
    ledger.feed_all(devices, device=True)
    ledger.close(max(e.ts for e in threads))
    b = ledger.budget(ph["tid"], start, end, dropped=46_328)
    assert b["dropped"] == 46_328 and ph["time_budget"]["covered_s"] > ph["seconds"] * 1.5
    assert sum(b["causes"].values()) <= ph["seconds"] + 2 * 0.05, b["causes"]  # the edge bins at most
    assert b["explained"] <= 1.0 + 1e-6 and b["causes"]["io"] >= 0.8 * ph["seconds"], b["causes"]
