"""The third attack (issue 19's fresh attack on the merged main), as a hostile user and a hostile
input: another user's named pipe at --json-file, the job's PYTORCH_CUDA_ALLOC_CONF and a torch
version in the preflight verdict, --alloc-conf sizes PyTorch refuses, a --python that prints without
end or lies, and captured trees with numbers and NUMA files no kernel writes. Each case runs the
real CLI (or the real check) against real files, the real kernel, a second user through setpriv
(nobody) and real child processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import CI_SNAPSHOT, IS_ROOT, REPO, hostpin

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
PYTHON3 = shutil.which("python3", path="/usr/bin:/bin")
needs_nobody = pytest.mark.skipif(not IS_ROOT or SETPRIV is None or PYTHON3 is None,
                                  reason="a second user needs root, setpriv (util-linux) and /usr/bin/python3")
CI_CGROUP = "sys/fs/cgroup/memory/process_api/18795cad93a3ce3c9c140697a9dffbb6"


def as_nobody(*argv: str) -> list[str]:
    return [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def checks_of(r: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(r.stdout)["checks"]}


# -- another user's named pipe at an output path ------------------------------------------------------------
@pytest.fixture
def sticky_dir():
    """A world-writable sticky directory like /tmp (under /tmp, so nobody can reach it)."""
    d = Path(f"/tmp/hostpin-attack3-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


READER = ("import fcntl, os, sys, time\n"
          "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)\n"
          "fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ: one page, so any document fills it\n"
          "print('ready', flush=True)\n"
          "time.sleep(120)\n")


@needs_nobody
def test_another_users_fifo_at_json_file_is_refused_not_written_forever(tmp_path, sticky_dir):
    """nobody plants a FIFO at the name root gives --json-file in /tmp, opens it for reading and
    never reads: the write blocked preflight forever (a prolog that never ends). Refused, exit 2."""
    fifo = sticky_dir / "hostpin.json"
    subprocess.run(as_nobody("mkfifo", str(fifo)), check=True)
    reader = subprocess.Popen(as_nobody(PYTHON3, "-c", READER, str(fifo)), stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        try:
            r = hostpin("preflight", "--no-cuda", "--json-file", str(fifo), "--out", str(tmp_path / "runs"),
                        timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("preflight --json-file on another user's FIFO hung (the reader never reads)")
        assert time.monotonic() - t0 < 30
        assert r.returncode == 2, r.stderr
        assert "uid 65534" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        reader.kill()
        reader.wait()


def test_own_fifo_at_json_file_is_still_written_through(tmp_path):
    """The rule keeps the launcher's own pipe: a FIFO of this user that a reader drains gets the document."""
    fifo = tmp_path / "doc.fifo"
    os.mkfifo(fifo)
    drain = ("import json, os, sys\n"
             "fd = os.open(sys.argv[1], os.O_RDWR)  # a write end of its own: hostpin's check opens and closes\n"
             "buf = b''\n"
             "while True:\n"
             "    buf += os.read(fd, 65536)\n"
             "    try:\n"
             "        print('doc', 'checks' in json.loads(buf)); break\n"
             "    except ValueError:\n"
             "        pass\n")
    reader = subprocess.Popen([sys.executable, "-c", drain, str(fifo)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    r = hostpin("preflight", "--no-cuda", "--json-file", str(fifo), "--out", str(tmp_path / "runs"), timeout=60)
    out, _ = reader.communicate(timeout=30)
    assert r.returncode in (0, 1, 3), r.stderr
    assert out.strip() == "doc True", out


def test_json_file_fifo_read_by_cat_gets_the_document(tmp_path):
    """`mkfifo F; cat F & hostpin preflight --json-file F`: the option's check opened and closed the
    FIFO, which ended cat (EOF) before anything was written; the document was lost ("nobody reads")."""
    fifo = tmp_path / "doc.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        time.sleep(0.3)
        r = hostpin("preflight", "--no-cuda", "--json-file", str(fifo), "--out", str(tmp_path / "runs"), timeout=60)
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
    assert "cannot write" not in r.stderr, r.stderr
    assert "checks" in json.loads(out)


def test_json_file_of_a_long_legal_name_is_written(tmp_path):
    """A file name of 250 bytes is legal, but its temporary name ('.NAME.XXXXXXXX.tmp') was past
    NAME_MAX: 'cannot write ...: File name too long' after every run, the document never kept."""
    f = tmp_path / ("j" * 250)
    r = hostpin("preflight", "--no-cuda", "--json-file", str(f), "--out", str(tmp_path / "runs"), timeout=60)
    assert "cannot write" not in r.stderr, r.stderr[:300]
    assert "checks" in json.loads(f.read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- foreign text in the preflight verdict ----------------------------------------------------------------
def test_alloc_conf_and_torch_version_cannot_forge_a_line(tmp_path):
    """The job's PYTORCH_CUDA_ALLOC_CONF (a prolog runs with it) and --torch-version were echoed in the
    verdict with their LF: 'FAKE: PASS' stood on a line of its own in the prolog's log."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True\nFAKE:PASS")
    r = hostpin("preflight", "--no-cuda", "--size", "1GiB", "--allocator", "torch", "--torch-version",
                "2.11.0\nFORGED: all verified", "--out", str(tmp_path / "runs"), env=env, timeout=60)
    assert r.returncode in (0, 1, 3), r.stderr
    lines = r.stdout.splitlines()
    assert not [line for line in lines if line.startswith(("FAKE", "FORGED"))], r.stdout[:2000]
    assert "FAKE:PASS" in r.stdout and "FORGED: all verified" in r.stdout  # still said, as one line


# -- --alloc-conf sizes PyTorch refuses -------------------------------------------------------------------
@pytest.mark.parametrize("value", ["\u0661\u0662",            # Arabic-Indic 12: str.isdigit(), not stoul's
                                   "9" * 53,                  # past a size_t of bytes
                                   "9" * 5000])               # past Python's own int() limit
def test_alloc_conf_sizes_pytorch_refuses_are_a_bad_command_line(tmp_path, value):
    r = hostpin("preflight", "--no-cuda", "--size", "1GiB", "--allocator", "torch", "--torch-version", "2.11.0",
                "--alloc-conf", f"pinned_reserve_segment_size_mb:{value}", "--out", str(tmp_path / "runs"),
                timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout[:500], r.stderr[:500])
    assert "pinned_reserve_segment_size_mb" in r.stderr and "set_int_max_str_digits" not in r.stderr
    assert len(r.stderr) < 600, r.stderr[:700]


# -- a --python that prints without end, or lies -----------------------------------------------------------
def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def test_python_that_prints_without_end_costs_no_memory(tmp_path):
    """check_torch kept all of --python's output in memory: 150 MB printed made hostpin's RSS ~450 MB."""
    bomb = _script(tmp_path, "python", "head -c 150000000 /dev/zero | tr '\\0' x\necho\necho 2.11.0\n")
    probe = ("import resource, repro.register as r\n"
             "try:\n    print('version', r.check_torch(%r))\n"
             "except r.ReproError as e:\n    print('refused', e)\n"
             "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n" % str(bomb))
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    rss = int(p.stdout.split("maxrss_kb")[1])
    # the old code kept it all: ~450 MB; once (in the full suite) this process peaked at 148 MB anyway
    assert rss < 300_000, p.stdout[-300:]
    assert p.stdout.startswith(("version", "refused"))


def test_python_whose_version_is_no_version_is_refused(tmp_path):
    liar = _script(tmp_path, "python", "printf '2.11.0\\nFAKE: ok\\n'\n")
    probe = ("import repro.register as r\n"
             "try:\n    print('version', r.check_torch(%r))\n"
             "except r.ReproError as e:\n    print('refused', e)\n" % str(liar))
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.stdout.startswith("refused") and "not a version" in p.stdout, p.stdout


# -- captured trees with numbers and NUMA files no kernel writes --------------------------------------------
def test_numa_meminfo_short_line_and_odd_node_name_are_no_crash(tmp_path, tree):
    """'x  ' in a node's meminfo (IndexError) and a directory node\u00b2 (ValueError: str.isdigit()
    but not int()) crashed the numa check ('check crashed ... please report this')."""
    for name, text in (("node0", "Node 0 MemTotal: 1048576 kB\nx  \n"), ("node\u00b2", None)):
        t = tree(CI_SNAPSHOT)
        if text is None:
            (t.path / "sys/devices/system/node" / name).mkdir(parents=True)
        else:
            t.write(f"sys/devices/system/node/{name}/meminfo", text)
        r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"),
                    timeout=60)
        numa = checks_of(r).get("numa")
        assert numa is None or "crashed" not in numa["summary"], numa


def test_a_number_of_5000_digits_is_a_damaged_reading(tmp_path, tree):
    """int() refuses 4,300 digits and more: 'could not evaluate TREE: ValueError ... (at parsing.py)'."""
    t = tree(CI_SNAPSHOT)
    meminfo = (t.path / "proc/meminfo").read_text()
    t.write("proc/meminfo", meminfo.replace("MemFree:", "MemFree: " + "9" * 5000 + " kB\nXMemFree:", 1))
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--out", str(tmp_path / "runs"), timeout=60)
    assert r.returncode == 3, r.stderr
    assert "ValueError" not in r.stderr and "could not evaluate" not in r.stderr, r.stderr[:500]
    assert "MemFree" in r.stdout, r.stdout[:1500]


def test_a_cgroup_page_cache_of_400_digits_is_no_crash(tmp_path, tree):
    """memory.stat total_inactive_file 10^400 crashed headroom in format_bytes (OverflowError)."""
    t = tree(CI_SNAPSHOT)
    t.write(f"{CI_CGROUP}/memory.limit_in_bytes", "8589934592\n")
    stat = (t.path / CI_CGROUP / "memory.stat").read_text()
    t.write(f"{CI_CGROUP}/memory.stat", "\n".join(f"total_inactive_file {10 ** 400}" if line.startswith(
        "total_inactive_file ") else line for line in stat.splitlines()) + "\n")
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"),
                timeout=60)
    head = checks_of(r)["headroom"]
    assert r.returncode == 3 and "crashed" not in head["summary"], head["summary"]
    assert "memory.stat" in head["summary"], head["summary"]


def test_a_page_cache_far_above_the_cgroup_s_usage_is_damage(tmp_path, tree):
    """Case 36: memory.stat put 2^63-1 bytes of page cache in a cgroup using 500 MiB; the working set
    clamped to 0 and the plan PASSed with "16777216 TiB page cache". The file LRU lists are part of the
    usage: far above it is a damaged reading (exit 3); a little above it (v1's approximate usage) is not."""
    t = tree(CI_SNAPSHOT)
    t.write(f"{CI_CGROUP}/memory.limit_in_bytes", "8589934592\n")
    usage = int((t.path / CI_CGROUP / "memory.usage_in_bytes").read_text())
    stat = (t.path / CI_CGROUP / "memory.stat").read_text()
    def with_cache(total: int) -> str:
        return "\n".join(f"total_inactive_file {total}" if line.startswith("total_inactive_file ") else
                         "total_active_file 0" if line.startswith("total_active_file ") else line
                         for line in stat.splitlines()) + "\n"
    t.write(f"{CI_CGROUP}/memory.stat", with_cache(2 ** 63 - 1))
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"),
                timeout=60)
    head = checks_of(r)["headroom"]
    assert r.returncode == 3 and "far above" in head["summary"], head["summary"]
    t.write(f"{CI_CGROUP}/memory.stat", with_cache(usage + (64 << 20)))  # within v1's slack: judged
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs2"),
                timeout=60)
    assert "far above" not in checks_of(r)["headroom"]["summary"], r.stdout[-800:]


def test_a_long_alloc_conf_is_cut_in_the_verdict(tmp_path):
    """A 100 KB PYTORCH_CUDA_ALLOC_CONF (the job's environment) made a 100 KB verdict line in the
    prolog's log; the JSON keeps it whole."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True," * 4000)
    r = hostpin("preflight", "--no-cuda", "--size", "1GiB", "--allocator", "torch", "--torch-version", "2.11.0",
                "--json", "--out", str(tmp_path / "runs"), env=env, timeout=60)
    doc = json.loads(r.stdout)
    assert len(doc["verdict"]) < 4000, len(doc["verdict"])
    assert "100,000 characters" in doc["verdict"] and env["PYTORCH_CUDA_ALLOC_CONF"] in r.stdout


# -- foreign text in report.md: a repro register or watch run from another node ----------------------------
FORGED = "x\n# FAKE: all verified\n![b](http://beacon.example/b.png) | <img src=http://beacon.example/c>"


def _forge(run: Path, change) -> None:
    p = run / "result.json"
    doc = json.loads(p.read_text())
    change(doc)
    p.write_text(json.dumps(doc))


def _prose(md: str) -> list[str]:
    """report.md's lines outside its fenced raw evidence."""
    lines, fence = [], None
    for line in md.splitlines():
        if fence is None and line.startswith("```"):
            fence = line[:len(line) - len(line.lstrip("`"))]
        elif fence is not None and line.startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line)
    return lines


