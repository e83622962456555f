"""Other projects' fixtures that proved a hostpin reading wrong: each case is the peer's own file
(or its test's values), kept under tests/fixtures/<peer-case>/ with a README citing the project, the
file and the commit. Where a case needs a whole node, it is laid over a copy of a real capture."""
from __future__ import annotations

import json
import shutil

import pytest

from diag import cgroup, meminfo, zoneinfo
from diag.checks import ERROR, FAIL, PASS, SKIP, WARN, Plan
from diag.facts import NOT_CAPTURED, Readings
from diag.preflight import run_preflight
from diag.results import result_dict
from diag.rootfs import Root

from conftest import CI_SNAPSHOT, FIXTURES, GPU_SNAPSHOT, hostpin

G = 1 << 30


def _overlay(t, case: str) -> None:
    """Lay a peer case's files (everything but its README) over a copied tree."""
    src = FIXTURES / case
    for path in sorted(src.rglob("*")):
        if path.is_file() and path.name not in ("README.md", "cases.json"):
            rel = path.relative_to(src)
            target = t.path / rel
            if target.exists() and target.is_dir():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _checks(root, **plan):
    result = result_dict(run_preflight(Plan(**plan), root, cuda="captured"))
    return {c["id"]: c for c in result["checks"]}, result


# 1. procfs: node1 and node2 with vmstat only
def test_numa_nodes_without_meminfo_are_not_captured_not_absent(tree):
    t = tree(GPU_SNAPSHOT)
    t.remove("sys/devices/system/node")
    _overlay(t, "procfs-numa-vmstat-only")
    r = Readings(Root(t.path))
    nodes = r.numa_nodes
    assert [(n.node, n.total_bytes, n.meminfo_read) for n in nodes] == [(1, None, False), (2, None, False)]
    assert r.state("numa_nodes") == NOT_CAPTURED
    checks, _ = _checks(t.path, size_bytes=G, method="hostalloc")
    numa = checks["numa"]
    assert numa["status"] == SKIP and "not captured" in numa["summary"] and "node1/meminfo" in numa["summary"]
    assert "placement cannot be remote" not in numa["summary"]


# 2. automemlimit: a cgroup path outside the mount's root
def test_a_cgroup_outside_the_mount_root_is_not_joined_under_it(tree):
    t = tree(GPU_SNAPSHOT)
    _overlay(t, "automemlimit-cgroup-outside-root")
    with pytest.raises(cgroup.CgroupUnseen, match="/other_container is not under the root /container0"):
        cgroup.read_cgroup_memory(Root(t.path))
    checks, result = _checks(t.path, size_bytes=G, method="hostalloc")
    head = checks["headroom"]
    assert head["status"] == ERROR and "not captured" in head["summary"] and "/other_container" in head["summary"]
    assert result["exit_code"] == 3
    # the peer's passing cases still resolve as it expects
    assert cgroup._dir_for({"root": "/container0", "mount_point": "/fake/mount"}, "/container0") == "fake/mount"
    assert cgroup._dir_for({"root": "/", "mount_point": "/fake/mount"}, "/") == "fake/mount"


def test_a_pid_whose_cgroup_is_outside_the_mount_root_is_the_callers_error(tree):
    t = tree(GPU_SNAPSHOT)
    _overlay(t, "automemlimit-cgroup-outside-root")
    t.write("proc/4242/cgroup", "0::/other_container\n")
    with pytest.raises(cgroup.CgroupError, match="pid 4242.*not under the root /container0"):
        cgroup.read_cgroup_memory(Root(t.path), pid=4242)


