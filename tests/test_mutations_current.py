"""bench/mutations.py keeps one-line mutations that each must fail a test; running it takes two minutes,
so the suite checks the cheap half: every mutation's original line is still in the source exactly once,
and every test it names exists (a refactor that moves them must move the mutation too)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("mutations", REPO / "bench" / "mutations.py")
mutations = importlib.util.module_from_spec(spec)
sys.modules.setdefault("mutations", mutations)  # dataclasses look their module up there
spec.loader.exec_module(mutations)


@pytest.mark.parametrize("m", mutations.MUTATIONS, ids=[m.name for m in mutations.MUTATIONS])
def test_mutation_still_applies(m):
    assert (REPO / m.path).read_text().count(m.old) == 1, f"{m.name}: update bench/mutations.py"
    for test in m.tests:
        path, _, name = test.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), test


def test_the_issues_ten_are_there():
    names = {m.name for m in mutations.MUTATIONS}
    assert {"failure-catalog-nothing", "margin-size-ignored", "swapin-rate-zero", "v1-hierarchical-ignored",
            "swap-exposure-ignores-plan", "verdict-drops-catalog", "dead-child-not-oom", "garbled-probe-ok",
            "crash-is-skip", "hostalloc-uncharged"} <= names


def test_issue_23s_nine_and_twenty_are_there():
    names = {m.name for m in mutations.MUTATIONS}
    assert {"cgroup-margin-of-memtotal", "pools-major-only", "v1-memsw-equal-can-swap", "v1-local-inactive-file",
            "zoneinfo-4k-pages", "reclaim-entries-swapped", "eta-swap-counted-twice", "bundle-follows-run-link",
            "swapon-failure-leaves-file"} <= names
    assert len(names) == len(mutations.MUTATIONS) >= 13 + 9 + 20
