"""Staging-memory accounting, tested on recorded runs:
- tests/fixtures/h200-staging/<case>: the H200 runs of the first version (driver 580.159.04), schema 1,
  recorded without the per-CPU free list counts;
- tests/fixtures/ci-staging-control/<case>: `--sides control` on the CI machine with this version
  (defaults: 3 GiB over 24 threads, 3 repeats; heldout: 512 MiB, 1 thread, both directions, 3 bursts,
  2 s hold), each repeat's raw readings kept.
Edge cases built from those readings are named where they are built."""
from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from diag.memacct import corrections
from diag.report import staging_body
from repro.staging import (SIDES, StagingResult, parse_sides, reserve_bytes, reserve_hint, sequence, step_accounting,
                           summarize, verdict)

from conftest import FIXTURES, hostpin

OLD = FIXTURES / "h200-staging"
CI = FIXTURES / "ci-staging-control"
MiB = 1 << 20


def repeats(base: Path, case: str) -> list[dict]:
    out = []
    for p in sorted((base / case / "repeats").glob("*.json"), key=lambda p: p.stem):
        if not p.stem.isdigit():
            continue
        rep = json.loads(p.read_text())
        parent = p.with_name(p.stem + ".parent.json")
        if parent.exists():
            rep["parent"] = json.loads(parent.read_text())
        out.append(rep)
    return out


def test_sequence_orders():
    assert sequence("alternate", 3) == ["pageable", "pinned", "pinned", "pageable", "pageable", "pinned"]
    assert sequence("alternate", 1, SIDES) == ["pageable", "pinned", "control"]
    assert sequence("control-first", 1, SIDES) == ["control", "pageable", "pinned"]
    assert sequence("alternate", 2, ("control",)) == ["control", "control"]


def test_sides_parse_and_refuse():
    assert parse_sides("pinned,pageable") == ("pageable", "pinned")
    for bad in ("", "gpu", "pageable,cuda"):
        with pytest.raises(ValueError, match="sides are pageable, pinned, control"):
            parse_sides(bad)


# -- the old H200 records: what they can and cannot say ------------------------------------------
def test_old_h200_steps_are_free_pages_that_no_recorded_counter_holds():
    """In every case recorded by the first version, a burst's change of MemTotal - MemAvailable is the
    change of MemFree itself (free pages went missing, not page cache), and none of the counters
    recorded (AnonPages, Shmem, SUnreclaim, KernelStack, PageTables, VmallocUsed) holds them: the
    signature of pages parked on per-CPU lists, which those runs did not read."""
    known = ("AnonPages", "Shmem", "SUnreclaim", "KernelStack", "PageTables", "SecPageTables", "VmallocUsed")
    deltas, free_match, unexplained = [], 0, 0
    for case in sorted(p.name for p in OLD.iterdir()):
        for rep in repeats(OLD, case):
            prev = rep["baseline"]
            for s in rep["steps"]:
                a, b = prev["meminfo"], s["after"]["meminfo"]
                d = s["after"]["in_use_bytes"] - prev["in_use_bytes"]
                deltas.append(d)
                free_match += abs(d + (b["MemFree"] - a["MemFree"])) <= 2 * MiB
                unexplained += abs(sum(b[k] - a[k] for k in known if k in a)) <= 3 * MiB
                assert "reading" not in s["after"] and "pcp_pages" not in json.dumps(s["after"])
                prev = s["after"]
    assert len(deltas) == 100
    assert free_match >= 90 and unexplained >= 95
    assert max(deltas) > 40 * MiB and min(deltas) < -40 * MiB  # both ways, on either side


def test_old_h200_records_are_said_to_be_uncorrected_and_give_no_reserve():
    for case in ("defaults", "threads1", "threads64", "both", "hold", "repeat5"):
        s = summarize(repeats(OLD, case))
        assert s["corrected"] is False
        v = verdict(s)
        assert v.startswith("recorded without the per-CPU free list counts, uncorrected: pageable bursts moved")
        assert "none of it is attributed" in v
        assert reserve_bytes(s) is None and reserve_hint(s) is None
    # the figure the first version printed (+55 MiB) is still what the raw steps say, now labelled
    # (56: file-backed RSS, page cache, is no longer taken off)
    s = summarize(repeats(OLD, "defaults"))
    assert abs(s["sides"]["pageable"]["retained"]["median"] - 55 * MiB) <= 2 * MiB


