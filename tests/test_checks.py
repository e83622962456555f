"""Every check's pass, warn, fail, skip and error paths, on real captured trees or on copies of them
with one named thing changed (the edge case each test names). Each boundary test names the
primary source of its rule (diag/catalog.py keeps the details)."""
from __future__ import annotations

import json

import pytest

from diag import catalog
from diag.checks import ERROR, FAIL, PASS, SKIP, WARN, Plan, register
from diag.checks.suite import all_checks
from diag.checks import _REGISTRY
from diag.checks.memory import CGROUP_BYTES_PER_PAGE
from diag.preflight import run_preflight
from diag.results import result_dict
from diag.units import GiB, MiB

from conftest import CI_SNAPSHOT, GPU_SNAPSHOT, REFERENCE

G = GiB
KiB4 = 4096


def evaluate(root, cuda="captured", strict=False, cgroup_path=None, swap_rate=None, skip=(), **plan):
    result = result_dict(run_preflight(Plan(**plan), root, cuda=cuda, strict=strict, cgroup_path=cgroup_path,
                                       swap_rate=swap_rate, skip=skip))
    return {c["id"]: c for c in result["checks"]}, result


def status(root, check_id, **plan):
    checks, _ = evaluate(root, **plan)
    return checks[check_id]["status"], checks[check_id]


def gpu_tree(tree):
    return tree(GPU_SNAPSHOT)


# -- headroom (catalog 8, 12, 16) -------------------------------------------------------------------
def test_headroom_pass_warn_fail_on_the_gpu_snapshot():
    # MemAvailable there: 125.4 GiB, MemTotal 125.9 GiB -> margin 5% = 6.3 GiB
    assert status(GPU_SNAPSHOT, "headroom", size_bytes=int(47.2 * G), ranks=2)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=60 * G, ranks=2)
    assert st == WARN and "margin" in c["summary"]
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=70 * G, ranks=2)
    assert st == FAIL and "does not fit" in c["summary"] and "per rank fits" in c["remedy"]
    # the driver's tables, 48 B per 4 KiB page for both methods (measured on the H200)
    assert c["evidence"]["driver_table_bytes"] == 140 * G // KiB4 * 48
    assert status(GPU_SNAPSHOT, "headroom", size_bytes=70 * G, ranks=2, method="hostalloc")[1]["evidence"][
        "driver_table_bytes"] == 140 * G // KiB4 * 48
    assert "do not count pages pinned by the NVIDIA driver" in c["evidence"]["note"]
    assert 8 in c["predicted"] and 16 in c["predicted"]


def test_margin_given_as_a_size_counts():
    """--margin 30GiB, not 5%: the 2 x 47.2 GiB plan passes with 5% (6.3 GiB) and warns with 30 GiB."""
    assert status(GPU_SNAPSHOT, "headroom", size_bytes=int(47.2 * G), ranks=2)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=int(47.2 * G), ranks=2, margin="30GiB")
    assert st == WARN and c["evidence"]["margin_bytes"] == 30 * G


def test_headroom_reserve_per_rank_counts():
    """--reserve: the staging memory measured by repro staging, set aside per rank."""
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=int(55 * G), ranks=2)
    assert st == PASS
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=int(55 * G), ranks=2, reserve_bytes=5 * G)
    assert st == WARN and c["evidence"]["reserve_bytes"] == 10 * G and "+ 10 GiB reserved" in c["summary"]


def test_headroom_without_a_size_reports_what_fits():
    st, c = status(GPU_SNAPSHOT, "headroom")
    assert st == PASS and "can be pinned now" in c["summary"]


def _leaf(t):
    return next(p for p in t.path.glob("sys/fs/cgroup/process_api/*/memory.max")).parent


def test_cgroup_limit_binds_for_every_method_hostalloc_included(tree):
    """Catalog 12 as measured on the H200: a touched 4 GiB cudaHostAlloc raised memory.current by
    4,113 MiB, as shmem. A 50 GiB container cannot take 2 x 47.2 GiB by any method."""
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(50 * G))
    (leaf / "memory.current").write_text(str(1 * G))
    for method in ("register", "hostalloc", "mlock"):
        checks, result = evaluate(t.path, size_bytes=int(47.2 * G), ranks=2, method=method)
        c = checks["headroom"]
        assert c["status"] == FAIL, method
        assert result["binding"] == "cgroup" and result["binding_dir"].endswith(leaf.name)
        assert "memory.max" in c["remedy"] and 12 in c["predicted"]
    # the cgroup is charged the region plus its page tables (17 B per page, measured), not the driver's vmalloc
    c = evaluate(t.path, size_bytes=4 * G, method="hostalloc")[0]["headroom"]
    assert c["evidence"]["need_cgroup_bytes"] == 4 * G + (4 * G // KiB4) * CGROUP_BYTES_PER_PAGE


def test_cgroup_headroom_is_limit_minus_usage_less_inactive_file(tree):
    """limit - (usage - inactive file): 40 GiB limit, 30 GiB used of which 20 GiB is inactive page cache
    -> 30 GiB of room, so a 25 GiB plan fits; without the cache figure it would not."""
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(40 * G))
    (leaf / "memory.current").write_text(str(30 * G))
    (leaf / "memory.stat").write_text(f"anon {10 * G}\nfile {20 * G}\ninactive_file {20 * G}\nactive_file 0\n")
    checks, result = evaluate(t.path, size_bytes=25 * G, method="mlock")
    assert checks["headroom"]["status"] in (PASS, WARN) and result["binding_bytes"] == 30 * G
    (leaf / "memory.stat").write_text(f"anon {30 * G}\ninactive_file 0\n")
    assert evaluate(t.path, size_bytes=25 * G, method="mlock")[0]["headroom"]["status"] == FAIL


