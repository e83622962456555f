"""The failure catalog: every entry's condition on facts, the watch bounds, the CUDA error names, and a
replay of the failed pins recorded on the H200 through repro's diagnosis (which reads the catalog)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess

import pytest

from diag import catalog
from diag.catalog import Facts, PinContext, diagnose_failed_pin
from diag.units import GiB

from conftest import FIXTURES, GPU_SNAPSHOT

G = GiB
H200_KERNEL = "6.18.44-fc-v657-gpu"
H200_DRIVER = (580, 159, 4)


def test_every_entry_complete():
    # MISSION.md's sixteen, 17 measured on the H200, 18 PyTorch's allocator rounding, 19 the load after the pin
    assert [e.id for e in catalog.ENTRIES] == list(range(1, 20))
    for e in catalog.ENTRIES:
        assert e.title and e.predicts and e.signature and e.remedy and e.source, e.id
        assert set(e.bounds) <= set(catalog.BOUNDS), e.id
        assert all(n in catalog.CUDA_ERROR_CODES for n in e.cuda_errors), e.id
        assert all(hasattr(errno, n) for n in e.errnos), e.id
        json.dumps(e.to_dict())
    from diag.checks.suite import all_checks
    ids = {c.id for c in all_checks()}
    assert {e.check for e in catalog.ENTRIES if e.check} <= ids
    # the two entries the node cannot predict say so, and have no condition
    assert [e.id for e in catalog.ENTRIES if e.condition is None] == [10, 15]


def test_corrected_entries_as_measured():
    """MISSION.md's catalog 12 and 16, corrected by the H200 measurement (580.159.04, 6.18)."""
    assert "cudaHostAlloc pages as shmem" in catalog.entry(12).predicts
    assert "Shmem/RssShmem" in catalog.entry(16).predicts and "pins outstanding" in catalog.entry(16).predicts
    assert catalog.DRIVER_BYTES_PER_PAGE == 48


def test_cuda_error_names_are_the_bindings_own():
    runtime = pytest.importorskip("cuda.bindings.runtime")
    for name, code in catalog.CUDA_ERROR_CODES.items():
        assert int(getattr(runtime.cudaError_t, name)) == code


@pytest.mark.parametrize("bound, ids", [("swap-in", [1]), ("fault-in/zeroing", [2, 17]), ("compaction", [2]),
                                        ("migration", [5]), ("lock wait", [6]), ("driver-lock", [7]),
                                        ("driver", [3, 7]), ("reclaim", [8, 12]), ("iommu", [13]),
                                        ("file-read", []), ("cpu", [])])
def test_for_bound(bound, ids):
    assert [e.id for e in catalog.for_bound(bound)] == ids
    if not ids:
        assert catalog.bound_note(bound)
    with pytest.raises(ValueError):
        catalog.for_bound("no-such-bound")


# -- each entry's condition on facts: one that holds, one that does not ----------------------------------
H200 = dict(release=H200_KERNEL, machine="x86_64", driver_version=H200_DRIVER, driver_open=True)
CASES = {
    1: (Facts(swap_used_bytes=256 << 20, swap_threshold_bytes=64 << 20), Facts(swap_used_bytes=0, swap_threshold_bytes=64 << 20)),
    2: (Facts(thp_region=True, fragmented=True, need_bytes=8 * G, huge_supply_bytes=G),
        Facts(thp_region=True, fragmented=False, need_bytes=8 * G, huge_supply_bytes=G)),
    3: (Facts(**H200, per_call_bytes=512 * G), Facts(**H200, per_call_bytes=512 * G - 4096)),
    4: (Facts(**{**H200, "release": "6.11.4"}, per_call_bytes=2 * G + 4096),
        Facts(**{**H200, "release": "6.11.10"}, per_call_bytes=47 * G)),
    5: (Facts(movable_bytes=G), Facts()),
    6: (Facts(hung_task_panic=True), Facts()),
    7: (Facts(gpu_cotenants=1), Facts()),
    8: (Facts(need_bytes=10 * G, available_bytes=9 * G), Facts(need_bytes=9 * G, available_bytes=9 * G)),
    9: (Facts(**H200, source="file", map="shared", file_fs="ext4"),
        Facts(**H200, source="file", map="shared", file_fs="tmpfs")),
    11: (Facts(**{**H200, "driver_version": (590, 44, 1)}, method="hostalloc"),
         Facts(**{**H200, "driver_version": (590, 44, 1)}, method="register")),
    12: (Facts(need_bytes=33 * G, cgroup_headroom_bytes=32 * G), Facts(need_bytes=31 * G, cgroup_headroom_bytes=32 * G)),
    13: (Facts(iommu_translated=True), Facts(iommu_translated=False)),
    14: (Facts(remote_numa=True), Facts(remote_numa=False)),
    16: (Facts(method="hostalloc"), Facts(method="mlock")),
    17: (Facts(**H200, source="file", map="private", readonly=True),
         Facts(**H200, source="file", map="private", readonly=False)),
    19: (Facts(swap_used_bytes=256 << 20, swap_threshold_bytes=64 << 20), Facts(swap_used_bytes=0, swap_threshold_bytes=64 << 20)),
}


