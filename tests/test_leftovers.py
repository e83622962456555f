"""Issue 11 cases 5, 9 and 17 with a real reproduction and the real kernel: the parent of a
swap-bound `repro register` is SIGKILLed in the middle of its pin, and what it leaves (an
active swap file, memory and blkio cgroups, a read throttle) is found, warned about, refused
beside, and removed; the killed run is bundled and reported as partial. Needs root and cgroups."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, hostpin
from test_repro import assert_nothing_left, needs_cgroups

pytestmark = [pytest.mark.skipif(not IS_ROOT, reason="swap files and cgroups need root"), needs_cgroups]


def _mine(pid: int):
    from diag.leftovers import find_leftovers
    return [x for x in find_leftovers() if x.pid == pid]


def test_5_9_a_sigkilled_reproduction_is_found_refused_beside_removed_and_reported_partial(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "repro", "register", "--json", "--out", str(out),
                             "--ignore-leftovers", "--size", "64MiB", "--method", "mlock", "--make-swap", "256MiB",
                             "--swap-dir", str(tmp_path), "--swap-out", "48MiB", "--swap-in-rate", "1MB/s",
                             "--deadline", "120"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        events = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(out.glob("*/events.jsonl"))
            if found and "pin_start" in found[0].read_text():
                events = found[0]
                break
            time.sleep(0.1)
        assert events is not None, proc.stderr.read() if proc.poll() is not None else "the run never reached its pin"
        time.sleep(1.0)  # a few timeline samples of the pin
        child = json.loads(events.read_text().splitlines()[0])["pid"]
        proc.kill()  # SIGKILL: nothing in the parent runs any more
        proc.wait(timeout=10)
        end = time.monotonic() + 15  # the child follows (PR_SET_PDEATHSIG)
        while Path(f"/proc/{child}").exists() and time.monotonic() < end:
            time.sleep(0.05)
        left = _mine(proc.pid)
        kinds = sorted(x.kind for x in left)
        from diag.leftovers import cgroup_mounts
        per_rank = 2 if cgroup_mounts()["version"] == 1 else 1  # v1: memory and blkio; v2: one cgroup
        assert kinds == ["cgroup"] * per_rank + ["swap"], [x.describe() for x in left]
        assert all(not x.alive for x in left)
        assert any(x.detail.get("throttles") for x in left if x.kind == "cgroup")  # the 1 MB/s read throttle

        # 5: the finder lists them with their owner, preflight warns with the exact command ...
        r = hostpin("repro", "cleanup", "--dry-run", "--json")
        assert r.returncode == 0, r.stderr
        rows = [x for x in json.loads(r.stdout)["found"] if x["pid"] == proc.pid]
        assert sorted(x["kind"] for x in rows) == kinds and {x["action"] for x in rows} == {"would remove"}
        assert len(_mine(proc.pid)) == len(kinds)  # --dry-run changed nothing
        r = hostpin("preflight", "--size", "16MiB", "--method", "mlock", "--no-cuda", "--sample", "0", "--json",
                    "--out", str(tmp_path / "pf"))
        check = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "leftovers")
        assert check["status"] == "warn" and "hostpin repro cleanup" in check["remedy"]
        assert f"owner pid {proc.pid} dead" in check["summary"]
        # ... and a new reproduction refuses to start beside them unless told
        r = hostpin("repro", "register", "--size", "16MiB", "--method", "mlock", "--json",
                    "--out", str(tmp_path / "r2"))
        res = json.loads(r.stdout)
        assert r.returncode == 4 and res["outcome"] == "refused" and res["refusal"]["check"] == "leftovers"
        assert "--ignore-leftovers" in res["verdict"] and "hostpin repro cleanup" in res["verdict"]

        # 9: the killed run is partial: bundled with its journal verified, reported with what it has
        run = events.parent
        assert not (run / "manifest.json").exists()
        b = hostpin("bundle", str(run), "-o", str(tmp_path / "killed.tar.gz"), "--json")
        assert b.returncode == 0, b.stderr
        info = json.loads(b.stdout)
        assert info["partial"] and {"timeline.jsonl", "child-0.log"} <= set(info["unrecorded"]), info
        rep = hostpin("report", str(tmp_path / "killed.tar.gz"))
        assert rep.returncode == 0, rep.stderr
        assert rep.stdout.startswith("# hostpin repro register: PARTIAL") and "partial, killed at" in rep.stdout
        assert "## Kernel stack" in rep.stdout
        assert "remove them" not in rep.stdout + b.stdout + b.stderr

        # 5: cleanup removes exactly them, and says so
        r = hostpin("repro", "cleanup", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [x for x in json.loads(r.stdout)["found"] if x["pid"] == proc.pid]
        assert {x["action"] for x in rows} == {"removed"}
        assert _mine(proc.pid) == []
        assert not list(tmp_path.glob("hostpin-swap-*"))
    finally:
        if proc.poll() is None:
            proc.kill()
        from repro.cleanup import remove_leftovers
        remove_leftovers(pids={proc.pid})


def test_17_nothing_left_is_judged_by_the_run_own_resources(tmp_path):
    """Another run's cgroup on the same machine (its owner, this test's process, is alive) does
    not make a clean run look unclean, and cleanup leaves it alone."""
    from diag.leftovers import cgroup_mounts, cgroup_name
    foreign = Path(cgroup_mounts()["memory"]) / cgroup_name(os.getpid(), 9999, 0)
    foreign.mkdir()
    try:
        r = hostpin("repro", "register", "--size", "32MiB", "--method", "mlock", "--no-calibrate", "--json",
                    "--ignore-leftovers", "--out", str(tmp_path / "runs"))
        assert r.returncode == 0, r.stderr
        assert_nothing_left(json.loads(r.stdout)["run_dir"])
        r = hostpin("repro", "cleanup", "--json")
        row = next(x for x in json.loads(r.stdout)["found"] if x["path"] == str(foreign))
        assert row["alive"] and row["action"].startswith("left alone") and foreign.exists()
    finally:
        foreign.rmdir()