def test_active_page_cache_is_reclaimable_and_shmem_is_not(tree):
    """The GPU machine's case in numbers (issue 17): a 32 GiB cgroup holding 24 GiB of page cache read
    twice (active_file 24 GiB, inactive_file ~0). 2 x 10 GiB hostalloc fits (the old rule: 7.3 GiB left,
    FAIL); v2's `file` also counts shmem, where cudaHostAlloc pages sit: 20 GiB of shmem in `file` is not
    reclaimable, and the same plan fails, saying the kernel OOM-kills (no swap in that tree)."""
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(32 * G))
    (leaf / "memory.current").write_text(str(24 * G + 700 * MiB))
    (leaf / "memory.stat").write_text(f"anon {700 * MiB}\nfile {24 * G}\nactive_file {24 * G}\ninactive_file 0\n"
                                      "shmem 0\nfile_dirty 0\nfile_writeback 0\n")
    c = evaluate(t.path, size_bytes=10 * G, ranks=2, method="hostalloc")[0]["headroom"]
    assert c["status"] == PASS, c["summary"]
    assert "evicts 12.8 GiB of the cgroup's 24 GiB page cache, 24 GiB of it active" in c["summary"], c["summary"]
    assert c["evidence"]["cgroup_reclaim"]["evicts_clean_bytes"] > 12 * G
    (leaf / "memory.stat").write_text(f"anon {700 * MiB}\nfile {24 * G}\nactive_file {4 * G}\ninactive_file 0\n"
                                      f"shmem {20 * G}\nfile_dirty 0\nfile_writeback 0\n")
    c = evaluate(t.path, size_bytes=10 * G, ranks=2, method="hostalloc")[0]["headroom"]
    assert c["status"] == FAIL and "OOM-kills" in c["summary"], c["summary"]


def test_dirty_page_cache_counts_at_the_write_rate_and_warns_when_slow(tree):
    """20 GiB of dirty page cache: reclaimable once written (100 MiB/s assumed); a pin that needs 12 GiB
    of it waits about 2 minutes for writeback, which warns."""
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(32 * G))
    (leaf / "memory.current").write_text(str(20 * G))
    (leaf / "memory.stat").write_text(f"anon 0\nfile {20 * G}\nactive_file {10 * G}\ninactive_file {10 * G}\n"
                                      f"shmem 0\nfile_dirty {19 * G}\nfile_writeback {1 * G}\n")
    c = evaluate(t.path, size_bytes=24 * G, method="mlock")[0]["headroom"]
    assert c["status"] == WARN and "dirty and is written back first" in c["summary"], c["summary"]
    assert c["evidence"]["cgroup_reclaim"]["writeback_seconds"] == pytest.approx(12 * 1024 / 100, rel=0.01)
    c = evaluate(t.path, size_bytes=12 * G + 512 * MiB, method="mlock")[0]["headroom"]  # 512 MiB of writeback: 5.12 s
    assert c["status"] == PASS and "about 5.12 s at an assumed 100 MiB/s" in c["summary"], c["summary"]


def test_every_ancestor_is_walked_with_its_own_usage(tree):
    """A parent (process_api) with 20 GiB limit and 15 GiB used binds before the leaf's 64 GiB."""
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(64 * G))
    (leaf / "memory.current").write_text(str(10 * G))
    parent = leaf.parent
    (parent / "memory.max").write_text(str(20 * G))
    (parent / "memory.current").write_text(str(15 * G))
    checks, result = evaluate(t.path, size_bytes=8 * G, method="mlock")
    assert checks["headroom"]["status"] == FAIL
    assert result["binding_dir"].endswith("process_api") and result["binding_bytes"] == 5 * G


def test_memory_high_is_where_throttling_starts(tree):
    t = gpu_tree(tree)
    leaf = _leaf(t)
    (leaf / "memory.max").write_text(str(100 * G))
    (leaf / "memory.high").write_text(str(20 * G))
    (leaf / "memory.current").write_text(str(1 * G))
    st, c = status(t.path, "headroom", size_bytes=30 * G, method="mlock")
    assert st == WARN and "memory.high" in c["summary"] and "throttling starts" in c["summary"]
    assert status(t.path, "headroom", size_bytes=10 * G, method="mlock")[0] == PASS


def test_cgroup_v1_hierarchical_memory_limit_binds(tree):
    """cgroup v1 (the CI snapshot): the leaf has no limit, an ancestor the container cannot see has 8 GiB;
    memory.stat's hierarchical_memory_limit carries it (mm/memcontrol-v1.c)."""
    t = tree(CI_SNAPSHOT)
    leaf = next(p for p in t.path.glob("sys/fs/cgroup/memory/process_api/*/memory.stat")).parent
    stat = (leaf / "memory.stat").read_text().replace("hierarchical_memory_limit 9223372036854771712",
                                                      f"hierarchical_memory_limit {8 * G}")
    (leaf / "memory.stat").write_text(stat)
    checks, result = evaluate(t.path, size_bytes=10 * G, method="mlock", cuda="off")
    assert checks["headroom"]["status"] == FAIL and result["binding"] == "cgroup"
    cg = checks["headroom"]["evidence"]["cgroup"]
    assert cg["hierarchical_limit_bytes"] == 8 * G and any(lv["inferred"] for lv in cg["levels"])


def test_cgroup_option_reads_the_named_cgroup(tree):
    """--cgroup PATH: the cgroup of the process that will pin, not preflight's own."""
    t = gpu_tree(tree)
    other = t.path / "sys/fs/cgroup/process_api/launcher"
    other.mkdir()
    (other / "memory.max").write_text(str(4 * G))
    (other / "memory.current").write_text(str(1 * G))
    checks, result = evaluate(t.path, size_bytes=8 * G, method="mlock", cgroup_path="/process_api/launcher")
    assert checks["headroom"]["status"] == FAIL and result["binding_dir"].endswith("process_api/launcher")
    checks, result = evaluate(t.path, size_bytes=8 * G, method="mlock", cgroup_path="none")
    assert checks["headroom"]["status"] == PASS and result["binding"] == "MemAvailable"
    from diag.cgroup import CgroupError
    with pytest.raises(CgroupError, match="no cgroup at"):
        evaluate(t.path, size_bytes=8 * G, cgroup_path="/nope")