@pytest.mark.parametrize("entry_id", sorted(CASES))
def test_each_entry_condition(entry_id):
    holds, does_not = CASES[entry_id]
    cond = catalog.entry(entry_id).condition
    assert cond(holds), entry_id
    assert not cond(does_not), entry_id


def test_rule_boundaries_exactly():
    # 6.11: 524,288 pages pass (kmalloc of exactly KMALLOC_MAX_SIZE), one more fails
    assert not catalog.entry(4).condition(Facts(**{**H200, "release": "6.11.0"}, per_call_bytes=2 * G))
    assert catalog.entry(4).condition(Facts(**{**H200, "release": "6.11.0"}, per_call_bytes=2 * G + 4096))
    # no FOLL_LONGTERM: arm64, or before 550.67
    assert not catalog.entry(4).condition(Facts(**{**H200, "release": "6.11.0", "machine": "aarch64"},
                                                per_call_bytes=47 * G))
    assert catalog.driver_uses_longterm((550, 67), "x86_64") and not catalog.driver_uses_longterm((550, 54, 15), "x86_64")
    # 512 GiB: 2^27 pages on 4 KiB, and a 64 KiB-page node gets 8 TiB
    assert not catalog.per_call_page_limit(Facts(**H200, page_size=65536, per_call_bytes=600 * G))
    assert catalog.per_call_page_limit(Facts(**H200, page_size=65536, per_call_bytes=8 << 40))
    assert not catalog.per_call_page_limit(Facts(**{**H200, "driver_version": (575, 64, 5)}, per_call_bytes=600 * G))
    # shared files: fsdax refused read-only too; ramfs and hugetlbfs allowed; before 6.5 allowed
    assert catalog.shared_file_refused(Facts(**H200, source="file", map="private", readonly=True, file_dax=True)) == "fsdax"
    assert catalog.shared_file_refused(Facts(**H200, source="file", map="shared", file_fs="ramfs")) is None
    assert catalog.shared_file_refused(Facts(**H200, source="file", map="shared", file_fs="hugetlbfs")) is None
    assert catalog.shared_file_refused(Facts(**{**H200, "release": "6.4.0"}, source="file", map="shared",
                                             file_fs="ext4")) is None
    # pools: the bit for the node's page size
    f = Facts(**{**H200, "driver_version": (590, 44, 1)}, method="hostalloc", page_size=65536,
              driver_params={"EnableSystemMemoryPools": "1"})
    assert not catalog.pools_apply(f)
    f.driver_params["EnableSystemMemoryPools"] = str(0x10)
    assert catalog.pools_apply(f)
    assert catalog.registration_unnecessary(1, 1) and not catalog.registration_unnecessary(1, 0)


# -- the failed pins recorded on the H200, replayed through repro's diagnosis -------------------------------
def _load(name):
    return json.loads((FIXTURES / name / "result.json").read_text())


