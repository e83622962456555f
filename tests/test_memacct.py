"""diag.memacct (what holds pages out of MemAvailable) and repro.settle, on this machine's /proc and
/sys and on zoneinfo captured on the H200 and the CI machine."""
from __future__ import annotations

import os
import re

import pytest

from diag.memacct import (corrected_in_use, corrections, in_use, memcg_dir, page_reporting_active, pageset_totals,
                          parse_pagesets, reading)
from diag.rootfs import Root
from repro.settle import Settler

from conftest import CI_SNAPSHOT, FIXTURES, GPU_SNAPSHOT, IS_ROOT

MiB = 1 << 20


def _regex_count(text: str) -> int:
    return sum(int(x) for x in re.findall(r"^\s+count:\s+(\d+)$", text, re.M))


@pytest.mark.parametrize("tree", [GPU_SNAPSHOT, CI_SNAPSHOT, FIXTURES / "h200-preflight", FIXTURES / "ci-preflight"])
def test_pagesets_on_captured_trees(tree):
    text = (tree / "root" / "proc" / "zoneinfo").read_text()
    zones = parse_pagesets(text)
    assert [z["zone"] for z in zones][:3] == ["DMA", "DMA32", "Normal"]
    totals = pageset_totals(zones)
    assert totals["pcp_pages"] == _regex_count(text)
    populated = [z for z in zones if z["cpus"]]
    cpus = {z["cpus"] for z in populated}
    assert len(cpus) == 1  # every populated zone lists every online CPU
    assert all(z["high_min"] is not None and z["high_max"] >= z["high_min"] for z in populated)  # 6.7+ tuning
    assert totals["low_pages"] > 0 and totals["boost_pages"] == 0 and totals["stat_drift_pages"] > 0


def test_pagesets_on_the_h200_capture():
    totals = pageset_totals(parse_pagesets((GPU_SNAPSHOT / "root/proc/zoneinfo").read_text()))
    # 16 CPUs; 75.8 MiB sat on the per-CPU lists when the snapshot was taken
    assert {z["cpus"] for z in parse_pagesets((GPU_SNAPSHOT / "root/proc/zoneinfo").read_text()) if z["cpus"]} == {16}
    assert round(totals["pcp_pages"] * 4096 / MiB, 1) == 75.8


def test_pagesets_live():
    text = open("/proc/zoneinfo").read()
    zones = parse_pagesets(text)
    assert {z["cpus"] for z in zones if z["cpus"]} == {os.cpu_count()}
    assert pageset_totals(zones)["pcp_high_max_pages"] > 0


def test_pagesets_before_6_7_and_damaged_lines():
    """Named edge cases from the CI capture: a kernel before 6.7 prints no high_min/high_max; a
    damaged count line is skipped, not fatal."""
    text = (CI_SNAPSHOT / "root/proc/zoneinfo").read_text()
    old = "\n".join(line for line in text.splitlines() if "high_min" not in line and "high_max" not in line)
    totals = pageset_totals(parse_pagesets(old))
    assert totals["pcp_high_min_pages"] is None and totals["pcp_high_max_pages"] is None
    assert totals["pcp_pages"] == _regex_count(text)
    damaged = text.replace("count:    ", "count:    x", 1)
    assert pageset_totals(parse_pagesets(damaged))["pcp_pages"] <= _regex_count(text)
    assert parse_pagesets("garbage\n\x00\n") == [] and pageset_totals([])["pcp_pages"] is None


def test_reading_live_and_its_corrections():
    root = Root("/")
    r = reading(root, memcg_dir(root))
    c = corrections(r)
    assert c["per_cpu_lists"] == r["pcp_pages"] * r["page_size"]
    assert corrected_in_use(r) == in_use(r) - c["per_cpu_lists"] - c["watermark_boost"]
    assert {"VmallocUsed", "Shmem", "Unevictable", "SUnreclaim"} <= set(r["meminfo"])
    assert "nr_foll_pin_acquired" in r["vmstat"] and "nr_foll_pin_released" in r["vmstat"]
    cg = r.get("cgroup")
    if cg is None:
        pytest.skip("this process is in no readable memory cgroup")
    assert cg["current"] > 0 and cg["anon"] is not None
    if cg["version"] == 1:
        assert cg["vmalloc"] is None and cg["kernel"] is not None  # v1 has kmem usage, no vmalloc line


def test_free_page_reporting_is_detected_here():
    active = page_reporting_active(Root("/"))
    if active is None:
        pytest.skip("no virtio bus on this machine")
    balloon = [d for d in os.listdir("/sys/bus/virtio/devices")
               if open(f"/sys/bus/virtio/devices/{d}/device").read().strip() == "0x0005"]
    assert active == any(open(f"/sys/bus/virtio/devices/{d}/features").read()[5] == "1" for d in balloon)


@pytest.mark.skipif(not IS_ROOT, reason="folding the per-CPU counters needs root")
def test_settle_here():
    s = Settler(Root("/"), tolerance=4 * MiB, max_s=5.0).settle()
    assert s["settle"]["folded"] is True and s["settle"]["readings"] >= 2
    assert s["settle"]["settled"] is True and s["settle"]["residue_bytes"] <= 4 * MiB
    assert s["rss"]["total"] > 0 and "lazyfree" in s["rss"]
    # a tolerance nothing can meet: the cap holds and the reading says it did not settle
    s = Settler(Root("/"), tolerance=-1, max_s=0.4).settle()
    assert s["settle"]["settled"] is False and s["settle"]["seconds"] >= 0.4