def test_old_report_says_uncorrected_and_has_no_reserve_advice():
    r = json.loads((OLD / "defaults" / "result.json").read_text())
    body = staging_body(r, md=True)
    assert "uncorrected" in body and "apply:" not in body


# -- the CI control recordings: the correction on real readings -----------------------------------
def _independent(before: dict, after: dict) -> dict:
    """The accounting recomputed from the raw reading fields, without repro.staging."""
    def fig(s):
        r, rss = s["reading"], s["rss"]
        m = r["meminfo"]
        return {"raw": m["MemTotal"] - m["MemAvailable"], "pcp": r["pcp_pages"] * r["page_size"],
                "rss": rss["total"] - rss["file"] - rss["lazyfree"], "others": m["AnonPages"] - rss["anon"]}
    a, b = fig(before), fig(after)
    d = {k: b[k] - a[k] for k in a}
    boost = 0
    if before["reading"]["boost_pages"] or after["reading"]["boost_pages"]:  # none on the CI machine
        boost = (corrections(after["reading"])["watermark_boost"] - corrections(before["reading"])["watermark_boost"])
    return {"uncorrected": d["raw"] - d["rss"], "retained": d["raw"] - d["pcp"] - boost - d["rss"] - d["others"]}


@pytest.mark.parametrize("case", ["defaults", "heldout"])
def test_per_cpu_correction_matters_on_the_ci_control_recordings(case):
    uncorrected, retained = [], []
    for rep in repeats(CI, case):
        prev = rep["baseline"]
        for s in rep["steps"]:
            mine = step_accounting(prev, s["after"])
            ind = _independent(prev, s["after"])
            assert mine["retained_bytes"] == ind["retained"]
            assert mine["corrected"] and mine["settled"] in (True, False)
            uncorrected.append(ind["uncorrected"])
            retained.append(ind["retained"])
            prev = s["after"]
    # uncorrected, a memcpy between pageable buffers "left" hundreds of MiB; corrected, nothing
    assert max(abs(u) for u in uncorrected) > 100 * MiB
    assert all(abs(r) <= 8 * MiB for r in retained), [round(r / MiB, 1) for r in retained]
    assert abs(statistics.median(retained)) <= 1 * MiB


# every run recorded with this version, here or on a GPU machine (tests/fixtures/*staging*/<case>/)
RECORDED = sorted(p for p in FIXTURES.glob("*staging*/*")
                  if (p / "result.json").is_file() and "schema_version" in json.loads((p / "result.json").read_text()))


