"""The second attack (issue 19), its inputs half: a swap directory another user can write to,
leftovers recognised by more than a name, foreign text on the terminal and in report.md, option
bounds, and `--root` confined to its tree. Each case runs the real CLI against the real kernel:
a second user through setpriv (nobody), real swap files and swapon, real signals, a real device
node. Swap files and directories made here have unique names and are removed on every path."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import CI_SNAPSHOT, IS_ROOT, REPO, hostpin

root_only = pytest.mark.skipif(not IS_ROOT, reason="swap files, setpriv and device nodes need root")
NOBODY = 65534
SETPRIV = shutil.which("setpriv")
needs_setpriv = pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is not installed")


def as_nobody(*argv: str) -> list[str]:
    return [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.fixture
def shared_dir():
    """A directory under /var/tmp that nobody owns (mode 0755): a user's own scratch directory,
    given as --swap-dir by a careless admin. Removed with whatever is left in it."""
    d = Path(f"/var/tmp/hostpin-attack2-{uuid.uuid4().hex[:8]}")
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    try:
        yield d
    finally:
        for p in d.iterdir() if d.exists() else []:
            _swapoff_quietly(p)
        shutil.rmtree(d, ignore_errors=True)


def _swapoff_quietly(path: Path) -> None:
    import ctypes
    active = [line.split()[0] for line in Path("/proc/swaps").read_text().splitlines()[1:] if line.split()]
    if str(path) in active:
        ctypes.CDLL(None, use_errno=True).swapoff(str(path).encode())


# -- 2: a --swap-dir another user can write to ----------------------------------------------------
ATTACKER = r"""
import os, sys, time
d = sys.argv[1]
bait = os.path.join(d, "mine")
open(bait, "wb").close()
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if n.startswith("hostpin-swap-") and not os.path.islink(p):
            try:
                os.rename(p, os.path.join(d, "stolen-" + n))
                os.symlink(bait, p)
                print("took", n, flush=True)
                sys.exit(0)
            except OSError as exc:
                print("failed", exc, flush=True)
print("never saw a swap file", flush=True)
"""


@root_only
@needs_setpriv
def test_2_a_swap_dir_another_user_can_write_is_refused_and_root_leaves_nothing_there(tmp_path, shared_dir):
    attacker = subprocess.Popen(as_nobody(sys.executable, "-c", ATTACKER, str(shared_dir), "20"),
                                stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the attacker is polling the directory
        r = hostpin("repro", "register", "--json", "--out", str(tmp_path / "runs"), "--ignore-leftovers",
                    "--method", "mlock", "--size", "16MiB", "--make-swap", "64MiB", "--no-calibrate",
                    "--swap-dir", str(shared_dir), timeout=120)
    finally:
        attacker.kill()
        attacker.wait()
    roots = [p.name for p in shared_dir.iterdir() if p.lstat().st_uid == 0]
    assert roots == [], f"root's files left in a directory nobody controls: {roots}"
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "--swap-dir" in r.stderr and f"belongs to uid {NOBODY}" in r.stderr
    assert "Traceback" not in r.stderr


@root_only
@pytest.mark.parametrize("mode, why", [(0o777, "every user"), (0o775, "its group")])
def test_2_a_root_owned_directory_others_may_write_without_the_sticky_bit_is_refused(tmp_path, mode, why):
    d = Path(f"/var/tmp/hostpin-attack2-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    try:
        os.chmod(d, mode)
        r = hostpin("repro", "register", "--out", str(tmp_path / "runs"), "--ignore-leftovers", "--method", "mlock",
                    "--size", "16MiB", "--make-swap", "64MiB", "--swap-dir", str(d))
        assert r.returncode == 2 and f"writable by {why} without the sticky bit" in r.stderr, r.stderr
        assert list(d.iterdir()) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


@root_only
def test_2_the_swap_activated_is_the_file_made_and_its_name_leads_to_it(tmp_path):
    """swapon is handed the open file (/proc/self/fd/N): /proc/swaps names the file made, and the
    file is gone with its record once it is removed."""
    from diag.leftovers import swap_records
    from repro.swapfile import SwapFile
    swap = SwapFile(tmp_path, 1 << 20, records=str(tmp_path / "records"))
    swap.create()
    try:
        listed = [line.split()[0] for line in Path("/proc/swaps").read_text().splitlines()[1:]]
        assert str(swap.path) in listed
        st, fst = os.stat(swap.path), os.fstat(swap._fd)
        assert (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
        assert list(swap_records(str(tmp_path / "records")).values()) == [str(swap.path)]
    finally:
        assert swap.remove() == []
    assert not swap.path.exists() and swap_records(str(tmp_path / "records")) == {}
    assert str(swap.path) not in Path("/proc/swaps").read_text()


# -- 12: a swap file left by kill -9 in a custom --swap-dir -----------------------------------------
KILLED_BEFORE_SWAPON = r"""
import os, signal, sys
import repro.swapfile as sf
class Libc:  # the real libc, but the process is SIGKILLed at the moment it would call swapon
    def swapon(self, *a):
        os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name):
        return getattr(sf._libc, name)