def test_replay_the_recorded_fileshared_failure():
    """h200-repro-fileshared-fail: cudaHostRegister of a writable MAP_SHARED file, cudaErrorInvalidValue (1)."""
    from repro.outcome import failure_catalog, verdict
    from repro.register import ReproOptions
    r = _load("h200-repro-fileshared-fail")
    event = next(json.loads(l) for l in (FIXTURES / "h200-repro-fileshared-fail" / "events.jsonl").read_text().splitlines()
                 if json.loads(l)["event"] == "pin_failed")
    opts = ReproOptions(**r["options"])
    ctx = PinContext(method=opts.method, register_flags=opts.register_flags, source=opts.source, map=opts.map,
                     per_call_bytes=opts.size, release=H200_KERNEL, driver_version=H200_DRIVER, machine="x86_64")
    d = diagnose_failed_pin(event, ctx)
    assert d.entry == 9 and "MAP_SHARED" in d.meaning
    # the kernel release was not recorded in that run: still entry 9, and it says from which kernel on
    d = diagnose_failed_pin(event, PinContext(**{**ctx.__dict__, "release": None}))
    assert d.entry == 9 and "from 6.5 on" in d.meaning
    # before 6.5 the kernel allows it: the error has another cause
    assert diagnose_failed_pin(event, PinContext(**{**ctx.__dict__, "release": "6.4.16"})) is None
    # repro's own path (this machine's kernel is >= 6.5) and its verdict carry the catalog entry
    catalog_id, meaning = failure_catalog(event, opts)
    assert catalog_id == 9
    from diag.results import load_result
    rank = load_result(r).ranks[0]  # as repro builds it: a RankResult, its error a PinError
    rank.error.catalog, rank.error.meaning = catalog_id, meaning
    text = verdict(opts, dict(r, ranks=[rank]))
    assert "(catalog 9: a writable long-term pin of a MAP_SHARED file mapping" in text
    assert "cudaErrorInvalidValue (1)" in text


@pytest.mark.parametrize("failure, ctx, entry_id", [
    # shared/reference/h200-2026-11-30 README: 513 GiB registration -> cudaErrorMemoryAllocation (2) at once
    ({"call": "cudaHostRegister", "code": 2, "name": "cudaErrorMemoryAllocation (2)"},
     dict(per_call_bytes=513 * G), 3),
    # 511 GiB on a 128 GiB host: out of memory, not the per-call limit
    ({"call": "cudaHostRegister", "code": 2, "name": "cudaErrorMemoryAllocation (2)"},
     dict(per_call_bytes=511 * G), 8),
    ({"call": "cudaHostRegister", "code": 712, "name": "cudaErrorHostMemoryAlreadyRegistered (712)"},
     dict(per_call_bytes=64 << 20), 10),
    ({"call": "cudaHostRegister", "code": 801, "name": "cudaErrorNotSupported (801)"},
     dict(per_call_bytes=2 * G, register_flags="readonly"), 9),
    ({"call": "cudaHostRegister", "code": 1}, dict(per_call_bytes=47 * G, release="6.11.2"), 4),
    ({"call": "cudaHostRegister", "code": 1}, dict(per_call_bytes=2 * G, source="file:/pmem/t", map="shared",
                                                     register_flags="readonly", file_fs="ext4"), None),
    ({"call": "mlock", "code": errno.ENOMEM}, dict(method="mlock", per_call_bytes=G), 8),
    ({"signal": 9}, dict(), 8),
])
def test_replay_the_reference_failures(failure, ctx, entry_id):
    base = dict(release=H200_KERNEL, driver_version=H200_DRIVER, machine="x86_64")
    d = diagnose_failed_pin(failure, PinContext(**{**base, **ctx}))
    assert (d.entry if d else None) == entry_id


def test_a_dead_child_is_attributed_to_the_oom_killer(tmp_path):
    """A real child killed by SIGKILL, read back by repro's rank summary: catalog 8."""
    from repro.outcome import _rank_result
    from repro.register import ReproOptions
    from repro.children import Child
    proc = subprocess.Popen(["sleep", "60"])
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    try:
        child = Child(0, proc, r_fd, "child-0.log")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        rank = _rank_result(ReproOptions(size=G, method="mlock"), child, None)
    finally:
        os.close(r_fd)
        os.close(w_fd)
    assert rank.outcome == "failed" and rank.error.catalog == 8 and rank.exit_status == -signal.SIGKILL
    assert "signal 9" in rank.error.message and "OOM" in rank.error.meaning


def test_preflight_and_diagnosis_read_the_same_rule(tree):
    """The shared-file rule preflight fails a plan on is the rule the diagnosis names (catalog 9)."""
    from diag.checks import Plan
    from diag.preflight import run_preflight
    r = run_preflight(Plan(size_bytes=2 * G, source="file", map="shared"), GPU_SNAPSHOT, cuda="captured")
    assert r.check("kernel").status == "fail" and 9 in r.catalog_predicted
    d = diagnose_failed_pin({"call": "cudaHostRegister", "code": 1},
                            PinContext(source="file:/x", map="shared", release=r.kernel, per_call_bytes=2 * G))
    assert d.entry == 9
