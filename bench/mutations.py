#!/usr/bin/env python3
"""Mutation check: one-line mutations of rule and check code must each fail a test.

The issue that introduced the catalog found ten one-line mutations that survived the suite. Each is
applied here to a temporary copy of the source tree, the named tests run against that copy, and the
mutation must make them fail. A mutation whose original line is no longer in the source fails the
script too (the code moved: update the mutation, do not drop it). Tests that skip on this machine
(root, cgroups) are reported as such, not as killed.

    flock /tmp/hostpin-suite.lock .venv/bin/python bench/mutations.py        # all (about 2 minutes)
    .venv/bin/python bench/mutations.py --only margin                        # one, by name
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: list[str]


MUTATIONS = [
    Mutation("failure-catalog-nothing", "failure_catalog always returning nothing", "repro/outcome.py",
             "    return found.as_tuple() if found else (None, None)", "    return (None, None)",
             ["tests/test_catalog.py::test_replay_the_recorded_fileshared_failure"]),
    Mutation("margin-size-ignored", "--margin given as a size ignored", "diag/checks/memory.py",
             "    return parse_size(text)", "    return int(total * 5 / 100)",
             ["tests/test_checks.py::test_margin_given_as_a_size_counts"]),
    Mutation("swapin-rate-zero", "the live swap-in rate forced to 0", "diag/checks/__init__.py",
             '"pages_per_s": pages / elapsed if elapsed > 0 else None}', '"pages_per_s": 0.0}',
             ["tests/test_preflight_live.py::test_swap_in_demand_is_sampled_live"]),
    Mutation("v1-hierarchical-ignored", "cgroup v1 hierarchical_memory_limit ignored", "diag/cgroup.py",
             '        hier = stat.get("hierarchical_memory_limit")', "        hier = None",
             ["tests/test_checks.py::test_cgroup_v1_hierarchical_memory_limit_binds"]),
    Mutation("swap-exposure-ignores-plan", "swap exposure ignoring the plan size", "diag/checks/memory.py",
             "    pressure_part = min(max(0, region - own_part), max(0, used - (own or 0))) if region else 0",
             "    pressure_part = max(0, used - (own or 0))",
             ["tests/test_checks.py::test_swap_exposure_is_bounded_by_the_plan"]),
    Mutation("verdict-drops-catalog", "the catalog dropped from failed-pin verdicts", "repro/outcome.py",
             '''        cat = f" (catalog {e['catalog']}: {e['meaning']})" if e.get("catalog") and e.get("meaning") else ""''',
             '        cat = ""',
             ["tests/test_catalog.py::test_replay_the_recorded_fileshared_failure"]),
    Mutation("dead-child-not-oom", "a dead child no longer attributed to OOM", "diag/catalog.py",
             "    if signal == 9:", "    if signal == -1:",
             ["tests/test_catalog.py::test_a_dead_child_is_attributed_to_the_oom_killer"]),
    Mutation("garbled-probe-ok", "a garbled CUDA probe read as ok (the device check)", "diag/checks/platform.py",
             "        garbled = _garbled(ctx.cuda)", "        garbled = None",
             ["tests/test_checks.py::test_a_garbled_cuda_probe_is_an_error_not_ok"]),
    Mutation("garbled-probe-child-ok", "a garbled CUDA probe read as ok (the probe's parent)", "diag/cuda.py",
             "    problem = _garbled(result)", "    problem = None if isinstance(result, dict) else _garbled(result)",
             ["tests/test_cuda_probe.py::test_a_garbled_probe_is_an_error"]),
    Mutation("crash-is-skip", "a check that crashes becomes SKIP (and the gate passes)", "diag/preflight.py",
             '            verdict = Verdict(ERROR, f"check crashed:', '            verdict = Verdict(SKIP, f"check crashed:',
             ["tests/test_checks.py::test_a_crashing_check_is_an_error_and_exits_3"]),
    Mutation("hostalloc-uncharged", "hostalloc exempt from the cgroup limit", "diag/checks/memory.py",
             "    if cg_room is not None:", '    if cg_room is not None and plan.method != "hostalloc":',
             ["tests/test_checks.py::test_cgroup_limit_binds_for_every_method_hostalloc_included"]),
    Mutation("active-cache-in-use", "a cgroup's active page cache counted as in use (the working-set heuristic)",
             "diag/cgroup.py", "        return (self.active_file_bytes or 0) + (self.inactive_file_bytes or 0)",
             "        return self.inactive_file_bytes or 0",
             ["tests/test_checks.py::test_active_page_cache_is_reclaimable_and_shmem_is_not"]),
    Mutation("negative-meminfo-accepted", "a negative meminfo value taken as data", "diag/meminfo.py",
             "        if not name or value is None or value < 0 or not unit_ok:",
             "        if not name or value is None or not unit_ok:",
             ["tests/test_peer_fixtures.py::test_a_negative_meminfo_value_is_damage_exit_3"]),
    Mutation("damaged-read-as-zero", "a damaged zoneinfo value read as 0", "diag/zoneinfo.py",
             "        value = to_int(text_value)", "        value = to_int(text_value) or 0",
             ["tests/test_checks.py::test_a_damaged_zoneinfo_value_exits_3"]),
    Mutation("distribution-6-11-as-upstream", "a 6.11 distribution build judged as upstream", "diag/catalog.py",
             '    return "upstream" if re.fullmatch(r"(-rc\\d+)?\\+?", suffix) else "distribution"',
             '    return "upstream"',
             ["tests/test_checks.py::test_kernel_6_11_pin_cap_boundaries"]),
]


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def run_one(m: Mutation | None, python: str, tests: list[str] | None = None) -> dict:
    """m None: the control arm, the same copy and tests without a mutation (they must pass)."""
    with tempfile.TemporaryDirectory(prefix="hostpin-mutant-") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        if m is None:
            env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
            proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=copy, env=env,
                                  capture_output=True, text=True, timeout=900)
            out = (proc.stdout + proc.stderr).strip().splitlines()
            return {"name": "control", "result": "passed" if proc.returncode == 0 else "FAILED",
                    "detail": out[-1] if out else ""}
        target = copy / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return {"name": m.name, "result": "STALE", "detail": f"the original line occurs {text.count(m.old)} times "
                                                                  f"in {m.path}: update the mutation"}
        target.write_text(text.replace(m.old, m.new))
        env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
        t0 = time.monotonic()
        proc = subprocess.run([python, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", *m.tests],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        if proc.returncode == 0:
            result = "SKIPPED" if " skipped" in out and " passed" not in out else "SURVIVED"
        elif proc.returncode in (1,):
            result = "killed"
        else:
            result = f"ERROR rc={proc.returncode}"
        return {"name": m.name, "result": result, "seconds": round(time.monotonic() - t0, 1),
                "detail": out.strip().splitlines()[-1] if out.strip() else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="run only mutations whose name contains this")
    opts = ap.parse_args()
    chosen = [m for m in MUTATIONS if not opts.only or any(o in m.name for o in opts.only)]
    control = run_one(None, sys.executable, sorted({t for m in chosen for t in m.tests}))
    print(f"control (no mutation, the same tests on the same copy): {control['result']}: {control['detail']}")
    if control["result"] != "passed":
        return 1
    results = []
    for m in chosen:
        r = run_one(m, sys.executable)
        results.append(r)
        print(f"{r['result']:>9}  {m.name:32s} {m.what}  ({r.get('seconds', '-')} s) {'' if r['result'] == 'killed' else r['detail']}",
              flush=True)
    bad = [r for r in results if r["result"] not in ("killed", "SKIPPED")]
    skipped = [r for r in results if r["result"] == "SKIPPED"]
    print(f"\n{len(results) - len(bad) - len(skipped)} of {len(results)} mutations killed"
          + (f", {len(skipped)} not testable on this machine" if skipped else "")
          + (f"; {len(bad)} survived or stale" if bad else ""))
    if skipped:  # a mutation nobody tested here is not killed: say so in the exit code too
        print("the skipped ones need what their tests skip for (root, swap, cgroups): run this as root", flush=True)
    return 1 if bad or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