# -- swap (catalog 1) -------------------------------------------------------------------------------
def _with_swap(t, total_gib: int, used_gib: float, media: str | None = None, zswap: bool | None = None):
    mem = (t.path / "proc/meminfo").read_text()
    mem = mem.replace("SwapTotal:             0 kB", f"SwapTotal:       {total_gib * 1024 * 1024} kB")
    mem = mem.replace("SwapFree:              0 kB", f"SwapFree:        {int((total_gib - used_gib) * 1024 * 1024)} kB")
    t.write("proc/meminfo", mem)
    t.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n"
                          f"/swap.img file {total_gib * 1024 * 1024} {int(used_gib * 1024 * 1024)} -2\n")
    if media:
        (t.base / "probes").mkdir(exist_ok=True)
        (t.base / "probes" / "node.json").write_text(json.dumps(
            {"page_size": 4096, "machine": "x86_64", "zswap_enabled": zswap,
             "swap_devices": [{"name": "/swap.img", "media": media, "rotational": 0, "disk": "nvme0n1"}]}))


def test_swap_pass_when_none():
    st, c = status(GPU_SNAPSHOT, "swap", size_bytes=G)
    assert st == PASS and "no swap configured" in c["summary"]


def test_swap_in_use_warns_with_the_predicted_cost_from_the_device(tree):
    """The paper's small node: 30 GiB of swap in use, what backs it not captured: the slowest kind's
    rate is assumed (an estimate) and the predicted seconds are in the evidence."""
    t = gpu_tree(tree)
    _with_swap(t, 64, 30)
    st, c = status(t.path, "swap", size_bytes=int(47.2 * G))
    ev = c["evidence"]
    assert st == WARN and "30 GiB of 64 GiB swap in use" in c["summary"]
    assert ev["exposed_bytes"] == 30 * G and ev["device_kind"] == "unknown" and ev["rate_is_estimate"]
    assert ev["predicted_pin_seconds"] == pytest.approx(30 * G / KiB4 / 2800, rel=1e-3)
    assert "MADV_WILLNEED" in c["remedy"] and "memory.swap.max=0" in c["remedy"] and "swapoff" in c["remedy"]
    assert 1 in c["predicted"]


def test_swap_exposure_is_bounded_by_the_plan(tree):
    """Other processes' swap is not the region's: a 1 GiB plan on a node with 30 GiB in swap is exposed
    for at most 1 GiB."""
    t = gpu_tree(tree)
    _with_swap(t, 64, 30, media="nvme")
    st, c = status(t.path, "swap", size_bytes=1 * G)
    assert st == WARN and c["evidence"]["exposed_bytes"] == 1 * G
    assert c["evidence"]["device_kind"] == "nvme"
    rate = catalog_rate = c["evidence"]["rate_pages_per_s"]
    assert catalog_rate > 10_000 and c["evidence"]["predicted_pin_seconds"] == pytest.approx(G / KiB4 / rate, rel=1e-3)


def test_swap_rate_per_kind_page_cluster_and_override(tree):
    t = gpu_tree(tree)
    _with_swap(t, 64, 4, media="zram")
    zram = status(t.path, "swap", size_bytes=4 * G)[1]["evidence"]
    assert zram["device_kind"] == "zram" and not zram["rate_is_estimate"]
    t.write("proc/sys/vm/page-cluster", "0\n")
    _with_swap(t, 64, 4, media="virtual")
    virt = status(t.path, "swap", size_bytes=4 * G)[1]["evidence"]
    assert virt["page_cluster"] == 0 and "scaled by 2^0/8" in virt["rate_source"]
    checks, _ = evaluate(t.path, swap_rate=16_000_000, size_bytes=4 * G)
    ev = checks["swap"]["evidence"]
    assert ev["rate_source"] == "--swap-in-rate" and ev["rate_pages_per_s"] == pytest.approx(16e6 / KiB4)


def test_swap_below_the_threshold_passes(tree):
    t = gpu_tree(tree)
    _with_swap(t, 8, 0.03)
    st, c = status(t.path, "swap", size_bytes=G)
    assert st == PASS and "below the 64 MiB threshold" in c["summary"]


def test_swap_fails_when_the_plan_cannot_fit_without_swapping(tree):
    t = gpu_tree(tree)
    _with_swap(t, 256, 1)
    st, c = status(t.path, "swap", size_bytes=70 * G, ranks=2)
    assert st == FAIL and "cannot fit without swapping" in c["summary"]
    assert c["evidence"]["predicted_pin_seconds"] > 0


def test_swap_in_a_cgroup_that_cannot_swap(tree):
    t = gpu_tree(tree)
    _with_swap(t, 64, 30)
    (_leaf(t) / "memory.swap.max").write_text("0\n")
    st, c = status(t.path, "swap", size_bytes=G)
    assert st == PASS and "cannot swap" in c["summary"]


