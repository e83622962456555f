"""Preflight against the real kernel: a memory cgroup that binds, memory of another process really in
swap, swap-in really happening, and damaged readings in copied trees. Root, cgroups and a swap file are
needed for the first ones; skipped with the reason where the machine cannot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from diag.units import MiB
from repro.cgroups import RunCgroup, leftover_cgroups
from repro.swapfile import SwapError, SwapFile

from conftest import GPU_SNAPSHOT, IS_ROOT, REPO, cgroups_unusable, hostpin


_cgroups_usable = cgroups_unusable  # conftest: one definition for every live file


needs_cgroups = pytest.mark.skipif(_cgroups_usable() is not None, reason=f"cgroups: {_cgroups_usable()}")


def _preflight(tmp_path, *args, cgroup: RunCgroup | None = None, timeout=120) -> tuple[subprocess.CompletedProcess, dict]:
    argv = [sys.executable, "-m", "repro.cli", "preflight", "--no-cuda", "--json", "--out", str(tmp_path / "runs"), *args]
    join = cgroup.join_files() if cgroup else []

    def preexec() -> None:
        for path in join:
            with open(path, "w") as fh:
                fh.write("0")

    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, preexec_fn=preexec)
    assert "Traceback" not in r.stderr, r.stderr
    return r, json.loads(r.stdout)


@pytest.fixture
def memcg():
    made = []

    def make(limit: int | None) -> RunCgroup:
        cg = RunCgroup(f"hostpin-test-{os.getpid()}-{len(made)}").create()
        made.append(cg)
        if limit is not None:
            cg.set_memory_limit(limit)
        return cg

    yield make
    for cg in made:
        assert cg.remove() == []
    assert not [c for c in leftover_cgroups() if "hostpin-test-" in c]


@needs_cgroups
def test_inside_a_1gib_cgroup_hostalloc_2gib_fails_headroom_and_names_it(tmp_path, memcg):
    """The done-when case: cgroup limited to 1 GiB, `preflight --method hostalloc --size 2GiB --no-cuda`."""
    cg = memcg(1 << 30)
    r, result = _preflight(tmp_path, "--method", "hostalloc", "--size", "2GiB", cgroup=cg)
    head = next(c for c in result["checks"] if c["id"] == "headroom")
    assert r.returncode == 1 and head["status"] == "fail"
    assert result["binding"] == "cgroup" and result["binding_dir"] == str(cg.memory_dir)
    assert str(cg.memory_dir) in head["summary"] and cg.name in head["remedy"]
    assert result["binding_bytes"] <= 1 << 30 and 12 in head["predicted"]
    # the same cgroup seen from outside, through the process that will pin (--pid) or its path (--cgroup)
    sleeper = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: open(cg.join_files()[0], "w").write("0"))
    try:
        r2, by_pid = _preflight(tmp_path, "--method", "hostalloc", "--size", "2GiB", "--pid", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r2.returncode == 1 and by_pid["binding"] == "cgroup" and by_pid["binding_dir"] == str(cg.memory_dir)
    r3, by_path = _preflight(tmp_path, "--method", "hostalloc", "--size", "2GiB", "--cgroup", str(cg.memory_dir))
    assert by_path["binding_dir"] == str(cg.memory_dir)
    # control: preflight's own cgroup has no such limit, and 2 GiB fits this machine
    r4, own = _preflight(tmp_path, "--method", "hostalloc", "--size", "2GiB")
    assert next(c for c in own["checks"] if c["id"] == "headroom")["status"] == "pass"


CHILD = r"""
import mmap, sys, time
size = int(sys.argv[1])
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, size, 4096):
    buf[off] = 1
print("ready", flush=True)
for line in sys.stdin:
    end = time.monotonic() + float(line.split()[1])
    while time.monotonic() < end:
        for off in range(0, size, 4096):
            buf[off] = 2
            if time.monotonic() > end:
                break
    print("touched", flush=True)
