"""Issue 11: evidence that cannot be turned against its user. One test (or a parametrized set)
per numbered case of the issue, each on real runs kept as fixtures or made here by hostpin
itself, changed in the one hostile or damaged way the test names. Cases that kill a real
reproduction (5, 9, 17) need root and cgroups and live in test_leftovers.py."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CI_SNAPSHOT, FIXTURES, REFERENCE, REPO, hostpin

SECRET = "TOPSECRET-7f3a9c"


@dataclass
class Result:
    code: object
    out: str
    err: str


def hp(*args: str, cwd: Path | None = None, env: dict | None = None) -> Result:
    """The real console entry point, in this process (fast); an exception that escapes it is
    recorded as code 'traceback' with its text in err."""
    from repro.cli import main
    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    old_env = dict(os.environ)
    old_umask = os.umask(0o022)
    os.umask(old_umask)
    code: object = 0
    try:
        if cwd:
            os.chdir(cwd)
        os.environ.update(env or {})
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code
    except BaseException:  # noqa: BLE001  what a user would see as a traceback
        code = "traceback"
        err.write("Traceback (in process)\n" + traceback.format_exc())
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        os.umask(old_umask)
    return Result(code, out.getvalue(), err.getvalue())


def one_line_error(r: Result, code: int) -> None:
    assert r.code == code, (r.code, r.err[-3000:])
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hostpin: error:"), r.err
    assert "Traceback" not in r.err


def copy_run(tmp_path: Path, name: str, dest: str | None = None) -> Path:
    target = tmp_path / (dest or Path(name).name)
    shutil.copytree(FIXTURES / name, target)
    return target


def tree_text(path: Path) -> str:
    """Every regular file's bytes under path, as text (for 'the secret is nowhere')."""
    out = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out.append(p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(out)


def bundle_text(path: Path) -> str:
    with tarfile.open(path) as tar:
        return "\n".join(tar.extractfile(m).read().decode("utf-8", "replace") for m in tar if m.isfile()) + \
            "\n".join(tar.getnames())


def secret_file(tmp_path: Path, name: str = "shadow") -> Path:
    p = tmp_path / "outside" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(f"MemTotal: 1 kB\n{SECRET}:$6$hash:19000:0:99999:7:::\n")
    return p


def make_tar(path: Path, members: list[tuple[str, bytes | None]], dirs: tuple[str, ...] = ()) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def entry(path: str, data: bytes, kind: str = "file") -> dict:
    return {"path": path, "kind": kind, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "skipped": False, "source": None, "reason": None, "started": "2026-11-30T12:00:00+00:00"}


# -- 1: report follows links when it writes into a run -----------------------------------------------
@pytest.mark.parametrize("planted", ["report.md", "timeline.png", "manifest.json.tmp", "manifest.jsonl",
                                     "manifest.added.jsonl"])
def test_1_report_never_writes_through_a_planted_link(tmp_path, planted):
    pytest.importorskip("matplotlib")
    run = copy_run(tmp_path, "h200-repro-swap32")
    victim = tmp_path / "outside" / "victim.conf"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    before = victim.stat()
    if (run / planted).exists():
        (run / planted).unlink()
    (run / planted).symlink_to(victim)
    r = hp("report", str(run))
    assert r.code in (0, 3) and "Traceback" not in r.err, r.err
    assert victim.read_text() == "precious\n" and victim.stat().st_mtime_ns == before.st_mtime_ns
    assert (run / planted).is_symlink()  # and the link itself is left as it was found


# -- 2: report discloses files outside the run -----------------------------------------------------
def test_2_a_link_inside_a_run_is_never_read(tmp_path):
    run = copy_run(tmp_path, "ci-preflight")
    secret = secret_file(tmp_path)
    (run / "root/proc/meminfo").unlink()
    (run / "root/proc/meminfo").symlink_to(secret)
    (run / "probes/cuda.json").unlink()
    (run / "probes/cuda.json").symlink_to(secret)
    r = hp("report", str(run), "--format", "text")
    assert r.code == 0, r.err
    assert SECRET not in r.out and SECRET not in r.err
    assert "root/proc/meminfo is a symbolic link" in r.out  # named, not followed
    assert SECRET not in tree_text(run)
    r = hp("preflight", "--root", str(run), "--no-cuda", "--json", "--out", str(tmp_path / "runs"))
    assert SECRET not in r.out and SECRET not in tree_text(tmp_path / "runs")


@pytest.mark.parametrize("walk", ["dotdot", "absolute"])
def test_2_a_crafted_bundle_cannot_point_its_manifest_outside(tmp_path, walk):
    """Every member is a regular file inside one directory (each member check passes), but the
    manifest's paths lead out: through a directory member and '..', or absolute, as stacks."""
    secret = secret_file(tmp_path)
    data = secret.read_bytes()
    path = ("result.jsonX/" + "../" * 16 + str(secret).lstrip("/")) if walk == "dotdot" else str(secret)
    result = {"command": "repro register", "outcome": "stalled", "verdict": "stalled at 3% (bound swap-in)"}
    result_bytes = json.dumps(result).encode()
    manifest = {"tool": "hostpin", "command": "repro-register", "complete": True, "argv": [], "host": "x",
                "entries": [entry(path, data, "stacks"), entry("result.json", result_bytes, "result")]}
    bundle = make_tar(tmp_path / "evil.tar.gz", [("run/manifest.json", json.dumps(manifest).encode()),
                                                 ("run/result.json", result_bytes),
                                                 ("run/result.jsonX/keep", b"")], dirs=("run", "run/result.jsonX"))
    r = hp("report", str(bundle))
    assert SECRET not in r.out and SECRET not in r.err
    one_line_error(r, 3)
    assert "outside" in r.err or "absolute" in r.err


# -- 3: repro register --source file:EXISTING writes into the user's file --------------------------
def test_3_an_existing_file_is_mapped_read_only_and_never_written(tmp_path):
    """The child's own code, in this process: a MAP_SHARED mapping of the user's 8 MiB data file
    asked writable, prefaulted and locked, leaves every byte and the mtime as they were."""
    from repro.region import map_region, mlock_range, munlock_range, prefault
    data = os.urandom(8 << 20)
    table = tmp_path / "table.bin"
    table.write_bytes(data)
    mtime = table.stat().st_mtime_ns
    region = map_region(8 << 20, f"file:{table}", "shared", writable=True)
    try:
        assert region.writable is False
        prefault(region, threads=2)
        mlock_range(region.addr, region.size)
        munlock_range(region.addr, region.size)
    finally:
        region.close()
    assert table.exists() and hashlib.sha256(table.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert table.stat().st_mtime_ns == mtime


def test_3_a_short_existing_file_is_refused_not_grown(tmp_path):
    table = tmp_path / "short.bin"
    table.write_bytes(b"\x01" * (4 << 20))
    r = hp("repro", "register", "--size", "8MiB", "--method", "mlock", "--source", f"file:{table}", "--map", "private",
           "--no-calibrate", "--json", "--out", str(tmp_path / "runs"))
    assert r.code == 2 and "never grown" in r.err, r.err
    assert table.stat().st_size == 4 << 20 and table.read_bytes()[:1] == b"\x01"
    from repro.region import LibcError, map_region
    with pytest.raises(LibcError, match="never grown"):
        map_region(8 << 20, f"file:{table}", "private", writable=True)
    assert table.stat().st_size == 4 << 20


def test_3_the_whole_command_leaves_the_users_file_alone(tmp_path):
    data = os.urandom(8 << 20)
    table = tmp_path / "table.bin"
    table.write_bytes(data)
    r = hostpin("repro", "register", "--size", "8MiB", "--method", "mlock", "--source", f"file:{table}", "--map",
                "shared", "--no-calibrate", "--json", "--out", str(tmp_path / "runs"), *IGNORE_LEFTOVERS())
    assert "Traceback" not in r.stderr
    res = json.loads(r.stdout)
    assert res["outcome"] in ("completed", "slow"), res
    assert table.read_bytes() == data
    # a shared registration of an existing file is read-only; a writable one is refused up front
    r = hostpin("repro", "register", "--size", "8MiB", "--source", f"file:{table}", "--map", "shared",
                "--register-flags", "portable", "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "read-only" in r.stderr and "Traceback" not in r.stderr


def test_3_a_private_writable_mapping_of_the_users_file_never_writes_it(tmp_path):
    """MAP_PRIVATE with PROT_WRITE of a file opened read-only: every write (the prefault's byte
    per page) lands in a private copy. This is what a launcher's private table mapping does, and
    what registers on the H200 with default flags (a read-only registration of a cold private file
    mapping spun there instead: bench/gpu_watch_stuck.py)."""
    from repro.region import map_region, mlock_range, munlock_range, prefault
    data = os.urandom(8 << 20)
    table = tmp_path / "table.bin"
    table.write_bytes(data)
    mtime = table.stat().st_mtime_ns
    region = map_region(8 << 20, f"file:{table}", "private", writable=True)
    try:
        assert region.writable is True
        prefault(region, threads=2)
        mlock_range(region.addr, region.size)
        munlock_range(region.addr, region.size)
    finally:
        region.close()
    assert hashlib.sha256(table.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert table.stat().st_mtime_ns == mtime
    r = hostpin("repro", "register", "--size", "8MiB", "--method", "mlock", "--source", f"file:{table}", "--map",
                "private", "--no-calibrate", "--json", "--out", str(tmp_path / "runs"), *IGNORE_LEFTOVERS())
    assert json.loads(r.stdout)["outcome"] in ("completed", "slow") and table.read_bytes() == data


def IGNORE_LEFTOVERS() -> list[str]:
    """--ignore-leftovers where this hostpin has it: the machine is shared, and another
    engineer's killed run must not make these tests refuse (test_leftovers.py tests the refusal)."""
    if not hasattr(IGNORE_LEFTOVERS, "cached"):
        IGNORE_LEFTOVERS.cached = "--ignore-leftovers" in hostpin("repro", "register", "--help").stdout
    return ["--ignore-leftovers"] if IGNORE_LEFTOVERS.cached else []


# -- 4: snapshot --root and preflight --root follow links in the tree ------------------------------
def _linked_tree(tmp_path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(CI_SNAPSHOT / "root", tree)
    secret = secret_file(tmp_path)
    (tree / "proc/cmdline").unlink()
    (tree / "proc/cmdline").symlink_to(secret)
    thp = tree / "sys/kernel/mm/transparent_hugepage"
    elsewhere = tmp_path / "outside" / "thp"
    shutil.copytree(thp, elsewhere)
    (elsewhere / "enabled").write_text(f"always [madvise] never {SECRET}\n")
    shutil.rmtree(thp)
    thp.symlink_to(elsewhere)
    return tree


def test_4_snapshot_root_records_links_and_never_copies_their_targets(tmp_path):
    tree = _linked_tree(tmp_path)
    r = hp("snapshot", "--root", str(tree), "--no-cuda", "--no-commands", "--json", "--out", str(tmp_path / "runs"))
    assert r.code == 0, r.err
    run = Path(json.loads(r.out)["run_dir"])
    assert SECRET not in tree_text(run)
    entries = {e["path"]: e for e in json.loads((run / "manifest.json").read_text())["entries"]}
    link = entries["root/proc/cmdline"]
    assert link["kind"] == "link" and link["skipped"] and link["target"] == str(tmp_path / "outside" / "shadow")
    assert not (run / "root/proc/cmdline").exists()
    assert not (run / "root/sys/kernel/mm/transparent_hugepage/enabled").exists()
    b = hp("bundle", str(run), "-o", str(tmp_path / "b.tar.gz"))
    assert b.code == 0, b.err
    assert SECRET not in bundle_text(tmp_path / "b.tar.gz")


def test_4_preflight_root_records_links_and_never_copies_their_targets(tmp_path):
    tree = _linked_tree(tmp_path)
    r = hp("preflight", "--root", str(tree), "--no-cuda", "--json", "--out", str(tmp_path / "runs"))
    # a copied tree without its manifest cannot say what was absent, and a refused link is not
    # captured: the gate fails closed (exit 3) and names the link instead of reading past it
    assert r.code == 3, r.err
    result = json.loads(r.out)
    assert any("transparent_hugepage is a symbolic link" in m for m in result["not_captured"])
    assert SECRET not in r.out and SECRET not in tree_text(Path(result["run_dir"]))
    entries = {e["path"]: e for e in json.loads((Path(result["run_dir"]) / "manifest.json").read_text())["entries"]}
    assert entries["root/proc/cmdline"]["kind"] == "link"
    enabled = entries["root/sys/kernel/mm/transparent_hugepage/enabled"]
    assert enabled["skipped"] and "transparent_hugepage is a symbolic link" in enabled["reason"]


# -- 6: corrupt, truncated or mistyped manifest.json / result.json ------------------------------
def _damage(run: Path, how: str) -> None:
    m, r = run / "manifest.json", run / "result.json"
    if how == "manifest cut":
        m.write_bytes(m.read_bytes()[: len(m.read_bytes()) // 2])
    elif how == "manifest a list":
        m.write_text("[1, 2]")
    elif how == "entry size a string":
        doc = json.loads(m.read_text())
        doc["entries"][0]["size"] = "12"
        m.write_text(json.dumps(doc))
    elif how == "entries an object":
        doc = json.loads(m.read_text())
        doc["entries"] = {"a": 1}
        m.write_text(json.dumps(doc))
    elif how == "argv a number":
        doc = json.loads(m.read_text())
        doc["argv"] = 7
        m.write_text(json.dumps(doc))
    elif how == "result cut":
        r.write_bytes(r.read_bytes()[: len(r.read_bytes()) // 2])
    elif how == "result a list":
        r.write_text("[]")


DAMAGES = ["manifest cut", "manifest a list", "entry size a string", "entries an object", "argv a number",
           "result cut", "result a list"]


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("command", ["report", "compare", "bundle", "preflight --root"])
def test_6_a_damaged_manifest_or_result_is_exit_3_in_one_line(tmp_path, how, command):
    run = copy_run(tmp_path, "ci-repro-swap-mlock")
    _damage(run, how)
    args = {"report": ["report", str(run)], "compare": ["compare", str(run), str(FIXTURES / "ci-preflight")],
            "bundle": ["bundle", str(run), "-o", str(tmp_path / "b.tar.gz")],
            "preflight --root": ["preflight", "--root", str(run), "--no-cuda", "--out", str(tmp_path / "runs")]}
    r = hp(*args[command])
    one_line_error(r, 3)
    assert ("manifest" in r.err or "result.json" in r.err), r.err


def test_6_mistyped_result_figures_never_trace_back(tmp_path):
    run = copy_run(tmp_path, "ci-repro-swap-mlock")
    doc = json.loads((run / "result.json").read_text())
    doc.update(rate_gib_s="fast", seconds=[1], ranks="all", options=None, stopped={"reason": 1}, notes=3)
    (run / "result.json").write_text(json.dumps(doc))
    for args in (["report", str(run)], ["compare", str(run), str(FIXTURES / "ci-repro-swap-mlock")]):
        r = hp(*args)
        assert r.code in (0, 3) and "Traceback" not in r.err, r.err
        if r.code == 3:
            one_line_error(r, 3)


# -- 7: bundles have no limits; Ctrl-C and errors leave unpacked bundles in /tmp -------------------
def _zeros_member(path: Path, size: int, name: str = "run/big.bin") -> Path:
    """A tar.gz with one member of `size` zero bytes (written piecewise: cheap)."""
    with gzip.open(path, "wb", compresslevel=1) as gz:
        with tarfile.open(fileobj=gz, mode="w|") as tar:
            info = tarfile.TarInfo(name)
            info.size = size

            class Zeros(io.RawIOBase):
                left = size

                def readable(self):
                    return True

                def readinto(self, b):
                    n = min(len(b), self.left)
                    b[:n] = bytes(n)
                    self.left -= n
                    return n

            tar.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return path


def test_7_a_bundle_over_the_size_limit_is_refused_early(tmp_path):
    bomb = _zeros_member(tmp_path / "bomb.tar.gz", 256 << 20)
    assert bomb.stat().st_size < 2 << 20
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    t0 = time.monotonic()
    r = hp("report", str(bomb), "--max-size", "64MiB", env={"TMPDIR": str(tmp)})
    one_line_error(r, 3)
    assert "--max-size" in r.err and time.monotonic() - t0 < 10
    assert list(tmp.iterdir()) == []


def test_7_a_bundle_with_too_many_members_is_refused(tmp_path):
    bundle = make_tar(tmp_path / "many.tar.gz", [(f"run/f{i}", b"x") for i in range(30)])
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = hp("report", str(bundle), "--max-files", "10", env={"TMPDIR": str(tmp)})
    one_line_error(r, 3)
    assert "--max-files" in r.err and list(tmp.iterdir()) == []


def test_7_error_paths_leave_no_unpacked_bundle(tmp_path):
    run = copy_run(tmp_path, "ci-preflight")
    assert hp("bundle", str(run), "-o", str(tmp_path / "b.tar.gz")).code == 0
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    broken = [(n, b"{" if n.endswith("/manifest.json") else d) for n, d in members]
    make_tar(tmp_path / "broken.tar.gz", broken)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for args in (["report", str(tmp_path / "broken.tar.gz")],
                 ["compare", str(tmp_path / "b.tar.gz"), str(tmp_path / "broken.tar.gz")],
                 ["preflight", "--root", str(tmp_path / "broken.tar.gz"), "--out", str(tmp_path / "runs")]):
        one_line_error(hp(*args, env={"TMPDIR": str(tmp)}), 3)
        assert list(tmp.iterdir()) == []


def test_7_ctrl_c_while_a_bundle_unpacks_leaves_nothing(tmp_path):
    bomb = _zeros_member(tmp_path / "bomb.tar.gz", 480 << 20)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "report", str(bomb), "--max-size", "2GiB"], cwd=REPO,
                            env=dict(os.environ, TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    started = False
    while time.monotonic() < deadline and proc.poll() is None and not started:
        started = any(p.stat().st_size > 0 for p in list(tmp.rglob("big.bin")))
        time.sleep(0.005)
    assert started, "the bundle never started unpacking"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode == 130 and "interrupted" in err, err
    assert list(tmp.iterdir()) == []


# -- 8: damaged bundles are misreported -------------------------------------------------------------
def _good_bundle(tmp_path) -> bytes:
    run = copy_run(tmp_path, "ci-vm-snapshot")
    assert hp("bundle", str(run), "-o", str(tmp_path / "good.tar.gz")).code == 0
    return (tmp_path / "good.tar.gz").read_bytes()


def test_8_a_truncated_bundle_could_not_be_read_exit_3(tmp_path):
    data = _good_bundle(tmp_path)
    for cut in (len(data) // 3, len(data) - 20):
        (tmp_path / "cut.tar.gz").write_bytes(data[:cut])
        r = hp("report", str(tmp_path / "cut.tar.gz"))
        one_line_error(r, 3)
        assert "could not be read" in r.err and ("truncated" in r.err or "corrupt" in r.err)


def test_8_a_corrupt_middle_could_not_be_read_exit_3(tmp_path):
    raw = gzip.decompress(_good_bundle(tmp_path))
    # the tar stream's headers are 512-byte blocks: break one in the middle of the archive
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    mid = offsets[len(offsets) // 2]
    broken = raw[:mid] + b"\xff" * 64 + raw[mid + 64:]
    (tmp_path / "mid.tar.gz").write_bytes(gzip.compress(broken))
    r = hp("report", str(tmp_path / "mid.tar.gz"))
    one_line_error(r, 3)
    assert "corrupt" in r.err


# -- 9: partial runs ---------------------------------------------------------------------------------
def killed_run(tmp_path) -> Path:
    """A run that hostpin itself writes and that is SIGKILLed in the middle of its pin: the real
    journal and streams of a killed `repro register`, with the CI machine's timeline samples."""
    src = FIXTURES / "ci-repro-swap-mlock"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from diag.evidence import RunDir
        run = RunDir({str(tmp_path / 'runs' / '20261130-120000-repro-register-ci')!r}, "repro-register",
                     ["hostpin", "repro", "register", "--size", "256MiB"], durable=True)
        run.add_file("root/proc/meminfo", open({str(src / 'root/proc/meminfo')!r}, "rb").read(), source="/proc/meminfo")
        timeline = run.open_stream("timeline.jsonl")
        for line in open({str(src / 'timeline.jsonl')!r}).read().splitlines()[:12]:
            timeline.write(line + "\\n")
        with open(os.path.join(str(run.path), "child-0.log"), "w") as log:
            log.write("pinning\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -signal.SIGKILL
    return tmp_path / "runs" / "20261130-120000-repro-register-ci"


def test_9_a_killed_run_is_bundled_as_partial_with_its_journal_verified(tmp_path):
    run = killed_run(tmp_path)
    before = {p.name for p in run.iterdir()}
    r = hp("bundle", str(run), "-o", str(tmp_path / "k.tar.gz"), "--json")
    assert r.code == 0, r.err
    info = json.loads(r.out)
    assert info["partial"] is True and info["killed_at"]
    assert set(info["unrecorded"]) == {"timeline.jsonl", "child-0.log"}
    with tarfile.open(tmp_path / "k.tar.gz") as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames()}
        manifest = json.loads(tar.extractfile(next(m for m in tar if m.name.endswith("/manifest.json"))).read())
    assert {"timeline.jsonl", "child-0.log", "manifest.jsonl", "root/proc/meminfo"} <= names
    assert manifest["partial"] is True and manifest["complete"] is False
    rep = hp("report", str(tmp_path / "k.tar.gz"))
    assert rep.code == 0, rep.err
    assert rep.out.startswith("# hostpin repro register: PARTIAL")
    assert "partial, killed at" in rep.out and "## Kernel stack" in rep.out and "do_swap_page" in rep.out
    assert "problem" not in rep.out.lower() and "does not match" not in rep.out
    assert {p.name for p in run.iterdir()} == before  # bundling changed nothing in the run


def test_9_report_of_a_killed_run_neither_seals_it_nor_advises_deleting_evidence(tmp_path):
    run = killed_run(tmp_path)
    r = hp("report", str(run))
    assert r.code == 0, r.err
    assert "partial, killed at" in r.out and "## Kernel stack" in r.out
    assert not (run / "manifest.json").exists()  # never sealed as if it had finished
    b = hp("bundle", str(run), "-o", str(tmp_path / "k.tar.gz"), "--json")
    assert b.code == 0 and json.loads(b.out)["partial"] is True, b.err
    for text in (r.out, r.err, b.out, b.err):
        assert "remove them" not in text and "delete" not in text


# -- 10: redaction misses -------------------------------------------------------------------------
POD = "5f1c7a8e-93b2-4d6e-8a1f-0c2b3d4e5f60"
CONTAINER = "3f4e5d6c7b8a91827364554637281900aabbccddeeff00112233445566778899"
BOOTIF_MAC = "01-0a-1b-2c-3d-4e-5f"
MACHINE_ID = "8f0c2d1e3b4a59687766554433221100"


def test_10_redaction_covers_pod_uids_container_ids_dash_macs_and_machine_ids(tmp_path):
    from diag.evidence import RunDir
    cgroup_v1 = (f"12:memory:/kubepods/burstable/pod{POD}/{CONTAINER}\n"
                 f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
                 f"cri-containerd-{CONTAINER}.scope\n")
    run = RunDir(tmp_path / "run", "snapshot", ["hostpin", "snapshot", "--out", f"/var/run/pod{POD}/hp"])
    run.add_file("root/proc/self/cgroup", cgroup_v1.encode(), source="/proc/self/cgroup")
    run.add_file("root/proc/cmdline", f"BOOT_IMAGE=/vmlinuz BOOTIF={BOOTIF_MAC} quiet\n".encode())
    run.add_file(f"root/sys/fs/cgroup/memory/kubepods/burstable/pod{POD}/{CONTAINER}/memory.limit_in_bytes", b"9\n",
                 source=f"/sys/fs/cgroup/memory/kubepods/burstable/pod{POD}/{CONTAINER}/memory.limit_in_bytes")
    run.add_file("commands/journal.txt", f"systemd[1]: machine-id {MACHINE_ID} set up\n".encode())
    run.add_skip(f"root/sys/fs/cgroup/memory/kubepods/burstable/pod{POD}/memory.max", "absent",
                 source=f"/sys/fs/cgroup/memory/kubepods/burstable/pod{POD}/memory.max")
    run.finish({"command": "snapshot", "status": "captured", "verdict": "ok",
                "facts": {"cgroup": f"/kubepods/burstable/pod{POD}/{CONTAINER}", "boot": BOOTIF_MAC}})
    r = hp("bundle", str(run.path), "--redact", "-o", str(tmp_path / "r.tar.gz"), "--json")
    assert r.code == 0, r.err
    blob = bundle_text(tmp_path / "r.tar.gz")
    for value in (POD, POD.replace("-", "_"), CONTAINER, BOOTIF_MAC, BOOTIF_MAC[3:], MACHINE_ID):
        assert value not in blob, f"{value} survived redaction"
    kinds = {t["kind"] for t in json.loads(r.out)["redactions"]}
    assert {"POD", "CONTAINER", "MAC", "MACHINE-ID"} <= kinds
    # one pod, one token, whichever way it was spelled
    assert len([t for t in json.loads(r.out)["redactions"] if t["kind"] == "POD"]) == 1
    back = hp("report", str(tmp_path / "r.tar.gz"))
    assert back.code == 0 and "does not match" not in back.out, back.out[:2000]


# -- 11: report BUNDLE writes ./timeline.png into the current directory -------------------------
def test_11_a_bundle_report_never_writes_into_the_current_directory(tmp_path):
    pytest.importorskip("matplotlib")
    run = copy_run(tmp_path, "h200-repro-swap32")
    assert hp("bundle", str(run), "-o", str(tmp_path / "b.tar.gz")).code == 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "timeline.png").write_text("mine")
    r = subprocess.run([sys.executable, "-m", "repro.cli", "report", str(tmp_path / "b.tar.gz")], cwd=cwd,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in cwd.iterdir()] == ["timeline.png"] and (cwd / "timeline.png").read_text() == "mine"
    out = tmp_path / "reports" / "node.md"
    out.parent.mkdir()
    assert hp("report", str(tmp_path / "b.tar.gz"), "-o", str(out)).code == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["node.md", "node.timeline.png"]
    assert "![pin timeline](node.timeline.png)" in out.read_text()


# -- 12: exit codes ------------------------------------------------------------------------------
def test_12_exit_codes_follow_one_table(tmp_path):
    missing = str(tmp_path / "nope")
    assert hp("bundle", missing).code == 2 and hp("report", missing).code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    rb, rr = hp("bundle", str(empty), "-o", str(tmp_path / "x.tar.gz")), hp("report", str(empty))
    one_line_error(rb, 3)
    one_line_error(rr, 3)  # report and bundle agree on the same bad input
    one_line_error(hp("preflight", "--root", str(REFERENCE), "--out", "/proc/hostpin-runs"), 3)
    one_line_error(hp("snapshot", "--no-cuda", "--no-commands", "--out", "/proc/hostpin-runs"), 3)
    r = hp("preflight", "--root", str(REFERENCE), "--size", "1GiB", "--prometheus", "/proc/hostpin.prom", "--json",
           "--out", str(tmp_path / "runs"))
    assert r.code == 3 and "cannot write /proc/hostpin.prom" in r.err and "Traceback" not in r.err
    assert json.loads(r.out)["exit_code"] == 3  # --json printed on this exit path too
    r = hp("bundle", missing, "--json")
    assert r.code == 2 and json.loads(r.out)["status"] == "error"


# -- 13: tracebacks ------------------------------------------------------------------------------
HUGE = "9" * 312


@pytest.mark.parametrize("args", [
    ["preflight", "--no-cuda", "--size", HUGE + "GiB"],
    ["preflight", "--no-cuda", "--size", "1GiB", "--reserve", HUGE],
    ["preflight", "--no-cuda", "--size", HUGE + ".5TiB"],
    ["repro", "register", "--size", HUGE + "MiB", "--method", "mlock"],
    ["repro", "register", "--size", "16MiB", "--method", "mlock", "--make-swap", HUGE + "GB"],
    ["repro", "register", "--size", "16MiB", "--method", "mlock", "--swap-in-rate", HUGE + "MB/s"],
    ["repro", "register", "--size", "16MiB", "--method", "mlock", "--swap-in-rate", "9" * 5000 + "pages/s"],
    ["repro", "register", "--size", "16MiB", "--method", "mlock", "--interval", "nan"],
    ["repro", "register", "--size", "16MiB", "--method", "mlock", "--make-swap", "1GiB", "--swap-dir",
     "/nonexistent/swap"],
])
def test_13_no_traceback_for_command_line_values(tmp_path, args):
    r = hp(*args, "--out", str(tmp_path / "runs"))
    one_line_error(r, 2)
    assert len(r.err) < 400  # the value is cut short, not echoed in full


@pytest.mark.parametrize("target", ["missing/dir/report.md", "/sys/hostpin-report.md", "/dev/full"])
def test_13_an_unwritable_output_is_exit_3_in_one_line(tmp_path, target):
    out = str(tmp_path / target) if not target.startswith("/") else target
    run = copy_run(tmp_path, "ci-preflight")
    one_line_error(hp("report", str(run), "-o", out), 3)
    if target != "/dev/full":
        one_line_error(hp("bundle", str(run), "-o", out + ".tar.gz"), 3)
    else:
        r = hp("bundle", str(run), "-o", out)
        one_line_error(r, 3)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # never replaced by a file


def test_13_a_tar_member_named_dot(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    # `tar -C DIR .`: a '.' directory member, then './run/...'
    with tarfile.open(tmp_path / "dot.tar.gz", "w:gz") as tar:
        tar.add(tmp_path, arcname=".", filter=lambda m: m if m.name == "." or m.name.startswith("./run") else None)
    r = hp("report", str(tmp_path / "dot.tar.gz"))
    assert r.code == 0 and r.out.startswith("# hostpin preflight:"), r.err
    make_tar(tmp_path / "dotfile.tar.gz", [(".", b"x")] + [(f"run/{p.relative_to(run)}", p.read_bytes())
                                                           for p in run.rglob("*") if p.is_file()])
    one_line_error(hp("report", str(tmp_path / "dotfile.tar.gz")), 3)


def test_13_ctrl_c_during_start_up_prints_no_traceback(tmp_path):
    """SIGINT at moments spread over hostpin's start-up (its imports), as a user's Ctrl-C lands.
    Before hostpin's first line runs, the interpreter's own start-up (site.py) answers a SIGINT
    with its own fatal error, which no program can catch: the moments are counted from the end
    of that, measured here (the GPU machine's Python 3.12 with many packages needs ~0.1 s)."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.monotonic() - t0
    seen = []
    run = copy_run(tmp_path, "ci-preflight")
    for delay in (interpreter + d for d in (0.03, 0.06, 0.1, 0.15, 0.25, 0.4)):
        proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "report", str(run), "--format", "text"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        seen.append(proc.returncode)
        assert "Traceback" not in err, (delay, err)
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, err)
    assert 130 in seen


# -- 14: --make-swap under 10 pages leaves its file -------------------------------------------------
def test_14_a_tiny_make_swap_leaves_no_file(tmp_path):
    swap_dir = tmp_path / "swapdir"
    swap_dir.mkdir()
    r = hp("repro", "register", "--size", "16MiB", "--method", "mlock", "--make-swap", "16KiB", "--swap-dir",
           str(swap_dir), "--out", str(tmp_path / "runs"))
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert list(swap_dir.iterdir()) == []
    from repro.swapfile import SwapError, SwapFile
    with pytest.raises(SwapError, match="at least 10 pages"):
        SwapFile(swap_dir, 16 << 10).create()
    assert list(swap_dir.iterdir()) == []


# -- 15: evidence is world-readable ----------------------------------------------------------------
def test_15_runs_are_0700_and_their_files_0600(tmp_path):
    r = hp("preflight", "--root", str(REFERENCE), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"))
    run = Path(json.loads(r.out)["run_dir"])
    modes = {p: stat.S_IMODE(p.lstat().st_mode) for p in [run, *run.rglob("*")]}
    assert modes[run] == 0o700
    bad = {str(p): oct(m) for p, m in modes.items() if m != (0o700 if p.is_dir() else 0o600)}
    assert bad == {}
    assert hp("bundle", str(run), "-o", str(tmp_path / "b.tar.gz")).code == 0
    assert stat.S_IMODE((tmp_path / "b.tar.gz").stat().st_mode) == 0o600
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        assert {m.mode for m in tar} == {0o600}


# -- 16: report rewrites the manifest of the run it reads ----------------------------------------
def test_16_report_changes_no_file_of_the_run_it_reads(tmp_path):
    """The fixture in a git checkout of its own: after `report`, git sees nothing modified."""
    repo = tmp_path / "checkout"
    run = copy_run(repo, "ci-repro-swap-mlock")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fixture"]):
        subprocess.run(git + args, check=True, capture_output=True)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    r = hp("report", str(run), "--no-picture")
    assert r.code == 0, r.err
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True).stdout.splitlines()
    assert not [line for line in status if not line.startswith("??")], status
    assert all(p.read_bytes() == data for p, data in before.items())
    added = {p.name for p in run.iterdir()} - {p.name for p in before} - {"root"}
    assert added == {"report.md", "manifest.added.jsonl"}
    again = hp("report", str(run), "--no-picture")
    assert again.code == 0 and {p.name for p in run.iterdir()} - {p.name for p in before} - {"root"} == added


# == the audit of the fixes above: one test per numbered finding =====================================
def _rewrite(run: Path, rel: str, data: bytes) -> None:
    """Change one file of a copied run and its manifest entry, as an attacker who knows the format would."""
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    (run / rel).write_bytes(data)
    m = json.loads((run / "manifest.json").read_text())
    for e in m["entries"]:
        if e["path"] == rel:
            e.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
            break
    else:
        m["entries"].append(entry(rel, data))
    (run / "manifest.json").write_text(json.dumps(m))


CMDLINE_IDS = {"mac": "01-52-54-00-ab-cd-ef", "ip": "10.20.30.40", "mid": "4c4c4544004e3510804bc4c04f4d3332",
               "host": "gpunode17.corp.example.com", "mac2": "52:54:00:12:34:56", "ip6": "fe80::5054:ff:fe12:3456"}


def test_audit_1_a_file_that_is_not_utf8_is_still_redacted(tmp_path):
    run = copy_run(tmp_path, "h200-preflight", "R")
    ids = CMDLINE_IDS
    _rewrite(run, "root/proc/cmdline", b"\xff\xfe" + (
        f"BOOTIF={ids['mac']} ip={ids['ip']} systemd.machine_id={ids['mid']} hostname={ids['host']} "
        f"ifname=eth0:{ids['mac2']} v6={ids['ip6']}\n").encode())
    r = hp("bundle", str(run), "--redact", "-o", str(tmp_path / "x.tar.gz"), "--json")
    assert r.code == 0, r.err
    with tarfile.open(tmp_path / "x.tar.gz") as tar:
        raw = b"".join(tar.extractfile(m).read() for m in tar if m.isfile())
        cmdline = next(tar.extractfile(m).read() for m in tar if m.name.endswith("root/proc/cmdline"))
        manifest = json.loads(next(tar.extractfile(m).read() for m in tar if m.name.endswith("/manifest.json")))
    for value in ids.values():
        assert value.encode() not in raw, f"{value} survived redaction"
    assert cmdline.startswith(b"\xff\xfeBOOTIF=REDACTED-MAC-")  # the other bytes kept as they were
    assert next(e for e in manifest["entries"] if e["path"] == "root/proc/cmdline")["redacted"] is True
    assert hp("report", str(tmp_path / "x.tar.gz")).code == 0


@pytest.mark.parametrize("value", ["4C4C4544004E3510804BC4C04F4D3333",
                                   "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:7d:a2:b6",
                                   "0c42:a103:007d:a2b6", "ip-10-1-2-3.ec2.internal", "alpha"])
def test_audit_2_redaction_gaps(tmp_path, value):
    run = copy_run(tmp_path, "h200-preflight", "R")
    m = json.loads((run / "manifest.json").read_text())
    m["host"] = "alpha"
    (run / "manifest.json").write_text(json.dumps(m))
    _rewrite(run, "root/proc/cmdline", f"root=nfs:alpha:/export id={value} quiet\n".encode())
    r = hp("bundle", str(run), "--redact", "-o", str(tmp_path / "x.tar.gz"))
    assert r.code == 0, r.err
    blob = bundle_text(tmp_path / "x.tar.gz")
    assert value not in blob and value.lower() not in blob
    assert "root=nfs:REDACTED-HOST-1:/export" in blob
    from diag.bundle import Redactor
    red = Redactor(["alpha"])
    assert red.apply("alphabet /alpha/x alpha-2 alpha", "root/proc/cmdline") == "alphabet /alpha/x alpha-2 REDACTED-HOST-1"


def test_audit_2_json_keys_are_redacted_too(tmp_path):
    run = copy_run(tmp_path, "h200-preflight", "R")
    m = json.loads((run / "manifest.json").read_text())
    m["host"] = "gpunode17.corp.example.com"
    m["extra_gpunode17.corp.example.com"] = {"10.20.30.40": "x"}
    (run / "manifest.json").write_text(json.dumps(m))
    r = hp("bundle", str(run), "--redact", "-o", str(tmp_path / "x.tar.gz"))
    assert r.code == 0, r.err
    blob = bundle_text(tmp_path / "x.tar.gz")
    assert "gpunode17" not in blob and "10.20.30.40" not in blob


def _hostpin_with_peak_rss(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """The CLI in a fresh interpreter, and that process's own peak RSS in KiB (os.wait4), not the
    largest of every child this test process ever waited for (RUSAGE_CHILDREN counts earlier tests'
    children: a live test's 800 MiB mlock child failed this check)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen([sys.executable, "-m", "repro.cli", *args], stdout=fo, stderr=fe, text=True, cwd=REPO)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text()), usage.ru_maxrss


@pytest.mark.parametrize("how", ["too-large", "dense"])
def test_audit_3_a_json_bomb_is_refused_before_it_is_parsed(tmp_path, how):
    run = copy_run(tmp_path, "ci-preflight", "run")
    n = (34 << 20) // 3 if how == "too-large" else (8 << 20) // 3  # 34 MiB: over the cap; 8 MiB: under it
    (run / "manifest.json").write_bytes(b'{"entries": [' + b"[]," * n + b"[]]}")
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(run, arcname="run")
    for target in (run, tmp_path / "b.tar.gz"):
        t0 = time.monotonic()
        r, peak_kib = _hostpin_with_peak_rss(tmp_path, "report", str(target), "--format", "text")
        assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
        assert "manifest.json" in r.stderr and ("more than a run ever writes" in r.stderr
                                                or "nested lists" in r.stderr), r.stderr
        assert time.monotonic() - t0 < 20
        assert peak_kib < 400 << 10  # KiB: under 400 MiB


def test_audit_3_a_journal_or_result_over_the_json_cap_is_refused(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    _rewrite(run, "result.json", b'{"a": "' + b"x" * (33 << 20) + b'"}')
    r = hp("report", str(run), "--max-size", "2GiB")
    one_line_error(r, 3)
    assert "result.json" in r.err and "more than a run ever writes" in r.err
    (run / "manifest.json").unlink()
    (run / "manifest.jsonl").write_bytes(b'{"run": {"command": "preflight"}}\n' + b'{"x": 1}\n' * (4 << 20))
    r = hp("report", str(run))
    one_line_error(r, 3)
    assert "manifest.jsonl" in r.err


def _plain_tar(run: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(run, arcname=run.name)
    return buf.getvalue()


def test_audit_4_data_after_the_end_of_the_archive_is_limited(tmp_path):
    run = copy_run(tmp_path, "h200-preflight", "run")
    data = _plain_tar(run)
    ok = tmp_path / "ok.tar.gz"
    ok.write_bytes(gzip.compress(data + b"\0" * 30_000, compresslevel=1))  # a few records of padding: normal
    assert hp("report", str(ok)).code == 0
    bomb = tmp_path / "bomb.tar.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as gz:
        gz.write(data)
        for _ in range(64):
            gz.write(bytes(1 << 20))
    r = hp("report", str(bomb))
    one_line_error(r, 3)
    assert "follow the end of the archive" in r.err


@pytest.mark.parametrize("gz", [False, True])
def test_audit_7_an_archive_cut_at_a_member_boundary_is_truncated(tmp_path, gz):
    run = copy_run(tmp_path, "h200-preflight", "run")
    data = _plain_tar(run)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert len(members) > 20
    cut = data[:members[10].offset]
    target = tmp_path / ("cut.tar.gz" if gz else "cut.tar")
    target.write_bytes(gzip.compress(cut) if gz else cut)
    r = hp("report", str(target))
    one_line_error(r, 3)
    assert "truncated" in r.err and "end-of-archive" in r.err


def test_audit_5_report_o_never_follows_nor_replaces_a_link_and_never_opens_a_pipe(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    victim = secret_file(tmp_path, "victim")
    before = victim.read_bytes()
    link = tmp_path / "out.md"
    link.symlink_to(victim)
    r = hp("report", str(run), "-o", str(link))  # issue 19: the link is not the run's to replace
    one_line_error(r, 3)
    assert victim.read_bytes() == before and link.is_symlink() and "symbolic link" in r.err
    old = tmp_path / "old.md"
    old.write_text("x")
    old.chmod(0o644)
    assert hp("report", str(run), "-o", str(old)).code == 0
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    fifo = tmp_path / "f.md"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "repro.cli", "report", str(run), "-o", str(fifo)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 3 and "named pipe" in proc.stderr, proc.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_audit_6_a_hard_link_in_a_run_is_neither_read_nor_appended_to(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    victim = secret_file(tmp_path, "victim")
    (run / "root/proc/meminfo").unlink()
    os.link(victim, run / "root/proc/meminfo")
    r = hp("report", str(run), "--format", "text")
    assert SECRET not in r.out + r.err
    assert "hard links" in r.out + r.err, (r.code, r.out[-2000:], r.err)
    # writing: the run's added-files journal hard-linked to a victim gets nothing appended
    run2 = copy_run(tmp_path, "ci-preflight", "run2")
    os.link(victim, run2 / "manifest.added.jsonl")
    before = victim.read_bytes()
    r = hp("report", str(run2), "--format", "text")
    assert victim.read_bytes() == before
    one_line_error(r, 3)
    from diag.confined import PathRefused, open_dir
    with open_dir(run2) as d, pytest.raises(PathRefused, match="hard links"):
        d.open_new("manifest.added.jsonl", append=True)
    assert victim.read_bytes() == before


def test_audit_6_a_first_line_that_is_not_json_is_damage_not_a_cut(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    (run / "manifest.added.jsonl").write_text("garbage\n")
    r = hp("report", str(run))
    one_line_error(r, 3)
    assert "manifest.added.jsonl line 1 is damaged" in r.err


def test_audit_11_a_special_file_in_a_tree_is_never_opened(tmp_path):
    """A named pipe stands in for a device node (mknod needs root): opening it for reading would
    release the writer blocked on its other end, as opening a device runs its driver."""
    run = copy_run(tmp_path, "ci-preflight", "R")
    (run / "root/proc/meminfo").unlink()
    os.mkfifo(run / "root/proc/meminfo")
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(run / 'root/proc/meminfo')!r}, 'wb')"])
    try:
        r = hp("preflight", "--no-cuda", "--root", str(run), "--out", str(tmp_path / "runs"), "--json")
        assert r.code in (0, 1, 3) and "Traceback" not in r.err
        r = hp("report", str(run), "--format", "text")
        time.sleep(0.3)
        assert writer.poll() is None, "the named pipe was opened"
        if os.geteuid() == 0:
            dev = tmp_path / "R2"
            shutil.copytree(run, dev, symlinks=True, ignore=shutil.ignore_patterns("meminfo"))
            os.mknod(dev / "root/proc/meminfo", stat.S_IFCHR | 0o600, os.makedev(1, 5))
            from diag.confined import PathRefused, open_dir
            with open_dir(dev) as d, pytest.raises(PathRefused, match="character device"):
                d.open_file("root/proc/meminfo")
    finally:
        writer.kill()
        writer.wait()


def _interrupt_unpacking(tmp_path: Path, bomb: Path, signals: list[tuple[int, float]]) -> tuple[int, str, Path]:
    tmp = tmp_path / f"tmp{len(list(tmp_path.glob('tmp*')))}"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "repro.cli", "report", str(bomb), "--max-size", "2GiB"], cwd=REPO,
                            env=dict(os.environ, TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.stat().st_size > 0 for p in list(tmp.rglob("big.bin"))):
            break
        time.sleep(0.005)
    for sig, pause in signals:
        proc.send_signal(sig)
        time.sleep(pause)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err, tmp


def test_audit_8_sighup_and_a_second_ctrl_c_leave_no_unpacked_bundle(tmp_path):
    bomb = _zeros_member(tmp_path / "bomb.tar.gz", 300 << 20)
    code, err, tmp = _interrupt_unpacking(tmp_path, bomb, [(signal.SIGHUP, 0)])
    assert code == 130 and "Traceback" not in err, err
    assert list(tmp.iterdir()) == []
    for gap in (0.001, 0.003, 0.006, 0.01):
        code, err, tmp = _interrupt_unpacking(tmp_path, bomb, [(signal.SIGINT, gap), (signal.SIGINT, 0)])
        assert code == 130 and "Traceback" not in err, (gap, err)
        assert list(tmp.iterdir()) == [], gap


def test_audit_10_prometheus_never_creates_a_directory(tmp_path):
    missing = tmp_path / "nonexist" / "x.prom"
    r = hp("preflight", "--no-cuda", "--root", str(REFERENCE), "--out", str(tmp_path / "runs"),
           "--prometheus", str(missing))
    one_line_error(r, 3)
    assert "does not exist" in r.err and not missing.parent.exists()
    from diag.prometheus import write_textfile
    with pytest.raises(FileNotFoundError):
        write_textfile({"checks": []}, missing, 0.0)
    assert not missing.parent.exists()
    ok = tmp_path / "x.prom"
    r = hp("preflight", "--no-cuda", "--root", str(REFERENCE), "--out", str(tmp_path / "runs"), "--prometheus", str(ok))
    assert "Traceback" not in r.err and stat.S_IMODE(ok.stat().st_mode) == 0o644


def test_audit_13_an_empty_run_name_is_a_bad_command_line(tmp_path):
    for args in (["report", ""], ["bundle", ""], ["compare", "", ""]):
        one_line_error(hp(*args, cwd=tmp_path), 2)
    r = hp("preflight", "--no-cuda", "--root", str(REFERENCE), "--out", "/dev/null")
    one_line_error(r, 3)
    assert "not a directory" in r.err and "every name is taken" not in r.err


def test_audit_12_a_chain_of_tar_headers_is_damage_not_an_internal_error(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    data = bytearray()
    for _ in range(5000):  # each an extended header for the next one
        data += tarfile.TarInfo._create_pax_generic_header({"comment": "x"}, tarfile.XHDTYPE, "utf-8")
    data += _plain_tar(run)
    target = tmp_path / "pax.tar.gz"
    target.write_bytes(gzip.compress(bytes(data)))
    r = hp("report", str(target))
    one_line_error(r, 3)
    assert "too many extended" in r.err and "internal error" not in r.err


def test_audit_12_a_run_nested_too_deep_is_damage_not_an_internal_error(tmp_path):
    run = copy_run(tmp_path, "ci-preflight", "run")
    fd = os.open(run / "root", os.O_RDONLY)
    try:
        for _ in range(1500):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    try:
        r = hp("bundle", str(run), "-o", str(tmp_path / "b.tar.gz"))
        one_line_error(r, 3)
        assert "nested more than" in r.err and "RecursionError" not in r.err
        from diag.confined import TooLarge, open_dir
        with open_dir(run) as d, pytest.raises(TooLarge, match="nested more than"):
            d.walk()
    finally:  # pytest's own clean-up of old temporary directories recurses: leave nothing this deep
        subprocess.run(["rm", "-rf", str(run / "root" / "d")], check=False)


MISTYPED_RESULTS = {
    "checks a string": {"checks": "pass"}, "checks of numbers": {"checks": [1, 2]},
    "a check without an id": {"checks": [{"status": "pass"}]}, "NaN in a figure": {"need_bytes": float("nan")},
    "unrecorded of numbers": {"unrecorded": [1, 2]}, "command a list": {"command": ["x"]},
    "facts a list": {"facts": [1]}, "exit code a string": {"exit_code": "0"},
}


@pytest.mark.parametrize("case", sorted(MISTYPED_RESULTS))
def test_audit_12_a_mistyped_result_is_refused_alike_by_report_and_compare(tmp_path, case):
    """Audit, issue 11 case 12: report said 3 and compare 0 on the same mistyped result (or the
    reverse), through a catch-all 'TypeError'. Both refuse it now, in one line naming the field."""
    runs = []
    for n in range(2):
        run = tmp_path / f"run{n}"
        shutil.copytree(FIXTURES / "h200-preflight", run)
        runs.append(run)
    result = json.loads((runs[0] / "result.json").read_text())
    result.update(MISTYPED_RESULTS[case])
    data = json.dumps(result).encode()  # json writes NaN as NaN, as a careless writer would
    (runs[0] / "result.json").write_bytes(data)
    manifest = json.loads((runs[0] / "manifest.json").read_text())
    for e in manifest["entries"]:
        if e.get("path") == "result.json":
            e["size"], e["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (runs[0] / "manifest.json").write_text(json.dumps(manifest))
    field = next(iter(MISTYPED_RESULTS[case]))
    for args in (("report", str(runs[0])), ("compare", str(runs[0]), str(runs[1]))):
        r = hostpin(*args)
        assert r.returncode == 3, (args[0], r.stdout[-300:], r.stderr)
        assert "Traceback" not in r.stderr and "TypeError" not in r.stderr and field in r.stderr, (args[0], r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_redacted_bundle_leaves_the_rendered_report_out(tmp_path):
    """A second audit: after `report` added report.md to a run, `bundle --redact` kept its
    "| host | vm |" row (a short host name is replaced only where host names live). The report is a
    view of the run: it is left out, its entry says why, and `report` remakes it from the bundle."""
    run = copy_run(tmp_path, "h200-preflight", "run")
    assert hp("report", str(run)).code == 0
    host = json.loads((run / "manifest.json").read_text())["host"]
    row = re.compile(rf"\|\s*host\s*\|\s*{re.escape(host)}\s*\|")
    assert row.search((run / "report.md").read_text())
    r = hp("bundle", str(run), "--redact", "-o", str(tmp_path / "b.tar.gz"))
    assert r.code == 0, r.err
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        names = tar.getnames()
        assert not any(n.endswith("report.md") for n in names)
        manifest = json.loads(tar.extractfile(next(n for n in names if n.endswith("/manifest.json"))).read())
    entry = next(e for e in manifest["entries"] if e["path"].endswith("report.md"))
    assert entry["skipped"] and "remakes it" in entry["reason"]
    back = hp("report", str(tmp_path / "b.tar.gz"))
    assert back.code == 0 and not row.search(back.out)