# -- fragmentation and THP (catalog 2) --------------------------------------------------------------
def test_the_h200_warn_at_rest_was_not_fragmentation():
    """What the old WARN at rest was, from the captured tree: the buddy allocator held 3.1 GiB, 3.0 GiB of
    it already in order >= 9 blocks; the other 121.5 GiB of MemFree was not in the buddy allocator yet
    (deferred_init=lazy: initialised on demand in whole blocks). Measured on the same node: 2 x 47 GiB THP
    regions faulted with 48,384 THP allocations, no fallback, no compaction stall (h200-repro-ranks2)."""
    st, c = status(GPU_SNAPSHOT, "fragmentation", size_bytes=int(47.2 * G), ranks=2)
    ev = c["evidence"]
    assert st == PASS and "deferred_init=lazy" in c["summary"]
    assert 2.9 * G < ev["free_huge_bytes"] < 3.1 * G and 3.0 * G < ev["buddy_free_bytes"] < 3.2 * G
    assert 121 * G < ev["outside_buddy_bytes"] < 122 * G
    # node-wide 97% of the buddy's free memory is in huge blocks (the Normal zone alone: 56%, unusable 0.444)
    assert ev["unusable_index_node"] < 0.05 and ev["unusable_index"] == 0.444
    assert ev["extfrag_index"] is None  # an order-9 allocation succeeds now (the kernel prints -1.000)


def _no_outside(t):
    """Make MemFree what the buddy allocator holds (an ordinary node)."""
    mem = (t.path / "proc/meminfo").read_text()
    t.write("proc/meminfo", mem.replace("MemFree:        130684304 kB", "MemFree:          3200000 kB"))


def test_fragmented_free_memory_warns(tree):
    """Held out: plenty of free memory, all of it in blocks below order 9 (extfrag index 0.99 > 0.5)."""
    t = gpu_tree(tree)
    _no_outside(t)
    t.write("proc/buddyinfo", "Node 0, zone   Normal  500000 200000 50000 10000 0 0 0 0 0 0 0\n")
    st, c = status(t.path, "fragmentation", size_bytes=4 * G)
    assert st == WARN and "fragmented free memory" in c["summary"] and c["evidence"]["fragmented"]
    assert 2 in c["predicted"]
    assert status(t.path, "fragmentation", size_bytes=4 * G, thp=False)[0] == PASS
    assert status(t.path, "fragmentation", size_bytes=4 * G, method="hostalloc")[0] == PASS


def test_a_node_of_clean_page_cache_does_not_warn(tree):
    """Held out: 1 GiB free in huge blocks, 60 GiB of clean page cache, not fragmented (little free memory,
    in few blocks: extfrag index near 0 = lack of memory, which reclaim answers)."""
    t = gpu_tree(tree)
    mem = (t.path / "proc/meminfo").read_text()
    mem = mem.replace("MemFree:        130684304 kB", "MemFree:          1100000 kB")
    mem = mem.replace("Inactive(file):   915836 kB", f"Inactive(file):   {50 * 1024 * 1024} kB")
    mem = mem.replace("Active(file):      68196 kB", f"Active(file):      {10 * 1024 * 1024} kB")
    t.write("proc/meminfo", mem)
    t.write("proc/buddyinfo", "Node 0, zone   Normal      4      2      1      0      0      0      0      0      0    128     192\n")
    st, c = status(t.path, "fragmentation", size_bytes=20 * G)
    assert st == PASS and "clean page cache" in c["summary"] and not c["evidence"]["fragmented"]
    st, c = status(t.path, "fragmentation", size_bytes=80 * G)
    assert st == WARN and "beyond free huge blocks and clean page cache" in c["summary"]


def test_64k_page_node_gets_its_own_thp_order(tree):
    """A Grace-like node: 64 KiB pages (recorded in probes/node.json), 512 MiB PMD huge pages, order 13."""
    t = gpu_tree(tree)
    _no_outside(t)
    t.write("sys/kernel/mm/transparent_hugepage/hpage_pmd_size", str(512 << 20) + "\n")
    (t.base / "probes" / "node.json").write_text(json.dumps({"page_size": 65536, "machine": "aarch64"}))
    # 10 free order-13 blocks of 64 KiB pages = 5 GiB; lots of small blocks besides
    t.write("proc/buddyinfo", "Node 0, zone   Normal  1000 0 0 0 0 0 0 0 0 0 0 0 0 10\n")
    checks, result = evaluate(t.path, size_bytes=4 * G)
    frag = checks["fragmentation"]["evidence"]
    assert result["page_size"] == 65536 and result["page_size_source"] == "probes/node.json"
    assert frag["order"] == 13 and frag["free_huge_bytes"] == 10 * (512 << 20)
    assert checks["fragmentation"]["status"] == PASS
    assert checks["headroom"]["evidence"]["driver_table_bytes"] == 4 * G // 65536 * 48
    # the per-call page count and the 6.11 cap count 64 KiB pages too
    assert checks["kernel"]["evidence"]["per_call_pages"] == 4 * G // 65536
    assert result["facts"]["thp_order"] == 13


def test_page_size_derived_from_hpage_pmd_size_when_not_recorded(tree):
    t = gpu_tree(tree)
    t.write("sys/kernel/mm/transparent_hugepage/hpage_pmd_size", str(512 << 20) + "\n")
    _, result = evaluate(t.path, size_bytes=G)
    assert result["page_size"] == 65536 and result["page_size_source"] == "derived from hpage_pmd_size"


