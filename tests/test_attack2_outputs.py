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
        cwd: Path | None = None, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, HOSTPIN_CONFIG=os.environ.get("HOSTPIN_CONFIG", "none"))
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


def passed(line: str) -> bool:
    """The gate line of a plan that passed (a warning too: swap in use on this shared machine)."""
    return line.startswith(("hostpin: ok: can pin 1 x 16 MiB", "hostpin: warning: "))


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
        assert passed(out) if code == 3 else out.startswith("hostpin: headroom"), out
    elif fmt == "json":
        data = json.loads(out)
        assert data["exit_code"] == code and data["status"] in (("pass", "warn") if code == 3 else ("fail",))
        assert any("evidence could not be kept" in e for e in data["errors"]), data["errors"]
    else:
        assert f"exit code {code}" in out
    assert not any((full / "runs").glob("*")) if (full / "runs").exists() else True  # nothing half made (20)


@needs_root
def test_4_8_the_reason_reaches_a_stderr_that_can_be_written(tmp_path, small_fs):
    full = small_fs()
    r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(full / "runs"), "--format", "line")
    assert r.returncode == 3
    assert passed(text(r.stdout)), text(r.stdout)
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
        assert r.returncode == 0 and passed(text(r.stdout))


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

@needs_root
def test_20_compare_of_the_parent_after_a_run_could_not_start(tmp_path, small_fs):
    fs = small_fs("2m", full=False)
    runs = fs / "runs"
    runs.mkdir()
    for i in range(2):
        shutil.copytree(FIXTURES / "ci-preflight", runs / f"20261201-00000{i}-preflight-n{i}")
    fill(fs)
    r = cli("repro", "register", "--size", "16MiB", "--method", "mlock", "--out", str(runs))
    assert r.returncode == 3 and "No space left" in text(r.stderr), text(r.stderr)
    assert len(list(runs.iterdir())) == 2
    c = cli("compare", str(runs))
    assert c.returncode == 0, text(c.stderr)


# -- output paths (item 1) ---------------------------------------------------------------------------------
needs_unshare = pytest.mark.skipif(not IS_ROOT or not shutil.which("unshare"), reason="needs root and unshare -m")


