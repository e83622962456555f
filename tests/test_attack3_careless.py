"""The third attack (issue 19), as a careless user and operator: a --json-file aimed at a run's
evidence, at the site file or at the --prometheus file; watch options the launcher form would
ignore; error messages that named the wrong variable or no value; a relative --cgroup from inside
a cgroup's directory; a torch version from a dist-info with control characters. Each case runs the
real CLI on real files, the real cgroup v1 hierarchy and a real dist-info on PYTHONPATH."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import IS_ROOT, REPO, hostpin

H200 = REPO / "tests" / "fixtures" / "h200-fc-snapshot-1201"
V1_MEMORY = Path("/sys/fs/cgroup/memory")


def _preflight_run(tmp_path: Path) -> Path:
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                "--format", "line")
    assert r.returncode == 0, r.stderr
    (run,) = (tmp_path / "runs").iterdir()
    return run


# -- --json-file into a run directory replaced its manifest: the run could never be read again ----
@pytest.mark.parametrize("name", ["manifest.json", "result.json", "new.json"])
def test_json_file_inside_a_run_directory_is_refused(tmp_path, name):
    run = _preflight_run(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--out", str(tmp_path / "runs2"),
                "--json-file", str(run / name))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "run directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert hostpin("report", str(run), "-o", str(tmp_path / "r.md")).returncode == 0


def test_json_file_into_the_root_tree_being_read_is_refused(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(H200, tree, symlinks=True)
    manifest = (tree / "manifest.json").read_bytes()
    r = hostpin("preflight", "--root", str(tree), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                "--json-file", str(tree / "manifest.json"))
    assert r.returncode == 2, r.stderr
    assert (tree / "manifest.json").read_bytes() == manifest
    again = hostpin("preflight", "--root", str(tree), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                    "--format", "line")
    assert again.returncode == 0, again.stdout + again.stderr


# -- --json-file on the site file replaced it: the next gate run was a bad site file (exit 2) -----
def test_json_file_that_is_the_site_file_is_refused(tmp_path):
    site = tmp_path / "hostpin.toml"
    site.write_text('[plan]\nsize = "4GiB"\n[preflight]\nstrict = true\n')
    before = site.read_bytes()
    for given in (str(site), str(tmp_path / "." / "hostpin.toml")):
        r = hostpin("preflight", "--root", str(H200), "--config", str(site), "--out", str(tmp_path / "runs"),
                    "--json-file", given)
        assert r.returncode == 2, r.stderr
        assert "site file" in r.stderr, r.stderr
        assert site.read_bytes() == before
    ok = hostpin("preflight", "--root", str(H200), "--config", str(site), "--out", str(tmp_path / "runs"),
                 "--format", "line")
    assert ok.returncode == 0, ok.stderr


def test_json_file_that_is_the_prometheus_file_is_refused(tmp_path):
    same = tmp_path / "hostpin.prom"
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                "--prometheus", str(same), "--json-file", str(same))
    assert r.returncode == 2 and "--prometheus" in r.stderr, r.stderr
    assert not same.exists()


# -- the help said a link at --json-file is replaced; it is refused, never followed nor replaced --
def test_json_file_help_says_what_happens_to_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "out.json"
    link.symlink_to(target)
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                "--json-file", str(link))
    assert r.returncode == 2 and link.is_symlink() and target.read_text() == "keep"
    for cmd in (("preflight",), ("watch",), ("repro", "register")):
        text = " ".join(hostpin(*cmd, "--help").stdout.split())
        assert "is replaced, never followed" not in text, cmd
        assert "never followed nor replaced" in text, cmd


def test_a_link_to_a_regular_file_is_named_as_one(tmp_path):
    target = tmp_path / "target.md"
    target.write_text("keep")
    link = tmp_path / "report.md"
    link.symlink_to(target)
    r = hostpin("report", str(H200), "-o", str(link))
    assert r.returncode == 3, r.stderr
    assert "it leads to a regular file" in r.stderr and "leads to not a regular file" not in r.stderr, r.stderr
    assert target.read_text() == "keep"


# -- watch: options the launcher form silently ignored ---------------------------------------------
@pytest.mark.parametrize("opts", [("--until", "pin"), ("--quiet-after", "3"), ("--until", "quiet")])
def test_watch_pid_options_with_the_launcher_form_are_refused(tmp_path, opts):
    marker = tmp_path / "ran"
    r = hostpin("watch", *opts, "--out", str(tmp_path / "runs"), "--", "touch", str(marker))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert opts[0] in r.stderr and "--pid" in r.stderr, r.stderr
    assert not marker.exists()  # refused before CMD ran


def test_watch_quiet_after_with_until_pin_is_refused(tmp_path):
    r = hostpin("watch", "--pid", str(os.getpid()), "--until", "pin", "--quiet-after", "3", "--deadline", "1",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "--quiet-after" in r.stderr, (r.returncode, r.stderr)
    assert not (tmp_path / "runs").exists()


# -- error messages that named the wrong thing or no value -----------------------------------------
def test_a_bad_pytorch_alloc_conf_is_named_as_itself(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTORCH_ALLOC_CONF"] = "bogus"
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--allocator", "torch", "--torch-version",
                "2.11", "--out", str(tmp_path / "runs"), env=env)
    assert r.returncode == 2, r.stderr
    assert "PYTORCH_ALLOC_CONF" in r.stderr and "PYTORCH_CUDA_ALLOC_CONF" not in r.stderr, r.stderr


def test_an_empty_torch_version_asks_for_a_version(tmp_path):
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--allocator", "torch", "--torch-version", "",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "--torch-version" in r.stderr, r.stderr
    assert "give a path" not in r.stderr and "version" in r.stderr.split("--torch-version", 1)[1], r.stderr


def test_a_size_off_the_page_names_the_value(tmp_path):
    r = hostpin("repro", "register", "--method", "mlock", "--size", "1000003", "--no-calibrate",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stderr
    assert "1,000,003" in r.stderr and "1003520" in r.stderr, r.stderr


def test_the_size_limit_is_given_in_a_unit_that_can_be_typed(tmp_path):
    r = hostpin("preflight", "--root", str(H200), "--size", "1048577TiB", "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "1048576TiB" in r.stderr, r.stderr
    at_limit = hostpin("preflight", "--root", str(H200), "--size", "1048576TiB", "--out", str(tmp_path / "runs"),
                       "--format", "line")
    assert at_limit.returncode == 1, at_limit.stdout + at_limit.stderr  # judged: it does not fit


# -- a relative --cgroup from inside a cgroup's directory was read from the hierarchy's root -------
@pytest.mark.skipif(not (IS_ROOT and (V1_MEMORY / "memory.limit_in_bytes").exists()),
                    reason="needs root and the cgroup v1 memory hierarchy")
def test_a_relative_cgroup_is_the_directory_it_names(tmp_path):
    parent = V1_MEMORY / f"hostpin-attack3-{uuid.uuid4().hex[:8]}"
    decoy = V1_MEMORY / "sub"  # a cgroup of the same name at the top: the old reading took it
    made_decoy = False
    try:
        (parent / "sub").mkdir(parents=True)
        (parent / "sub" / "memory.limit_in_bytes").write_text(str(64 << 20))
        if not decoy.exists():
            decoy.mkdir()
            made_decoy = True
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--size", "100MiB", "--method", "mlock",
                            "--no-cuda", "--sample", "0", "--cgroup", "./sub", "--out", str(tmp_path / "runs"),
                            "--json"], capture_output=True, text=True, timeout=120, cwd=parent, env=env)
        doc = json.loads(r.stdout)
        assert doc["binding_dir"] == str(parent / "sub"), (doc["binding_dir"], r.stderr)
        assert r.returncode == 1 and doc["binding"] == "cgroup", doc["verdict"]  # 100 MiB > its 64 MiB
    finally:
        for d in (parent / "sub", parent):
            if d.exists():
                d.rmdir()
        if made_decoy:
            decoy.rmdir()


# -- a torch version read from a dist-info is foreign text -----------------------------------------
def test_the_installed_torch_version_is_escaped(tmp_path):
    site = tmp_path / "site"
    dist = site / "torch-2.11.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\x1b]0;owned\x07\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTHONPATH"] = str(site)
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--allocator", "torch", "--json",
                "--out", str(tmp_path / "runs"), env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["torch"]["version"] == "2.11.0\\x1b]0;owned\\x07", doc["torch"]
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout


# -- README: one "What hostpin promises" section, not two ------------------------------------------
def test_the_readme_has_one_promises_section():
    headings = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("#")]
    sections = [h for h in headings if h.startswith("## ")]
    assert sections.count("## What hostpin promises") == 1
    assert len(sections) == len(set(sections)), sorted(h for h in sections if sections.count(h) > 1)


# -- repro register refused: "REFUSED: refused: need ..." said the outcome twice --------------------
def test_a_refusal_says_refused_once(tmp_path):
    r = hostpin("repro", "register", "--method", "mlock", "--size", "64TiB", "--ranks", "2", "--no-calibrate",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 4, r.stdout + r.stderr  # refused before anything is allocated
    first = r.stdout.splitlines()[0]
    assert first.startswith("hostpin repro register: REFUSED: need "), first
    assert "refused: refused" not in first.lower()


# -- watch: a load phase "not a pin" was explained "as the pin goes" --------------------------------
GROW = r"""
import mmap, sys, time
m = mmap.mmap(-1, 48 << 20)
print("ready", flush=True)
time.sleep(0.8)
for off in range(0, 48 << 20, 4096):
    m[off] = 1
    if off % (1 << 20) == 0:
        time.sleep(0.04)
