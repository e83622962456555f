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

from conftest import CI_SNAPSHOT, GPU_SNAPSHOT, IS_ROOT, REPO, hostpin

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


# -- 5 and 17: foreign text on the terminal, in report.md, in the gate's line ------------------------
EVIL_RELEASE = "6.18\x1b]0;PWNED\x07\x1b[2J\x1b[H\rhostpin preflight: PASS (spoofed)\nFAKE: all verified\u202e\n"
RAW = ("\x1b", "\x07", "\r", "\u202e")


def _no_raw(text: str, where: str) -> None:
    assert not [c for c in RAW if c in text], f"{where}: a raw control character: {text[-600:]!r}"
    assert not [line for line in text.splitlines() if line.lstrip("-| ").startswith("FAKE")], \
        f"{where}: a forged line: {text[-600:]!r}"


def _rehash(run: Path) -> None:
    """Make a run's manifest agree with an edited file (a forged bundle is self-consistent)."""
    import hashlib
    manifest = json.loads((run / "manifest.json").read_text())
    for e in manifest["entries"]:
        p = run / e["path"]
        if p.is_file() and not e.get("skipped"):
            data = p.read_bytes()
            e["size"], e["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_5_a_captured_kernel_release_with_escapes_and_newlines_reaches_no_output_raw(tmp_path, tree):
    t = tree(CI_SNAPSHOT)
    t.write("proc/sys/kernel/osrelease", EVIL_RELEASE)
    args = ("preflight", "--root", str(t.path), "--no-cuda", "--size", "1GiB", "--method", "mlock", "--cgroup", "none",
            "--out", str(tmp_path / "runs"))
    r = hostpin(*args)
    assert r.returncode in (0, 1) and "6.18\\x1b]0;PWNED" in r.stdout, r.stderr
    _no_raw(r.stdout + r.stderr, "preflight text")
    for fmt in ("line", "npd"):
        r = hostpin(*args, "--format", fmt)
        _no_raw(r.stdout, f"--format {fmt}")
        assert len(r.stdout.splitlines()) == 1
    snap = hostpin("snapshot", "--root", str(t.path), "--no-cuda", "--out", str(tmp_path / "snaps"))
    assert snap.returncode == 0, snap.stderr
    run = next((tmp_path / "snaps").iterdir())
    for fmt in ("markdown", "text"):
        out = tmp_path / f"report.{fmt}"
        r = hostpin("report", str(run), "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        _no_raw(out.read_text(), f"report --format {fmt}")


def test_5_a_forged_verdict_and_host_in_a_run_reach_report_and_compare_as_one_line(tmp_path):
    snap = hostpin("snapshot", "--root", str(CI_SNAPSHOT / "root"), "--no-cuda", "--out", str(tmp_path / "snaps"))
    assert snap.returncode == 0, snap.stderr
    run = next((tmp_path / "snaps").iterdir())
    result = json.loads((run / "result.json").read_text())
    result["verdict"] = "captured\nFAKE: all verified\x1b[2J"
    (run / "result.json").write_text(json.dumps(result))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["host"] = "node\rFAKE: all verified"
    (run / "manifest.json").write_text(json.dumps(manifest))
    _rehash(run)
    shutil.copytree(run, tmp_path / "snaps" / (run.name + "-2"))
    bundle = tmp_path / "b.tar.gz"
    assert hostpin("bundle", str(run), "-o", str(bundle)).returncode == 0
    for args in (("report", str(run), "--format", "text"), ("report", str(bundle), "--format", "markdown"),
                 ("compare", str(run), str(tmp_path / "snaps" / (run.name + "-2")), "--format", "text"),
                 ("compare", str(tmp_path / "snaps"), "--format", "markdown")):
        r = hostpin(*args)
        assert r.returncode in (0, 1), (args, r.stderr)
        assert "FAKE: all verified" in r.stdout.replace("\\", ""), args  # shown, as text
        _no_raw(r.stdout + r.stderr, " ".join(args[:1] + args[2:]))


@root_only
@needs_setpriv
def test_5_a_process_that_names_itself_with_escapes_is_watched_without_them(tmp_path):
    name = "\\x1b]0;PWN\\x07\\x1b[2J\\nFAKE"
    target = subprocess.Popen(as_nobody("/usr/bin/python3", "-c",
                                        f"import ctypes,time; ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0); "
                                        "time.sleep(20)"))
    try:
        time.sleep(0.5)
        comm = Path(f"/proc/{target.pid}/comm").read_bytes()
        assert b"\x1b" in comm  # the kernel keeps the name as given
        r = hostpin("watch", "--pid", str(target.pid), "--deadline", "1.5", "--out", str(tmp_path / "runs"))
        assert f"pid {target.pid} (\\x1b]0;PWN" in r.stdout, r.stdout + r.stderr
        _no_raw(r.stdout + r.stderr, "watch --pid")
    finally:
        target.kill()
        target.wait()


def _fence_state(markdown: str) -> list[tuple[str, bool]]:
    """Each line with whether it is inside a fenced code block (CommonMark: a closing fence is a
    line of at least as many backticks as the opening one)."""
    out, opened = [], None
    for line in markdown.splitlines():
        stripped = line.strip()
        ticks = len(stripped) - len(stripped.lstrip("`"))
        if opened is None and ticks >= 3:
            opened = ticks
            out.append((line, True))
        elif opened is not None and ticks >= opened and stripped == "`" * ticks:
            opened = None
            out.append((line, True))
        else:
            out.append((line, opened is not None))
    return out


def test_17_a_fence_in_a_captured_file_stays_inside_the_raw_evidence(tmp_path, tree):
    t = tree(CI_SNAPSHOT)
    t.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz\n```\n# Injected heading\n![b](http://beacon.example/x.png)\n"
                            "`````\n## Another\n")
    snap = hostpin("snapshot", "--root", str(t.path), "--no-cuda", "--out", str(tmp_path / "snaps"))
    assert snap.returncode == 0, snap.stderr
    out = tmp_path / "report.md"
    r = hostpin("report", str(next((tmp_path / "snaps").iterdir())), "-o", str(out))
    assert r.returncode == 0, r.stderr
    lines = _fence_state(out.read_text())
    injected = [(line, inside) for line, inside in lines if "Injected" in line or "beacon" in line
                or line == "## Another"]
    assert injected and all(inside for _, inside in injected), injected


# -- 6: --root TREE reads only inside TREE (and its run), no links, bounded ----------------------------
def test_6_a_bare_tree_is_read_alone_not_through_a_link_beside_it(tmp_path):
    case, elsewhere = tmp_path / "case", tmp_path / "elsewhere"
    shutil.copytree(GPU_SNAPSHOT / "root", case / "tree")
    elsewhere.mkdir()
    (elsewhere / "nvidia-smi-apps.txt").write_text("4242, TOPSECRET-outside-the-tree, 1 MiB\n")
    (elsewhere / "node.json").write_text(json.dumps({"page_size": 65536}))
    (case / "commands").symlink_to(elsewhere)
    (case / "probes").symlink_to(elsewhere)
    r = hostpin("preflight", "--root", str(case / "tree"), "--size", "1GiB", "--no-cuda", "--cgroup", "none",
                "--json", "--out", str(tmp_path / "runs"))
    assert "TOPSECRET" not in r.stdout and json.loads(r.stdout)["page_size_source"] != "probes/node.json"
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and b"TOPSECRET" in p.read_bytes()]


def test_6_a_run_s_commands_file_hard_linked_or_huge_is_not_read_whole(tmp_path, tree):
    import resource
    t = tree(GPU_SNAPSHOT)  # a run's root/ with its manifest beside it: commands/ belongs to the run
    (t.base / "commands").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("4242, TOPSECRET-hard-linked, 1 MiB\n")
    os.link(outside, t.base / "commands" / "nvidia-smi-apps.txt")
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--no-cuda", "--cgroup", "none", "--json",
                "--out", str(tmp_path / "runs"))
    assert "TOPSECRET" not in r.stdout, "a hard link to a file outside the run was read"
    (t.base / "commands" / "nvidia-smi-apps.txt").unlink()
    with open(t.base / "commands" / "nvidia-smi-apps.txt", "wb") as f:
        f.truncate(400 << 20)  # sparse: 400 MiB of zeros that cost no disk
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run([sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], "
                        "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                        sys.executable, "-m", "repro.cli", "preflight", "--root", str(t.path), "--size", "1GiB",
                        "--no-cuda", "--cgroup", "none", "--out", str(tmp_path / "runs")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    peak_kib = int(r.stdout.split()[-1])
    assert before is not None and peak_kib < 200 << 10, f"peak RSS {peak_kib >> 10} MiB reading a 1 MiB-capped file"


# -- 10, 22, 24, 29: option bounds -------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("watch", "--interval", "nan", "--", "true"), ("watch", "--deadline", "nan", "--", "true"),
    ("watch", "--stall-after", "nan", "--", "true"), ("watch", "--heartbeat", "nan", "--", "true"),
    ("watch", "--deadline", "inf", "--", "true"),
    ("repro", "staging", "--settle-max", "nan"),
    ("preflight", "--sample", "1e9"), ("preflight", "--sample", "1e308"), ("preflight", "--cuda-timeout", "3e6"),
    ("snapshot", "--cuda-timeout", "1e7"), ("preflight", "--ranks", "100000"),
    ("repro", "register", "--size", "1TiB", "--method", "mlock", "--ranks", "5000"),  # never allocates: refused
])
def test_10_22_24_29_out_of_range_timing_and_count_options_are_a_bad_command_line(tmp_path, args):
    r = hostpin(*args, "--out", str(tmp_path / "runs"), timeout=30) if args[0] != "watch" else \
        hostpin(*args[:-2], "--out", str(tmp_path / "runs"), *args[-2:], timeout=30)
    assert r.returncode == 2, (r.returncode, r.stdout[-300:], r.stderr[-300:])
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()


