"""Every check's pass, warn and fail paths, on real captured trees or on copies of them with
one named thing changed (the edge case each test names)."""
from __future__ import annotations

import json

import pytest

from diag.checks import FAIL, PASS, SKIP, WARN, Plan, all_checks
from diag.preflight import run_preflight
from diag.units import GiB

from conftest import CI_SNAPSHOT, GPU_SNAPSHOT, REFERENCE

G = GiB


def evaluate(root, **plan):
    result = run_preflight(Plan(**plan), root, cuda="captured")
    return {c["id"]: c for c in result["checks"]}, result


def status(root, check_id, **plan):
    checks, _ = evaluate(root, **plan)
    return checks[check_id]["status"], checks[check_id]


# -- headroom ---------------------------------------------------------------------------------
def test_headroom_pass_warn_fail_on_the_gpu_snapshot():
    # MemAvailable there: 125.0 GiB, MemTotal 125.9 GiB -> margin 5% = 6.3 GiB
    assert status(GPU_SNAPSHOT, "headroom", size_bytes=int(47.2 * G), ranks=2)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=60 * G, ranks=2)
    assert st == WARN and "margin" in c["summary"]
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=70 * G, ranks=2)
    assert st == FAIL and "does not fit" in c["summary"] and "per rank fits" in c["remedy"]
    assert c["evidence"]["driver_table_bytes"] == 140 * G // 4096 * 16
    assert "do not count pages pinned by the NVIDIA driver" in c["evidence"]["note"]


def test_headroom_reserve_per_rank_counts():
    """--reserve: the staging memory measured by repro staging, set aside per rank."""
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=int(55 * G), ranks=2)
    assert st == PASS
    st, c = status(GPU_SNAPSHOT, "headroom", size_bytes=int(55 * G), ranks=2, reserve_bytes=5 * G)
    assert st == WARN and c["evidence"]["reserve_bytes"] == 10 * G and "+ 10 GiB reserved" in c["summary"]


def test_headroom_without_a_size_reports_what_fits():
    st, c = status(GPU_SNAPSHOT, "headroom")
    assert st == PASS and "can be pinned now" in c["summary"]


def test_headroom_cgroup_limit_binds_for_register_not_hostalloc(tree):
    """Edge case: the container's memory.max (50 GiB) is below MemAvailable."""
    t = tree(GPU_SNAPSHOT)
    leaf = next(p for p in t.path.glob("sys/fs/cgroup/process_api/*/memory.max")).parent
    (leaf / "memory.max").write_text(str(50 * G))
    (leaf / "memory.current").write_text(str(1 * G))
    st, c = status(t.path, "headroom", size_bytes=int(47.2 * G), ranks=2)
    assert st == FAIL and "cgroup v2" in c["evidence"]["binding"]
    assert "memory.max" in c["remedy"]
    st, c = status(t.path, "headroom", size_bytes=int(47.2 * G), ranks=2, method="hostalloc")
    assert st == PASS and c["evidence"]["binding"] == "MemAvailable"


# -- swap ---------------------------------------------------------------------------------------
def test_swap_pass_when_none(tmp_path):
    st, c = status(GPU_SNAPSHOT, "swap", size_bytes=G)
    assert st == PASS and "no swap configured" in c["summary"]


def test_swap_in_use_in_a_capture_warns(tree):
    """Edge case: the paper's small node, 30 GiB of swap in use (a captured tree: no live sample)."""
    t = tree(GPU_SNAPSHOT)
    mem = (t.path / "proc/meminfo").read_text()
    mem = mem.replace("SwapTotal:             0 kB", f"SwapTotal:       {64 * 1024 * 1024} kB")
    mem = mem.replace("SwapFree:              0 kB", f"SwapFree:        {34 * 1024 * 1024} kB")
    t.write("proc/meminfo", mem)
    t.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/swap.img file 67108864 31457280 -2\n")
    st, c = status(t.path, "swap", size_bytes=int(47.2 * G))
    assert st == WARN and "30 GiB of 64 GiB swap in use" in c["summary"] and "not sampled" in c["summary"]
    assert c["evidence"]["devices"][0]["used_bytes"] == 30 * G


# -- fragmentation and THP ------------------------------------------------------------------------
def test_fragmentation_warns_for_a_thp_region_larger_than_free_order9():
    st, c = status(GPU_SNAPSHOT, "fragmentation", size_bytes=int(47.2 * G), ranks=2)
    assert st == WARN and "direct compaction" in c["summary"]
    assert c["evidence"]["free_order9_bytes"] < 4 * G
    assert "onlined or initialised on demand" in c["summary"]  # this VM plugs memory in as used


def test_fragmentation_passes_without_thp():
    assert status(GPU_SNAPSHOT, "fragmentation", size_bytes=int(47.2 * G), ranks=2, thp=False)[0] == PASS
    assert status(GPU_SNAPSHOT, "fragmentation", size_bytes=int(47.2 * G), ranks=2, method="hostalloc")[0] == PASS


