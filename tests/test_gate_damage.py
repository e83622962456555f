"""The gate fails closed on what a captured tree lacks or garbles, case by case: each one below gave
exit 0 (or a crash) on a copy of the H200 snapshot before, found by an audit that edited one file at
a time. A missing or damaged input that decides the verdict is exit 3 ("not captured" / "damaged");
one that cannot change it is a skip with the reason."""
from __future__ import annotations

import os

import pytest

from diag import catalog
from diag.checks import ERROR, FAIL, PASS, SKIP, WARN, Plan
from diag.preflight import run_preflight
from diag.psi import parse_psi
from diag.results import result_dict
from diag.units import GiB

from conftest import GPU_SNAPSHOT

G = GiB
LEAF_PARENT = "sys/fs/cgroup/process_api"


def evaluate(root, strict=False, **plan):
    result = result_dict(run_preflight(Plan(**plan), root, cuda="captured", strict=strict))
    return {c["id"]: c for c in result["checks"]}, result


def _cgroup_binds(t):
    """The parent cgroup limited to 8 GiB: a 10 GiB plan fails headroom there (the baseline)."""
    t.write(f"{LEAF_PARENT}/memory.max", f"{8 * G}\n")


CGROUP_DAMAGE = {
    "proc/self/cgroup removed": lambda t: t.remove("proc/self/cgroup"),
    "proc/self/cgroup garbage": lambda t: (t.path / "proc/self/cgroup").write_bytes(os.urandom(64)),
    "proc/self/cgroup empty": lambda t: t.write("proc/self/cgroup", ""),
    "proc/self/cgroup path without /": lambda t: t.write("proc/self/cgroup", "0::process_api/x\n"),
    "mountinfo removed": lambda t: t.remove("proc/self/mountinfo"),
    "the binding memory.max removed": lambda t: t.remove(f"{LEAF_PARENT}/memory.max"),
    "the binding memory.current removed": lambda t: t.remove(f"{LEAF_PARENT}/memory.current"),
    "sys/fs/cgroup removed": lambda t: t.remove("sys/fs/cgroup"),
}


def test_the_cgroup_baseline_fails(tree):
    t = tree(GPU_SNAPSHOT)
    _cgroup_binds(t)
    checks, result = evaluate(t.path, size_bytes=10 * G)
    assert checks["headroom"]["status"] == FAIL and result["exit_code"] == 1


@pytest.mark.parametrize("damage", sorted(CGROUP_DAMAGE))
def test_a_binding_cgroup_that_cannot_be_read_is_exit_3_not_pass(tree, damage):
    t = tree(GPU_SNAPSHOT)
    _cgroup_binds(t)
    CGROUP_DAMAGE[damage](t)
    checks, result = evaluate(t.path, size_bytes=10 * G)
    assert checks["headroom"]["status"] == ERROR, checks["headroom"]["summary"]
    assert ("not captured" in checks["headroom"]["summary"] or "damaged" in checks["headroom"]["summary"])
    assert result["exit_code"] == 3


def test_a_level_the_capture_saw_absent_is_no_limit(tree):
    """A snapshot records a limit file the node lacks as absent: that level is then no limit, not a gap
    (the v2 root cgroup's memory.max is recorded so in this fixture)."""
    checks, result = evaluate(GPU_SNAPSHOT, size_bytes=10 * G)
    assert checks["headroom"]["status"] == PASS and result["exit_code"] == 0


PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"


@pytest.mark.parametrize("text", ["", "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n",
                                  PSI.replace("full avg10", "full avgn/a"), PSI.replace("full avg10=0.00 ", "")])
def test_psi_without_its_lines_or_keys_is_damaged(tree, text):
    """An empty pressure file read as 'some 0.00%, full 0.00%' PASS; a dropped line or key as WARN."""
    assert parse_psi(text).bad
    t = tree(GPU_SNAPSHOT)
    t.write("proc/pressure/memory", text)
    checks, result = evaluate(t.path, size_bytes=G)
    assert checks["psi"]["status"] == ERROR and result["exit_code"] == 3