def in_private_dev(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run script in a private mount namespace whose /dev is a fresh tmpfs, with /dev/null and
    /dev/stdout as a system has them: the real /dev is never touched."""
    prelude = ("set -e; mount --make-rprivate / ; mount -t tmpfs hostpin-test-dev /dev; "
               "mknod -m 666 /dev/null c 1 3; ln -s /proc/self/fd/1 /dev/stdout; set +e; ")
    return subprocess.run(["unshare", "-m", "sh", "-c", prelude + script], capture_output=True, timeout=120,
                          cwd=tmp_path, env=dict(os.environ, HOSTPIN_CONFIG="none"))


@needs_unshare
@pytest.mark.parametrize("what", ["report", "bundle", "prometheus"])
@pytest.mark.parametrize("target", ["/dev/stdout", "-"])
def test_1_dev_stdout_is_written_through_and_never_replaced(tmp_path, what, target):
    run = preflight_run(tmp_path, tmp_path / "runs")
    out = tmp_path / "out.bin"
    cmd = {"report": f"report {run} -o {target}",
           "bundle": f"bundle {run} -o {target}",
           "prometheus": f"preflight --config {site(tmp_path, PASS)} --out {tmp_path / 'r2'} --prometheus {target}"
           }[what]
    r = in_private_dev(f"PYTHONPATH={REPO} {PY} -m repro.cli {cmd} > {out} 2>{tmp_path / 'err'}; echo rc=$?; "
                       "if [ -L /dev/stdout ]; then echo link=$(readlink /dev/stdout); else echo link=gone; fi; "
                       "ls -a /dev", tmp_path)
    said = text(r.stdout)
    assert "rc=0" in said, (said, text(r.stderr), (tmp_path / "err").read_text())
    assert "link=/proc/self/fd/1" in said  # the system's /dev/stdout is still the link it was
    assert ".stdout." not in said  # no temporary file left in /dev
    data = out.read_bytes()
    if what == "report":
        assert data.startswith(b"# hostpin")
    elif what == "bundle":
        assert b"bundle: " not in data  # the summary went to stderr, not into the archive
        with tarfile.open(fileobj=__import__("io").BytesIO(data), mode="r:gz") as tar:
            assert any(n.endswith("/manifest.json") for n in tar.getnames())
    else:
        assert b"hostpin_preflight_status" in data and data.endswith(b"\n")


@pytest.mark.parametrize("what", ["report", "bundle", "prometheus"])
def test_1_a_link_at_the_output_is_never_followed_nor_replaced(tmp_path, what):
    run = preflight_run(tmp_path, tmp_path / "runs")
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    link = tmp_path / "out.link"
    link.symlink_to(victim)
    args = {"report": ["report", str(run), "-o", str(link)], "bundle": ["bundle", str(run), "-o", str(link)],
            "prometheus": ["preflight", "--config", str(site(tmp_path, PASS)), "--out", str(tmp_path / "r2"),
                           "--prometheus", str(link)]}[what]
    r = cli(*args)
    assert r.returncode == 3, text(r.stderr)
    assert "symbolic link" in text(r.stderr) and "Traceback" not in text(r.stderr)
    assert link.is_symlink() and os.readlink(link) == str(victim) and victim.read_text() == "keep me\n"
    if what == "prometheus":  # a pass whose textfile could not be written: 3, the verdict still printed
        assert "ok" in text(r.stdout).lower() or "exit code 3" in text(r.stdout)


def test_1_a_pipe_with_a_reader_is_written_through(tmp_path):
    run = preflight_run(tmp_path, tmp_path / "runs")
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    time.sleep(0.2)
    r = cli("report", str(run), "-o", str(fifo))
    out, _ = reader.communicate(timeout=30)
    assert r.returncode == 0, text(r.stderr)
    assert out.startswith(b"# hostpin") and stat.S_ISFIFO(fifo.lstat().st_mode)


# -- watch -- CMD: CMD first (items 3, 11) -----------------------------------------------------------------
MLOCK_LOOP = (
    "import ctypes, mmap, sys, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.mlock.argtypes = libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n"
    "open(sys.argv[2] + '.pid', 'w').write(str(__import__('os').getpid()))\n"
    "end = time.time() + float(sys.argv[1]); n = 64 << 20\n"
    "while time.time() < end:\n"
    "    m = mmap.mmap(-1, n); b = ctypes.c_char.from_buffer(m); a = ctypes.addressof(b)\n"
    "    libc.mlock(a, n); libc.munlock(a, n); del b; m.close()\n"
    "open(sys.argv[2], 'w').write('done')\n"
    "sys.exit(5)\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@needs_root
def test_3_a_disk_that_fills_during_watch_never_orphans_cmd(tmp_path, small_fs):
    fs = small_fs("2m", full=False)
    done = tmp_path / "cmd-done"
    proc = subprocess.Popen([PY, "-m", "repro.cli", "watch", "--interval", "0.05", "--out", str(fs / "w"), "--",
                             PY, "-c", MLOCK_LOOP, "4", str(done)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO, env=dict(os.environ, HOSTPIN_CONFIG="none"))
    try:
        time.sleep(1.5)
        fill(fs)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        pidfile = Path(f"{done}.pid")
        if pidfile.exists() and _alive(int(pidfile.read_text())):  # orphaned by the watch: ended here
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert proc.returncode == 5, text(err)  # CMD's own exit code, after CMD ended
    assert done.read_text() == "done"  # CMD lived its whole life
    assert "the evidence could not be kept" in text(err) and "No space left" in text(err), text(err)
    assert "Traceback" not in text(err) and "internal error" not in text(err)


@needs_root
def test_3_a_runs_dir_that_cannot_be_made_still_runs_cmd(tmp_path, small_fs):
    full = small_fs()
    r = cli("watch", "--out", str(full / "w"), "--", "sh", "-c", "exit 7")
    assert r.returncode == 7 and "the evidence could not be kept" in text(r.stderr), text(r.stderr)
    with open("/dev/full", "wb") as devfull:
        r = cli("watch", "--out", str(full / "w"), "--", "sh", "-c", "echo out; exit 0", stderr=devfull)
    assert r.returncode == 0 and text(r.stdout) == "out\n"


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_11_cmd_runs_with_the_callers_umask(tmp_path, mask):
    made = tmp_path / "made"
    r = subprocess.run([PY, "-m", "repro.cli", "watch", "--out", str(tmp_path / "w"), "--", "sh", "-c",
                        f"umask; touch {made}"], capture_output=True, cwd=REPO, timeout=60,
                       env=dict(os.environ, HOSTPIN_CONFIG="none"), preexec_fn=lambda: os.umask(mask))
    assert r.returncode == 0, text(r.stderr)
    assert text(r.stdout).strip() == f"{mask:04o}"
    assert stat.S_IMODE(made.stat().st_mode) == 0o666 & ~mask
    run = next((tmp_path / "w").iterdir())
    assert stat.S_IMODE(run.stat().st_mode) == 0o700  # hostpin's own evidence stays private
    assert stat.S_IMODE((run / "manifest.json").stat().st_mode) == 0o600


# -- report into a run (items 7, 16) -------------------------------------------------------------------------
@needs_root
def test_7_a_full_disk_during_report_never_blocks_a_later_bundle(tmp_path, small_fs):
    """For each amount of room left (none, a page, a few), report adds report.md with its entry
    or not at all; once space is back, report and bundle both work."""
    probe = preflight_run(tmp_path, tmp_path / "probe")
    need = -(-len(cli("report", str(probe)).stdout) // 4096)  # pages report.md takes
    for pages in (0, need - 1, need, need + 1):
        fs = small_fs("2m", full=False)
        run = fs / "r" / probe.name
        shutil.copytree(probe, run)
        (run / "report.md").unlink()
        (run / "manifest.added.jsonl").unlink()
        fill(fs)
        for f in fs.glob("fill-*"):  # leave `pages` pages free
            with open(f, "r+b") as fh:
                fh.truncate(max(0, f.stat().st_size - pages * 4096))
            break
        r = cli("report", str(run))
        assert r.returncode == 0, text(r.stderr)  # the report itself reached stdout
        assert "Traceback" not in text(r.stderr)
        for f in fs.glob("fill-*"):
            f.unlink()
        assert cli("report", str(run)).returncode == 0
        b = cli("bundle", str(run), "-o", str(tmp_path / f"b{pages}.tar.gz"))
        assert b.returncode == 0, (pages, text(b.stderr), sorted(p.name for p in run.iterdir()))


def test_7_a_report_killed_between_its_entry_and_its_file_leaves_a_bundlable_run(tmp_path):
    """What a kill -9 inside `report` leaves, at each point: the announced entry alone, or it and
    a part of report.md. A real SIGKILL is sent to a report stopped (SIGSTOP) after it announced."""
    run = preflight_run(tmp_path, tmp_path / "runs")
    added = run / "manifest.added.jsonl"
    proc = subprocess.Popen([PY, "-c", (
        "import os, signal, sys; from diag import evidence\n"
        "real = evidence.Dir.write_new\n"
        "def stop_then_write(self, rel, data, **kw):\n"
        "    fd = os.open(os.path.join(sys.argv[1], rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
        "    os.write(fd, data[:100]); os.close(fd)\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "evidence.Dir.write_new = stop_then_write\n"
        "evidence.add_after_run(sys.argv[1], 'report.md', b'# hostpin report' * 100, 'report')\n"),
        str(run)], cwd=REPO)
    for _ in range(200):
        if Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "T":
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (run / "report.md").stat().st_size == 100 and '"open": true' in added.read_text()
    b = cli("bundle", str(run), "-o", str(tmp_path / "b.tar.gz"))
    assert b.returncode == 0, text(b.stderr)
    r = cli("report", str(run))
    assert r.returncode == 0 and (run / "report.2.md").exists()
    assert cli("bundle", str(run), "-o", str(tmp_path / "c.tar.gz")).returncode == 0


@pytest.mark.parametrize("name", ["manifest.json", "result.json", "report.md", "root/new.md"])
def test_16_report_o_into_the_run_it_reads_is_refused(tmp_path, name):
    run = preflight_run(tmp_path, tmp_path / "runs")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    via_link = tmp_path / "alias"
    via_link.symlink_to(run)
    for target in (run / name, via_link / name, run / "root" / ".." / name):
        r = cli("report", str(run), "-o", str(target))
        assert r.returncode == 2 and "inside the run" in text(r.stderr), text(r.stderr)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert cli("bundle", str(run), "-o", str(tmp_path / "b.tar.gz")).returncode == 0


# -- small ones (items 18, 23, 26) ----------------------------------------------------------------------------
@pytest.mark.parametrize("mem_kb", [str(10 ** 400), str(2 ** 70)])
def test_18_implausible_readings_still_make_a_textfile(tmp_path, tree, mem_kb):
    t = tree(CI_SNAPSHOT)
    meminfo = (t.path / "proc/meminfo").read_text()
    t.write("proc/meminfo", "\n".join(f"MemTotal:       {mem_kb} kB" if line.startswith("MemTotal:") else
                                      f"MemAvailable:   {mem_kb} kB" if line.startswith("MemAvailable:") else line
                                      for line in meminfo.splitlines()) + "\n")
    prom = tmp_path / "hostpin.prom"
    prom.write_text("old\n")
    r = cli("preflight", "--root", str(t.path), "--no-cuda", "--out", str(tmp_path / "runs"), "--prometheus",
            str(prom), "--cgroup", "none")
    assert "internal error" not in text(r.stderr) and "Traceback" not in text(r.stderr), text(r.stderr)
    assert r.returncode in (0, 1, 3)
    body = prom.read_text()
    assert body != "old\n" and "hostpin_preflight_status" in body
    for line in body.splitlines():
        if not line.startswith("#"):
            value = line.rsplit(" ", 1)[1]
            assert value in ("+Inf", "-Inf", "NaN") or float(value) == float(value), line
            assert len(value) < 40, line  # never a 400-digit number node_exporter cannot parse


def test_26_bundle_counts_each_byte_once_against_its_limit(tmp_path):
    """A run of 40 MiB bundles under --max-size 64MiB (it was counted as 80 MiB and refused);
    one of 80 MiB is still refused."""
    for mib, ok in ((40, True), (80, False)):
        run = preflight_run(tmp_path, tmp_path / f"runs{mib}")
        from diag.evidence import add_after_run
        add_after_run(run, "big.bin", os.urandom(1 << 20) * mib, "file")
        r = cli("bundle", str(run), "-o", str(tmp_path / f"b{mib}.tar.gz"), "--max-size", "64MiB")
        assert (r.returncode == 0) is ok, text(r.stderr)
        if not ok:
            assert r.returncode == 3 and "limit" in text(r.stderr)


GATE = REPO / "deploy" / "slurm" / "hostpin-gate"


def _gate(tmp_path: Path, plan: str, state: Path) -> subprocess.CompletedProcess:
    shim = tmp_path / "hostpin"
    shim.write_text(f"#!/bin/sh\nexec {PY} -m repro.cli \"$@\"\n")
    shim.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOSTPIN": str(shim), "HOSTPIN_CONFIG": str(site(tmp_path, plan)),
           "HOSTPIN_STATE_DIR": str(state), "SCONTROL": "/bin/true", "SINFO": "/bin/true",
           "SLURMD_NODENAME": "n1", "PYTHONPATH": str(REPO)}
    return subprocess.run([str(GATE), "prolog"], env=env, capture_output=True, text=True, timeout=120)


def test_23_the_gates_first_run_says_nothing(tmp_path):
    r = _gate(tmp_path, PASS, tmp_path / "fresh-state")
    assert r.returncode == 0 and r.stderr == "", r.stderr


@needs_root
@pytest.mark.parametrize("plan,code", [(PASS, 0), (FAIL, 1)])
def test_4_8_the_gate_on_a_full_var_drains_only_a_failing_node(tmp_path, small_fs, plan, code):
    """The state directory (its runs and its stderr log) on a full disk: a failing plan drains the
    node (1), a passing one starts the job (0, logged as not judged: its evidence is lost)."""
    state = small_fs("1m", full=False)
    assert _gate(tmp_path, PASS, state).returncode == 0  # a log and a run exist already
    fill(state)
    r = _gate(tmp_path, plan, state)
    assert r.returncode == code, r.stderr
    if code == 1:
        assert "drained: hostpin: headroom" in r.stderr
    else:
        assert "could not judge this node (exit 3): hostpin: " in r.stderr and "not evaluated" not in r.stderr


# -- how a partial run ended (item 19) -------------------------------------------------------------------
@needs_root
def test_19_a_run_stopped_by_a_full_disk_reads_as_stopped_not_killed(tmp_path, small_fs):
    fs = small_fs("24k", full=False)
    r = cli("preflight", "--config", str(site(tmp_path, PASS)), "--out", str(fs / "r"))
    assert r.returncode == 3
    (run,) = list((fs / "r").iterdir())
    journal = (run / "manifest.jsonl").read_text()
    assert '"stopped"' in journal, journal[-500:]
    rep = cli("report", str(run))
    assert rep.returncode == 0, text(rep.stderr)
    head = text(rep.stdout)[:3000]
    assert "stopped at" in head and "No space left on device" in head and "killed" not in head, head


def test_19_a_run_still_running_reads_as_running_then_killed(tmp_path):
    pidfile = tmp_path / "cmd.pid"
    proc = subprocess.Popen([PY, "-m", "repro.cli", "watch", "--out", str(tmp_path / "w"), "--", "sh", "-c",
                             f"echo $$ > {pidfile}; exec sleep 30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                            env=dict(os.environ, HOSTPIN_CONFIG="none"))
    try:
        for _ in range(200):
            runs = list((tmp_path / "w").glob("*/manifest.jsonl")) if (tmp_path / "w").exists() else []
            if runs:
                break
            time.sleep(0.05)
        run = runs[0].parent
        rep = cli("report", str(run))
        assert rep.returncode == 0, text(rep.stderr)
        assert f"still running (pid {proc.pid}" in text(rep.stdout) and "killed" not in text(rep.stdout)[:2000]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        rep = cli("report", str(run))
        assert "partial, killed at" in text(rep.stdout) and "still running" not in text(rep.stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pidfile.exists() and _alive(int(pidfile.read_text())):  # CMD, left behind by the killed watch
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


# -- compare at scale (items 9, 15) ---------------------------------------------------------------------------
def _fleet(tmp_path: Path, n: int) -> Path:
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for i in range(n):
        shutil.copytree(FIXTURES / "ci-preflight", fleet / f"20261201-{i:06d}-preflight-n{i}")
    return fleet


def _limit_fds(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_15_compare_past_ulimit_n_reads_every_run(tmp_path):
    fleet = _fleet(tmp_path, 80)
    r = cli("compare", str(fleet), "--json", preexec_fn=_limit_fds(48))
    assert r.returncode == 0, text(r.stderr)[-2000:]
    data = json.loads(r.stdout)
    assert data["runs"] == 80 and data["unreadable"] == 0, (data["runs"], data["unreadable"])


def test_15_running_out_of_descriptors_is_exit_3_never_a_dropped_run(tmp_path):
    fleet = _fleet(tmp_path, 12)
    r = cli("compare", str(fleet), preexec_fn=_limit_fds(12))
    assert r.returncode == 3 or (r.returncode == 0 and "could not be read" not in text(r.stdout)), \
        (r.returncode, text(r.stdout)[:800], text(r.stderr)[-800:])
    assert "Traceback" not in text(r.stderr)


def _big_bundles(tmp_path: Path, n: int, mib: int, sizes: tuple = ()) -> list[str]:
    out = []
    from diag.evidence import add_after_run
    for i in range(n):
        mib = sizes[i] if sizes else mib
        run = tmp_path / "runs" / f"20261201-{i:06d}-preflight-n{i}"
        shutil.copytree(FIXTURES / "ci-preflight", run)
        add_after_run(run, "big.bin", os.urandom(mib << 20), "file")  # random: it does not compress
        b = tmp_path / f"n{i}.tar.gz"
        assert cli("bundle", str(run), "-o", str(b)).returncode == 0
        out.append(str(b))
    return out


@needs_root
def test_9_compare_unpacks_one_bundle_at_a_time(tmp_path, small_fs):
    bundles = _big_bundles(tmp_path, 8, 2)
    tmp = small_fs("6m", full=False)  # room for two unpacked bundles, not for eight
    env = dict(os.environ, TMPDIR=str(tmp))
    r = cli("compare", *bundles, "--json", env=env)
    assert r.returncode == 0, text(r.stderr)[-1500:]
    data = json.loads(r.stdout)
    assert data["mode"] == "fleet" and data["runs"] == 8 and data["unreadable"] == 0
    assert list(tmp.iterdir()) == []  # nothing left unpacked


@needs_root
def test_9_no_room_to_unpack_is_exit_3_never_a_dropped_run(tmp_path, small_fs):
    """Six bundles that fit TMPDIR one at a time and one that does not: hostpin's own lack of room
    stops the summary (3); it never passes for a damaged run left out of an exit-0 summary."""
    bundles = _big_bundles(tmp_path, 7, 0, sizes=(0, 0, 0, 3, 0, 0, 0))
    tmp = small_fs("2m", full=False)
    r = cli("compare", *bundles, env=dict(os.environ, TMPDIR=str(tmp)))
    assert r.returncode == 3 and "No space left" in text(r.stderr), (r.returncode, text(r.stderr)[-800:])
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("target,code", [("/dev/null", 0), ("/dev/full", 3), ("/dev/zero", 3)])
def test_1_a_link_to_a_device_is_written_through_only_for_null_and_terminals(tmp_path, target, code):
    run = preflight_run(tmp_path, tmp_path / "runs")
    link = tmp_path / "out.md"
    link.symlink_to(target)
    r = cli("report", str(run), "-o", str(link))
    assert r.returncode == code, text(r.stderr)
    assert link.is_symlink() and os.readlink(link) == target and stat.S_ISCHR(os.stat(target).st_mode)
    if code:
        assert "leads to a character device" in text(r.stderr) and "Traceback" not in text(r.stderr)


def test_4_closed_stdout_and_stderr_keep_the_exit_code_and_write_nothing_astray(tmp_path):
    """Started with `>&- 2>&-`: the next file opened would take descriptor 1 and get stdout's bytes;
    hostpin puts /dev/null there. A failed plan stays 1; a bundle meant for stdout is exit 3."""
    close = lambda: (os.close(1), os.close(2))  # noqa: E731
    r = subprocess.run([PY, "-m", "repro.cli", "preflight", "--config", str(site(tmp_path, FAIL)), "--out",
                        str(tmp_path / "runs")], cwd=tmp_path, preexec_fn=close, timeout=120,
                       env=dict(os.environ, HOSTPIN_CONFIG="none", PYTHONPATH=str(REPO)))
    assert r.returncode == 1
    (run,) = list((tmp_path / "runs").iterdir())
    assert json.loads((run / "result.json").read_text())["status"] == "fail"  # no stdout bytes in its files
    r = subprocess.run([PY, "-m", "repro.cli", "bundle", str(run), "-o", "-"], cwd=tmp_path, preexec_fn=close,
                       timeout=120, env=dict(os.environ, HOSTPIN_CONFIG="none", PYTHONPATH=str(REPO)))
    assert r.returncode == 3
    assert not (tmp_path / "-").exists()
