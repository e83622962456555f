"""Issue 19, the outputs half: writing that fails (a full disk, /dev/full, an unwritable runs
directory), output paths (/dev/stdout, `-`, a link, the run being read), and compare's open
runs. One rule is tested throughout: the verdict first; a failed plan exits 1 whatever could be
written; a pass whose evidence or output could not be written exits 3, its verdict still printed;
the launcher form keeps CMD's life and exit code.

Each test uses the real thing its case needs: a small tmpfs filled to ENOSPC (mounted in the
test's own directory and removed), /dev/full, a private mount namespace (unshare -m) with a tmpfs
over /dev, real child processes and signals."""
from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import CI_SNAPSHOT, FIXTURES, IS_ROOT, REPO

needs_root = pytest.mark.skipif(not IS_ROOT, reason="mounts a tmpfs (needs root)")
PY = sys.executable


def cli(*args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout: float = 120,
        cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOSTPIN_CONFIG=os.environ.get("HOSTPIN_CONFIG", "none"))
    env.pop("HOSTPIN_DEBUG", None)
    return subprocess.run([PY, "-m", "repro.cli", *args], stdout=stdout, stderr=stderr, timeout=timeout,
                          cwd=cwd or REPO, env=env, **kw)


def text(b: bytes | None) -> str:
    return (b or b"").decode(errors="replace")


def fill(path: Path) -> None:
    """Fill the file system of path to its last block (tmpfs: inodes too are left few)."""
    fd = os.open(path / f"fill-{uuid.uuid4().hex[:6]}", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * (1 << 20)
        while True:
            os.write(fd, chunk if os.statvfs(path).f_bavail * 4096 > len(chunk) else chunk[:4096])
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a few pages of its own, mounted inside tmp_path; unmounted afterwards."""
    mounts = []

    def make(size: str = "1m", full: bool = True) -> Path:
        where = tmp_path / f"hostpin-enospc-{uuid.uuid4().hex[:8]}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "hostpin-test", str(where)],
                       check=True)
        mounts.append(where)
        if full:
            fill(where)
        return where

    yield make
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def site(tmp_path: Path, size: str) -> Path:
    path = tmp_path / f"plan-{size}.toml"
    path.write_text(f'[plan]\nsize = "{size}"\nmethod = "mlock"\n[preflight]\nno-cuda = true\nsample = 0\n')
    return path


PASS, FAIL = "16MiB", "100TiB"  # a plan this machine holds, and one it never can


def preflight_run(tmp_path: Path, runs: Path) -> Path:
    r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(runs))
    assert r.returncode == 0, text(r.stderr)
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


# -- the rule: verdict first, whatever writing fails (items 4, 8, 20) ---------------------------------------
@needs_root
@pytest.mark.parametrize("plan,code", [(PASS, 3), (FAIL, 1)])
@pytest.mark.parametrize("fmt", ["line", "npd", "table", "json"])
def test_4_8_a_full_runs_dir_and_a_full_stderr_never_change_the_verdict(tmp_path, small_fs, plan, code, fmt):
    """[runs] dir on a full disk, stderr on /dev/full (the gate's log on the same full /var): a plan
    that fails exits 1 (the gate drains), one that passes 3 (not evaluated: the evidence is lost),
    with the verdict printed; npd says problem (1) or unknown (2)."""
    full = small_fs()
    args = ["preflight", "--config", str(site(tmp_path, plan)), "--out", str(full / "runs")]
    args += ["--json"] if fmt == "json" else [] if fmt == "table" else ["--format", fmt]
    with open("/dev/full", "wb") as devfull:
        r = cli(*args, stderr=devfull)
    expect = {3: 2, 1: 1}[code] if fmt == "npd" else code
    assert r.returncode == expect, text(r.stdout)
    out = text(r.stdout)
    if fmt in ("line", "npd"):
        assert out.startswith("hostpin: ") and len(out.splitlines()) == 1
        assert ("ok: can pin" in out) if code == 3 else ("headroom" in out), out
    elif fmt == "json":
        data = json.loads(out)
        assert data["exit_code"] == code and data["status"] == ("pass" if code == 3 else "fail")
        assert any("evidence could not be kept" in e for e in data["errors"]), data["errors"]
    else:
        assert f"exit code {code}" in out
    assert not any((full / "runs").glob("*")) if (full / "runs").exists() else True  # nothing half made (20)


@needs_root
def test_4_8_the_reason_reaches_a_stderr_that_can_be_written(tmp_path, small_fs):
    full = small_fs()
    r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(full / "runs"), "--format", "line")
    assert r.returncode == 3
    assert text(r.stdout).startswith("hostpin: ok: can pin 1 x 16 MiB")
    err = text(r.stderr)
    assert "the evidence could not be kept" in err and "No space left on device" in err
    assert "Traceback" not in err and "internal error" not in err


@needs_root
def test_4_every_exit_path_keeps_its_code_with_stderr_on_dev_full(tmp_path):
    with open("/dev/full", "wb") as devfull:
        assert cli("report", str(tmp_path / "nope"), stderr=devfull).returncode == 2
        assert cli("preflight", "--size", "47XB", stderr=devfull).returncode == 2
        bad = tmp_path / "bad"
        (bad).mkdir()
        (bad / "manifest.json").write_text("{")
        assert cli("report", str(bad), stderr=devfull).returncode == 3
        r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(tmp_path / "runs"),
                "--format", "line", stderr=devfull)
        assert r.returncode == 0 and text(r.stdout).startswith("hostpin: ok")


@needs_root
def test_4_a_result_that_cannot_reach_stdout_is_3_for_a_pass_and_1_for_a_fail(tmp_path):
    with open("/dev/full", "wb") as devfull:
        r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(tmp_path / "r"), stdout=devfull)
        assert r.returncode == 3 and "could not write the output to stdout" in text(r.stderr), text(r.stderr)
        r = cli("preflight", "--config", str(site(tmp_path, FAIL)), "--out", str(tmp_path / "r"), stdout=devfull)
        assert r.returncode == 1, text(r.stderr)
    assert "Traceback" not in text(r.stderr)


@needs_root
def test_8_20_the_disk_filling_during_the_run_is_judged_and_said(tmp_path, small_fs):
    """Room for the run's first files only: the checks still judge, the run stops writing, and it
    reads back as stopped on a full disk (19), not killed; a fail stays 1."""
    fs = small_fs("24k", full=False)
    for plan, code in ((FAIL, 1), (PASS, 3)):
        runs = fs / plan
        r = cli("preflight", "--config", str(site(tmp_path, plan)), "--out", str(runs), "--format", "line")
        assert r.returncode == code, (text(r.stdout), text(r.stderr))
        assert "the evidence could not be kept" in text(r.stderr)
        for run in runs.glob("*"):
            assert (run / "manifest.jsonl").stat().st_size > 0  # never a 0-byte journal (20)


@needs_root
def test_20_a_run_directory_that_cannot_be_started_leaves_nothing(tmp_path, small_fs):
    full = small_fs()
    runs = full / "runs"
    (runs).mkdir()
    fill(full)
    r = cli("snapshot", "--no-cuda", "--no-commands", "--root", str(CI_SNAPSHOT / "root"), "--out", str(runs))
    assert r.returncode == 3 and "No space left" in text(r.stderr)
    assert list(runs.iterdir()) == []  # no empty run with a 0-byte manifest.jsonl
    good = FIXTURES / "ci-preflight"
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for i in range(2):
        shutil.copytree(good, fleet / f"20261201-00000{i}-preflight-n{i}")
    assert cli("compare", str(fleet)).returncode == 0