def test_meminfo_without_its_swap_lines_is_damaged_not_no_swap(tree):
    """Deleting SwapTotal/SwapFree read as 'no swap configured' PASS while /proc/swaps showed 4 GiB used."""
    t = tree(GPU_SNAPSHOT)
    mi = (t.path / "proc/meminfo").read_text()
    t.write("proc/meminfo", "".join(line for line in mi.splitlines(True) if not line.startswith(("SwapTotal", "SwapFree"))))
    _, result = evaluate(t.path, size_bytes=G)
    assert result["exit_code"] == 3


def _swap_in_use(t):
    mi = (t.path / "proc/meminfo").read_text().splitlines(True)
    mi = [("SwapTotal:       8388608 kB\n" if line.startswith("SwapTotal") else
           "SwapFree:        4194304 kB\n" if line.startswith("SwapFree") else line) for line in mi]
    t.write("proc/meminfo", "".join(mi))
    t.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n1p3 partition\t8388604\t4194304\t-2\n")


def test_swappiness_0_does_not_keep_a_region_resident(tree):
    """mm/vmscan.c: reclaim near OOM swaps whatever swappiness says ('mm: vmscan: disregard swappiness
    shortly before going OOM', 3.8); only memory.swap.max=0 forbids it. Swappiness 0 read as 'stays
    resident' PASS with 4 GiB in swap."""
    t = tree(GPU_SNAPSHOT)
    _swap_in_use(t)
    t.write("proc/sys/vm/swappiness", "0\n")
    checks, _ = evaluate(t.path, size_bytes=4 * G)
    assert checks["swap"]["status"] == WARN and checks["swap"]["evidence"]["predicted_pin_seconds"] > 0


@pytest.mark.parametrize("damage", ["swappiness", "page-cluster", "swaps"])
def test_a_damaged_swap_input_is_exit_3(tree, damage):
    t = tree(GPU_SNAPSHOT)
    _swap_in_use(t)
    if damage == "swaps":
        (t.path / "proc/swaps").write_bytes(os.urandom(200).replace(b"\n", b"x"))
    else:
        t.write(f"proc/sys/vm/{damage}", "n/a\n")
    checks, result = evaluate(t.path, size_bytes=4 * G)
    assert checks["swap"]["status"] == ERROR and result["exit_code"] == 3


def test_swap_prediction_moves_bytes_not_pages_on_64k_nodes(tree):
    """The measured default rates count 4 KiB pages: a 64 KiB-page node (hpage_pmd_size 512 MiB) must
    predict the same seconds for the same bytes, not 16x fewer."""
    t4 = tree(GPU_SNAPSHOT)
    _swap_in_use(t4)
    t64 = tree(GPU_SNAPSHOT)
    _swap_in_use(t64)
    t64.write("sys/kernel/mm/transparent_hugepage/hpage_pmd_size", f"{512 << 20}\n")
    s4 = evaluate(t4.path, size_bytes=4 * G)[0]["swap"]["evidence"]
    s64 = evaluate(t64.path, size_bytes=4 * G)[0]["swap"]["evidence"]
    assert s64["predicted_pin_seconds"] == pytest.approx(s4["predicted_pin_seconds"], rel=0.01)
    assert s64["rate_pages_per_s"] == pytest.approx(s4["rate_pages_per_s"] / 16, rel=0.01)


def test_empty_zone_files_are_damaged_not_empty(tree):
    for rel, check, plan in (("proc/zoneinfo", "zones", {}), ("proc/buddyinfo", "fragmentation", {"thp": True})):
        t = tree(GPU_SNAPSHOT)
        t.write(rel, "")
        checks, result = evaluate(t.path, strict=True, size_bytes=4 * G, **plan)
        assert checks[check]["status"] == ERROR and "no zone" in checks[check]["summary"], rel
        assert result["exit_code"] == 3


