#!/usr/bin/env python3
"""Mutation check: one-line mutations of rule and check code must each fail a test.

The issue that introduced the catalog found ten one-line mutations that survived the suite; issue 23
added nine behaviours no test caught and twenty more mutations of other kinds (their tests are in
tests/test_mutation_kills.py). Each is applied here to a temporary copy of the source tree, the named
tests run against that copy, and the mutation must make them fail. A mutation whose original line is
no longer in the source fails the script too (the code moved: update the mutation, do not drop it).
Tests that skip on this machine (root, cgroups) are reported as such, not as killed.

    flock /tmp/hostpin-live.lock .venv/bin/python bench/mutations.py         # all, as root (42: 6 minutes on
                                                                             # the shared 2-core CI machine)
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
K = "tests/test_mutation_kills.py::"


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
             '        cat = f" (catalog {e.catalog}: {e.meaning})" if e.catalog and e.meaning else ""',
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
    # issue 23: nine behaviours that no test caught
    Mutation("cgroup-margin-of-memtotal", "the cgroup's margin taken as 5% of MemTotal", "diag/checks/memory.py",
             "    cg_margin = margin_for(plan.margin, binding.limit_bytes) if binding is not None else None",
             "    cg_margin = margin_for(plan.margin, m.total_bytes) if binding is not None else None",
             [K + "test_the_cgroup_margin_is_five_percent_of_its_limit"]),
    Mutation("pools-major-only", "the driver-pools rule (catalog 11) comparing the major version only",
             "diag/catalog.py", "    if tuple(f.driver_version) < POOLS_DRIVER:",
             "    if tuple(f.driver_version)[:1] < POOLS_DRIVER[:1]:",
             [K + "test_driver_pools_boundary_inside_the_major_version"]),
    Mutation("v1-memsw-equal-can-swap", "cgroup v1 memsw equal to the memory limit read as able to swap",
             "diag/cgroup.py", "leaf.swap_limit_bytes > leaf.limit_bytes", "leaf.swap_limit_bytes >= leaf.limit_bytes",
             [K + "test_cgroup_v1_memsw_equal_to_the_limit_cannot_swap"]),
    Mutation("v1-local-inactive-file", "cgroup v1 hierarchical usage paired with the local inactive_file",
             "diag/cgroup.py", 'inactive_file_bytes=total("inactive_file"), active_file_bytes=total("active_file"),',
             'inactive_file_bytes=stat.get("inactive_file"), active_file_bytes=total("active_file"),',
             [K + "test_cgroup_v1_usage_pairs_with_total_inactive_file"]),
    Mutation("zoneinfo-4k-pages", "ZONE_MOVABLE counted in 4 KiB pages on a 64 KiB-page node", "diag/facts.py",
             "zoneinfo.read_zoneinfo(self.root, self.page_size)", "zoneinfo.read_zoneinfo(self.root)",
             [K + "test_movable_zone_on_a_64k_page_node"]),
    Mutation("reclaim-entries-swapped", "memcg reclaim named catalog 8 and node reclaim 12", "diag/watch/bounds.py",
             '        return 12 if "mem_cgroup" in str((evidence or {}).get("frame") or "") else 8',
             '        return 8 if "mem_cgroup" in str((evidence or {}).get("frame") or "") else 12',
             [K + "test_reclaim_names_headroom_on_the_node_and_the_limit_in_a_cgroup"]),
    Mutation("eta-swap-counted-twice", "the ETA counting pages still in swap again at the clean rate",
             "diag/watch/bounds.py", "max(0, expected_pages - done_pages - left)",
             "max(0, expected_pages - done_pages)",
             [K + "test_eta_arithmetic_counts_pages_in_swap_once"]),
    Mutation("bundle-follows-run-link", "hostpin bundle LINK following the link to the run", "diag/bundle.py",
             "        d = open_dir(run_dir, limits, follow_last=False)",
             "        d = open_dir(run_dir, limits, follow_last=True)",
             [K + "test_bundle_refuses_a_run_named_through_a_symlink"]),
    Mutation("swapon-failure-leaves-file", "a swap file whose swapon failed left behind", "repro/swapfile.py",
             "            self._discard()  # never leave a file that did not become swap",
             "            pass",
             [K + "test_a_swap_file_that_swapon_refused_is_removed",
              K + "test_make_swap_on_tmpfs_exits_3_and_leaves_nothing"]),
    # issue 23: twenty more, of kinds the ones above do not cover
    Mutation("zswap-fraction-ignored", "pages held by zswap predicted at the device's rate", "diag/checks/memory.py",
             "    fast_fraction = min(1.0, zswapped / used) if used else 0.0", "    fast_fraction = 0.0",
             [K + "test_zswapped_pages_come_back_at_the_zswap_rate"]),
    Mutation("fastest-swap-device", "the fastest swap device in use taken to set the pace", "diag/checks/memory.py",
             "        slow = min(rates, key=lambda x: x.pages_per_s)",
             "        slow = max(rates, key=lambda x: x.pages_per_s)",
             [K + "test_the_slowest_swap_device_in_use_sets_the_pace"]),
    Mutation("swap-overflow-uncapped", "the overflow into swap not capped at the region", "diag/checks/memory.py",
             "        overflow = min(region, r.need_bytes - r.available_bytes)",
             "        overflow = r.need_bytes - r.available_bytes",
             [K + "test_the_overflow_into_swap_is_at_most_the_region"]),
    Mutation("own-swap-ignored", "the pinning cgroup's own swap ignored under the node threshold",
             "diag/checks/memory.py", "    if used > SWAP_IN_USE_THRESHOLD or own:",
             "    if used > SWAP_IN_USE_THRESHOLD:",
             [K + "test_the_pinning_cgroup_s_own_swap_warns_below_the_node_threshold"]),
    Mutation("pages-rounded-down", "a region's page count rounded down", "diag/checks/memory.py",
             "    pages = -(-plan.pinned_bytes // ctx.page_size) * plan.ranks",
             "    pages = plan.pinned_bytes // ctx.page_size * plan.ranks",
             [K + "test_page_counts_round_up_to_whole_pages"]),
    Mutation("memlock-equal-refused", "RLIMIT_MEMLOCK equal to the region judged too small", "diag/checks/memory.py",
             "    if need > soft:", "    if need >= soft:",
             [K + "test_memlock_exactly_the_region_is_enough"]),
    Mutation("shared-file-rule-6-6", "the 6.5 shared-file rule taken to start at 6.6", "diag/catalog.py",
             "SHARED_FILE_RULE = (6, 5)", "SHARED_FILE_RULE = (6, 6)",
             [K + "test_the_shared_file_rule_starts_at_6_5_0"]),
    Mutation("per-call-limit-before-5-14", "the per-call page-table limit applied before kvmalloc's cap (5.14)",
             "diag/catalog.py", "    if rel is not None and rel < KVMALLOC_INT_MAX_KERNEL:",
             "    if rel is not None and rel < (5, 0):",
             [K + "test_the_per_call_limit_needs_the_kvmalloc_cap_of_5_14"]),
    Mutation("unknown-arch-as-safe", "an unnamed architecture read as not pinning long-term (6.11 cap)",
             "diag/catalog.py", "pin_cap_6_11(f.release) and _longterm(f) is not False",
             "pin_cap_6_11(f.release) and _longterm(f) is True",
             [K + "test_an_unnamed_architecture_is_not_read_as_safe_from_the_6_11_cap"]),
    Mutation("oom-kills-not-container", "an allocation failure with OOM kills not attributed to the container",
             "diag/catalog.py", "            if ctx.oom_kills:\n                return Diagnosis(12",
             "            if ctx.oom_kills is None:\n                return Diagnosis(12",
             [K + "test_an_allocation_failure_with_oom_kills_is_the_container_limit"]),
    Mutation("eta-at-20-taken-early", "the ETA 'at 20%' taken at 2%", "diag/watch/tracker.py",
             "work >= 20.0 and unfinished", "work >= 2.0 and unfinished",
             [K + "test_the_eta_at_20_percent_is_taken_at_20_percent"]),
    Mutation("swapin-rate-from-vmswap-fall", "the swap-in ETA at VmSwap's fall (readahead-slowed), not the swap reads",
             "diag/watch/bounds.py", 'if read is not None and read > 0 and not sig["sys_zswpin_pages_s"] and pswpin > 0:',
             "if False:",
             ["tests/test_watch_bounds.py::test_recorded_register_eta_is_at_the_swap_read_rate_replays_h200"]),
    Mutation("eta-counts-all-vmswap", "the swap-in ETA counting the whole VmSwap though the region's swap is known",
             "diag/watch/tracker.py", "            if region_left is not None:\n", "            if False:\n",
             ["tests/test_watch_bounds.py::test_recorded_region_swap_replays_ci"]),
    Mutation("eta-counts-done-pages", "the ETA without swap counting the pages already pinned",
             "diag/watch/bounds.py", '        out["eta_s"] = max(0, expected_pages - done_pages) / progress_rate',
             '        out["eta_s"] = expected_pages / progress_rate',
             [K + "test_eta_without_swap_counts_only_the_pages_left"]),
    Mutation("cleanup-in-push-order", "undo actions run in the order they were pushed", "repro/cleanup.py",
             "                what, undo = self._actions.pop()", "                what, undo = self._actions.pop(0)",
             [K + "test_cleanup_undoes_in_reverse_order"]),
    Mutation("cleanup-stops-at-a-failed-undo", "one failing undo stops the rest", "repro/cleanup.py",
             "                except Exception as exc:  # keep undoing the rest\n"
             '                    problems = [f"{type(exc).__name__}: {exc}"]',
             "                except Exception as exc:  # keep undoing the rest\n                    raise",
             [K + "test_cleanup_keeps_undoing_after_one_undo_fails"]),
    Mutation("zombie-owner-alive", "a zombie owner keeps its leftovers", "diag/leftovers.py",
             '    if not fields or fields[0] in ("Z", "X"):', "    if not fields:",
             [K + "test_a_zombie_owner_is_dead"]),
    Mutation("reused-pid-owns-leftovers", "a reused pid keeps a dead owner's leftovers", "diag/leftovers.py",
             "        if started is not None and started > made_at + 2.0:",
             "        if started is not None and started > made_at + 1e9:",
             [K + "test_a_reused_pid_does_not_keep_old_leftovers"]),
    Mutation("hard-link-read", "a file with a second name outside the run read", "diag/confined.py",
             "        if st.st_nlink > 1:", "        if st.st_nlink > 2:",
             [K + "test_a_run_file_hard_linked_from_outside_is_not_read"]),
    Mutation("directory-link-followed", "a directory link inside a run followed", "diag/confined.py",
             "                    nxt = os.open(part, _DIRFLAGS, dir_fd=fd)",
             "                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)",
             [K + "test_a_directory_link_inside_a_run_is_not_followed"]),
    Mutation("unlisted-file-bundled", "a file added to a finished run bundled", "diag/bundle.py",
             "    if unlisted and not partial:", "    if unlisted and partial:",
             [K + "test_a_finished_run_with_a_file_added_later_is_not_bundled"]),
    Mutation("strict-ignored", "--strict no longer failing on a warning", "diag/preflight.py",
             "EXIT_FAIL if strict and status == WARN else EXIT_OK", "EXIT_OK",
             [K + "test_strict_makes_a_warning_exit_1"]),
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
