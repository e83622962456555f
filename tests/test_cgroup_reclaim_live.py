"""The headroom rule of a memory cgroup judged by the kernel, not by a formula: a real cgroup on this
machine holds page cache read twice (the active list), dirty page cache, or anonymous memory with
swap allowed or not; preflight judges a plan that PASSes and one that FAILs with --cgroup, and then
those sizes are really faulted in and mlocked by a child inside the cgroup. The PASS plan must pin
with no OOM kill; the FAIL plan must be OOM-killed or push memory to swap. Root and a memory cgroup
controller are needed (CI: cgroup v1); sizes are small (a 768 MiB limit, a few hundred MiB of cache).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from diag.units import MiB
from repro.cgroups import RunCgroup, leftover_cgroups
from repro.swapfile import SwapError, SwapFile

from conftest import IS_ROOT, REPO, cgroups_unusable

LIMIT = 768 * MiB
TARGET = REPO / "tests" / "pin_target.py"


_usable = cgroups_unusable  # conftest: one definition for every live file


pytestmark = pytest.mark.skipif(_usable() is not None, reason=f"cgroups: {_usable()}")


@pytest.fixture
def memcg():
    made, files = [], []

    def make() -> RunCgroup:
        cg = RunCgroup(f"hostpin-test-{os.getpid()}-reclaim-{len(made)}").create()
        made.append(cg)
        cg.set_memory_limit(LIMIT)
        return cg

    make.files = files
    yield make
    for cg in made:
        assert cg.remove() == []
    for f in files:
        f.unlink(missing_ok=True)
    assert not [c for c in leftover_cgroups() if f"hostpin-test-{os.getpid()}-reclaim" in c]


def _joined(cg: RunCgroup):
    join = cg.join_files()

    def preexec() -> None:
        for path in join:
            with open(path, "w") as fh:
                fh.write("0")
    return preexec


def _stat(cg: RunCgroup) -> dict[str, int]:
    out = {}
    for line in (cg.memory_dir / "memory.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    if cg.layout["version"] == 1:  # the hierarchical figures, named as v2 names them
        return {"active_file": out["total_active_file"], "inactive_file": out["total_inactive_file"],
                "file_dirty": out["total_dirty"] + out["total_writeback"], "anon": out["total_rss"]}
    return {"active_file": out["active_file"], "inactive_file": out["inactive_file"],
            "file_dirty": out["file_dirty"] + out["file_writeback"], "anon": out["anon"]}


def _oom_kills(cg: RunCgroup) -> int:
    name = "memory.oom_control" if cg.layout["version"] == 1 else "memory.events"
    for line in (cg.memory_dir / name).read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    raise AssertionError(f"no oom_kill line in {name}")


def _failcnt(cg: RunCgroup) -> int | None:
    path = cg.memory_dir / "memory.failcnt"
    return int(path.read_text()) if path.exists() else None


def _new_file(memcg, size: int) -> Path:
    """A file on the real disk (not tmpfs) whose pages are in no page cache yet."""
    path = Path("/var/tmp") / f"hostpin-test-{os.getpid()}-{uuid.uuid4().hex[:8]}.cache"
    memcg.files.append(path)
    block = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        for _ in range(size // MiB):
            os.write(fd, block)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def _read_twice(cg: RunCgroup, path: Path) -> None:
    """Read by a process inside the cgroup, twice: the cache is charged there, on the active list."""
    subprocess.run(["sh", "-c", f"cat {path} > /dev/null; cat {path} > /dev/null"], check=True,
                   preexec_fn=_joined(cg), timeout=120)


def _write_dirty(cg: RunCgroup, memcg, size: int) -> None:
    path = Path("/var/tmp") / f"hostpin-test-{os.getpid()}-{uuid.uuid4().hex[:8]}.dirty"
    memcg.files.append(path)
    subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={size // MiB}", "status=none"],
                   check=True, preexec_fn=_joined(cg), timeout=120)


def _preflight(tmp_path, cg: RunCgroup, size: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--no-cuda", "--json", "--out",
                        str(tmp_path / "runs"), "--method", "mlock", "--size", f"{size // MiB}MiB",
                        "--cgroup", str(cg.memory_dir), "--sample", "0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in r.stderr, r.stderr
    head = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "headroom")
    return head


class Holder:
    """pin_target inside the cgroup: maps and touches `size` of anonymous memory, then waits."""

    def __init__(self, cg: RunCgroup, size: int):
        self.p = subprocess.Popen([sys.executable, str(TARGET), "--size", f"{size // MiB}MiB", "--method", "mlock",
                                   "--join", *cg.join_files()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        self.line = self.p.stdout.readline().strip()  # 'paged N', or '' when killed while faulting

    def swap_bytes(self) -> int:
        try:
            for line in open(f"/proc/{self.p.pid}/status"):
                if line.startswith("VmSwap:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.kill()
        return self.p.wait(timeout=30)


def _pin(cg: RunCgroup, size: int) -> dict:
    """Fault in and mlock `size` inside the cgroup, for real; what the kernel did."""
    before = _oom_kills(cg)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(TARGET), "--size", f"{size // MiB}MiB", "--method", "mlock",
                          "--join", *cg.join_files()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pinned = False
    try:
        if p.stdout.readline().startswith("paged"):
            p.stdin.write("go\n")
            p.stdin.flush()
            pinned = p.stdout.readline().startswith("pinned")
        if pinned:
            p.stdin.write("quit\n")
            p.stdin.flush()
    except BrokenPipeError:
        pass
    finally:
        rc = p.wait(timeout=120)
    return {"pinned": pinned, "rc": rc, "oom_kills": _oom_kills(cg) - before, "failcnt": _failcnt(cg),
            "seconds": round(time.monotonic() - t0, 2)}


def test_active_page_cache_is_reclaimed_for_a_pin_pass_pins_fail_is_oom_killed(memcg, tmp_path):
    """400 MiB of clean cache read twice (active list) in a 768 MiB cgroup: 600 MiB fits (the old rule,
    limit - (usage - inactive_file), counted the active cache as in use and failed it), 800 MiB does not."""
    cg = memcg()
    _read_twice(cg, _new_file(memcg, 400 * MiB))
    st = _stat(cg)
    assert st["active_file"] > 300 * MiB, st  # really on the active list
    ok, too_big = _preflight(tmp_path, cg, 600 * MiB), _preflight(tmp_path, cg, 800 * MiB)
    assert ok["status"] == "pass", ok["summary"]
    assert "evicts" in ok["summary"] and "of it active" in ok["summary"], ok["summary"]
    assert too_big["status"] == "fail" and "OOM-kills" in too_big["summary"], too_big["summary"]
    got = _pin(cg, 600 * MiB)
    assert got["pinned"] and got["oom_kills"] == 0, got
    after = _stat(cg)
    assert after["active_file"] + after["inactive_file"] < st["active_file"] + st["inactive_file"]  # evicted
    print(f"\nactive cache {st['active_file'] / MiB:.0f} MiB: PASS 600 MiB pin {got}, cache after "
          f"{(after['active_file'] + after['inactive_file']) / MiB:.0f} MiB")
    got = _pin(cg, 800 * MiB)
    assert not got["pinned"] and got["oom_kills"] >= 1 and got["rc"] == -9, got
    print(f"FAIL 800 MiB pin {got}; verdicts: {ok['summary']} | {too_big['summary']}")


def test_dirty_page_cache_is_written_back_for_a_pin(memcg, tmp_path):
    """300 MiB dirty in a 768 MiB cgroup: 600 MiB fits once part of it is written back, 800 MiB does not."""
    cg = memcg()
    _write_dirty(cg, memcg, 300 * MiB)
    st = _stat(cg)
    assert st["file_dirty"] > 150 * MiB, st  # really dirty when preflight looks
    ok, too_big = _preflight(tmp_path, cg, 600 * MiB), _preflight(tmp_path, cg, 800 * MiB)
    assert ok["status"] == "pass", ok["summary"]
    assert "dirty" in ok["summary"] and "written back first" in ok["summary"], ok["summary"]
    assert too_big["status"] == "fail", too_big["summary"]
    got = _pin(cg, 600 * MiB)
    assert got["pinned"] and got["oom_kills"] == 0, got
    print(f"\ndirty {st['file_dirty'] / MiB:.0f} MiB: PASS 600 MiB pin {got}")
    got = _pin(cg, 800 * MiB)
    assert not got["pinned"] and got["oom_kills"] >= 1, got
    print(f"FAIL 800 MiB pin {got}; verdict: {ok['summary']}")


@pytest.fixture
def swap_area():
    """A 512 MiB swap file at a low priority: other tests' swap areas (same machine, other cgroups) fill
    first, so that their pages seldom land in this one; swapoff fails with ENOMEM while a page in it
    belongs to a process whose cgroup cannot take it back, so removal waits for those to end."""
    try:
        swap = SwapFile("/var/tmp", 512 * MiB, priority=10).create()
    except SwapError as exc:
        pytest.skip(f"cannot create a swap file here: {exc}")
    yield swap
    deadline = time.monotonic() + 90
    while (problems := swap.remove()) and time.monotonic() < deadline:
        time.sleep(1)
    assert problems == []


@pytest.mark.parametrize("swap_allowed", [True, False], ids=["swap-allowed", "swappiness-0"])
def test_anonymous_memory_goes_to_swap_only_where_allowed(memcg, tmp_path, swap_area, swap_allowed):
    """300 MiB of another process's anonymous memory and 200 MiB of active cache in a 768 MiB cgroup:
    350 MiB fits on the cache alone; 600 MiB needs the anonymous memory out of the way, which swap
    does where allowed (the holder is swapped out, the pin completes) and the OOM killer does where
    not (memory.swappiness 0: the cgroup's own reclaim scans file pages only)."""
    cg = memcg()
    if not swap_allowed:
        (cg.memory_dir / ("memory.swappiness" if cg.layout["version"] == 1 else "memory.swap.max")).write_text("0")
    holder = Holder(cg, 300 * MiB)
    try:
        assert holder.line.startswith("paged"), holder.line
        _read_twice(cg, _new_file(memcg, 200 * MiB))
        ok, too_big = _preflight(tmp_path, cg, 350 * MiB), _preflight(tmp_path, cg, 600 * MiB)
        assert ok["status"] == "pass", ok["summary"]
        assert too_big["status"] == "fail", too_big["summary"]
        if swap_allowed:
            assert "goes to swap" in too_big["summary"] and "reading it back takes" in too_big["summary"], \
                too_big["summary"]
        else:
            assert "OOM-kills" in too_big["summary"] and "swappiness 0" in too_big["summary"], too_big["summary"]
        got = _pin(cg, 350 * MiB)
        assert got["pinned"] and got["oom_kills"] == 0 and holder.p.poll() is None, got
        got = _pin(cg, 600 * MiB)
        swapped = holder.swap_bytes()
        if swap_allowed:
            # the kernel swaps the holder out and the pin completes, or OOM-kills when reclaim gives up while
            # that swap-out is in flight (seen here: the first such pin killed with 1.8 MiB swapped out)
            assert (got["pinned"] and got["oom_kills"] == 0 and swapped > 100 * MiB) or got["oom_kills"] >= 1, \
                (got, swapped)
        else:  # no swap for this cgroup: someone in it was OOM-killed (the pinner or the holder), nothing swapped
            assert got["oom_kills"] >= 1 and (not got["pinned"] or holder.p.poll() is not None), got
            assert swapped < 16 * MiB, swapped
        print(f"\n{'swap allowed' if swap_allowed else 'swappiness 0'}: 600 MiB pin {got}, holder VmSwap "
              f"{swapped / MiB:.1f} MiB")
    finally:
        holder.stop()
