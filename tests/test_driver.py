"""repro.driver: the steps run in order, and what they set up is undone in reverse on every exit
path. The signals are real ones, sent to this process while a step runs."""
from __future__ import annotations

import os
import signal

import pytest

from repro.driver import Driver


class Record:
    """The state the test steps share, as repro.register's RunState does: the driver's undo, and
    what happened, in order."""

    def __init__(self, driver: Driver):
        self.undo = driver.undo
        self.seen: list[str] = []


def sets_up(name: str):
    def step(r: Record) -> None:
        r.seen.append(f"step {name}")
        r.undo(name, lambda: r.seen.append(f"undo {name}"))
    step.__name__ = name
    return step


def drive(*steps):
    driver = Driver(steps)
    r = Record(driver)
    log = driver.run(r, finish=lambda stop: r.seen.append(f"finish {stop}"), close=lambda: r.seen.append("close"),
                     interrupted=lambda name: r.seen.append(f"interrupted {name}"))
    return r, log


def test_every_step_runs_and_everything_is_undone_in_reverse():
    r, log = drive(sets_up("swap"), sets_up("cgroup"), sets_up("children"))
    assert r.seen == ["step swap", "step cgroup", "step children", "finish None", "close",
                      "undo children", "undo cgroup", "undo swap"]
    assert [x["undo"] for x in log] == ["children", "cgroup", "swap"] and all(x["ok"] for x in log)


def test_a_stop_skips_the_rest_and_still_undoes():
    def stalls(r):
        r.seen.append("step pin")
        return "stall"

    r, _ = drive(sets_up("children"), stalls, sets_up("never"))
    assert r.seen == ["step children", "step pin", "finish stall", "close", "undo children"]


def test_an_error_propagates_after_the_undos():
    def fails(r):
        raise RuntimeError("cannot create a cgroup")

    driver = Driver((sets_up("swap"), fails, sets_up("never")))
    r = Record(driver)
    with pytest.raises(RuntimeError, match="cannot create a cgroup"):
        driver.run(r, finish=lambda stop: r.seen.append("finish"), close=lambda: r.seen.append("close"),
                   interrupted=lambda name: r.seen.append(name))
    assert r.seen == ["step swap", "close", "undo swap"]
    assert [x["undo"] for x in driver.log] == ["swap"]


def test_an_undo_that_fails_is_logged_and_the_rest_still_run():
    def breaks(r):
        r.undo("cgroup", lambda: 1 / 0)

    r, log = drive(sets_up("swap"), breaks, sets_up("children"))
    assert [x["undo"] for x in log] == ["children", "cgroup", "swap"]
    assert log[1]["problems"] == ["ZeroDivisionError: division by zero"] and log[2]["ok"]
    assert r.seen[-2:] == ["undo children", "undo swap"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_a_step_is_an_interruption_and_a_second_one_cannot_cut_the_undo_short(sig):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def signalled(r):
        r.seen.append("step pin")
        os.kill(os.getpid(), sig)
        r.seen.append("never after the signal")

    def undo_signalled_again():
        os.kill(os.getpid(), sig)  # the double Ctrl-C: ignored while undoing
        return []

    def sets_up_then_signalled_in_undo(r):
        r.undo("children", undo_signalled_again)

    r, log = drive(sets_up("swap"), sets_up_then_signalled_in_undo, signalled, sets_up("never"))
    assert r.seen == ["step swap", "step pin", "close", f"interrupted {signal.Signals(sig).name}", "undo swap"]
    assert [x["undo"] for x in log] == ["children", "swap"] and all(x["ok"] for x in log)
    assert {s: signal.getsignal(s) for s in before} == before

