"""The fourth attack as a careless new user: the README's first command on a node without a GPU,
and `hostpin repro cleanup --help` on a node a killed --trace left an instance on."""
from __future__ import annotations

import json
from pathlib import Path

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