@pytest.mark.parametrize("run", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_run_adds_up_and_its_control_is_near_zero(run):
    """The accounting identity on every step, recomputed from the raw readings; the summary
    recomputed from the raw repeats; and the control arm, where it ran, within 8 MiB of zero."""
    reps = repeats(run.parent, run.name)
    for rep in reps:
        prev = rep["baseline"]
        for s in rep["steps"]:
            assert step_accounting(prev, s["after"])["retained_bytes"] == _independent(prev, s["after"])["retained"]
            prev = s["after"]
    recorded = json.loads((run / "result.json").read_text())
    fresh = summarize(reps)
    if recorded["schema_version"] == StagingResult.SCHEMA_VERSION:
        assert recorded["verdict"].endswith(verdict(fresh))  # an interrupted run prefixes it
    else:  # schema 2 attributed past the noise, not twice the noise: the figures must still agree
        assert recorded["schema_version"] == 2
        for side, f in recorded["sides"].items():
            b = fresh["sides"][side].get("beyond_control")
            assert f.get("beyond_control_bytes") == (b["median"] if b else None)
            assert f["noise_bytes"] == fresh["sides"][side]["noise_bytes"]
    for side, f in recorded["sides"].items():
        assert f["retained_bytes"] == fresh["sides"][side]["retained"]["median"]
    if "control" in recorded["sides"]:
        assert abs(recorded["sides"]["control"]["retained_bytes"]) <= 8 * MiB


@pytest.mark.parametrize("case", ["defaults", "heldout"])
def test_ci_control_result_is_near_zero_and_matches_a_fresh_summary(case):
    recorded = json.loads((CI / case / "result.json").read_text())
    fresh = summarize(repeats(CI, case))
    side = recorded["sides"]["control"]
    assert side["retained_bytes"] == fresh["sides"]["control"]["retained"]["median"]
    assert abs(side["retained_bytes"]) <= 8 * MiB and side["noise_bytes"] <= 8 * MiB
    assert side["uncorrected_range_bytes"][1] > 100 * MiB
    assert recorded["verdict"] == verdict(fresh)
    assert recorded["verdict"].startswith("control arm (memcpy, no CUDA): ")
    assert "this node's noise floor" in recorded["verdict"]
    assert recorded["reserve_bytes"] is None  # no pageable side: nothing to say about --reserve


def test_json_contract():
    r = json.loads((CI / "defaults" / "result.json").read_text())
    # recorded under schema 2; 3 changed the attribution threshold, not the fields of the contract
    assert r["schema"] == StagingResult.SCHEMA and r["schema_version"] in (2, StagingResult.SCHEMA_VERSION)
    assert {"outcome", "verdict", "sides", "corrections"} <= set(r)
    side = r["sides"]["control"]
    assert {"retained_bytes", "retained_range_bytes", "noise_bytes", "attribution", "throughput_gb_s"} <= set(side)
    lo, hi = side["retained_range_bytes"]
    assert lo <= side["retained_bytes"] <= hi
    assert set(side["attribution"]) >= {"vmalloc", "shmem", "kernel", "unevictable", "pins", "cgroup"}
    steps = sum(len(rep["steps"]) for rep in repeats(CI, "defaults"))
    assert len(r["corrections"]) == steps == 6
    for c in r["corrections"]:
        assert c["raw_delta_bytes"] - c["per_cpu_lists_bytes"] - c["watermark_boost_bytes"] - c["rss_bytes"] \
            + c["lazyfree_bytes"] - c["other_processes_anon_bytes"] == c["retained_bytes"]


def test_hold_teardown_and_exit_on_the_heldout_recording():
    s = summarize(repeats(CI, "heldout"))
    assert s["hold_returned_bytes"]["n"] == 2 and abs(s["hold_returned_bytes"]["median"]) <= 8 * MiB
    assert abs(s["reset_left_bytes"]["median"]) <= 8 * MiB and abs(s["exit_left_bytes"]["median"]) <= 8 * MiB
    assert "nothing came back during the hold" in verdict(s)
    assert s["sides"]["control"]["bursts"] == 3


# -- attribution: edge cases built from the CI readings -------------------------------------------
def _shift(snap: dict, nbytes: int, place: str | None = None) -> None:
    """Take nbytes out of MemAvailable/MemFree in one reading, optionally shown in a meminfo place."""
    m = snap["reading"]["meminfo"]
    m["MemAvailable"] -= nbytes
    m["MemFree"] -= nbytes
    if place:
        m[place] += nbytes


def _as_two_sides(driver_keeps: int = 0, place: str | None = "VmallocUsed", reset_returns: bool = True) -> list[dict]:
    """The CI defaults recording with each repeat's first burst relabelled 'pageable' (the second
    stays the control). Named edge case: a driver that keeps `driver_keeps` bytes in `place` after
    the pageable burst, until cudaDeviceReset (or, reset_returns=False, until the process exits)."""
    reps = copy.deepcopy(repeats(CI, "defaults"))
    for rep in reps:
        rep["steps"][0]["side"] = "pageable"
        if driver_keeps:
            for st in rep["steps"]:
                _shift(st["after"], driver_keeps, place)
            if not reset_returns:
                _shift(rep["after_reset"], driver_keeps, place)
    return reps


def test_nothing_retained_is_said_plainly():
    s = summarize(_as_two_sides())
    v = verdict(s)
    assert v.startswith("pageable copies: no staging memory retained: 0 MiB (median of 3, range ")
    assert ", noise ±" in v.split(";")[0]
    assert reserve_bytes(s) == 0 and "--reserve 0" in reserve_hint(s)


def test_retention_beyond_the_control_is_attributed_and_located():
    s = summarize(_as_two_sides(400 * MiB))
    v = verdict(s)
    assert v.startswith("pageable copies retained 400 MiB beyond the control arm (median of 3")
    assert "in vmalloc 400 MiB" in v and "cudaDeviceReset returned it" in v
    largest = s["sides"]["pageable"]["beyond_control"]["max"]
    assert 400 * MiB <= largest <= 403 * MiB
    assert reserve_bytes(s) == -(-largest // MiB) * MiB  # the largest repeat, rounded up to MiB
    assert f"--reserve {reserve_bytes(s) // MiB}MiB" in reserve_hint(s)
    s = summarize(_as_two_sides(400 * MiB, place=None, reset_returns=False))
    v = verdict(s)
    assert "in no counter: not vmalloc, shmem, kernel, unevictable, pins or the cgroup" in v
    assert "process exit returned it" in v


def test_an_effect_within_the_control_noise_is_not_the_drivers():
    """Named edge case: a neighbour takes 50 MiB during one control burst; a 30 MiB pageable effect
    is then inside the noise and not attributed."""
    reps = _as_two_sides(30 * MiB)
    _shift(reps[1]["steps"][1]["after"], 50 * MiB)
    for later in (reps[1]["after_reset"],):
        _shift(later, 50 * MiB)
    s = summarize(reps)
    assert s["sides"]["pageable"]["noise_bytes"] >= 50 * MiB
    assert verdict(s).startswith("pageable copies: no staging memory retained: +30 MiB")
    assert reserve_bytes(s) == 0


def test_without_the_control_arm_nothing_is_attributed():
    reps = _as_two_sides(400 * MiB)
    for rep in reps:
        rep["steps"] = rep["steps"][:1]
    s = summarize(reps)
    assert "not attributed: the control arm was not run" in verdict(s)
    assert reserve_bytes(s) is None


# -- the command here ------------------------------------------------------------------------------
def test_control_alone_runs_without_cuda(tmp_path):
    r = hostpin("repro", "staging", "--sides", "control", "--bytes", "64MiB", "--threads", "2", "--bursts", "1",
                "--repeat", "1", "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["outcome"] == "completed" and list(out["sides"]) == ["control"]
    assert abs(out["sides"]["control"]["retained_bytes"]) <= 8 * MiB, out["corrections"]
    child = json.loads((Path(out["run_dir"]) / "repeats" / "0.json").read_text())
    assert child["cuda_loaded"] is False and child["teardown"] == "buffers unmapped (no CUDA)"
    assert child["steps"][0]["after"]["settle"]["folded"] is True


def test_without_a_gpu_the_default_says_so_and_points_to_the_control(tmp_path):
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    r = hostpin("repro", "staging", "--json", "--out", str(tmp_path))
    assert r.returncode == 3 and "Traceback" not in r.stderr
    v = json.loads(r.stdout)["verdict"]
    assert "no NVIDIA driver" in v and "--sides control" in v


@pytest.mark.parametrize("args, says", [(["--sides", "gpu"], "sides are pageable, pinned, control"),
                                        (["--sides", "control", "--order", "pinned-first"], "pinned-first needs pinned")])
def test_bad_options_are_one_line(tmp_path, args, says):
    r = hostpin("repro", "staging", *args, "--out", str(tmp_path))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr


def test_report_of_a_control_run(tmp_path):
    import shutil

    from diag.report import render_report
    from diag.runs import open_run_path
    shutil.copytree(CI / "heldout", tmp_path / "run")
    text = render_report(open_run_path(tmp_path / "run"))
    assert text.splitlines()[2].startswith("**control arm (memcpy, no CUDA): ")
    body = text[text.index("## Staging memory"):]
    assert "| control |" in body and "per-CPU free lists moved" in body and "settled" in body
    assert "came back during the hold" in body and "apply:" not in body


def test_two_device_calls_of_the_defaults_agree_and_attribute_nothing():
    """Issue 8's done-when on the H200 (open driver 580.159.04, kernel 6.18): the defaults (3 GiB,
    24 threads, 3 repeats) in two separate device calls agree within max(10 MiB, 20%), agree with
    the control arm, and, counted past twice the noise, attribute nothing to the driver (the first
    call's ~2 MiB against a noise of ±1.4 MiB was 'retained' under schema 2's rule)."""
    calls = [FIXTURES / "h200-staging-8" / name for name in ("defaults", "defaults-call2")]
    figures = []
    for run in calls:
        summary = summarize(repeats(run.parent, run.name))
        figures.append(summary)
        assert verdict(summary).startswith("pageable copies: no staging memory retained: ")
        assert reserve_bytes(summary) == 0
    for side in ("pageable", "pinned", "control"):
        a, b = (f["sides"][side]["retained"]["median"] for f in figures)
        assert abs(a - b) <= max(10 * MiB, 0.2 * max(abs(a), abs(b))), (side, a / MiB, b / MiB)
    for f in figures:
        control = f["sides"]["control"]["retained"]["median"]
        assert abs(f["sides"]["pageable"]["retained"]["median"] - control) <= 10 * MiB