def test_thp_policy(tree):
    assert status(GPU_SNAPSHOT, "thp", size_bytes=G)[0] == PASS
    t = gpu_tree(tree)
    t.write("sys/kernel/mm/transparent_hugepage/defrag", "[always] defer defer+madvise madvise never\n")
    st, c = status(t.path, "thp", size_bytes=G)
    assert st == WARN and "compacts directly" in c["summary"]
    assert status(t.path, "thp", size_bytes=G, method="hostalloc")[0] == PASS
    t.write("sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    st, c = status(t.path, "thp", size_bytes=G, thp=True)
    assert st == WARN and "disabled" in c["summary"]


def test_thp_not_captured_is_not_config_off(tree):
    """A snapshot killed at 0.1 s never captured the THP files: that is 'not captured', not
    CONFIG_TRANSPARENT_HUGEPAGE=n; it decides the verdict under --strict (exit 3)."""
    t = gpu_tree(tree)
    t.remove("sys/kernel/mm/transparent_hugepage")
    st, c = status(t.path, "thp", size_bytes=G)
    assert st == SKIP and "not captured" in c["summary"] and "CONFIG_TRANSPARENT_HUGEPAGE" not in c["summary"]
    checks, result = evaluate(t.path, strict=True, size_bytes=G)
    assert checks["thp"]["status"] == ERROR and result["exit_code"] == 3
    # the capture's manifest says the directory was absent on the node: now it is CONFIG=n
    manifest = json.loads((t.base / "manifest.json").read_text())
    manifest["entries"].append({"path": "root/sys/kernel/mm/transparent_hugepage/enabled", "kind": "file",
                                "skipped": True, "reason": "absent"})
    (t.base / "manifest.json").write_text(json.dumps(manifest))
    st, c = status(t.path, "thp", size_bytes=G)
    assert st == SKIP and "CONFIG_TRANSPARENT_HUGEPAGE=n" in c["summary"]


# -- zones ----------------------------------------------------------------------------------------
def test_zones(tree):
    assert status(GPU_SNAPSHOT, "zones")[0] == PASS
    t = gpu_tree(tree)
    zi = (t.path / "proc/zoneinfo").read_text()
    t.write("proc/zoneinfo", zi.replace("Node 0, zone  Movable\n  pages free     0\n",
                                        "Node 0, zone  Movable\n  pages free     262000\n")
            .replace("        spanned  0\n        present  0\n        managed  0\n",
                     "        spanned  262144\n        present  262144\n        managed  262144\n", 1))
    st, c = status(t.path, "zones")
    assert st == WARN and "1 GiB in ZONE_MOVABLE" in c["summary"] and 5 in c["predicted"]
    t2 = tree(REFERENCE)
    t2.write("proc/cmdline", (REFERENCE / "proc/cmdline").read_text().replace(
        "memhp_default_state=online_kernel", "memhp_default_state=online_movable movablecore=8G"))
    t2.write("proc/zoneinfo", (GPU_SNAPSHOT / "root/proc/zoneinfo").read_text())
    st, c = status(t2.path, "zones")
    assert st == WARN and "movablecore=8G" in c["summary"] and "onlined movable" in c["summary"]


def test_a_damaged_zoneinfo_value_exits_3(tree):
    """The issue's case: one zoneinfo value replaced by n/a in a copy of the H200 snapshot gave exit 0."""
    t = gpu_tree(tree)
    zi = (t.path / "proc/zoneinfo").read_text()
    t.write("proc/zoneinfo", zi.replace("pages free     37750", "pages free     n/a", 1))
    checks, result = evaluate(t.path, size_bytes=G)
    assert checks["zones"]["status"] == ERROR and "damaged reading" in checks["zones"]["summary"]
    assert "free='n/a'" in checks["zones"]["summary"]
    assert result["status"] == "error" and result["exit_code"] == 3


# -- kernel rules (catalog 4, 9) ----------------------------------------------------------------------
def _release(t, text):
    t.write("proc/sys/kernel/osrelease", text + "\n")


def test_kernel_6_11_pin_cap_boundaries(tree):
    """linux 53ba78de064b (6.11) kmalloc_array()s a folio pointer per page: more than 524,288 pages
    (2 GiB) per FOLL_LONGTERM pin fails, and the pinned pages leak; fixed by 94efde1d1539 in 6.11.10."""
    t = gpu_tree(tree)
    for rel, expected in (("6.11.0", FAIL), ("6.11.9", FAIL), ("6.11.10", PASS), ("6.12.1", PASS),
                          ("6.11.0-1003-nvidia", WARN), ("6.11.5-arch1-1", WARN), ("6.10.14", PASS)):
        _release(t, rel)
        st, c = status(t.path, "kernel", size_bytes=47 * G)
        assert st == expected, (rel, c["summary"])
        if st == FAIL:
            assert "until reboot" in c["summary"] and "524,288 pages" in c["summary"] and 4 in c["predicted"]
        if st == WARN:
            assert "distribution build" in c["summary"]
    _release(t, "6.11.3")
    assert status(t.path, "kernel", size_bytes=2 * G)[0] == PASS               # exactly 524,288 pages
    assert status(t.path, "kernel", size_bytes=2 * G + KiB4)[0] == FAIL        # one page more
    assert status(t.path, "kernel", size_bytes=47 * G, chunk_bytes=2 * G)[0] == PASS
    assert status(t.path, "kernel", size_bytes=47 * G, method="mlock")[0] == PASS
    assert status(t.path, "kernel", size_bytes=47 * G, method="hostalloc")[0] == FAIL


def test_kernel_rules_only_where_the_driver_pins_long_term(tree):
    """open-gpu-kernel-modules os-mlock.c: FOLL_LONGTERM only '#if defined(NVCPU_FAMILY_X86)', first in
    550.67 (commit 3bf16b890): older drivers and arm64 builds are not affected by either kernel rule."""
    t = gpu_tree(tree)
    _release(t, "6.11.3")
    version = "NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {v}  Release Build\n"
    for arch, v, expected in (("x86_64", "550.67", FAIL), ("x86_64", "550.54.15", PASS),
                              ("aarch64", "580.159.04", PASS)):
        t.write("proc/driver/nvidia/version", version.format(arch=arch, v=v))
        st, c = status(t.path, "kernel", size_bytes=47 * G)
        assert st == expected, (arch, v, c["summary"])
        st, c = status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared")
        assert st == (FAIL if expected == FAIL else PASS)


def test_kernel_6_5_shared_file_rule(tree):
    """linux mm/gup.c writable_file_mapping_allowed (6.5): writable long-term pins of MAP_SHARED files that
    need dirty tracking are refused; shmem, hugetlbfs, ramfs allowed; fsdax refused even read-only."""
    t = gpu_tree(tree)
    st, c = status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared")
    assert st == FAIL and "cudaErrorInvalidValue" in c["summary"] and 9 in c["predicted"]
    assert status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", readonly=True)[0] == PASS
    assert status(t.path, "kernel", size_bytes=2 * G, source="file", map="private")[0] == PASS
    assert status(t.path, "kernel", size_bytes=2 * G, source="shm", map="shared")[0] == PASS
    mi = (t.path / "proc/self/mountinfo").read_text()
    t.write("proc/self/mountinfo", mi + "90 27 0:90 / /tables rw - tmpfs tmpfs rw\n"
                                        "91 27 259:3 / /pmem rw - ext4 /dev/pmem0 rw,dax=always\n"
                                        "92 27 0:92 / /huge rw - hugetlbfs hugetlbfs rw\n"
                                        "93 27 259:4 / /data rw - xfs /dev/nvme1n1 rw\n")
    assert status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", file="/tables/t.bin")[0] == PASS
    assert status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", file="/huge/t.bin")[0] == PASS
    st, c = status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", file="/data/t.bin")
    assert st == FAIL and "xfs" in c["summary"]
    st, c = status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", readonly=True,
                   file="/pmem/t.bin")
    assert st == FAIL and "fsdax" in c["summary"]
    _release(t, "6.4.16")
    assert status(t.path, "kernel", size_bytes=2 * G, source="file", map="shared", file="/data/t.bin")[0] == PASS
    _release(t, "5.4.0-150-generic")
    assert status(t.path, "kernel", size_bytes=G)[0] == WARN


