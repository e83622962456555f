"""The classifier and the ETA model on the real timeline of a swap-bound registration on an
H200 (shared/reference/h200-2026-11-30/swap-stall-timeline.json, kept in tests/fixtures)."""
from __future__ import annotations

import json

import pytest

from diag.process import parse_stack
from repro.bounds import classify, estimate_eta, stack_bound

from conftest import REFERENCE

PIN_PID = "p597"       # the registering process in that capture
PIN_START_S = 74.8     # the last sample before nr_foll_pin_acquired moved
PIN_END_S = 100.4      # the first sample with all 8,388,608 pages pinned
EXPECTED = 32 * (1 << 30) // 4096


def _samples():
    raw = json.loads((REFERENCE / "swap-stall-timeline.json").read_text())
    out = []
    for s in raw:
        procs = {}
        if PIN_PID in s:
            state, rss, swap, wchan = s[PIN_PID]
            frames = parse_stack(s["k597"]) if "k597" in s else None
            procs[597] = {"state": state.split()[1], "vm_rss": int(rss.split()[1]) * 1024,
                          "vm_swap": int(swap.split()[1]) * 1024,
                          "threads": {597: {"tid": 597, "state": state.split()[1], "wchan": wchan, "frames": frames}}}
        out.append({"t": s["t"], "vm": s["d"], "procs": procs})
    return out


def replay():
    """Feed the samples one by one as the watchdog would (2 s window from the pin start)."""
    samples, last_frames, seen = _samples(), {}, []
    for s in samples:
        if s["t"] < PIN_START_S:
            continue
        for p in s["procs"].values():
            for tid, th in p["threads"].items():
                if th["frames"]:
                    last_frames[tid] = th["frames"]
        seen.append(s)
        window = [x for x in seen if x["t"] >= s["t"] - 2.0]
        done = s["vm"].get("nr_foll_pin_acquired", 0)
        yield s, done, classify(window, "nr_foll_pin_acquired", last_frames), \
            estimate_eta(window, "nr_foll_pin_acquired", done, EXPECTED)
        if done >= EXPECTED:
            return


def test_the_real_stack_reads_as_swap_in():
    stack = next(s["k597"] for s in json.loads((REFERENCE / "swap-stall-timeline.json").read_text())
                 if "k597" in s and "do_swap_page" in s["k597"])
    frames = parse_stack(stack)
    assert frames[0] == "__folio_lock_or_retry" and "os_lock_user_pages" in frames
    assert stack_bound(frames) == ("swap-in", "do_swap_page")


def test_bound_is_named_within_5_s_and_stays_swap_in():
    bounds = [(s["t"], c["bound"]) for s, _, c, _ in replay()]
    named = [(t, b) for t, b in bounds if b != "unknown"]
    assert named[0][0] - PIN_START_S <= 5.0
    assert {b for _, b in named} == {"swap-in"}


def test_eta_at_20_percent_is_within_25_percent_of_the_real_end():
    for s, done, _, eta in replay():
        if done >= 0.2 * EXPECTED and eta["eta_s"] is not None:
            predicted_total = s["t"] - PIN_START_S + eta["eta_s"]
            actual = PIN_END_S - PIN_START_S
            assert abs(predicted_total - actual) / actual <= 0.25, (s["t"], predicted_total, actual)
            return
    pytest.fail("never reached 20%")


def test_classify_other_bounds_from_stacks():
    def window(frames, vm_after):
        proc = lambda: {1: {"state": "D", "vm_swap": 0, "vm_rss": 0,
                            "threads": {1: {"tid": 1, "state": "D", "frames": frames}}}}
        return [{"t": 0.0, "vm": {"p": 0}, "procs": proc()}, {"t": 1.0, "vm": vm_after, "procs": proc()}]
    # named edge cases: stacks as the kernel prints them for each bound
    assert classify(window(["try_to_compact_pages", "__alloc_pages_slowpath"], {"p": 10, "compact_stall": 3}), "p")["bound"] == "compaction"
    assert classify(window(["rwsem_down_read_slowpath", "down_read", "lock_mm_and_find_vma"], {"p": 0}), "p")["bound"] == "lock wait"
    assert classify(window(["clear_page_erms", "folio_zero_user", "do_huge_pmd_anonymous_page"], {"p": 500}), "p")["bound"] == "fault-in/zeroing"
    assert classify(window(["migrate_pages", "migrate_longterm_unpinnable_folios", "__gup_longterm_locked"], {"p": 0}), "p")["bound"] == "migration"
    assert classify(window(["__get_user_pages", "pin_user_pages"], {"p": 5000}), "p")["bound"] == "cpu"
    assert classify(window(["handle_userfault"], {"p": 0}), "p")["bound"] == "unknown"


# -- our own watchdog's timelines, recorded on the GPU machine and the CI machine -------------------
from conftest import FIXTURES  # noqa: E402

RECORDED = ["h200-repro-swap32", "ci-repro-swap-mlock"]


def _recorded(name):
    run = FIXTURES / name
    result = json.loads((run / "result.json").read_text())
    samples = [json.loads(l) for l in (run / "timeline.jsonl").read_text().splitlines()]
    return result, samples


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_swap_bound_runs_replay_to_the_same_bound_and_eta(name):
    """Replay a real timeline through the classifier and the ETA model as they are now: the
    bound must be swap-in within 5 s, and the ETA at 20% within 25% of the recorded end."""
    result, samples = _recorded(name)
    expected = result["expected_pages"]
    pin = [s for s in samples if s["phase"] == "pin"]
    pin_t = pin[0]["t"]
    cal = result["calibration"]
    clean = cal["bytes"] / 4096 / cal["seconds"]
    last_frames, seen, named_at, eta_checked = {}, [], None, False
    for s in pin:
        for p in s["procs"].values():
            for tid, th in p["threads"].items():
                if th.get("frames"):
                    last_frames[int(tid)] = th["frames"]
        seen.append(s)
        window = [x for x in seen if x["t"] >= s["t"] - 2.0]
        done = s["vm"]["hostpin_progress_pages"]
        c = classify(window, "hostpin_progress_pages", last_frames)
        if named_at is None and c["bound"] != "unknown":
            named_at = s["t"] - pin_t
            assert c["bound"] == "swap-in", c
        e = estimate_eta(window, "hostpin_progress_pages", done, expected, clean)
        if not eta_checked and done >= 0.2 * expected and e["eta_s"] is not None:
            predicted = s["t"] - pin_t + e["eta_s"]
            assert abs(predicted - result["seconds"]) / result["seconds"] <= 0.25
            eta_checked = True
    assert named_at is not None and named_at <= 5.0 and eta_checked
    assert result["outcome"] == "slow" and result["bound"] == "swap-in"


def test_recorded_throttled_run_was_killed_with_evidence():
    run = FIXTURES / "h200-repro-swap32-throttled"
    result = json.loads((run / "result.json").read_text())
    assert result["outcome"] == "killed" and result["stopped"]["reason"] == "deadline"
    stacks = (run / result["kill"]["stacks"]).read_text()
    assert "do_swap_page" in stacks and "os_lock_user_pages" in stacks  # the driver's pin, in swap-in
    # the ETA at the kill agrees with the physics of the throttle: pages left / 16 MB/s
    progress = result["stopped"]["progress"]
    physics = progress["swap_pages_left"] * 4096 / 16e6
    assert abs(progress["eta_s"] - physics) / physics < 0.1