# 3. psutil: MemAvailable: -1 kB
def test_a_negative_meminfo_value_is_damage_exit_3(tree, tmp_path):
    text = (FIXTURES / "psutil-meminfo-negative/proc/meminfo").read_text()
    m = meminfo.parse_meminfo(text)
    assert m.available_bytes is None and "MemAvailable: '-1 kB'" in m.bad
    assert m.total_bytes == 16325648 * 1024  # the other lines are read as psutil reads them
    t = tree(CI_SNAPSHOT)
    original = (t.path / "proc/meminfo").read_text()
    # the peer's MemAvailable line in a whole meminfo, so that nothing else in it is missing
    t.write("proc/meminfo", "".join(line + "\n" if not line.startswith("MemAvailable:") else "MemAvailable:         -1 kB\n"
                                    for line in original.splitlines()))
    r = hostpin("preflight", "--root", str(t.base), "--size", "1GiB", "--method", "mlock", "--json",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 3, r.stdout[-500:]
    verdict = json.loads(r.stdout)["verdict"]
    assert "MemAvailable" in verdict and "-1 kB" in verdict and "--root must point" not in verdict
    # and the peer's file as it is: damaged, exit 3
    t.write("proc/meminfo", text)
    r = hostpin("preflight", "--root", str(t.base), "--size", "1GiB", "--method", "mlock", "--json",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 3 and "MemAvailable" in json.loads(r.stdout)["verdict"]


# 4. automemlimit: mountinfo lines
@pytest.mark.parametrize("case", json.loads((FIXTURES / "automemlimit-mountinfo/cases.json").read_text()),
                         ids=lambda c: c["name"][:40])
def test_mountinfo_lines_as_automemlimit_expects(case):
    parsed = cgroup.parse_mountinfo(case["input"])
    if case["want_error"]:
        assert parsed == [] and parsed.bad, parsed
    else:
        assert parsed == [case["want"]] and not parsed.bad


def test_a_damaged_mountinfo_line_where_the_cgroup_mount_should_be_is_damage(tree):
    t = tree(GPU_SNAPSHOT)
    lines = (t.path / "proc/self/mountinfo").read_text().splitlines()
    cut = [" ".join(ln.split(" - ")[0].split()[:5]) + " - " + ln.split(" - ")[1] if " cgroup2 " in ln else ln
           for ln in lines]
    t.write("proc/self/mountinfo", "\n".join(cut) + "\n")
    with pytest.raises(cgroup.CgroupDamaged, match="unreadable line"):
        cgroup.read_cgroup_memory(Root(t.path))


# 5. procfs / node_exporter: no MemAvailable line
def test_no_memavailable_is_estimated_as_the_kernel_does_and_judged(tree):
    case = FIXTURES / "procfs-meminfo-no-memavailable"
    m = meminfo.parse_meminfo((case / "proc/meminfo").read_text())
    zones = zoneinfo.parse_zoneinfo((case / "proc/zoneinfo").read_text())
    e = meminfo.estimate_available(m, zones)
    assert e["totalreserve_pages"] == 48021 and e["wmark_low_pages"] == 34942  # by hand in the README
    assert e["available_bytes"] == 14733288 * 1024
    t = tree(CI_SNAPSHOT)
    _overlay(t, "procfs-meminfo-no-memavailable")
    checks, result = _checks(t.path, size_bytes=G, method="mlock")
    head = checks["headroom"]
    assert head["status"] in (PASS, WARN) and "estimated" in head["summary"], head["summary"]
    assert head["evidence"]["mem_available_bytes"] == 14733288 * 1024
    checks, _ = _checks(t.path, size_bytes=20 * G, method="mlock")  # over the estimate: judged, and fails
    assert checks["headroom"]["status"] == FAIL and "estimated" in checks["headroom"]["summary"]


def test_no_memavailable_and_no_zoneinfo_names_the_zoneinfo_not_the_root(tree, tmp_path):
    t = tree(CI_SNAPSHOT)
    _overlay(t, "node-exporter-meminfo-no-memavailable")
    t.remove("proc/zoneinfo")
    checks, result = _checks(t.path, size_bytes=G, method="mlock")
    head = checks["headroom"]
    assert head["status"] == ERROR and "MemAvailable is missing" in head["summary"] and "zoneinfo" in head["summary"]
    r = hostpin("preflight", "--root", str(t.base), "--size", "1GiB", "--method", "mlock", "--json",
                "--out", str(tmp_path / "runs"))
    assert r.returncode == 3 and "--root must point" not in r.stdout
