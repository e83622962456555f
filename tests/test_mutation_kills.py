"""Tests that notice: each one fails when a behaviour that decides a verdict, a bound, an ETA, a
confinement or a cleanup goes wrong in one small way (bench/mutations.py breaks the code on purpose
and runs the test named for it). Inputs are real: copies of captured trees with one named thing
changed, stacks recorded on the H200, a recorded timeline, a real tmpfs, a real symbolic link."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from diag import catalog
from diag.checks import FAIL, PASS, WARN, Plan
from diag.preflight import run_preflight
from diag.process import parse_stack
from diag.results import result_dict
from diag.units import GiB, MiB
from diag.watch.bounds import catalog_for, estimate_eta, remedy_for
from diag.watch.frames import stack_bound

from conftest import CI_SNAPSHOT, FIXTURES, GPU_SNAPSHOT, IS_ROOT, REFERENCE, hostpin

G = GiB


def evaluate(root, cuda="captured", **plan):
    result = result_dict(run_preflight(Plan(**plan), root, cuda=cuda))
    return {c["id"]: c for c in result["checks"]}, result


def gpu_leaf(t):
    return next(p for p in t.path.glob("sys/fs/cgroup/process_api/*/memory.max")).parent


def ci_leaf(t):
    return next(p for p in t.path.glob("sys/fs/cgroup/memory/process_api/*/memory.stat")).parent


def with_swap(t, total_gib: int, used_gib: float):
    """The captured meminfo and swaps with swap configured and in use (the trees had none)."""
    mem = (t.path / "proc/meminfo").read_text()
    mem = mem.replace("SwapTotal:             0 kB", f"SwapTotal:       {total_gib * 1024 * 1024} kB")
    mem = mem.replace("SwapFree:              0 kB", f"SwapFree:        {int((total_gib - used_gib) * 1024 * 1024)} kB")
    assert f"SwapTotal:       {total_gib * 1024 * 1024} kB" in mem
    t.write("proc/meminfo", mem)
    t.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n"
                          f"/swap.img file {total_gib * 1024 * 1024} {int(used_gib * 1024 * 1024)} -2\n")


# -- 1: the cgroup's margin is a share of the cgroup's limit, not of MemTotal ---------------------------
def test_the_cgroup_margin_is_five_percent_of_its_limit(tree):
    """The H200 snapshot (MemTotal 125.9 GiB) with the leaf's memory.max at 16 GiB: 12 GiB fits with
    the cgroup's 5% margin (0.8 GiB). 5% of MemTotal (6.3 GiB) would WARN (exit 1 under --strict)."""
    t = tree(GPU_SNAPSHOT)
    (gpu_leaf(t) / "memory.max").write_text(str(16 * G))
    checks, result = evaluate(t.path, size_bytes=12 * G, method="mlock")
    c = checks["headroom"]
    assert result["binding"] == "cgroup"
    assert c["evidence"]["margin_bytes"] == int(16 * G * 5 / 100)       # 0.8 GiB
    assert c["evidence"]["node_margin_bytes"] == int(131981020 * 1024 * 5 / 100)
    assert c["status"] == PASS, c["summary"]


# -- 2: the driver-pools rule (catalog 11) compares the whole version ---------------------------------
def test_driver_pools_boundary_inside_the_major_version(tree):
    """NVreg_EnableSystemMemoryPools came in tag 590.44.01: 590.40.07 (same major, before it) has no
    pools; 590.44.01 and 590.48.01 have them."""
    t = tree(GPU_SNAPSHOT)
    banner = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build\n"
    for version, pooled in (("590.40.07", False), ("590.44.01", True), ("590.48.01", True), ("595.10", True)):
        t.write("proc/driver/nvidia/version", banner.format(version))
        c = evaluate(t.path, size_bytes=47 * G, method="hostalloc")[0]["driver"]
        assert (11 in c["predicted"]) is pooled, (version, c["summary"])


# -- 3: cgroup v1, memsw limit equal to the memory limit forbids swap -------------------------------
def test_cgroup_v1_memsw_equal_to_the_limit_cannot_swap(tree):
    """The CI snapshot (cgroup v1) with 30 GiB in swap: the leaf with memory.memsw.limit_in_bytes equal
    to memory.limit_in_bytes (the v1 way to forbid swap) cannot swap; one byte-page more and it can."""
    t = tree(CI_SNAPSHOT)
    with_swap(t, 64, 30)
    leaf = ci_leaf(t)
    (leaf / "memory.limit_in_bytes").write_text(str(8 * G))
    (leaf / "memory.memsw.limit_in_bytes").write_text(str(8 * G))
    c = evaluate(t.path, size_bytes=G, method="mlock", cuda="off")[0]["swap"]
    assert c["status"] == PASS and "cannot swap" in c["summary"], c["summary"]
    assert c["evidence"]["can_swap"] is False
    (leaf / "memory.memsw.limit_in_bytes").write_text(str(8 * G + 4096))
    c = evaluate(t.path, size_bytes=G, method="mlock", cuda="off")[0]["swap"]
    assert c["status"] == WARN and "pinning it back takes" in c["summary"], c["summary"]


