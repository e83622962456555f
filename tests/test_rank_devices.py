"""Each rank's GPU: `repro register --devices`, its checks, what the result records, and the one rule
(diag.placement) that preflight's placement check and repro's children both follow.

The CUDA side (a child opening its device, an out-of-range one) needs a GPU:
bench/gpu_register_per_rank_devices.sh runs it."""
from __future__ import annotations

import json

import pytest

from diag.checks import Plan
from diag.preflight import run_preflight
from diag.results import result_dict
from diag.units import GiB
from repro.pinner import NoSuchDevice, Pinner, _describe

from conftest import GPU_SNAPSHOT, hostpin


def register(tmp_path, *args):
    r = hostpin("repro", "register", "--json", "--out", str(tmp_path / "runs"), "--ignore-leftovers",
                "--size", "16MiB", "--method", "mlock", *args, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r, json.loads(r.stdout)


@pytest.mark.parametrize("args, needle", [
    (["--ranks", "2", "--devices", "0,1,0"], "--devices names 3 devices for --ranks 2: give one per rank (0,1 puts"),
    (["--ranks", "3", "--devices", "0,1"], "--devices names 2 devices for --ranks 3"),
    (["--devices", "0", "--device", "0"], "--device and --devices are the same choice twice"),
    (["--devices", "0,,1"], "is not a list of devices"),
    (["--devices", ""], "is not a list of devices"),
    (["--devices", "-1"], "'-1' is not a CUDA device number"),
    (["--devices", "GPU0"], "'GPU0' is not a CUDA device number"),
    (["--devices", "\u0663"], "is not a CUDA device number"),  # an Arabic-Indic 3: isdigit(), not ASCII
    (["--devices", "1" * 40], "is not a CUDA device number a node has"),
    (["--matrix", "--devices", "0,1"], "--matrix runs one rank per case"),
])
def test_bad_device_lists_are_a_bad_command_line(tmp_path, args, needle):
    r, res = register(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and res["status"] == "error" and needle in res["verdict"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was run


def test_mlock_records_each_rank_with_no_device_and_says_the_list_is_unused(tmp_path):
    r, res = register(tmp_path, "--ranks", "2", "--devices", "0,1")
    assert r.returncode == 0, r.stderr
    assert res["options"]["devices"] == [0, 1] and res["options"]["device"] is None
    assert [(x["rank"], x["device"]) for x in res["ranks"]] == [(0, None), (1, None)]
    assert "--method mlock opens no GPU: the devices given are not used" in res["notes"]
    # the default: no list, nothing to say
    r, res = register(tmp_path, "--ranks", "2")
    assert r.returncode == 0, r.stderr
    assert res["options"]["devices"] is None and res["options"]["device"] is None
    assert [x["device"] for x in res["ranks"]] == [None, None]
    assert not any("devices given" in n for n in res["notes"])


def _child_device(rank: int, count: int, devices=None) -> int:
    """The device a pinning child (repro.pinner) picks, given the CUDA devices it sees."""
    return Pinner({"size": 4096, "method": "register", "rank": rank, "devices": devices}).choose_device(count)


@pytest.mark.parametrize("gpus, ranks", [(1, 2), (2, 2), (2, 3), (3, 5)])
def test_the_children_put_the_ranks_where_preflight_placed_them(tree, gpus, ranks):
    """Preflight's NUMA check, on the H200's captured tree with `gpus` GPUs each on its own node,
    places rank r on GPU g's node; the child of rank r, seeing `gpus` devices, opens GPU g."""
    t = tree(GPU_SNAPSHOT)
    cuda = json.loads((GPU_SNAPSHOT / "probes" / "cuda.json").read_text())
    for i in range(1, gpus):
        dev = json.loads(json.dumps(cuda["devices"][0]))
        dev.update(index=i, pci_bus_id=f"0000:00:{7 + i:02x}.0")
        cuda["devices"].append(dev)
    for i, dev in enumerate(cuda["devices"]):
        dev["pci_numa_node"] = i
    t.set_cuda(cuda)
    nodes = max(gpus, 2)  # the check places only across more than one node
    for node in range(nodes):
        t.write(f"sys/devices/system/node/node{node}/meminfo",
                f"Node {node} MemTotal:       {256 * 1024 * 1024} kB\nNode {node} MemFree:        {200 * 1024 * 1024} kB\n")
    result = result_dict(run_preflight(Plan(size_bytes=GiB, ranks=ranks), t.path, cuda="captured"))
    numa = next(c for c in result["checks"] if c["id"] == "numa")
    placed = {rank: int(node) for node, rs in numa["evidence"]["ranks_per_node"].items() for rank in rs}
    assert sorted(placed) == list(range(ranks))
    assert {rank: _child_device(rank, gpus) for rank in range(ranks)} == placed


def test_a_device_the_child_does_not_see_is_its_clear_error(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(NoSuchDevice) as caught:
        _child_device(1, 1, devices=[0, 1])
    described = _describe(caught.value)
    assert (described["call"], described["code"], described["name"]) == ("cudaSetDevice", 101, "cudaErrorInvalidDevice (101)")
    assert described["error"] == ("rank 1 was given CUDA device 1, and this node shows 1 CUDA device (0); "
                                  "give --devices one of those per rank")
    assert _child_device(1, 1, devices=[0]) == 0 and _child_device(1, 2, devices=[1, 0]) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA numbers the devices it shows from 0
    with pytest.raises(NoSuchDevice, match=r"1 CUDA device \(0\) under CUDA_VISIBLE_DEVICES='1'; give"):
        _child_device(0, 1, devices=[1])


def test_the_verdict_names_the_rank_and_the_devices_the_node_shows(tmp_path, monkeypatch):
    """The setup_failed event a child of rank 1 emits for `--devices 0,1` on a one-GPU node (CI has no
    GPU: the event is the child's own _describe of NoSuchDevice), read by repro.outcome."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from repro.children import Child
    from repro.outcome import summarize
    from repro.register import ReproOptions

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    try:
        _child_device(1, 1, devices=[0, 1])
    except NoSuchDevice as exc:
        event = dict(_describe(exc), event="setup_failed", device=1)
    children = []
    for rank in (0, 1):
        proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
        proc.wait()
        child = Child(rank, proc, -1, f"child-{rank}.log")
        child.last = {"cuda_ready": {"device": 0}} if rank == 0 else {"setup_failed": event}
        children.append(child)
    opts = ReproOptions(size=GiB, ranks=2, devices=[0, 1])
    result = {"ranks": [], "notes": [], "expected_pages": 2 * GiB // 4096}
    summarize(opts, SimpleNamespace(children=children, tracker=None, pin_t=None), result, stop_reason="setup_failed")
    assert [(r.rank, r.device) for r in result["ranks"]] == [(0, 0), (1, 1)]
    assert result["outcome"] == "failed" and result["verdict"] == (
        "rank 1 was given CUDA device 1, and this node shows 1 CUDA device (0); give --devices one of those per "
        "rank (cudaSetDevice: cudaErrorInvalidDevice (101)).")
    from repro.outcome import build_result
    from repro.render import render_result
    table = render_result(build_result(dict(result, run_dir=str(tmp_path)))).splitlines()
    header = next(line for line in table if line.lstrip().startswith("rank"))
    assert header.split()[:3] == ["rank", "GPU", "outcome"]