def test_a_hung_task_setting_not_captured_decides_only_under_strict(tree):
    t = tree(GPU_SNAPSHOT)
    t.remove("proc/sys/kernel/hung_task_panic")
    checks, result = evaluate(t.path, size_bytes=4 * G)
    assert checks["hung_task"]["status"] == SKIP and "not captured" in checks["hung_task"]["summary"]
    checks, result = evaluate(t.path, strict=True, size_bytes=4 * G)
    assert checks["hung_task"]["status"] == ERROR and result["exit_code"] == 3


def test_a_release_nobody_can_read_is_damaged_not_a_crash(tree):
    t = tree(GPU_SNAPSHOT)
    t.remove("proc/sys/kernel/osrelease")
    t.write("proc/version", "garbage\n")
    checks, result = evaluate(t.path, size_bytes=4 * G)
    assert checks["kernel"]["status"] == ERROR and "damaged" in checks["kernel"]["summary"]
    assert "AttributeError" not in checks["kernel"]["summary"] and result["exit_code"] == 3


def test_a_garbled_architecture_does_not_switch_off_the_kernel_rules(tree):
    """open-gpu-kernel-modules os-mlock.c: FOLL_LONGTERM under NVCPU_FAMILY_X86 only. An architecture
    the banner does not name is unknown (the rule stays), not 'no FOLL_LONGTERM' (it went away)."""
    assert catalog.driver_uses_longterm((580, 159, 4), "xn/a_64") is None
    assert catalog.driver_uses_longterm((580, 159, 4), "aarch64") is False
    t = tree(GPU_SNAPSHOT)
    t.write("proc/sys/kernel/osrelease", "6.11.3\n")
    v = (t.path / "proc/driver/nvidia/version").read_text()
    t.write("proc/driver/nvidia/version", v.replace("x86_64", "xn/a_64"))
    checks, result = evaluate(t.path, size_bytes=4 * G)
    assert checks["kernel"]["status"] in (FAIL, ERROR) and result["exit_code"] != 0


@pytest.mark.parametrize("release", ["6.11.0-rc7", "6.11.9-rc1", "6.11.0-rc1+"])
def test_6_11_release_candidates_are_upstream(release):
    """The cap came with 6.11's merge window (53ba78de064b): its release candidates have it for sure."""
    assert catalog.pin_cap_6_11(release) == "upstream"