# -- 4: cgroup v1 hierarchical usage pairs with total_inactive_file -----------------------------------
def test_cgroup_v1_usage_pairs_with_total_inactive_file(tree):
    """v1's memory.usage_in_bytes counts the children's pages; its local inactive_file does not. A leaf
    whose 4 GiB of page cache belongs to a sub-cgroup (inactive_file 0, total_inactive_file 4 GiB),
    limit 8 GiB, usage 6 GiB: the working set is 2 GiB and a 4 GiB plan fits. Taking the local figure
    would put the working set at 6 GiB and FAIL it."""
    t = tree(CI_SNAPSHOT)
    leaf = ci_leaf(t)
    (leaf / "memory.limit_in_bytes").write_text(str(8 * G))
    (leaf / "memory.usage_in_bytes").write_text(str(6 * G))
    stat = (leaf / "memory.stat").read_text()
    stat = stat.replace("\ninactive_file 449892352\n", "\ninactive_file 0\n")
    stat = stat.replace("total_inactive_file 449892352", f"total_inactive_file {4 * G}")
    assert f"total_inactive_file {4 * G}" in stat and "\ninactive_file 0\n" in stat
    (leaf / "memory.stat").write_text(stat)
    checks, result = evaluate(t.path, size_bytes=4 * G, method="mlock", cuda="off")
    level = checks["headroom"]["evidence"]["cgroup"]["levels"][0]
    assert level["inactive_file_bytes"] == 4 * G and level["working_set_bytes"] == 2 * G
    assert result["binding"] == "cgroup" and result["binding_bytes"] == 6 * G
    assert checks["headroom"]["status"] == PASS, checks["headroom"]["summary"]


# -- 5: ZONE_MOVABLE counted in the node's own pages ----------------------------------------------
def test_movable_zone_on_a_64k_page_node(tree):
    """A Grace-like node (64 KiB pages, recorded in probes/node.json) with 16,384 managed pages in
    ZONE_MOVABLE: that is 1 GiB, not the 64 MiB a 4 KiB page would make of it."""
    t = tree(GPU_SNAPSHOT)
    (t.base / "probes" / "node.json").write_text(json.dumps({"page_size": 65536, "machine": "aarch64"}))
    t.write("sys/kernel/mm/transparent_hugepage/hpage_pmd_size", str(512 << 20) + "\n")
    zi = (t.path / "proc/zoneinfo").read_text()
    movable = "Node 0, zone  Movable\n  pages free     0\n"
    assert movable in zi
    head, tail = zi.split(movable, 1)
    tail = tail.replace("        spanned  0\n        present  0\n        managed  0\n",
                        "        spanned  16384\n        present  16384\n        managed  16384\n", 1)
    t.write("proc/zoneinfo", head + "Node 0, zone  Movable\n  pages free     16000\n" + tail)
    checks, result = evaluate(t.path, size_bytes=G)
    c = checks["zones"]
    assert result["page_size"] == 65536
    assert c["evidence"]["movable_managed_bytes"] == 16384 * 65536
    assert c["status"] == WARN and "1 GiB in ZONE_MOVABLE" in c["summary"], c["summary"]


# -- 6: the reclaim bound names the entry of the reclaim it is ----------------------------------------
def _recorded_node_reclaim() -> list[str]:
    """The H200 reference capture: the memory hog (k623) in direct reclaim, writing pages to swap
    (try_to_free_pages under __alloc_pages_slowpath)."""
    stacks = [s["k623"] for s in json.loads((REFERENCE / "swap-stall-timeline.json").read_text())
              if "try_to_free_pages" in (s.get("k623") or "")]
    assert stacks
    return parse_stack(stacks[0])


# mm/vmscan.c and mm/memcontrol.c (6.18): a charge over memory.max reclaims from the cgroup itself
MEMCG_RECLAIM = ["shrink_folio_list", "shrink_inactive_list", "shrink_lruvec", "shrink_node_memcgs", "shrink_node",
                 "do_try_to_free_pages", "try_to_free_mem_cgroup_pages", "try_charge_memcg", "__mem_cgroup_charge",
                 "do_anonymous_page", "__handle_mm_fault", "handle_mm_fault", "__get_user_pages",
                 "__gup_longterm_locked", "pin_user_pages", "os_lock_user_pages [nvidia]"]