def test_fragmentation_pass_and_unusable_index_warn(tree):
    """Edge cases: plenty of order-10 blocks (pass); enough order-9 for 1 GiB but most free memory
    in small blocks (unusable index > 0.5: warn)."""
    t = tree(GPU_SNAPSHOT)
    t.write("proc/buddyinfo", "Node 0, zone   Normal      0      0      0      0      0      0      0      0      0      0  50000\n")
    assert status(t.path, "fragmentation", size_bytes=int(47.2 * G), ranks=2)[0] == PASS
    t.write("proc/buddyinfo", "Node 0, zone   Normal  2000000 100000 0 0 0 0 0 0 0 0 300\n")
    st, c = status(t.path, "fragmentation", size_bytes=1 * G)
    assert st == WARN and c["evidence"]["zones"][0]["unusable_index_order9"] > 0.5


def test_thp_policy(tree):
    assert status(GPU_SNAPSHOT, "thp", size_bytes=G)[0] == PASS
    t = tree(GPU_SNAPSHOT)
    t.write("sys/kernel/mm/transparent_hugepage/defrag", "[always] defer defer+madvise madvise never\n")
    st, c = status(t.path, "thp", size_bytes=G)
    assert st == WARN and "compacts directly" in c["summary"]
    assert status(t.path, "thp", size_bytes=G, method="hostalloc")[0] == PASS
    t.write("sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    st, c = status(t.path, "thp", size_bytes=G, thp=True)
    assert st == WARN and "disabled" in c["summary"]
    t.remove("sys/kernel/mm/transparent_hugepage")
    assert status(t.path, "thp", size_bytes=G)[0] == SKIP


# -- zones ----------------------------------------------------------------------------------------------
def test_zones(tree):
    assert status(GPU_SNAPSHOT, "zones")[0] == PASS
    t = tree(GPU_SNAPSHOT)
    zi = (t.path / "proc/zoneinfo").read_text()
    t.write("proc/zoneinfo", zi + "Node 0, zone  Movable\n  pages free     262000\n        min      0\n"
                                  "        present  262144\n        managed  262144\n        cma      0\n")
    st, c = status(t.path, "zones")
    assert st == WARN and "1 GiB in ZONE_MOVABLE" in c["summary"]
    t2 = tree(REFERENCE)
    t2.write("proc/cmdline", (REFERENCE / "proc/cmdline").read_text().replace(
        "memhp_default_state=online_kernel", "memhp_default_state=online_movable movablecore=8G"))
    st, c = status(t2.path, "zones")
    assert st == WARN and "movablecore=8G" in c["summary"] and "onlined movable" in c["summary"]


# -- kernel -------------------------------------------------------------------------------------------------
def test_kernel_rules(tree):
    assert status(GPU_SNAPSHOT, "kernel", size_bytes=47 * G)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "kernel", size_bytes=2 * G, source="file", map="shared")
    assert st == FAIL and "cudaErrorInvalidValue (1)" in c["summary"] and "catalog 9" in c["summary"]
    assert status(GPU_SNAPSHOT, "kernel", size_bytes=2 * G, source="file", map="shared", readonly=True)[0] == PASS
    assert status(GPU_SNAPSHOT, "kernel", size_bytes=2 * G, source="file", map="private")[0] == PASS
    t = tree(GPU_SNAPSHOT)
    t.write("proc/sys/kernel/osrelease", "6.11.0-1003-nvidia\n")
    st, c = status(t.path, "kernel", size_bytes=47 * G)
    assert st == FAIL and "2 GiB" in c["summary"]
    assert status(t.path, "kernel", size_bytes=47 * G, chunk_bytes=2 * G)[0] == PASS
    assert status(t.path, "kernel", size_bytes=47 * G, method="mlock")[0] == PASS
    t.write("proc/sys/kernel/osrelease", "5.4.0-150-generic\n")
    assert status(t.path, "kernel", size_bytes=G)[0] == WARN


# -- driver ------------------------------------------------------------------------------------------------
def test_driver_rules(tree):
    assert status(GPU_SNAPSHOT, "driver", size_bytes=47 * G)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "driver", size_bytes=600 * G)
    assert st == FAIL and "512 GiB" in c["summary"] and "--chunk 64GiB" in c["remedy"]
    assert status(GPU_SNAPSHOT, "driver", size_bytes=600 * G, chunk_bytes=64 * G)[0] == PASS
    st, c = status(GPU_SNAPSHOT, "driver", size_bytes=47 * G, method="hostalloc")
    assert st == PASS and "zeroes every page" in c["summary"]
    t = tree(GPU_SNAPSHOT)
    t.write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.44.01  Release Build\n")
    st, c = status(t.path, "driver", size_bytes=47 * G)
    assert st == WARN and "catalog 11" in c["summary"]
    st, c = status(CI_SNAPSHOT, "driver", size_bytes=G)
    assert st == FAIL and "no NVIDIA driver" in c["summary"]
    assert status(CI_SNAPSHOT, "driver", size_bytes=G, method="mlock")[0] == SKIP


# -- device ------------------------------------------------------------------------------------------------
def _cuda(**attrs):
    base = json.loads((GPU_SNAPSHOT / "probes" / "cuda.json").read_text())
    base["devices"][0]["attributes"].update(attrs)
    return base