def _assert_inert(md: str) -> None:
    prose = _prose(md)
    assert not [x for x in prose if x.startswith("# FAKE")], "\n".join(prose)
    assert not [x for x in prose if "![b]" in x or "<img" in x], "\n".join(x for x in prose if "beacon" in x)


def test_a_repro_runs_notes_and_cells_cannot_write_report_md(tmp_path):
    """A bundle's repro register result (its notes, 'why', a rank's error) reached report.md raw:
    a heading of its own, an image beacon, a '|' that ends the table cell."""
    r = hostpin("repro", "register", "--method", "mlock", "--size", "4MiB", "--out", str(tmp_path / "runs"),
                timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run = next((tmp_path / "runs").iterdir())

    def change(doc):
        doc["notes"].append("through PyTorch 2.11.0" + FORGED)
        doc["bound_reason"] = FORGED
        doc["ranks"].append(dict(doc["ranks"][0], rank=1, outcome=FORGED, error={"name": FORGED, "message": FORGED,
                                                                                "catalog": 9, "meaning": FORGED}))
    _forge(run, change)
    out = tmp_path / "report.md"
    r = hostpin("report", str(run), "-o", str(out), timeout=60)
    assert r.returncode == 0, r.stderr
    _assert_inert(out.read_text())
    # a catalog entry is a number in the typed result: text there is damage, refused in one line
    _forge(run, lambda doc: doc["ranks"][1]["error"].update(catalog=FORGED))
    r = hostpin("report", str(run), "-o", str(tmp_path / "report2.md"), timeout=60)
    assert r.returncode == 3 and "ranks[1].error.catalog is a str" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "report2.md").exists()