sf._libc = Libc()
sf.SwapFile(sys.argv[1], 1 << 20).create()
"""


@root_only
def test_12_a_swap_file_killed_in_a_custom_swap_dir_is_found_and_removed(tmp_path):
    d = tmp_path / "swapdir"
    d.mkdir(mode=0o700)
    child = subprocess.run([sys.executable, "-c", KILLED_BEFORE_SWAPON, str(d)], cwd=REPO)
    assert child.returncode == -signal.SIGKILL
    left = [p for p in d.iterdir() if p.name.startswith("hostpin-swap-")]
    assert len(left) == 1
    try:
        r = hostpin("repro", "cleanup", "--dry-run", "--json")
        found = {row["path"]: row for row in json.loads(r.stdout)["found"]}
        assert str(left[0]) in found, f"{left[0]} is not found by `repro cleanup`"
        assert found[str(left[0])]["kind"] == "swap-file" and not found[str(left[0])]["alive"]
        pre = hostpin("preflight", "--no-cuda", "--method", "mlock", "--size", "16MiB", "--json",
                      "--out", str(tmp_path / "runs"))
        check = next(c for c in json.loads(pre.stdout)["checks"] if c["id"] == "leftovers")
        assert check["status"] == "warn" and str(left[0]) in check["summary"]
        r = hostpin("repro", "cleanup", "--json")
        assert not left[0].exists(), r.stdout
        from diag.leftovers import SWAP_RECORDS
        assert not Path(SWAP_RECORDS, left[0].name).exists()
    finally:
        left[0].unlink(missing_ok=True)
        from diag.leftovers import SWAP_RECORDS
        Path(SWAP_RECORDS, left[0].name).unlink(missing_ok=True)


# -- 13: any user's file named like a leftover ----------------------------------------------------
@root_only
@needs_setpriv
def test_13_a_users_file_named_like_a_leftover_is_neither_reported_nor_deleted(tmp_path):
    fake = Path(f"/var/tmp/hostpin-swap-99999999-{uuid.uuid4().hex[:8]}")
    subprocess.run(as_nobody("touch", str(fake)), check=True)
    root_junk = Path(f"/var/tmp/hostpin-swap-99999998-{uuid.uuid4().hex[:8]}")
    root_junk.write_bytes(b"not a swap header, mode 0644")  # root's, but not a file hostpin makes
    try:
        r = hostpin("repro", "cleanup", "--dry-run", "--json")
        paths = {row["path"] for row in json.loads(r.stdout)["found"]}
        assert str(fake) not in paths and str(root_junk) not in paths
        pre = hostpin("preflight", "--no-cuda", "--method", "mlock", "--size", "16MiB", "--json", "--strict",
                      "--out", str(tmp_path / "runs"))
        check = next(c for c in json.loads(pre.stdout)["checks"] if c["id"] == "leftovers")
        assert fake.name not in check["summary"] and fake.name not in json.dumps(check["evidence"])
        hostpin("repro", "cleanup", "--json")
        assert fake.exists() and root_junk.exists(), "root's cleanup deleted a file hostpin did not make"
    finally:
        fake.unlink(missing_ok=True)
        root_junk.unlink(missing_ok=True)


# -- 14: a second signal right after the first ----------------------------------------------------
@root_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_14_a_second_signal_within_a_moment_of_the_first_still_ends_in_130_with_a_result(tmp_path, sig):
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "repro", "register", "--out", str(out),
                             "--ignore-leftovers", "--method", "mlock", "--size", "64MiB", "--make-swap", "128MiB",
                             "--swap-dir", str(tmp_path), "--swap-out", "48MiB", "--swap-in-rate", "2MB/s",
                             "--no-calibrate", "--deadline", "120"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            found = list(out.glob("*/events.jsonl"))
            if found and "pin_start" in found[0].read_text():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(sig)
        time.sleep(0.05)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-800:]
    assert "internal error" not in err
    run = next(out.iterdir())
    result = json.loads((run / "result.json").read_text())
    assert result["outcome"] == "interrupted"
    from diag.leftovers import find_leftovers
    from test_repro import run_owners
    assert [x.describe() for x in find_leftovers() if x.pid in run_owners(run)] == []
