"""Reproductions with real child processes and the real kernel (--method mlock walks the same
fault path as the driver's pin). Swap files and cgroups need root; skipped with the reason
where the machine cannot."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.evidence import load_manifest, verify_manifest
from repro.cgroups import CgroupError, cgroup_layout, leftover_cgroups
from repro.swapfile import PREFIX as SWAP_PREFIX, active_swaps

from conftest import IS_ROOT, REPO, hostpin

needs_root = pytest.mark.skipif(not IS_ROOT, reason="swap files, cgroups and kernel stacks need root")


def _cgroups_usable() -> str | None:
    try:
        layout = cgroup_layout()
    except CgroupError as exc:
        return str(exc)
    if layout["version"] == 1 and not layout["io"]:
        return "no blkio controller"
    return None


needs_cgroups = pytest.mark.skipif(_cgroups_usable() is not None, reason=f"cgroups: {_cgroups_usable()}")


def repro(tmp_path, *args, timeout=180):
    # --ignore-leftovers: on a shared machine another run's leftovers must not make these refuse
    # (test_leftovers.py tests the refusal)
    r = hostpin("repro", "register", "--json", "--out", str(tmp_path / "runs"), "--ignore-leftovers", *args,
                timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def run_owners(run_dir: str | Path) -> set[int]:
    """The pids whose names a run's swap files, cgroups and /dev/shm files carry: the run's own
    (in its manifest) and its children's (in its result)."""
    manifest = load_manifest(run_dir)
    pids = {manifest["pid"]} if manifest.get("pid") else set()
    result = Path(run_dir, "result.json")
    if result.exists():
        pids |= {r["pid"] for r in json.loads(result.read_text()).get("ranks", []) if r.get("pid")}
    return pids


def assert_nothing_left(run_dir: str | Path):
    """Nothing of this run is left: its own swap files, cgroups, throttles and /dev/shm files
    (other runs on this shared machine hold theirs), and its evidence matches its manifest."""
    from diag.leftovers import find_leftovers
    owners = run_owners(run_dir)
    assert owners, f"{run_dir} does not say which process made it"
    mine = [x.describe() for x in find_leftovers() if x.pid in owners]
    assert mine == [], mine
    assert verify_manifest(run_dir) == []