time.sleep(30)
"""


def test_a_load_phase_is_not_explained_as_a_pin(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", GROW], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        out = tmp_path / "watch.json"
        r = hostpin("watch", "--pid", str(child.pid), "--quiet-after", "1", "--deadline", "20",
                    "--out", str(tmp_path / "runs"), "--json-file", str(out))
        doc = json.loads(out.read_text())
    finally:
        child.kill()
        child.wait()
    alloc = [p for p in doc["phases"] if p["kind"] == "alloc"]
    assert alloc and not alloc[0]["pin"], (r.stdout, doc["phases"])
    assert alloc[0]["bound"] == "fault-in/zeroing", alloc[0]
    assert "the pin" not in alloc[0]["bound_reason"], alloc[0]["bound_reason"]
    assert "as the pin goes" not in r.stdout, r.stdout


# -- more messages: --python as a bare name, an empty --json-file, a '..' the gate line dropped ----
def test_python_given_as_a_name_gets_its_path(tmp_path):
    name = Path(sys.executable).name
    found = shutil.which(name)
    r = hostpin("repro", "register", "--allocator", "torch", "--size", "16MiB", "--python", name,
                "--out", str(tmp_path / "runs"), env={**os.environ, "PATH": str(Path(sys.executable).parent)})
    assert r.returncode == 2 and repr(name) in r.stderr, r.stderr
    assert str(Path(sys.executable).parent / name) in r.stderr or (found and found in r.stderr), r.stderr


def test_an_empty_json_file_is_called_empty(tmp_path):
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--json-file", "", "--out", str(tmp_path / "runs"))
    assert r.returncode == 2 and "an empty path" in r.stderr and "is a directory" not in r.stderr, r.stderr


def test_the_gate_line_keeps_the_dotdot_it_refuses(tmp_path):
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--cgroup", "/a/../b", "--format", "line",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "/a/../b" in r.stdout and "'..'" in r.stderr, r.stdout


def test_a_web_projects_manifest_json_is_no_run_directory(tmp_path):
    """The refusal above is for hostpin's runs only: a directory with someone's manifest.json
    (a web app, an extension) still takes the document."""
    (tmp_path / "manifest.json").write_text('{"name": "my app", "start_url": "/"}\n')
    out = tmp_path / "preflight.json"
    r = hostpin("preflight", "--root", str(H200), "--size", "4GiB", "--out", str(tmp_path / "runs"),
                "--json-file", str(out), "--format", "line")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["schema"] == "hostpin.preflight"