def test_a_page_size_the_tree_does_not_say_is_not_assumed_where_it_decides(tree):
    """Without probes/node.json or hpage_pmd_size the page size is assumed 4 KiB: the fragmentation
    check (THP order) skips saying so, and under --strict refuses; the 512 GiB per-call rule, which
    needs the page count, refuses rather than fail a 64 KiB node."""
    t = tree(GPU_SNAPSHOT)
    t.remove("sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
    checks, _ = evaluate(t.path, size_bytes=4 * G, thp=True)
    assert checks["fragmentation"]["status"] == SKIP and "not captured" in checks["fragmentation"]["summary"]
    checks, result = evaluate(t.path, strict=True, size_bytes=4 * G, thp=True)
    assert checks["fragmentation"]["status"] == ERROR and result["exit_code"] == 3
    checks, result = evaluate(t.path, size_bytes=600 * G)
    assert checks["driver"]["status"] == ERROR and "page size" in checks["driver"]["summary"]


def test_a_snapshot_of_another_boot_is_judged_as_the_live_node_was():
    """Held out: `hostpin snapshot` on the H200 on 2026-12-01 (another VM boot, kernel
    6.18.44-fc-v973-gpu, recorded with this version: every cgroup level's files). Live, preflight
    said PASS for 2 x 47.2 GiB by register (bench/gpu_pin_accounting.sh); read back it says the same, and
    600 GiB fails on headroom and on the driver's per-call limit."""
    snap = GPU_SNAPSHOT.parent / "h200-fc-snapshot-1201"
    checks, result = evaluate(snap, size_bytes=int(47.2 * G), ranks=2)
    assert result["exit_code"] == 0 and all(c["status"] == PASS for c in checks.values()), \
        {k: c["summary"] for k, c in checks.items() if c["status"] != PASS}
    assert result["page_size_source"] == "probes/node.json"
    checks, result = evaluate(snap, size_bytes=600 * G)
    assert checks["headroom"]["status"] == FAIL and checks["driver"]["status"] == FAIL and result["exit_code"] == 1


CUT = {
    "zoneinfo cut mid-line before its Movable zone": ("proc/zoneinfo", lambda s: s[: s.index("zone  Movable") - 30]),
    "zoneinfo cut in half": ("proc/zoneinfo", lambda s: s[: len(s) // 2]),
    "buddyinfo cut in half": ("proc/buddyinfo", lambda s: s[: len(s) // 2]),
    "a buddyinfo line with 8 of its orders": ("proc/buddyinfo", lambda s: "".join(
        " ".join(line.split()[:8]) + "\n" if i == 1 else line for i, line in enumerate(s.splitlines(True)))),
    "meminfo cut mid-line": ("proc/meminfo", lambda s: s[: s.index("SwapFree") + 12]),
}


@pytest.mark.parametrize("case", sorted(CUT))
def test_a_reading_cut_short_is_damaged(tree, case):
    """A second audit cut captured files short: zoneinfo before its Movable zone passed --strict (the
    zone, 32 GiB of ZONE_MOVABLE, was simply not there); half a buddyinfo reported 14 MiB of free
    huge pages and passed. The kernel ends every line of these files: a last line without its end,
    or a zone line with fewer orders than the others, was cut short."""
    rel, cut = CUT[case]
    t = tree(GPU_SNAPSHOT)
    t.write(rel, cut((t.path / rel).read_text()))
    checks, result = evaluate(t.path, strict=True, size_bytes=int(47.2 * G), ranks=2, thp=True)
    assert result["exit_code"] == 3, {k: c["summary"] for k, c in checks.items() if c["status"] != PASS}
    assert any(c["status"] == ERROR and "damaged" in c["summary"] for c in checks.values()) or \
        "cut short" in result["verdict"], result["verdict"]


@pytest.mark.parametrize("rel, text", [
    ("sys/kernel/mm/transparent_hugepage/enabled", "foo\n"),      # no such policy (mm/huge_memory.c)
    ("proc/pressure/memory", PSI.replace("some avg10=0.00", "some avg10=500.00")),  # a percent past 100
])
def test_values_no_kernel_prints_are_damaged(tree, rel, text):
    t = tree(GPU_SNAPSHOT)
    t.write(rel, text)
    _, result = evaluate(t.path, strict=True, size_bytes=4 * G, thp=True)
    assert result["exit_code"] == 3


def test_memavailable_above_memtotal_is_damaged(tree):
    t = tree(GPU_SNAPSHOT)
    mi = (t.path / "proc/meminfo").read_text().splitlines(True)
    t.write("proc/meminfo", "".join("MemAvailable:   999999999 kB\n" if line.startswith("MemAvailable") else line
                                    for line in mi))
    checks, result = evaluate(t.path, size_bytes=4 * G)
    assert result["exit_code"] == 3


def test_the_npd_line_of_a_damaged_reading_names_the_check_and_the_file(tree):
    """node-problem-detector shows one line: 'cannot evaluate whether this node can pin 2 x 47.2...'
    said nothing; the check and the file come first."""
    import subprocess
    import sys
    t = tree(GPU_SNAPSHOT)
    t.write(f"{LEAF_PARENT}/memory.max", "garbage\n")
    r = subprocess.run([sys.executable, "-m", "repro.cli", "preflight", "--config", "none", "--root", str(t.path),
                        "--size", "47.2GiB", "--ranks", "2", "--format", "npd", "--out", str(t.base / "runs")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout.count("\n") == 1, (r.stdout, r.stderr)
    assert r.stdout.startswith("hostpin: not evaluated: headroom: damaged cgroup memory.max"), r.stdout
    assert len(r.stdout.strip()) <= 80
