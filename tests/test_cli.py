"""The command line as a user and a launcher meet it: exit codes, one-line errors, --json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.evidence import load_manifest, verify_manifest

from conftest import GPU_SNAPSHOT, REFERENCE


@pytest.mark.parametrize("args, bad", [
    (["--size", "47XB"], "'47XB'"), (["--size", "-5GiB"], "'-5GiB'"), (["--size", "0"], "'0'"),
    (["--ranks", "0"], "'0'"), (["--ranks", "two"], "'two'"), (["--margin", "lots"], "'lots'"),
    (["--skip", "nosuchcheck"], "'nosuchcheck'"), (["--method", "magic"], "'magic'"),
])
def test_bad_input_is_one_line_exit_2(run_cli, args, bad):
    r = run_cli("preflight", "--no-cuda", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert bad in lines[0] and lines[0].startswith("hostpin: error:")
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_size_names_a_good_example(run_cli):
    r = run_cli("preflight", "--size", "lots")
    assert "47GiB" in r.stderr and "512MiB" in r.stderr


def test_root_on_the_reference_tree_json(run_cli):
    """The reference capture lacks the process's cgroup, PSI and the CUDA facts: a gate that fails
    closed says so and exits 3; accepting each gap explicitly evaluates the rest."""
    r = run_cli("preflight", "--root", str(REFERENCE), "--size", "47.2GiB", "--ranks", "2", "--json")
    assert r.returncode == 3, r.stderr
    result = json.loads(r.stdout)
    assert result["status"] == "error" and result["exit_code"] == 3
    assert result["schema"] == "hostpin.preflight" and result["schema_version"] == 2
    assert {e.split(":")[0] for e in result["errors"]} == {"headroom", "psi", "device"}
    assert any("proc/self/cgroup (not captured)" in m for m in result["not_captured"])
    r = run_cli("preflight", "--root", str(REFERENCE), "--size", "47.2GiB", "--ranks", "2", "--json",
                "--cgroup", "none", "--no-cuda", "--skip", "psi")
    assert r.returncode == 0, r.stdout
    result = json.loads(r.stdout)
    assert result["status"] == "pass" and result["binding"] == "MemAvailable"
    ids = {c["id"] for c in result["checks"]}
    assert {"headroom", "swap", "fragmentation", "thp", "zones", "kernel", "driver", "device", "cotenants"} <= ids
    for c in result["checks"]:
        assert {"id", "status", "summary", "remedy", "evidence", "predicted", "missing"} <= set(c)
    run = Path(result["run_dir"])
    manifest = load_manifest(run)
    assert manifest["complete"] and verify_manifest(run) == []
    copied = {e["path"] for e in manifest["entries"] if not e["skipped"]}
    assert "root/proc/meminfo" in copied and "result.json" in copied
    skipped = {e["path"]: e["reason"] for e in manifest["entries"] if e["skipped"]}
    assert skipped["root/proc/zoneinfo"] == "absent"


def test_strict_turns_warnings_into_failure(run_cli):
    args = ("preflight", "--root", str(GPU_SNAPSHOT), "--size", "60GiB", "--ranks", "2")
    assert run_cli(*args).returncode == 0  # headroom: fits, under the margin: a warning
    r = run_cli(*args, "--strict")
    assert r.returncode == 1 and "--strict" in r.stdout


def test_failure_table_shows_failures_first_with_remedy(run_cli):
    r = run_cli("preflight", "--root", str(GPU_SNAPSHOT), "--size", "70GiB", "--ranks", "2")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("hostpin preflight: FAIL: this node cannot pin 2 x 70 GiB")
    table = [l for l in lines if l[:4] in ("FAIL", "WARN", "PASS", "skip")]
    assert table[0].startswith("FAIL  headroom")
    assert any(l.strip().startswith("-> free") for l in lines)
    assert "evidence:" in r.stdout


def test_unreadable_tree_exit_3(run_cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("preflight", "--root", str(empty), "--json")
    assert r.returncode == 3
    result = json.loads(r.stdout)
    assert result["status"] == "error" and "proc/meminfo" in result["verdict"]


def test_missing_root_is_usage_error(run_cli, tmp_path):
    r = run_cli("preflight", "--root", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope" in r.stderr


def test_live_preflight_on_this_machine(run_cli):
    """On the CI machine (no GPU) the register plan fails on the driver, cleanly, with JSON."""
    r = run_cli("preflight", "--size", "1GiB", "--json")
    assert "Traceback" not in r.stderr
    result = json.loads(r.stdout)
    checks = {c["id"]: c for c in result["checks"]}
    if not Path("/proc/driver/nvidia/version").exists():
        assert r.returncode == 1
        assert checks["driver"]["status"] == "fail" and "no NVIDIA driver" in checks["driver"]["summary"]
        assert checks["device"]["status"] == "fail" and "no NVIDIA driver" in checks["device"]["summary"]
        assert result["cuda"]["status"] in ("no_driver", "no_device")
    manifest = load_manifest(result["run_dir"])
    probe = next(e for e in manifest["entries"] if e["path"] == "probes/cuda.json")
    # None: the probe's answer came whole and its child was still exiting (it is reaped apart)
    assert probe["returncode"] in (0, None) and probe["timed_out"] is False


def test_live_mlock_plan_needs_no_gpu(run_cli):
    r = run_cli("preflight", "--size", "256MiB", "--method", "mlock", "--json")
    result = json.loads(r.stdout)
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["headroom"]["status"] == "pass"
    if not Path("/proc/driver/nvidia/version").exists():
        assert checks["driver"]["status"] == "skip" and checks["device"]["status"] == "skip"
    assert r.returncode == (1 if any(c["status"] == "fail" for c in result["checks"]) else 0)


def test_snapshot_then_preflight_root(run_cli, tmp_path):
    r = run_cli("snapshot", "--no-commands", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["files"] > 30
    run = Path(snap["run_dir"])
    assert verify_manifest(run) == []
    r2 = run_cli("preflight", "--root", str(run), "--size", "1GiB", "--method", "mlock", "--json")
    result = json.loads(r2.stdout)
    assert result["live"] is False and result["root"].endswith("/root")
    assert {c["id"] for c in result["checks"] if c["status"] != "skip"} >= {"headroom", "swap", "fragmentation"}


def test_help_and_version(run_cli):
    r = run_cli("preflight", "--help")
    assert r.returncode == 0 and "--size" in r.stdout and "Exit code" in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and "hostpin" in r.stdout


def test_an_interrupt_after_the_gate_line_keeps_its_answer(tmp_path, monkeypatch, capsys):
    """The gate's line is the answer: a Ctrl-C once it is printed does not add "not evaluated:
    interrupted" nor change the exit code. The interrupt is injected (the one fake here) where
    preflight returns, after the line, in the real console entry point run in this process."""
    import os

    import diag.gate
    from repro.cli import main
    real = diag.gate.npd_exit_code
    calls = []

    def npd_exit_code(data):  # the first call gives the answer; the second is the return, after the line
        calls.append(data)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(data)

    monkeypatch.setattr(diag.gate, "npd_exit_code", npd_exit_code)
    monkeypatch.setenv("HOSTPIN_CONFIG", "none")
    umask = os.umask(0o022)
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["preflight", "--root", str(REFERENCE), "--size", "47.2GiB", "--ranks", "2", "--cgroup", "none",
                  "--no-cuda", "--skip", "psi", "--format", "npd", "--out", str(tmp_path)])
    finally:
        os.umask(umask)
    out = capsys.readouterr().out
    assert len(calls) == 2, "the interrupt was not injected after the line"
    assert out.splitlines() == [out.strip()] and out.startswith("hostpin: ") and "interrupted" not in out, out
    assert exit_.value.code == 0  # the pass that was printed, not npd's "unknown" (2)