# -- driver rules (catalog 3, 11) ---------------------------------------------------------------------
def test_driver_per_call_page_limit(tree):
    """open-gpu-kernel-modules nv.c nvos_create_alloc (580.65.06): one kvzalloc of 16 B per page, capped at
    INT_MAX by kvmalloc (linux mm/util.c): 2^27 = 134,217,728 pages per call fail."""
    t = gpu_tree(tree)
    limit = catalog.PER_CALL_PAGE_LIMIT
    st, c = status(t.path, "driver", size_bytes=limit * KiB4)
    assert st == FAIL and "134,217,728 pages" in c["summary"] and "--chunk 64GiB" in c["remedy"]
    assert status(t.path, "driver", size_bytes=(limit - 1) * KiB4)[0] == PASS
    assert status(t.path, "driver", size_bytes=600 * G, chunk_bytes=64 * G)[0] == PASS
    assert status(t.path, "driver", size_bytes=600 * G, method="hostalloc")[0] == FAIL
    t.write("proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.64.05  Release Build\n")
    assert status(t.path, "driver", size_bytes=600 * G)[0] == PASS
    st, c = status(CI_SNAPSHOT, "driver", size_bytes=G)
    assert st == FAIL and "no NVIDIA driver" in c["summary"]
    assert status(CI_SNAPSHOT, "driver", size_bytes=G, method="mlock")[0] == SKIP


def test_driver_page_pools(tree):
    """open-gpu-kernel-modules nv-reg.h NVreg_EnableSystemMemoryPools (590.44.01): open module only,
    default 0x211; nv-vm.c registers a shrinker per pool. cudaHostAlloc only."""
    t = gpu_tree(tree)
    t.write("proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build\n")
    st, c = status(t.path, "driver", size_bytes=47 * G, method="hostalloc")
    assert st == PASS and 11 in c["predicted"] and "reclaimable by the pools' shrinker" in c["summary"]
    assert 11 not in status(t.path, "driver", size_bytes=47 * G, method="register")[1]["predicted"]
    params = (t.path / "proc/driver/nvidia/params").read_text()
    t.write("proc/driver/nvidia/params", params + "EnableSystemMemoryPools: 0\n")
    assert 11 not in status(t.path, "driver", size_bytes=47 * G, method="hostalloc")[1]["predicted"]
    t.write("proc/driver/nvidia/params", params)
    t.write("proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  590.44.01  Release Build\n")
    assert 11 not in status(t.path, "driver", size_bytes=47 * G, method="hostalloc")[1]["predicted"]
    st, c = status(GPU_SNAPSHOT, "driver", size_bytes=47 * G, method="hostalloc")
    assert st == PASS and "zeroes every page" in c["summary"]


def test_driver_not_captured_is_an_error_for_a_gpu_plan(tree):
    t = gpu_tree(tree)
    t.remove("proc/driver/nvidia")
    st, c = status(t.path, "driver", size_bytes=G)
    assert st == ERROR and "not captured" in c["summary"]
    assert status(t.path, "driver", size_bytes=G, method="mlock")[0] == SKIP


# -- device (catalog 9) --------------------------------------------------------------------------------
def _cuda(**attrs):
    base = json.loads((GPU_SNAPSHOT / "probes" / "cuda.json").read_text())
    base["devices"][0]["attributes"].update(attrs)
    return base


def test_device_capabilities(tree):
    st, c = status(GPU_SNAPSHOT, "device", size_bytes=G)
    assert st == PASS and "NVIDIA H200" in c["summary"]
    t = gpu_tree(tree)
    t.set_cuda(_cuda(HOST_REGISTER_SUPPORTED=0))
    st, c = status(t.path, "device", size_bytes=G)
    assert st == FAIL and "HOST_REGISTER_SUPPORTED=0" in c["summary"]
    assert status(t.path, "device", size_bytes=G, method="hostalloc")[0] == PASS
    t.set_cuda(_cuda(READ_ONLY_HOST_REGISTER_SUPPORTED=0))
    st, c = status(t.path, "device", size_bytes=G, readonly=True)
    assert st == FAIL and "(801)" in c["summary"]
    st, c = status(CI_SNAPSHOT, "device", size_bytes=G)
    assert st == FAIL and "no NVIDIA driver" in c["summary"]
    assert status(CI_SNAPSHOT, "device", size_bytes=G, method="mlock")[0] == SKIP
    st, c = status(REFERENCE, "device", size_bytes=G)
    assert st == ERROR and "no CUDA facts" in c["summary"]
    assert status(REFERENCE, "device", size_bytes=G, method="mlock")[0] == SKIP


