"""`hostpin snapshot`: capture the node's pin-relevant state, without judging it.

The tree it writes (RUN/root/...) has the layout of / so that `hostpin preflight --root RUN`
and the tests read it exactly like a live machine. Symlinks that readers list (IOMMU group
members, /sys/class/iommu) are kept as empty marker files with the link target in the
manifest. CUDA facts go to RUN/probes/cuda.json, command outputs to RUN/commands/.

`--root DIR` copies someone else's tree: nothing in it is followed. A file that is a link, or
lies under a linked directory, is recorded as a link with its target string (see Root), and
globs do not enter linked directories.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import cgroup, cuda as cuda_mod
from .evidence import RunDir
from .rootfs import Root

__all__ = ["SNAPSHOT_FILES", "SNAPSHOT_GLOBS", "take_snapshot"]

SNAPSHOT_FILES = (
    "proc/meminfo", "proc/vmstat", "proc/buddyinfo", "proc/pagetypeinfo", "proc/zoneinfo", "proc/swaps",
    "proc/pressure/memory", "proc/pressure/io", "proc/pressure/cpu", "proc/version", "proc/cmdline",
    "proc/sys/kernel/osrelease", "proc/sys/kernel/hostname", "proc/sys/kernel/domainname", "proc/uptime", "proc/loadavg", "proc/self/limits", "proc/self/status",
    "proc/self/cgroup", "proc/self/mountinfo", "proc/driver/nvidia/version", "proc/driver/nvidia/params",
    "proc/driver/nvidia/registry", "sys/devices/system/memory/auto_online_blocks",
    "sys/module/zswap/parameters/enabled",
    "sys/devices/system/memory/block_size_bytes", "sys/devices/system/node/online",
)
SNAPSHOT_GLOBS = (
    "proc/sys/vm/*", "proc/sys/kernel/hung_task_*",
    "sys/kernel/mm/transparent_hugepage/*", "sys/kernel/mm/transparent_hugepage/khugepaged/*",
    "sys/devices/system/node/node*/meminfo", "sys/devices/system/node/node*/numastat",
    "sys/module/memory_hotplug/parameters/*", "sys/kernel/iommu_groups/*/type",
    "proc/driver/nvidia/gpus/*/information",
)
LISTED_DIRS = ("sys/kernel/iommu_groups", "sys/class/iommu", "sys/devices/system/node")
PCI_FILES = ("vendor", "device", "numa_node", "local_cpulist", "current_link_speed", "current_link_width",
             "max_link_speed", "max_link_width")
COMMANDS = (
    ("nvidia-smi-q", ["nvidia-smi", "-q"], 30),
    ("nvidia-smi-apps", ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
                         "--format=csv"], 15),
    ("dmesg", ["dmesg", "--ctime"], 10),
    ("uname", ["uname", "-a"], 5),
)


def take_snapshot(run: RunDir, root_path: Path | str = "/", cuda: bool = True,
                  cuda_timeout: float = cuda_mod.DEFAULT_TIMEOUT_S, commands: bool = True) -> dict[str, Any]:
    from .preflight import record_node_probe, record_probe, start_cuda_probe

    root = Root(root_path, run=run)
    probe = start_cuda_probe(cuda_timeout) if (cuda and root.live) else None
    for rel in SNAPSHOT_FILES:
        root.read_text(rel)
    for pattern in SNAPSHOT_GLOBS:
        for rel in root.glob(pattern):
            root.read_text(rel)
    cgroup.read_cgroup_memory(root)  # reads the cgroup's own files, every level up
    record_node_probe(run, root)      # page size, architecture, what backs each swap area (probes/node.json)
    # IOMMU group members and units are symlinks: keep them as markers a reader can list
    for group in root.listdir("sys/kernel/iommu_groups"):
        for dev in root.listdir(f"sys/kernel/iommu_groups/{group}/devices"):
            target = root.readlink(f"sys/kernel/iommu_groups/{group}/devices/{dev}")
            run.add_file(f"root/sys/kernel/iommu_groups/{group}/devices/{dev}", b"", kind="link", target=target)
    for unit in root.listdir("sys/class/iommu"):
        run.add_file(f"root/sys/class/iommu/{unit}", b"", kind="link",
                     target=root.readlink(f"sys/class/iommu/{unit}"))
    for rel in LISTED_DIRS:  # an empty one says 'none here', which an absent one cannot
        if root.exists(rel):
            run.add_dir(f"root/{rel}", source=root.display(rel))
    for bdf in root.listdir("sys/bus/pci/devices"):
        vendor = root.read_fresh(f"sys/bus/pci/devices/{bdf}/vendor")
        if vendor and vendor.strip() == "0x10de":  # NVIDIA
            for name in PCI_FILES:
                root.read_text(f"sys/bus/pci/devices/{bdf}/{name}")
    if commands and root.live:
        for name, argv, timeout in COMMANDS:
            run.run_command(name, argv, timeout=timeout)
    cuda_result = None
    if probe is not None:
        thread, box = probe
        thread.join()
        cuda_result = box["result"]
        record_probe(run, cuda_result)
    elif cuda:
        run.add_skip("probes/cuda.json", "captured tree: no live CUDA probe", kind="probe")
    else:
        run.add_skip("probes/cuda.json", "CUDA probe off (--no-cuda)", kind="probe")
    files = [e for e in run.entries if e["path"].startswith("root/") and not e["skipped"]]
    skipped = [e for e in run.entries if e["skipped"]]
    cuda_text = "not probed" if cuda_result is None else f"{cuda_result.get('status')}: {cuda_result.get('message')}"
    return {"tool": "hostpin", "command": "snapshot", "root": str(root.path), "live": root.live,
            "run_dir": str(run.path), "files": len(files), "skipped": len(skipped), "status": "captured",
            "verdict": f"{len(files)} files captured, {len(skipped)} skipped with their reasons; CUDA {cuda_text}",
            "cuda": None if cuda_result is None else {k: cuda_result.get(k) for k in ("status", "message")}}