def test_reclaim_names_headroom_on_the_node_and_the_limit_in_a_cgroup():
    frames = _recorded_node_reclaim()
    assert "__alloc_pages_slowpath" in [f.split(".")[0] for f in frames]
    bound, frame = stack_bound(frames)
    assert bound == "reclaim"
    assert catalog_for(bound, {"frame": frame}) == 8, frame
    assert remedy_for(bound, catalog_for(bound, {"frame": frame})) == catalog.entry(8).remedy
    bound, frame = stack_bound(MEMCG_RECLAIM)
    assert bound == "reclaim"
    assert catalog_for(bound, {"frame": frame}) == 12, frame
    assert remedy_for(bound, 12) == catalog.entry(12).remedy
    # a lock taken inside the cgroup's reclaim is that reclaim's too
    bound, frame = stack_bound(["rwsem_down_read_slowpath", "down_read"] + MEMCG_RECLAIM)
    assert bound == "reclaim" and catalog_for(bound, {"frame": frame}) == 12, frame


# -- 7: the ETA counts a page once -------------------------------------------------------------------
def test_eta_arithmetic_counts_pages_in_swap_once():
    """The recorded 32 GiB swap-bound registration on the H200 (h200-repro-swap32), its first two
    seconds of pin phase: pages still in VmSwap come back at the process's own swap-in rate, the
    rest of the pages left at the node's measured clean rate, each page once. The live tests judge
    this within 25%; this one checks the formula exactly."""
    run = FIXTURES / "h200-repro-swap32"
    result = json.loads((run / "result.json").read_text())
    samples = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    window = [s for s in samples if s.get("phase") == "pin"][:5]
    pid = next(iter(window[0]["procs"]))
    dt = window[-1]["t"] - window[0]["t"]
    swapin = round((window[0]["procs"][pid]["vm_swap"] - window[-1]["procs"][pid]["vm_swap"]) / 4096 / dt, 1)
    cal = result["calibration"]
    clean = cal["bytes"] / 4096 / cal["seconds"]
    expected = result["expected_pages"]
    swap_left = window[-1]["procs"][pid]["vm_swap"] // 4096
    done = 2_000_000
    eta = estimate_eta(window, done, expected, swap_left, clean_pages_s=clean, pids={pid})
    assert eta["swapin_pages_s"] == swapin and 100_000 < swapin < 200_000
    rest = expected - done - swap_left
    assert rest > 0
    assert eta["eta_s"] == pytest.approx(swap_left / swapin + rest / clean, rel=1e-9)
    # the figures: 1,000,000 pages in swap at 50,000 pages/s (20 s) and 1,400,000 more at
    # 100,000 pages/s (14 s) is 34.0 s, not the 43.0 s of counting the swapped ones again
    fixed = [{"t": 0.0, "vm": {}, "procs": {1: {"vm_swap": 2_000_000 * 4096}}},
             {"t": 1.0, "vm": {}, "procs": {1: {"vm_swap": 1_950_000 * 4096}}}]
    eta = estimate_eta(fixed, 600_000, 3_000_000, 1_000_000, clean_pages_s=100_000)
    assert eta["eta_s"] == pytest.approx(34.0)
    # fewer pages left than in swap: only the pages left count
    eta = estimate_eta(fixed, 2_500_000, 3_000_000, 1_000_000, clean_pages_s=100_000)
    assert eta["eta_s"] == pytest.approx(10.0)


# -- 8: a run directory reached through a link is refused --------------------------------------------
def test_bundle_refuses_a_run_named_through_a_symlink(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "ci-preflight", run, symlinks=True)
    assert hostpin("bundle", str(run), "-o", str(tmp_path / "real.tar.gz")).returncode == 0
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    r = hostpin("bundle", str(link), "-o", str(tmp_path / "b.tar.gz"))
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "symbolic link" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b.tar.gz").exists()


# -- 9: a file that did not become swap is removed ---------------------------------------------------
@pytest.mark.skipif(not IS_ROOT, reason="mounts a tmpfs (root)")
def test_a_swap_file_that_swapon_refused_is_removed(tmp_path):
    """--swap-dir on tmpfs: the file is created and allocated (in RAM), then swapon refuses it
    (EINVAL: tmpfs has no swap support). It must not be left behind."""
    from repro.swapfile import PREFIX, SwapError, SwapFile, active_swaps
    mnt = tmp_path / f"hostpin-tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2G", f"hostpin-test-{mnt.name}", str(mnt)], check=True)
    try:
        sf = SwapFile(mnt, 4 * MiB)
        with pytest.raises(SwapError, match="swapon .*tmpfs"):
            sf.create()
        assert not sf.active and str(sf.path) not in active_swaps()
        assert [p.name for p in mnt.iterdir() if p.name.startswith(PREFIX)] == []
        assert os.statvfs(mnt).f_bfree == os.statvfs(mnt).f_blocks  # nothing of it holds RAM
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