def test_24_repro_s_headroom_counts_each_child_s_own_memory():
    """256 children cost 4 GiB beside their regions: a plan whose regions fit with 2 GiB to spare is refused
    (evaluated only: nothing is allocated)."""
    from diag.checks import Context, Plan
    from diag.checks.memory import headroom
    from diag.rootfs import Root
    from repro.children import CHILD_RSS_BYTES
    from repro.register import ReproOptions, safety
    ranks = 256
    ctx = Context(Root("/"), Plan(size_bytes=4096, ranks=1, method="mlock"), sample_s=0)
    spare = headroom(ctx).evidence
    fits = spare["binding_bytes"] - spare["margin_bytes"] - (2 << 30)
    size = max(4096, fits // ranks // 4096 * 4096)
    refusal = safety(ReproOptions(size=size, method="mlock", ranks=ranks))
    assert refusal is not None and refusal["check"] == "headroom", refusal
    assert refusal["evidence"]["reserve_bytes"] == ranks * CHILD_RSS_BYTES


def test_24_a_cuda_child_counts_its_context():
    """A child that creates a CUDA context held 133 MiB beside a 256 MiB region on the H200 (VmHWM,
    bench/gpu_child_rss_and_foreign_text.sh), an mlock child 17 MiB: the reserve follows the method."""
    from repro.children import CHILD_RSS_BYTES, CHILD_RSS_CUDA_BYTES, child_rss_bytes
    assert child_rss_bytes("mlock") == CHILD_RSS_BYTES >= 18 << 20
    assert child_rss_bytes("register") == child_rss_bytes("hostalloc") == CHILD_RSS_CUDA_BYTES >= 134 << 20


# -- 21 and 28: the site file ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [None, "line", "npd"])
def test_21_a_deeply_nested_site_file_is_a_bad_site_file_in_one_line(tmp_path, fmt):
    site = tmp_path / "site.toml"
    site.write_text("a = " + "[" * 5000 + "1" + "]" * 5000 + "\n")
    r = hostpin("preflight", "--config", str(site), "--no-cuda", "--size", "1GiB", "--out", str(tmp_path / "runs"),
                *(("--format", fmt) if fmt else ()))
    assert r.returncode == 2 and "nested too deeply" in r.stderr, r.stderr
    assert "internal error" not in r.stderr + r.stdout and "RecursionError" not in r.stderr
    if fmt:
        assert len(r.stdout.splitlines()) == 1 and r.stdout.startswith("hostpin: not evaluated: ")


@root_only
def test_28_a_device_node_as_the_site_file_is_refused_without_being_opened(tmp_path):
    import ctypes
    import struct
    node = tmp_path / "site.toml"
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))  # a character device (/dev/null's numbers)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    try:
        IN_OPEN = 0x20
        assert libc.inotify_add_watch(fd, str(node).encode(), IN_OPEN) >= 0
        r = hostpin("preflight", "--config", str(node), "--no-cuda", "--size", "1GiB", "--out",
                    str(tmp_path / "runs"))
        assert r.returncode == 2 and "a device, not a file" in r.stderr, r.stderr
        try:
            events = os.read(fd, 4096)
        except BlockingIOError:
            events = b""
        opened = [struct.unpack_from("iIII", events, i)[1] & IN_OPEN for i in range(0, len(events), 16)]
        assert not any(opened), "hostpin opened the device node"
    finally:
        os.close(fd)


