"""The fourth attack as a careless new user: the README's first command on a node without a GPU,
`hostpin repro cleanup --help` on a node a killed --trace left an instance on, and an output
path that names the bundle being read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import hostpin


def test_the_device_remedy_names_the_package_hostpin_depends_on(tmp_path):
    """Without a driver the device check told the user to install cuda-python, the metapackage the
    README warns against (its 12.6.0 has no cuda.bindings); hostpin depends on cuda-bindings."""
    r = hostpin("preflight", "--size", "1GiB", "--json", "--out", str(tmp_path / "runs"), timeout=120)
    device = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "device")
    if device["status"] != "fail":  # a node with a usable GPU: no remedy to read
        return
    assert "cuda-bindings" in device["remedy"] and "cuda-python" not in device["remedy"], device["remedy"]


def test_cleanup_help_names_the_tracefs_instances_it_removes():
    """`repro cleanup` removes a killed --trace's tracefs instances; its help listed everything else."""
    r = hostpin("repro", "cleanup", "--help", timeout=60)
    assert r.returncode == 0 and "tracefs" in r.stdout, r.stdout


BUNDLED = Path(__file__).parent / "fixtures" / "h200-repro-ranks2"


def _bundle(tmp_path: Path) -> Path:
    out = tmp_path / "ranks2.tar.gz"
    r = hostpin("bundle", str(BUNDLED), "-o", str(out), timeout=60)
    assert r.returncode == 0, r.stderr
    return out


def test_json_file_naming_the_bundle_being_compared_keeps_the_bundle(tmp_path):
    """`compare a.tar.gz b --json-file a.tar.gz` (a slip of the tab key) replaced the bundle with
    the JSON document: the evidence was gone. Now refused before the command runs (exit 2)."""
    bundle = _bundle(tmp_path)
    before = bundle.read_bytes()
    r = hostpin("compare", str(bundle), str(BUNDLED), "--json-file", str(bundle), timeout=60)
    assert r.returncode == 2 and "gzip or tar archive" in r.stderr, r.stderr
    assert bundle.read_bytes() == before
    tar = tmp_path / "ranks2.tar"  # an uncompressed archive too
    tar.write_bytes(__import__("gzip").decompress(before))
    r = hostpin("preflight", "--no-cuda", "--out", str(tmp_path / "runs"), "--json-file", str(tar), timeout=120)
    assert r.returncode == 2 and "archive" in r.stderr and tar.read_bytes()[257:262] == b"ustar", r.stderr
    doc = tmp_path / "doc.json"  # its own document is replaced, run after run
    for _ in range(2):
        r = hostpin("compare", str(bundle), str(BUNDLED), "--json-file", str(doc), timeout=60)
        assert r.returncode == 0 and len(json.loads(doc.read_text())["runs"]) == 2, r.stderr


def test_report_o_naming_the_bundle_being_read_keeps_the_bundle(tmp_path):
    """`hostpin report ranks2.tar.gz -o ranks2.tar.gz` replaced the bundle with its report (exit 0)."""
    bundle = _bundle(tmp_path)
    before = bundle.read_bytes()
    r = hostpin("report", str(bundle), "-o", str(bundle), timeout=60)
    assert r.returncode == 2 and bundle.read_bytes() == before, r.stderr
