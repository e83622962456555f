"""Readers against this machine's own /proc and /sys, cross-checked with independent sources
(psutil, os, resource) or with the kernel's own answer where it prints one."""
from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time

import psutil
import pytest

from diag import buddyinfo, cgroup, kernel, limits, meminfo, process, psi, swap, sysctl, thp, vmstat, zoneinfo
from diag.rootfs import Root

from conftest import IS_ROOT

LIVE = Root("/")


def test_meminfo_matches_psutil():
    m = meminfo.read_meminfo(LIVE)
    assert m.total_bytes == psutil.virtual_memory().total
    assert 0 < m.available_bytes <= m.total_bytes
    assert m.swap_total_bytes == psutil.swap_memory().total
    assert "MemTotal" not in m.missing


def test_memavailable_estimate_is_the_kernels_own_figure():
    """si_mem_available redone from meminfo and zoneinfo, against the MemAvailable this kernel prints
    (read a moment apart: a few MiB of drift; measured here 0 B apart on the CI VM)."""
    for _ in range(3):
        root = Root("/")
        m, zones = meminfo.read_meminfo(root), zoneinfo.read_zoneinfo(root)
        e = meminfo.estimate_available(m, zones)
        if abs(e["available_bytes"] - m.available_bytes) <= 16 << 20:
            break
    assert abs(e["available_bytes"] - m.available_bytes) <= 16 << 20, (e, m.available_bytes)
    assert e["totalreserve_pages"] > 0 and e["wmark_low_pages"] > 0


def test_vmstat_has_the_counters_the_watchdog_needs():
    v = vmstat.read_vmstat(LIVE)
    for key in ("pswpin", "pswpout", "pgmajfault", "nr_free_pages"):
        assert key in v
    if kernel.parse_release(os.uname().release) >= (5, 7):
        assert "nr_foll_pin_acquired" in v  # FOLL_PIN accounting since 5.7


def test_buddyinfo_agrees_with_zoneinfo_free_pages():
    zones = {(z.node, z.zone): z for z in zoneinfo.read_zoneinfo(LIVE)}
    buddy = buddyinfo.read_buddyinfo(LIVE)
    assert buddy
    for z in buddy:
        free = sum(c << o for o, c in enumerate(z.counts))
        zi = zones[(z.node, z.zone)]
        # both are live and move a little between the two reads; per-cpu lists are in neither
        assert abs(free - zi.free_pages) <= max(2048, zi.free_pages // 20), (z.zone, free, zi.free_pages)


@pytest.mark.skipif(not IS_ROOT, reason="mounting debugfs needs root")
def test_fragmentation_indices_match_the_kernels_own():
    """mm/vmstat.c prints both indices in debugfs: our formula must give the same numbers."""
    mnt = tempfile.mkdtemp()
    if subprocess.run(["mount", "-t", "debugfs", "none", mnt], capture_output=True).returncode != 0:
        pytest.skip("cannot mount debugfs here")
    try:
        kernel_lines = open(f"{mnt}/extfrag/unusable_index").read().splitlines()
        buddy = buddyinfo.parse_buddyinfo(open("/proc/buddyinfo").read())
        extfrag_lines = open(f"{mnt}/extfrag/extfrag_index").read().splitlines()
    finally:
        subprocess.run(["umount", mnt])
        os.rmdir(mnt)
    compared = 0
    for z in buddy:
        line = next(l for l in kernel_lines if f"zone{z.zone:>9s}" in l.replace("  ", " ") or l.split()[3] == z.zone)
        theirs = [float(x) for x in line.split()[4:]]
        ours = [buddyinfo.unusable_free_index(z.counts, order) for order in range(len(theirs))]
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= 0.02  # free lists move between the two reads
            compared += 1
        eline = next(l for l in extfrag_lines if l.split()[3] == z.zone)
        for order, value in enumerate(eline.split()[4:]):
            mine = buddyinfo.fragmentation_index(z.counts, order)
            kernel_value = float(value)
            if kernel_value == -1.0:
                assert mine is None or abs(mine) < 0.05
            elif mine is not None:
                assert abs(mine - kernel_value) <= 0.05
    assert compared >= 11


def test_swaps_agree_with_meminfo():
    devices = swap.read_swaps(LIVE)
    m = meminfo.read_meminfo(LIVE)
    assert sum(d.size_bytes for d in devices) == m.swap_total_bytes


def test_psi_when_the_kernel_has_it():
    p = psi.read_psi_memory(LIVE)
    if p is None:
        pytest.skip("no /proc/pressure/memory (CONFIG_PSI=n or psi=0)")
    assert set(p) >= {"some"} and p["some"]["avg10"] >= 0


def test_release_and_cmdline():
    assert kernel.read_release(LIVE) == os.uname().release
    cmd = kernel.read_cmdline(LIVE)
    assert isinstance(cmd, dict) and cmd


def test_thp_matches_sysfs_brackets():
    t = thp.read_thp(LIVE)
    if not t.available:
        pytest.skip("CONFIG_TRANSPARENT_HUGEPAGE=n")
    raw = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    assert f"[{t.enabled}]" in raw
    assert t.pmd_size_bytes == 2 << 20


def test_memlock_matches_getrlimit():
    soft, hard = limits.read_memlock(LIVE)
    rs, rh = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert soft == (None if rs == resource.RLIM_INFINITY else rs)
    assert hard == (None if rh == resource.RLIM_INFINITY else rh)


def test_vm_sysctls_read_as_ints():
    vm = sysctl.read_vm_sysctls(LIVE)
    assert vm["swappiness"] == int(open("/proc/sys/vm/swappiness").read())
    assert vm["min_free_kbytes"] > 0


def test_cgroup_of_this_process():
    cg = cgroup.read_cgroup_memory(LIVE)
    if cg is None:
        pytest.skip("this process is in no readable memory cgroup")
    lines = open("/proc/self/cgroup").read()
    assert cg.path in lines
    assert cg.usage_bytes is None or cg.usage_bytes > 0
    if cg.version == 1:
        direct = int(open(f"/{cg.dir}/memory.usage_in_bytes").read())
        assert abs(direct - cg.usage_bytes) < 256 << 20


def test_process_status_stack_and_tasks_of_a_real_child():
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until it has exec'd and gone to sleep
            st = process.read_status(child.pid)
            if st and st.name == "sleep" and st.state == "S":
                break
            time.sleep(0.01)
        assert st.name == "sleep" and st.state in ("S", "R") and st.vm_rss_bytes > 0
        assert st.vm_lck_bytes == 0
        assert process.list_tasks(child.pid) == [child.pid]
        text, why = process.read_stack(child.pid)
        if IS_ROOT:
            assert text and "sleep" in text  # hrtimer_nanosleep / do_nanosleep
            assert process.parse_stack(text)[0]
        else:
            assert text is None and why == "needs root"
        assert process.read_wchan(child.pid) is not None
    finally:
        child.kill()
        child.wait()
    assert process.read_status(child.pid) is None