def test_device_capabilities(tree):
    st, c = status(GPU_SNAPSHOT, "device", size_bytes=G)
    assert st == PASS and "NVIDIA H200" in c["summary"]
    t = tree(GPU_SNAPSHOT)
    t.set_cuda(_cuda(HOST_REGISTER_SUPPORTED=0))
    st, c = status(t.path, "device", size_bytes=G)
    assert st == FAIL and "HOST_REGISTER_SUPPORTED=0" in c["summary"]
    assert status(t.path, "device", size_bytes=G, method="hostalloc")[0] == PASS
    t.set_cuda(_cuda(READ_ONLY_HOST_REGISTER_SUPPORTED=0))
    st, c = status(t.path, "device", size_bytes=G, readonly=True)
    assert st == FAIL and "(801)" in c["summary"]
    t.set_cuda(_cuda(PAGEABLE_MEMORY_ACCESS=1, PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES=1, INTEGRATED=1))
    st, c = status(t.path, "device", size_bytes=G)
    assert st == WARN and "not needed" in c["summary"]
    st, c = status(CI_SNAPSHOT, "device", size_bytes=G)
    assert st == FAIL and "no NVIDIA driver" in c["summary"]
    assert status(CI_SNAPSHOT, "device", size_bytes=G, method="mlock")[0] == SKIP
    st, c = status(REFERENCE, "device", size_bytes=G)
    assert st == SKIP and "no CUDA facts" in c["summary"]


# -- memlock, pressure, hung task ----------------------------------------------------------------------------------
def test_memlock_for_mlock(tree):
    t = tree(GPU_SNAPSHOT)
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


def test_pressure(tree):
    assert status(GPU_SNAPSHOT, "psi")[0] == PASS
    t = tree(GPU_SNAPSHOT)
    t.write("proc/pressure/memory", "some avg10=22.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=0.50 avg60=0 avg300=0 total=1\n")
    assert status(t.path, "psi")[0] == WARN
    t.write("proc/pressure/memory", "some avg10=60.00 avg60=5.00 avg300=1.00 total=1\nfull avg10=15.00 avg60=0 avg300=0 total=1\n")
    assert status(t.path, "psi")[0] == FAIL


def test_hung_task(tree):
    st, c = status(GPU_SNAPSHOT, "hung_task")
    assert st == PASS and "2.0 min" in c["summary"]
    t = tree(GPU_SNAPSHOT)
    t.write("proc/sys/kernel/hung_task_panic", "1\n")
    st, c = status(t.path, "hung_task")
    assert st == WARN and "panics the node" in c["summary"]


# -- IOMMU and NUMA ------------------------------------------------------------------------------------------------
def test_iommu(tree):
    assert status(CI_SNAPSHOT, "iommu")[0] == PASS
    t = tree(GPU_SNAPSHOT)
    t.write("sys/kernel/iommu_groups/7/type", "DMA-FQ\n")
    t.write("sys/kernel/iommu_groups/7/devices/0000:00:06.0", "")
    st, c = status(t.path, "iommu")
    assert st == WARN and "0000:00:06.0 (DMA-FQ)" in c["summary"] and "iommu=pt" in c["remedy"]
    t.write("sys/kernel/iommu_groups/7/type", "identity\n")
    assert status(t.path, "iommu")[0] == PASS


def test_numa_remote_placement(tree):
    """Edge case: two nodes, the GPU on node 1, which has 8 GiB free for a 47 GiB rank."""
    t = tree(GPU_SNAPSHOT)
    t.write("sys/devices/system/node/node1/meminfo",
            f"Node 1 MemTotal:       {256 * 1024 * 1024} kB\nNode 1 MemFree:        {8 * 1024 * 1024} kB\n")
    cuda = _cuda()
    cuda["devices"][0]["pci_numa_node"] = 1
    t.set_cuda(cuda)
    st, c = status(t.path, "numa", size_bytes=47 * G)
    assert st == WARN and "remote node" in c["summary"]
    assert status(t.path, "numa", size_bytes=4 * G)[0] == PASS


# -- every check, every tree: the conformance walk ----------------------------------------------------------------
@pytest.mark.parametrize("root", [REFERENCE, GPU_SNAPSHOT, CI_SNAPSHOT], ids=["reference", "gpu", "ci"])
@pytest.mark.parametrize("method", ["register", "hostalloc", "mlock"])
def test_every_check_returns_a_complete_verdict(root, method):
    checks = all_checks()
    assert len({c.id for c in checks}) == len(checks)
    results, result = evaluate(root, size_bytes=int(47.2 * G), ranks=2, method=method)
    assert set(results) == {c.id for c in checks}
    for c in checks:
        r = results[c.id]
        assert r["status"] in (PASS, WARN, FAIL, SKIP)
        assert r["summary"] and "crashed" not in r["summary"], (c.id, r["summary"])
        if r["status"] in (WARN, FAIL):
            assert r["remedy"], f"{c.id} {r['status']} without a remedy"
        json.dumps(r["evidence"])
    order = [r["status"] for r in result["checks"]]
    assert order == sorted(order, key=[FAIL, WARN, PASS, SKIP].index)