def test_pageable_memory_access_advice_needs_host_page_tables(tree):
    """'Registration unnecessary' only with PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES=1 (ATS); through
    HMM the GPU faults and migrates pages (CUDA programming guide, system allocated memory; cudaMallocHost:
    'may not page-lock' only where pageableMemoryAccessUsesHostPageTables)."""
    t = gpu_tree(tree)
    t.set_cuda(_cuda(PAGEABLE_MEMORY_ACCESS=1, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES=1, INTEGRATED=1))
    st, c = status(t.path, "device", size_bytes=G)
    assert st == WARN and "registration is unnecessary" in c["summary"]
    t.set_cuda(_cuda(PAGEABLE_MEMORY_ACCESS=1, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES=0))
    st, c = status(t.path, "device", size_bytes=G)
    assert st == PASS and "HMM" in c["summary"] and "unnecessary" not in c["summary"]


def test_a_garbled_cuda_probe_is_an_error_not_ok(tree):
    t = gpu_tree(tree)
    garbled = _cuda()
    garbled["devices"] = "ok"
    t.set_cuda(garbled)
    st, c = status(t.path, "device", size_bytes=G)
    assert st == ERROR and "garbled" in c["summary"]
    (t.base / "probes" / "cuda.json").write_text("{not json")
    checks, result = evaluate(t.path, size_bytes=G)
    assert checks["device"]["status"] == ERROR and result["exit_code"] == 3


# -- memlock, pressure, hung task -------------------------------------------------------------------------
def test_memlock_for_mlock(tree):
    t = gpu_tree(tree)
    limits = (t.path / "proc/self/limits").read_text()
    t.write("proc/self/limits", limits.replace(
        "Max locked memory         unlimited            unlimited", "Max locked memory         65536                65536"))
    status_text = (t.path / "proc/self/status").read_text()
    t.write("proc/self/status", "\n".join(
        "CapEff:\t0000000000000000" if l.startswith("CapEff") else l for l in status_text.splitlines()))
    st, c = status(t.path, "memlock", size_bytes=G, method="mlock")
    assert st == FAIL and "ENOMEM" in c["summary"]
    assert status(t.path, "memlock", size_bytes=G, method="register")[0] == PASS
    t.write("proc/self/status", status_text)  # root's CapEff has CAP_IPC_LOCK
    st, c = status(t.path, "memlock", size_bytes=G, method="mlock")
    assert st == PASS and "CAP_IPC_LOCK" in c["summary"]
    # a damaged limit is not 'unlimited'
    t.write("proc/self/limits", limits.replace(
        "Max locked memory         unlimited            unlimited", "Max locked memory         lots                 unlimited"))
    assert status(t.path, "memlock", size_bytes=G, method="mlock")[0] == ERROR


def test_pressure(tree):
    assert status(GPU_SNAPSHOT, "psi")[0] == PASS
    t = gpu_tree(tree)
    t.write("proc/pressure/memory", "some avg10=22.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=0.50 avg60=0 avg300=0 total=1\n")
    assert status(t.path, "psi")[0] == WARN
    t.write("proc/pressure/memory", "some avg10=60.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=15.00 avg60=0 avg300=0 total=1\n")
    assert status(t.path, "psi")[0] == FAIL
    t.write("proc/pressure/memory", "some avg10=x avg60=5.00 avg300=1.00 total=1\n")
    assert status(t.path, "psi")[0] == ERROR


def test_hung_task(tree):
    st, c = status(GPU_SNAPSHOT, "hung_task")
    assert st == PASS and "2.0 min" in c["summary"]
    t = gpu_tree(tree)
    t.write("proc/sys/kernel/hung_task_panic", "1\n")
    st, c = status(t.path, "hung_task")
    assert st == WARN and "panics the node" in c["summary"] and 6 in c["predicted"]


# -- IOMMU, NUMA, co-tenants ---------------------------------------------------------------------------
def test_iommu(tree):
    t = gpu_tree(tree)
    t.write("sys/kernel/iommu_groups/7/type", "DMA-FQ\n")
    t.write("sys/kernel/iommu_groups/7/devices/0000:00:06.0", "")
    st, c = status(t.path, "iommu")
    assert st == WARN and "0000:00:06.0 (DMA-FQ)" in c["summary"] and "iommu=pt" in c["remedy"]
    t.write("sys/kernel/iommu_groups/7/type", "identity\n")
    assert status(t.path, "iommu")[0] == PASS


def test_numa_sums_the_ranks_that_share_a_node(tree):
    """Two GPUs on node 1, 60 GiB free there: one 40 GiB rank fits, two ranks sharing the node do not."""
    t = gpu_tree(tree)
    for node in (0, 1):
        t.write(f"sys/devices/system/node/node{node}/meminfo", f"Node {node} MemTotal:       {256 * 1024 * 1024} kB\n"
                                                               f"Node {node} MemFree:        {60 * 1024 * 1024} kB\n")
    cuda = _cuda()
    second = json.loads(json.dumps(cuda["devices"][0]))
    second.update(index=1, pci_bus_id="0000:00:07.0")
    cuda["devices"].append(second)
    for dev in cuda["devices"]:
        dev["pci_numa_node"] = 1
    t.set_cuda(cuda)
    assert status(t.path, "numa", size_bytes=40 * G, ranks=1)[0] == PASS
    st, c = status(t.path, "numa", size_bytes=40 * G, ranks=2)
    assert st == WARN and "ranks 0, 1 need 80 GiB" in c["summary"] and 14 in c["predicted"]
    cuda["devices"][0]["pci_numa_node"] = 0
    t.set_cuda(cuda)
    assert status(t.path, "numa", size_bytes=40 * G, ranks=2)[0] == PASS


