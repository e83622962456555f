"""Leftovers of killed hostpin runs: swap files still active, cgroups with a read throttle on
the swap disk, /dev/shm region files. They hold memory and swap, and a throttle slows every
later swap-in of the processes in that cgroup; `hostpin repro cleanup` removes them."""
from __future__ import annotations

from ..leftovers import CLEANUP_COMMAND, find_leftovers, owner_pid
from . import PASS, SKIP, WARN, Context, Verdict, register


@register("leftovers", "Swap files, cgroups and throttles left by killed hostpin runs")
def leftovers(ctx: Context) -> Verdict:
    if not ctx.root.live:
        swaps = ctx.swaps
        if swaps is None:
            return Verdict(SKIP, f"cannot read {ctx.why_missing('swaps')}")
        ours = [(s.name, owner_pid(s.name.rsplit("/", 1)[-1], "swap")) for s in swaps]
        ours = [(name, pid) for name, pid in ours if pid is not None]
        ev = {"swap_files": [{"path": name, "pid": pid} for name, pid in ours]}
        if ours:
            return Verdict(WARN, "the capture shows hostpin swap files active: " + ", ".join(
                f"{name} (owner pid {pid})" for name, pid in ours) + "; whether their runs were still going is "
                "not recorded", f"on that node: {CLEANUP_COMMAND} (removes those of runs that are gone; "
                f"{CLEANUP_COMMAND} --dry-run lists them first)", ev)
        return Verdict(PASS, "no hostpin swap file in the capture's /proc/swaps", evidence=ev)
    found = find_leftovers()
    dead = [x for x in found if not x.alive]
    running = sorted({x.pid for x in found if x.alive})
    ev = {"leftovers": [x.to_dict() for x in found]}
    if dead:
        return Verdict(WARN, f"{len(dead)} left by killed hostpin runs: " + "; ".join(x.describe() for x in dead[:4])
                       + (f"; and {len(dead) - 4} more" if len(dead) > 4 else ""),
                       f"{CLEANUP_COMMAND} (removes only what belongs to runs that are gone; "
                       f"{CLEANUP_COMMAND} --dry-run lists it first)", ev)
    if running:
        return Verdict(PASS, "nothing left by killed runs; hostpin runs going now (pid "
                       + ", ".join(map(str, running)) + ") hold " + "; ".join(x.describe() for x in found[:3]),
                       evidence=ev)
    return Verdict(PASS, "no hostpin swap file, cgroup, throttle, /dev/shm file or tracefs instance on this node", evidence=ev)