def test_a_watch_runs_notes_and_phases_cannot_write_report_md(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = hostpin("watch", "--pid", str(sleeper.pid), "--deadline", "1", "--out", str(tmp_path / "runs"), timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 1, r.stderr
    run = next((tmp_path / "runs").iterdir())

    def change(doc):
        doc["notes"] = (doc.get("notes") or []) + [FORGED]
        doc["remedy"] = FORGED
        doc["phases"] = [{"pid": 1, "kind": FORGED, "outcome": FORGED, "bound": FORGED, "bound_reason": FORGED,
                          "catalog": FORGED}]
    _forge(run, change)
    out = tmp_path / "report.md"
    r = hostpin("report", str(run), "-o", str(out), timeout=60)
    assert r.returncode == 0, r.stderr
    _assert_inert(out.read_text())


@pytest.mark.parametrize("version", ["9" * 5000 + ".1", "\u0662.\u0661\u0661"])  # 5000 digits; Arabic-Indic 2.11
def test_torch_version_of_no_release_is_a_bad_command_line(tmp_path, version):
    """5000 digits were 'internal error: ValueError' (exit 3); digits of another script read as 2.11."""
    r = hostpin("preflight", "--no-cuda", "--size", "1GiB", "--allocator", "torch", "--torch-version", version,
                "--out", str(tmp_path / "runs"), timeout=60)
    assert r.returncode == 2 and "--torch-version" in r.stderr and "internal error" not in r.stderr, r.stderr[:300]


@pytest.mark.parametrize("exp", [2000, 40])
def test_a_page_size_no_kernel_has_in_the_node_probe_is_not_taken(tmp_path, tree, exp):
    """probes/node.json beside a tree said page_size 2^2000: three checks crashed (OverflowError in
    format_bytes); 2^40 (1 TiB pages) was taken and MemAvailable estimated as 0 B."""
    t = tree(CI_SNAPSHOT)
    (t.base / "probes").mkdir(exist_ok=True)
    (t.base / "probes" / "node.json").write_text(json.dumps({"schema": "hostpin.node-probe", "page_size": 2 ** exp}))
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"),
                timeout=60)
    doc = json.loads(r.stdout)
    assert not [c["id"] for c in doc["checks"] if "crashed" in (c.get("summary") or "")], r.stdout[:3000]
    assert str(2 ** exp) not in r.stdout


@pytest.mark.parametrize("devices", [[{"name": ["x"]}], "a string", [{"name": {"a": 1}, "media": "ssd"}]])
def test_a_node_probes_swap_devices_of_another_shape_are_no_crash(tmp_path, tree, devices):
    """probes/node.json swap_devices [{"name": ["x"]}] crashed the swap check (TypeError: unhashable)."""
    t = tree(CI_SNAPSHOT)
    t.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/var/tmp/swapfile file 1048572 0 -2\n")
    (t.base / "probes").mkdir(exist_ok=True)
    (t.base / "probes" / "node.json").write_text(json.dumps({"schema": "hostpin.node-probe", "swap_devices": devices}))
    r = hostpin("preflight", "--root", str(t.path), "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"),
                timeout=60)
    swap_check = checks_of(r)["swap"]
    assert "crashed" not in swap_check["summary"], swap_check["summary"]