"""


@pytest.fixture
def swapped_child(memcg):
    """A process with about 256 MiB of its memory really in swap (a 128 MiB memory cgroup around 384 MiB)."""
    try:
        swap = SwapFile("/var/tmp", 512 * MiB).create()
    except SwapError as exc:
        pytest.skip(f"cannot create a swap file here: {exc}")
    cg = memcg(128 * MiB)
    join = cg.join_files()

    def preexec() -> None:
        for path in join:
            with open(path, "w") as fh:
                fh.write("0")

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(384 * MiB)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        yield child
    finally:
        child.kill()
        child.wait()
        assert swap.remove() == []


def _vmswap(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmSwap:"):
            return int(line.split()[1]) * 1024
    return 0


@needs_cgroups
def test_another_process_in_swap_warns_with_the_predicted_pin_time(tmp_path, swapped_child):
    """The done-when case: 256 MiB of another process in swap, an idle device, a 1 GiB plan: the swap
    check warns, with predicted_pin_seconds > 0 in its evidence and the holder named."""
    in_swap = _vmswap(swapped_child.pid)
    assert in_swap >= 200 * MiB, in_swap
    r, result = _preflight(tmp_path, "--method", "mlock", "--size", "1GiB", "--sample", "0.5")
    swap = next(c for c in result["checks"] if c["id"] == "swap")
    ev = swap["evidence"]
    assert swap["status"] == "warn" and ev["predicted_pin_seconds"] > 0
    assert result["predicted_pin_seconds"] == ev["predicted_pin_seconds"]
    assert ev["swapin_now"]["sampled"] and ev["swapin_now"]["pages_per_s"] < 50  # the device is idle
    assert any(h["pid"] == swapped_child.pid for h in ev["swap_holders"])
    assert f"pid {swapped_child.pid}" in swap["summary"]
    # exposure: the plan's share of what the node pushed to swap, never more than the plan
    assert 0 < ev["exposed_bytes"] <= 1 << 30 and ev["device_kind"] in ("virtual", "ssd", "rotational", "nvme")
    assert ev["predicted_pin_seconds"] == pytest.approx(ev["exposed_pages"] / ev["rate_pages_per_s"], rel=0.01)
    # the process that will pin (--pid) has its own memory in swap: that part is exposed for certain
    # (its cgroup's limit lifted, so that the plan fits there; the pages stay in swap until touched)
    cg_dir = next(d for d in open(f"/proc/{swapped_child.pid}/cgroup").read().split("\n") if "hostpin-test" in d)
    limit_file = "/sys/fs/cgroup/memory" + cg_dir.split(":")[2] + "/memory.limit_in_bytes"
    if os.path.exists(limit_file):
        open(limit_file, "w").write("-1")
    else:
        open("/sys/fs/cgroup" + cg_dir.split(":")[2] + "/memory.max", "w").write("max")
    r2, by_pid = _preflight(tmp_path, "--method", "mlock", "--size", "1GiB", "--sample", "0", "--pid",
                            str(swapped_child.pid))
    ev2 = next(c for c in by_pid["checks"] if c["id"] == "swap")["evidence"]
    assert ev2["own_swap_bytes"] >= 200 * MiB and ev2["exposure"]["own_bytes"] >= 200 * MiB


@needs_cgroups
def test_swap_in_demand_is_sampled_live(tmp_path, swapped_child):
    """While the other process reads its pages back, the sample sees swap-in (demand, reported as
    such; the prediction still comes from the device)."""
    swapped_child.stdin.write("touch 4\n")
    swapped_child.stdin.flush()
    time.sleep(0.3)
    r, result = _preflight(tmp_path, "--method", "mlock", "--size", "1GiB", "--sample", "1.5")
    swap = next(c for c in result["checks"] if c["id"] == "swap")
    assert swap["evidence"]["swapin_now"]["pages_per_s"] > 50, swap["evidence"]["swapin_now"]
    assert "swap-in now" in swap["summary"] and swap["status"] == "warn"
    assert result["swapin_pages_per_s"] > 50
    assert swapped_child.stdout.readline().strip() == "touched"


def test_a_corrupted_reading_in_a_copied_tree_exits_3(run_cli, tree):
    """The done-when case, and the issue's own: a bad value in /proc/pressure/memory used to crash
    preflight outside the guard (traceback, exit 1, no JSON)."""
    t = tree(GPU_SNAPSHOT)
    t.write("proc/pressure/memory", "some avg10=1.5O avg60=0.00 avg300=0.00 total=12\n")
    r = run_cli("preflight", "--root", str(t.base), "--size", "1GiB", "--json")
    assert r.returncode == 3 and "Traceback" not in r.stderr
    result = json.loads(r.stdout)
    psi = next(c for c in result["checks"] if c["id"] == "psi")
    assert result["status"] == "error" and psi["status"] == "error" and "damaged reading" in psi["summary"]
    t = tree(GPU_SNAPSHOT)
    zi = (t.path / "proc/zoneinfo").read_text()
    t.write("proc/zoneinfo", zi.replace("managed  360448", "managed  n/a"))
    r = run_cli("preflight", "--root", str(t.base), "--size", "1GiB")
    assert r.returncode == 3 and "damaged reading" in r.stdout and "ERROR" in r.stdout


def test_json_on_every_exit_path(run_cli, tmp_path):
    r = run_cli("preflight", "--size", "lots", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["exit_code"] == 2
    r = run_cli("preflight", "--root", str(tmp_path), "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["status"] == "error"
    r = run_cli("preflight", "--cgroup", "/no/such/cgroup", "--json", "--no-cuda")
    assert r.returncode == 2 and "no cgroup at" in json.loads(r.stdout)["verdict"]
    if not open("/proc/swaps").read().strip().count("\n"):  # no swap: repro refuses with a ReproError
        r = hostpin("repro", "register", "--size", "64MiB", "--method", "mlock", "--swap-in-rate", "16MB/s",
                    "--json", "--out", str(tmp_path / "r"))
        assert r.returncode == 3 and "no swap" in r.stderr
        data = json.loads(r.stdout)
        assert data["exit_code"] == 3 and data["schema"] == "hostpin.repro-register" and "no swap" in data["error"]