def test_clean_mlock_pin(tmp_path):
    r, res = repro(tmp_path, "--size", "128MiB", "--method", "mlock")
    assert r.returncode == 0, r.stderr
    assert res["outcome"] == "completed"
    assert res["expected_pages"] == 32768 and res["pinned_pages"] >= 0.95 * 32768
    assert res["seconds"] > 0 and res["rate_gib_s"] > 0 and res["clean_rate_gib_s"] > 0
    assert res["ranks"][0]["prefault"]["seconds"] > 0
    assert res["watchdog"]["samples"] >= 2
    run = Path(res["run_dir"])
    events = [json.loads(l)["event"] for l in (run / "timeline.jsonl").parent.joinpath("events.jsonl").read_text().splitlines()]
    assert events[:2] == ["ready", "prefault_start"] and "pin_done" in events and events[-1] == "exit"
    timeline = [json.loads(l) for l in (run / "timeline.jsonl").read_text().splitlines()]
    assert {"t", "vm", "mem", "procs", "progress"} <= set(timeline[-1])
    manifest = load_manifest(run)
    kinds = {e["kind"] for e in manifest["entries"]}
    assert {"timeline", "events", "child-log", "result"} <= kinds
    import stat
    modes = {str(p.relative_to(run)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in run.rglob("*")}
    assert {k: m for k, m in modes.items() if m != ("0o700" if (run / k).is_dir() else "0o600")} == {}
    assert stat.S_IMODE(run.stat().st_mode) == 0o700  # issue 11, case 15: the child's log too
    assert_nothing_left(run)


@pytest.mark.parametrize("case", ["completed", "refused", "unevaluated"])
def test_a_live_run_round_trips_through_the_typed_result(tmp_path, case):
    """What a real run prints and keeps (result.json) is diag.reproresult.ReproRegisterResult's
    schema 2, every field present, and reads back into it unchanged: the ranks as RankResult, the
    cleanup as Undo; report renders it. Also the runs that pin nothing (refused: too big for the
    node; unevaluated: a CUDA method with no driver)."""
    from diag.report import render_report
    from diag.reproresult import RankResult, ReproRegisterResult, Undo
    from diag.results import load_result, result_dict
    from diag.runs import open_run_path
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if case == "unevaluated" and Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    args = {"completed": ["--size", "32MiB", "--method", "mlock", "--ranks", "2", "--no-calibrate"],
            "refused": ["--size", str(total), "--method", "mlock"],
            "unevaluated": ["--size", "32MiB", "--method", "register"]}[case]
    r, res = repro(tmp_path, *args)
    assert res["outcome"] == case and r.returncode == res["exit_code"], r.stderr
    assert res["schema"] == "hostpin.repro-register" and res["schema_version"] == 2 and res["upgraded_from"] is None
    fields = {f.name for f in __import__("dataclasses").fields(ReproRegisterResult)} - {"extra"}
    assert fields <= set(res), fields - set(res)
    typed = load_result(res)
    assert isinstance(typed, ReproRegisterResult) and typed.upgraded_from is None and typed.extra == {}
    assert result_dict(typed) == res
    assert json.loads((Path(res["run_dir"]) / "result.json").read_text()) == res
    if case == "completed":
        assert [rk.rank for rk in typed.ranks] == [0, 1] and all(isinstance(rk, RankResult) for rk in typed.ranks)
        assert all(rk.outcome == "completed" and rk.seconds > 0 and rk.prefault.seconds > 0 for rk in typed.ranks)
        assert typed.cleanup and all(isinstance(u, Undo) and u.ok for u in typed.cleanup)
        assert typed.expected_pages == 2 * (32 << 20) // typed.page_size
    else:
        assert typed.ranks == [] and (typed.refusal if case == "refused" else True)
    run = open_run_path(res["run_dir"])
    try:
        assert f"hostpin repro register: {case.upper()}" in render_report(run, fmt="text")
    finally:
        run.close()


def test_ranks_pin_at_once(tmp_path):
    r, res = repro(tmp_path, "--size", "64MiB", "--method", "mlock", "--ranks", "2")
    assert r.returncode == 0
    assert [x["rank"] for x in res["ranks"]] == [0, 1]
    assert all(x["outcome"] == "completed" for x in res["ranks"])
    assert res["expected_pages"] == 2 * 16384


@needs_root
@needs_cgroups
def test_swap_bound_pin_is_classified_and_predicted(tmp_path):
    """256 MiB region, 192 MiB pushed to swap for real, swap-in throttled to 16 MB/s: ~12 s."""
    r, res = repro(tmp_path, "--size", "256MiB", "--method", "mlock", "--thp", "--make-swap", "1GiB",
                   "--swap-out", "192MiB", "--swap-in-rate", "16MB/s", "--deadline", "120")
    assert r.returncode == 0, r.stderr
    assert res["outcome"] == "slow" and res["bound"] == "swap-in"
    assert res["swapped_out_bytes"][0] >= 150 << 20
    assert 6 < res["seconds"] < 40
    assert 1500 < res["swapin_pages_per_s"] < 8000  # 16 MB/s is ~3,900 pages/s
    assert res["first_bound_at_s"] is not None and res["first_bound_at_s"] <= 5.0
    assert res["eta_error"] is not None and abs(res["eta_error"]) <= 0.25
    assert "was in swap and was read back at" in res["verdict"], res["verdict"]
    assert res["watchdog"]["watchdog_cpu_pct_of_core"] < 5.0
    undone = [step["undo"] for step in res["cleanup"]]
    assert any(u.startswith("swap file") for u in undone) and any(u.startswith("cgroup") for u in undone)
    assert all(step["ok"] for step in res["cleanup"])
    assert_nothing_left(res["run_dir"])


@needs_root
def test_stall_is_detected_and_killed_with_stacks(tmp_path):
    """A child that truly stops: its region's page faults wait on a userfaultfd nobody serves."""
    t0 = time.monotonic()
    r, res = repro(tmp_path, "--size", "64MiB", "--method", "mlock", "--source", "uffd", "--no-prefault",
                   "--no-calibrate", "--stall-after", "2", "--deadline", "60")
    assert r.returncode == 1
    assert res["outcome"] == "stalled" and "no progress for 2.00 s" in res["verdict"]
    assert time.monotonic() - t0 < 30
    stacks = Path(res["run_dir"]) / res["kill"]["stacks"]
    text = stacks.read_text()
    assert "handle_userfault" in text
    assert (Path(res["run_dir"]) / res["kill"]["dmesg"]).exists()
    assert res["ranks"][0]["exit_status"] == -signal.SIGKILL
    assert_nothing_left(res["run_dir"])


@needs_root
def test_deadline_kills(tmp_path):
    r, res = repro(tmp_path, "--size", "64MiB", "--method", "mlock", "--source", "uffd", "--no-prefault",
                   "--no-calibrate", "--stall-after", "600", "--deadline", "3")
    assert r.returncode == 1
    assert res["outcome"] == "killed" and "deadline" in res["verdict"]
    assert res["kill"]["stacks"].endswith("stacks-deadline.txt")


def test_refusal_when_the_node_cannot_take_it(tmp_path):
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    r, res = repro(tmp_path, "--size", str(total), "--method", "mlock")
    assert r.returncode == 4
    assert res["outcome"] == "refused" and "does not fit" in res["verdict"] and "--force" in res["verdict"]
    assert res["refusal"]["evidence"]["mem_available_bytes"] > 0
    assert not (Path(res["run_dir"]) / "child-0.log").exists()  # nothing was started


def test_cuda_method_without_a_gpu_says_so(tmp_path):
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    r, res = repro(tmp_path, "--size", "64MiB", "--method", "register")
    assert r.returncode == 3 and res["outcome"] == "unevaluated" and "no NVIDIA driver" in res["verdict"]


@pytest.mark.parametrize("args, needle", [
    (["--size", "64MiB", "--swap-out", "128MiB", "--method", "mlock"], "larger than --size"),
    (["--size", "64MiB", "--source", "bogus"], "'bogus' is not a source"),
    (["--size", "64MiB", "--swap-in-rate", "fast"], "'fast' is not a rate"),
    (["--size", "1GiB", "--method", "hostalloc", "--swap-out", "1MiB"], "does not apply"),
])
def test_bad_combinations_are_usage_errors(tmp_path, args, needle):
    r, _ = repro(tmp_path, *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_matrix_without_a_gpu(tmp_path):
    r = hostpin("repro", "register", "--matrix", "--size", "32MiB", "--json", "--out", str(tmp_path), "--ignore-leftovers")
    res = json.loads(r.stdout)
    rows = {x["case"]: x for x in res["rows"]}
    assert len(rows) == 9
    for name, row in rows.items():
        if name.startswith("mlock"):
            assert row["outcome"] in ("completed", "slow") and row["seconds"] > 0
        elif not Path("/proc/driver/nvidia/version").exists():
            assert row["outcome"] == "skipped" and "no NVIDIA driver" in row["verdict"]
    assert rows["mlock-thpoff-pfoff"]["bound"] in ("fault-in/zeroing", "cpu", None)
    r2 = hostpin("repro", "register", "--matrix", "--size", "32MiB", "--out", str(tmp_path), "--ignore-leftovers")
    assert "method" in r2.stdout and "GiB/s" in r2.stdout and r2.returncode == 0


@needs_root
@needs_cgroups
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cleanup_after_a_signal(tmp_path, sig):
    """Interrupt a slow swap-bound run in the middle of its pin: everything must be removed."""
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "repro", "register", "--json", "--out", str(out), "--ignore-leftovers",
                             "--size", "128MiB", "--method", "mlock", "--make-swap", "512MiB", "--swap-out", "96MiB",
                             "--swap-in-rate", "2MB/s", "--deadline", "120"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    events = None
    while time.monotonic() < deadline:
        found = list(out.glob("*/events.jsonl"))
        if found and "pin_start" in found[0].read_text():
            events = found[0]
            break
        time.sleep(0.1)
    assert events is not None, "the run never reached its pin"
    time.sleep(0.5)
    assert any(f"{SWAP_PREFIX}{proc.pid}-" in s for s in active_swaps()) and leftover_cgroups(owner=proc.pid)
    child_pid = json.loads(events.read_text().splitlines()[0])["pid"]
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    res = json.loads(stdout)
    assert res["outcome"] == "interrupted" and res["interrupted_by"] == signal.Signals(sig).name
    assert all(step["ok"] for step in res["cleanup"]), res["cleanup"]
    assert not Path(f"/proc/{child_pid}").exists()
    assert_nothing_left(res["run_dir"])


@needs_root
def test_an_unkillable_child_is_reported_and_the_run_still_finishes(tmp_path):
    """A real child that SIGKILL cannot end: frozen in a cgroup v1 freezer, a task stays (in D
    state) until it is thawed. The watchdog must say so with its stack and still finish."""
    freezer = Path("/sys/fs/cgroup/freezer")
    if not (freezer / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 freezer on this machine (v2 freezes killably)")
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "repro", "register", "--json", "--out", str(out), "--ignore-leftovers",
                             "--size", "64MiB", "--method", "mlock", "--source", "uffd", "--no-prefault",
                             "--no-calibrate", "--stall-after", "2", "--deadline", "120"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fz = freezer / f"hostpin-test-{os.getpid()}"
    child_pid = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child_pid is None:
            for events in out.glob("*/events.jsonl"):
                text = events.read_text()
                if "pin_start" in text:
                    child_pid = json.loads(text.splitlines()[0])["pid"]
            time.sleep(0.05)
        assert child_pid, "the run never reached its pin"
        fz.mkdir()
        (fz / "cgroup.procs").write_text(str(child_pid))
        (fz / "freezer.state").write_text("FROZEN")
        stdout, stderr = proc.communicate(timeout=120)
        res = json.loads(stdout)
        assert proc.returncode == 1, stderr
        assert res["outcome"] == "unkillable" and "still alive after SIGKILL" in res["verdict"]
        assert Path(res["run_dir"], res["kill"]["unkillable_stacks"]).exists()
        problems = [p for step in res["cleanup"] for p in step["problems"]]
        assert any("unkillable" in p for p in problems)
        assert Path(f"/proc/{child_pid}").exists()  # it really is still there
    finally:
        if fz.exists():
            (fz / "freezer.state").write_text("THAWED")
            end = time.monotonic() + 10
            while child_pid and Path(f"/proc/{child_pid}/status").exists() and time.monotonic() < end:
                if "Z (zombie)" in Path(f"/proc/{child_pid}/status").read_text():
                    break
                time.sleep(0.05)
            for _ in range(50):
                try:
                    fz.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