# -- 25: host names are redacted whatever their case --------------------------------------------------
def test_25_bundle_redact_replaces_the_host_name_in_every_case(tmp_path, tree):
    t = tree(CI_SNAPSHOT)
    t.write("proc/sys/kernel/hostname", "gpu-node-17\n")
    t.write("proc/cmdline", "root=nfs:10.1.2.3:/export/GPU-NODE-17 ip=10.1.2.17::10.1.2.1:255.255.255.0:"
                            "Gpu-Node-17.cluster.example.com:eth0:off\n")
    assert hostpin("snapshot", "--root", str(t.path), "--no-cuda", "--out", str(tmp_path / "snaps")).returncode == 0
    bundle = tmp_path / "red.tar.gz"
    r = hostpin("bundle", str(next((tmp_path / "snaps").iterdir())), "--redact", "-o", str(bundle))
    assert r.returncode == 0, r.stderr
    import tarfile
    with tarfile.open(bundle) as tar:
        text = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()).decode(errors="replace")
    assert "gpu-node-17" not in text.lower(), [line for line in text.splitlines() if "node-17" in line.lower()][:3]


# -- 27: --source file: a link to nothing ------------------------------------------------------------
def test_27_a_dangling_link_as_the_source_file_is_a_bad_command_line(tmp_path):
    link = tmp_path / "table.bin"
    link.symlink_to(tmp_path / "nowhere" / "table.bin")
    r = hostpin("repro", "register", "--size", "4MiB", "--method", "mlock", "--source", f"file:{link}",
                "--ignore-leftovers", "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "a link to nothing" in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "nowhere").exists()


@root_only
def test_2_a_swap_file_renamed_away_before_swapon_is_never_left_active_or_behind(tmp_path, monkeypatch):
    """The race of the attack, played in-process: just before swapon the file is renamed away and a
    link to someone else's file put in its place (the kernel refuses a rename once it is swap).
    What is activated is the file that was made, the swap is switched off again, the file is
    removed under the name it was moved to, and the other file is untouched."""
    import repro.swapfile as sf
    d = tmp_path / "swapdir"
    d.mkdir(mode=0o700)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"someone else's file")
    moved: list[Path] = []
    real = sf._libc

    class Racing:
        def swapon(self, path, flags):
            name = next(p for p in d.iterdir() if p.name.startswith("hostpin-swap-"))
            moved.append(d / f"stolen-{name.name}")
            os.rename(name, moved[0])
            name.symlink_to(decoy)
            return real.swapon(path, flags)

        def __getattr__(self, attr):
            return getattr(real, attr)

    monkeypatch.setattr(sf, "_libc", Racing())
    try:
        with pytest.raises(sf.SwapError, match="replaced while it was made"):
            sf.SwapFile(d, 1 << 20).create()
        assert moved and str(moved[0]) not in Path("/proc/swaps").read_text(), "root's swap file is still active"
        assert not moved[0].exists(), "root's swap file was left under the name it was moved to"
        assert decoy.read_bytes() == b"someone else's file"
    finally:
        for p in moved:
            _swapoff_quietly(p)


@root_only
def test_2_swapfile_itself_refuses_a_directory_another_user_owns(shared_dir):
    from repro.swapfile import SwapError, SwapFile
    with pytest.raises(SwapError, match=f"belongs to uid {NOBODY}"):
        SwapFile(shared_dir, 1 << 20).create()
    assert list(shared_dir.iterdir()) == []