def test_cotenants(tree):
    st, c = status(GPU_SNAPSHOT, "cotenants", size_bytes=G)
    assert st == PASS and "no other GPU process" in c["summary"]
    t = gpu_tree(tree)
    (t.base / "commands").mkdir()
    (t.base / "commands" / "nvidia-smi-apps.txt").write_text(
        "pid, process_name, used_gpu_memory [MiB]\n4242, python3, 81920 MiB\n")
    st, c = status(t.path, "cotenants", size_bytes=G)
    assert st == WARN and "pid 4242 (python3, 80 GiB" in c["summary"] and 7 in c["predicted"]
    vm = (t.path / "proc/vmstat").read_text()
    (t.base / "commands" / "nvidia-smi-apps.txt").write_text("pid, process_name, used_gpu_memory [MiB]\n")
    t.write("proc/vmstat", vm.replace("nr_foll_pin_acquired 2048", "nr_foll_pin_acquired 4196352"))
    st, c = status(t.path, "cotenants", size_bytes=G)
    assert st == WARN and "16 GiB pinned now by other pinners" in c["summary"]
    st, c = status(CI_SNAPSHOT, "cotenants", size_bytes=G)
    assert st == PASS and "no NVIDIA driver" in c["summary"]


# -- the gate --------------------------------------------------------------------------------------------
def test_a_crashing_check_is_an_error_and_exits_3():
    @register("crashes", "a check that crashes (test only)")
    def crashes(ctx):
        raise KeyError("boom")
    try:
        checks, result = evaluate(GPU_SNAPSHOT, size_bytes=G)
    finally:  # by name: registered before the check modules were imported, it is not the last
        _REGISTRY[:] = [c for c in _REGISTRY if c.id != "crashes"]
    assert checks["crashes"]["status"] == ERROR and "check crashed: KeyError" in checks["crashes"]["summary"]
    assert result["status"] == "error" and result["exit_code"] == 3
    assert result["verdict"].startswith("cannot evaluate")


def test_skip_accepts_a_gap():
    checks, result = evaluate(REFERENCE, size_bytes=G, cgroup_path="none", skip=("psi", "device"))
    assert result["exit_code"] == 0 and checks["psi"]["status"] == SKIP


# -- every check, every tree: the conformance walk ------------------------------------------------------------
@pytest.mark.parametrize("root", [REFERENCE, GPU_SNAPSHOT, CI_SNAPSHOT], ids=["reference", "gpu", "ci"])
@pytest.mark.parametrize("method", ["register", "hostalloc", "mlock"])
def test_every_check_returns_a_complete_verdict(root, method):
    checks = all_checks()
    assert len({c.id for c in checks}) == len(checks)
    results, result = evaluate(root, size_bytes=int(47.2 * G), ranks=2, method=method)
    assert set(results) == {c.id for c in checks}
    for c in checks:
        r = results[c.id]
        assert r["status"] in (PASS, WARN, FAIL, SKIP, ERROR)
        assert r["summary"] and "crashed" not in r["summary"], (c.id, r["summary"])
        if r["status"] in (WARN, FAIL, ERROR) and "not captured" not in r["summary"] and "no CUDA" not in r["summary"]:
            assert r["remedy"], f"{c.id} {r['status']} without a remedy"
        if r["status"] == ERROR:
            assert r["missing"], c.id
        assert set(r["predicted"]) <= set(catalog.entry(e).id for e in r["predicted"])
        json.dumps(r["evidence"])
    order = [r["status"] for r in result["checks"]]
    assert order == sorted(order, key=[ERROR, FAIL, WARN, PASS, SKIP].index)
    expected = 3 if ERROR in order else 1 if FAIL in order else 0
    assert result["exit_code"] == expected


def test_a_read_only_registration_of_a_private_file_warns_catalog_17(run_cli):
    """Catalog 17, measured on the H200 whose snapshot this is: the read-only flag on a MAP_PRIVATE
    file spun there (cold page cache); default flags on the same mapping read and copied it."""
    from conftest import GPU_SNAPSHOT
    import json
    args = ("preflight", "--root", str(GPU_SNAPSHOT), "--size", "4GiB", "--source", "file", "--map", "private",
            "--json")
    r = run_cli(*args, "--readonly")
    kernel = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "kernel")
    assert kernel["status"] == "warn" and kernel["predicted"] == [17] and "vmtouch" in kernel["remedy"]
    r = run_cli(*args)
    kernel = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "kernel")
    assert kernel["status"] == "pass" and 17 not in kernel["predicted"]


def test_a_missing_cgroup_points_to_the_option_that_keeps_the_check(tmp_path):
    """The H200 reference capture lacks the process's cgroup line: the remedy names --cgroup (which
    keeps the headroom check, judged against MemAvailable), not --skip headroom (which drops it)."""
    from conftest import hostpin
    base = ["preflight", "--root", str(REFERENCE), "--size", "47.2GiB", "--ranks", "2", "--no-cuda", "--skip", "psi",
            "--json", "--out", str(tmp_path)]
    head = next(c for c in json.loads(hostpin(*base).stdout)["checks"] if c["id"] == "headroom")
    assert head["status"] == ERROR and "--cgroup none" in head["remedy"] and "--skip" not in head["remedy"]
    followed = next(c for c in json.loads(hostpin(*base, "--cgroup", "none").stdout)["checks"] if c["id"] == "headroom")
    assert followed["status"] in (PASS, FAIL) and "MemAvailable" in followed["summary"]
