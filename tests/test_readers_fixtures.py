"""Readers against trees captured on real hosts: the H200 reference capture, a hostpin snapshot
of the GPU machine, and one of the CI machine. Values are the ones in those files."""
from __future__ import annotations

import json

from diag import buddyinfo, cgroup, hotplug, kernel, limits, meminfo, numa, nvidia, swap, thp, vmstat, zoneinfo
from diag.evidence import load_manifest, verify_manifest
from diag.rootfs import Root, resolve_root
from diag.units import GiB

from conftest import CI_SNAPSHOT, GPU_SNAPSHOT, REFERENCE


def test_reference_tree_reads_like_a_live_machine():
    r = Root(REFERENCE)
    m = meminfo.read_meminfo(r)
    assert m.total_bytes == 131981020 * 1024 and m.available_bytes == 131481032 * 1024
    assert m.swap_total_bytes == 0 and m.cma_total_bytes is None and "CmaTotal" in m.missing
    assert kernel.release_from_version(r.read_text("proc/version")) == "6.18.44-fc-v657-gpu"
    assert kernel.read_release(r) == "6.18.44-fc-v657-gpu"  # osrelease absent: falls back to proc/version
    assert kernel.read_cmdline(r)["memhp_default_state"] == "online_kernel"
    t = thp.read_thp(r)
    assert (t.enabled, t.defrag, t.khugepaged_defrag, t.shmem_enabled) == ("madvise", "madvise", "1", "never")
    assert limits.read_memlock(r) == (None, None)
    assert swap.read_swaps(r) == []
    v = vmstat.read_vmstat(r)  # only vmstat.partial was captured
    assert v["nr_free_pages"] == 824611 and v["compact_stall"] == 0


def test_reference_buddyinfo_and_pagetypeinfo():
    r = Root(REFERENCE)
    zones = buddyinfo.read_buddyinfo(r)
    assert [z.zone for z in zones] == ["DMA", "DMA32", "Normal"]
    normal = zones[2]
    assert normal.counts == [1, 0, 2, 2, 1, 3, 5, 18, 17, 8, 37]
    assert buddyinfo.free_bytes_at_or_above(normal.counts, 9) == (8 * 512 + 37 * 1024) * 4096
    assert buddyinfo.unusable_free_index(normal.counts, 9) == 0.144
    pti = buddyinfo.read_pagetypeinfo(r)
    assert pti["pageblock_order"] == 9
    assert pti["free"][(0, "Normal", "Movable")][-1] == 13
    assert pti["blocks"][(0, "Normal")]["Unmovable"] == 188
    # the free lists by migrate type add up to buddyinfo's totals, per order
    for order in range(11):
        total = sum(c[order] for (n, z, t), c in pti["free"].items() if z == "Normal")
        assert total == normal.counts[order]


def test_reference_nvidia_driver():
    nv = nvidia.read_nvidia(Root(REFERENCE))
    assert nv.loaded and nv.version.version == (580, 159, 4) and nv.version.open_module is True
    assert nvidia.version_str(nv.version.version) == "580.159.04"
    assert nv.params["InitializeSystemMemoryAllocations"] == "1"
    assert nv.params["RegistryDwords"] == ""


def test_gpu_snapshot():
    r = Root(resolve_root(GPU_SNAPSHOT))
    assert r.path.name == "root"
    nv = nvidia.read_nvidia(r)
    assert list(nv.gpus) == ["0000:00:06.0"] and nv.gpus["0000:00:06.0"]["Model"] == "NVIDIA H200"
    z = zoneinfo.read_zoneinfo(r)
    assert {x.zone for x in z} >= {"DMA", "DMA32", "Normal"}
    assert all(x.managed_pages is not None for x in z)
    cg = cgroup.read_cgroup_memory(r)
    assert cg.version == 2 and cg.path.startswith("/process_api/")
    assert cg.levels and cg.levels[0].usage_bytes > 0
    hp = hotplug.read_hotplug_policy(r)
    assert hp.auto_online_blocks == "online_kernel" and not hp.hot_added_goes_movable
    nodes = numa.read_numa_nodes(r)
    # this VM's node 0 reports only its boot memory (4.3 GiB) while /proc/meminfo has 125 GiB:
    # memory is plugged in as it is used; the reader reports what the kernel says
    assert [n.node for n in nodes] == [0] and nodes[0].total_bytes == 4659331072
    assert numa.read_pci_numa_node(r, "0000:00:06.0") is None  # the kernel printed -1
    cuda = json.loads((GPU_SNAPSHOT / "probes" / "cuda.json").read_text())
    assert cuda["status"] == "ok" and cuda["devices"][0]["attributes"]["HOST_REGISTER_SUPPORTED"] == 1


def test_ci_snapshot_cgroup_v1_and_no_driver():
    r = Root(resolve_root(CI_SNAPSHOT))
    cg = cgroup.read_cgroup_memory(r)
    assert cg.version == 1 and cg.path.startswith("/process_api/")
    assert cg.usage_bytes > 0
    assert not nvidia.read_nvidia(r).loaded
    assert r.exists("sys/kernel/iommu_groups")  # kept by the manifest although empty (git drops it)
    cuda = json.loads((CI_SNAPSHOT / "probes" / "cuda.json").read_text())
    assert cuda["status"] == "no_driver" and "libcuda" in cuda["message"]


def test_snapshot_manifests_verify():
    for run in (GPU_SNAPSHOT, CI_SNAPSHOT):
        manifest = load_manifest(run)
        assert manifest["complete"] and manifest["command"] == "snapshot"
        assert verify_manifest(run) == []
        kinds = {e["kind"] for e in manifest["entries"]}
        assert {"file", "probe", "command"} <= kinds


def test_cgroup_v2_binding_level_is_the_tightest(tree):
    """Constructed from the GPU snapshot: a parent limit tighter than the leaf's binds."""
    t = tree(GPU_SNAPSHOT)
    cg = cgroup.read_cgroup_memory(Root(t.path))
    leaf = cg.dir
    parent = leaf.rsplit("/", 1)[0]
    t.write(f"{leaf}/memory.max", str(64 * GiB))
    t.write(f"{leaf}/memory.current", str(10 * GiB))
    t.write(f"{parent}/memory.max", str(20 * GiB))
    t.write(f"{parent}/memory.current", str(15 * GiB))
    cg = cgroup.read_cgroup_memory(Root(t.path))
    assert cg.limit_dir == parent and cg.headroom_bytes == 5 * GiB
