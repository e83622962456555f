"""`hostpin repro register`: pin a region for real, under the watchdog, and say what happened.

The parent (this module and repro.watchdog) sets up what the run needs (a swap file, memory
and io cgroups, a read throttle), starts one pinning child per rank, drives them through
prefault -> pin -> undo, and removes everything it set up on every exit path.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from diag import catalog
from diag.checks import FAIL, WARN, Context, Plan
from diag.checks.memory import headroom
from diag.evidence import RunDir
from diag.facts import node_facts
from diag.exitcodes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, EXIT_UNEVALUATED
from diag.nvidia import read_nvidia
from diag.rootfs import Root
from diag.units import GiB, PAGE_SIZE, format_bytes, format_duration

from diag.leftovers import cgroup_name

from .cgroups import CgroupError, RunCgroup, block_device_for
from .cleanup import Cleanup, Interrupted, leftovers_refusal
from .region import FileSourceError, existing_file_flags
from .swapfile import SwapError, SwapFile, active_swaps
from .watchdog import Child, Watchdog, kill_and_wait, spawn_child

__all__ = ["ReproOptions", "run_repro", "exit_code_for", "SLOW_FACTOR", "OUTCOMES"]

SLOW_FACTOR = 4.0  # completed at less than a quarter of this node's clean rate: "slow"
OUTCOMES = ("completed", "slow", "failed", "stalled", "killed", "unkillable", "refused", "interrupted",
            "unevaluated")
_SEVERITY = {"completed": 0, "slow": 1, "failed": 2, "stalled": 3, "killed": 4, "unkillable": 5}
SETUP_TIMEOUT_S = 180.0   # CUDA context creation and calibration
UNDO_TIMEOUT_S = 300.0    # cudaFreeHost of tens of GiB takes seconds; munlock of a swap-bound region more


class ReproError(RuntimeError):
    """A reproduction that cannot be set up on this node; the message says what to do."""


class ReproUsageError(ValueError):
    """Options that contradict each other; the message names them and what works."""


@dataclass
class ReproOptions:
    size: int
    method: str = "register"
    register_flags: str = "default"
    source: str = "anon"
    map: str = "private"
    thp: bool | None = None
    prefault: bool = True
    chunk: int | None = None
    ranks: int = 1
    swap_out: int | None = None
    swap_in_rate: int | None = None
    make_swap: int | None = None
    swap_dir: str = "/var/tmp"
    deadline: float | None = 1800.0
    stall_after: float = 120.0
    interval: float = 0.5
    force: bool = False
    device: int = 0
    calibrate: bool = True
    register_twice: bool = False
    prefault_threads: int = field(default_factory=lambda: max(1, min(16, os.cpu_count() or 1)))
    margin: str = "5%"
    ignore_leftovers: bool = False

    @property
    def uses_gpu(self) -> bool:
        return self.method in ("register", "hostalloc")

    def child_spec(self) -> dict:
        return {"size": self.size, "method": self.method, "register_flags": self.register_flags,
                "source": self.source, "map": self.map, "thp": self.thp, "chunk": self.chunk,
                "device": self.device, "calibrate": self.calibrate, "register_twice": self.register_twice,
                "prefault_threads": self.prefault_threads,
                "prefault_piece": 256 << 20}


def validate(opts: ReproOptions) -> None:
    if opts.swap_out is not None:
        if opts.swap_out > opts.size:
            raise ReproUsageError(f"--swap-out {format_bytes(opts.swap_out)} is larger than --size "
                             f"{format_bytes(opts.size)}; push at most the region out")
        if opts.method == "hostalloc":
            raise ReproUsageError("--swap-out does not apply to --method hostalloc (the driver allocates its own "
                             "pages, which are never swapped)")
        if opts.source not in ("anon", "shm"):
            raise ReproUsageError("--swap-out needs --source anon or shm (file pages are written back, not swapped)")
    if opts.register_flags != "default" and opts.method != "register":
        raise ReproUsageError("--register-flags applies to --method register only")
    if opts.source.startswith("file:"):  # an existing file is the user's: read-only, never written
        try:
            opts.register_flags = existing_file_flags(opts.source[5:], opts.size, opts.method, opts.register_flags)
        except FileSourceError as exc:
            raise ReproUsageError(str(exc)) from None
    if opts.chunk is not None and opts.chunk % PAGE_SIZE:
        raise ReproUsageError("--chunk must be a multiple of 4 KiB, e.g. 64GiB")
    if opts.size % PAGE_SIZE:
        raise ReproUsageError("--size must be a multiple of 4 KiB, e.g. 47GiB")


def safety(opts: ReproOptions) -> dict | None:
    """A refusal (with the numbers) when the node cannot take the run, else None."""
    plan = Plan(size_bytes=opts.size, ranks=opts.ranks, method=opts.method, thp=opts.thp, margin=opts.margin,
                chunk_bytes=opts.chunk)
    ctx = Context(Root("/"), plan, sample_s=0)
    verdict = headroom(ctx)
    if verdict.status in (FAIL, WARN):
        return {"check": "headroom", "summary": verdict.summary, "evidence": verdict.evidence}
    if opts.swap_out:
        free_swap = (ctx.meminfo.swap_free_bytes or 0) + (opts.make_swap or 0)
        need = opts.swap_out * opts.ranks
        if free_swap < need * 1.05:
            return {"check": "swap", "summary": f"--swap-out needs {format_bytes(need)} of swap, the node has "
                                                f"{format_bytes(free_swap)} free (counting --make-swap); "
                                                "add or enlarge --make-swap SIZE",
                    "evidence": {"swap_free_bytes": ctx.meminfo.swap_free_bytes, "make_swap": opts.make_swap}}
    return None


def exit_code_for(outcome: str) -> int:
    return {"completed": EXIT_OK, "slow": EXIT_OK, "refused": EXIT_REFUSED, "interrupted": EXIT_INTERRUPTED,
            "unevaluated": EXIT_UNEVALUATED}.get(outcome, EXIT_FAIL)


def failure_catalog(ev: dict, opts: ReproOptions) -> tuple[int | None, str | None]:
    """The catalog entry (diag/catalog.py, the same rules preflight decides with) a failed pin matches."""
    nv = read_nvidia(Root("/"))
    ctx = catalog.PinContext(method=opts.method, register_flags=opts.register_flags, source=opts.source, map=opts.map,
                             per_call_bytes=opts.chunk or opts.size, page_size=PAGE_SIZE, release=os.uname().release,
                             driver_version=nv.version.version if nv.loaded and nv.version else None,
                             machine=os.uname().machine)
    found = catalog.diagnose_failed_pin(ev, ctx)
    return found.as_tuple() if found else (None, None)


def run_repro(opts: ReproOptions, run: RunDir, prefix: str = "",
              on_tick: Callable[[dict], None] | None = None) -> dict[str, Any]:
    validate(opts)
    result: dict[str, Any] = {
        "tool": "hostpin", "command": "repro register", "options": asdict(opts), "run_dir": str(run.path),
        "outcome": None, "bound": None, "seconds": None, "rate_gib_s": None, "pinned_pages": None,
        "expected_pages": opts.size // PAGE_SIZE * opts.ranks, "page_size": PAGE_SIZE, "first_bound_at_s": None,
        "eta_error": None,
        "ranks": [], "notes": [],
    }
    if opts.uses_gpu and not read_nvidia(Root("/")).loaded:
        result.update(outcome="unevaluated", verdict="no NVIDIA driver / no GPU on this node: --method "
                      f"{opts.method} needs one; --method mlock reproduces the kernel side without a GPU")
        return result
    refusal = None if opts.ignore_leftovers else leftovers_refusal()
    refusal = refusal or (None if opts.force else safety(opts))
    if refusal:
        result.update(outcome="refused", refusal=refusal, verdict=f"refused: {refusal['summary']}; nothing was "
                      f"allocated ({refusal.get('override', '--force')} runs it anyway)")
        return result
    cleanup = Cleanup()
    state: dict[str, Any] = {"children": [], "wd": None}
    try:
        with cleanup.signals_raise():
            try:
                _run(opts, run, prefix, on_tick, cleanup, state, result)
            except Interrupted as exc:
                result["outcome"] = "interrupted"
                result["interrupted_by"] = exc.args[0]
                wd = state["wd"]
                if wd is not None and any(c.alive for c in state["children"]):
                    result["kill"] = wd.kill_children("interrupted", wait_s=10.0)
    finally:
        result["cleanup"] = cleanup.run_all()
        problems = [p for step in result["cleanup"] for p in step["problems"]]
        if problems:
            result["notes"].append("cleanup could not undo everything: " + "; ".join(problems))
    if result["outcome"] == "interrupted":
        result["verdict"] = (f"interrupted by {result['interrupted_by']}; children killed and everything set up "
                             "was removed" + ("" if not problems else " except: " + "; ".join(problems)))
    return result


def _run(opts: ReproOptions, run: RunDir, prefix: str, on_tick, cleanup: Cleanup, state: dict,
         result: dict) -> None:
    if not prefix:  # a matrix records the node once, before its first case
        result["facts"] = node_facts(Root("/", run=run))  # the node before, in the evidence (root/...)
    if opts.make_swap:
        try:
            swap = SwapFile(opts.swap_dir, opts.make_swap).create()
        except SwapError as exc:
            raise ReproError(str(exc)) from None
        cleanup.push(f"swap file {swap.path}", swap.remove)
        result["swap_file"] = str(swap.path)
    swaps = active_swaps()
    if (opts.swap_out or opts.swap_in_rate) and not swaps:
        raise ReproError("the node has no swap: add --make-swap SIZE (a temporary swap file, removed afterwards)")
    cgroups: list[RunCgroup | None] = [None] * opts.ranks
    # throttles apply to the whole disks that hold the swap devices
    disks = sorted({block_device_for(dev) for dev in swaps}) if opts.swap_in_rate else []
    if opts.swap_out or opts.swap_in_rate:
        for rank in range(opts.ranks):
            try:
                cg = RunCgroup(cgroup_name(os.getpid(), abs(hash(prefix)) % 10000, rank)).create(
                    want_io=bool(opts.swap_in_rate))
            except (CgroupError, OSError) as exc:
                raise ReproError(f"cannot create a cgroup for the swap scenario: {exc} (needs root)") from None
            cleanup.push(f"cgroup {', '.join(map(str, cg.dirs))}", cg.remove)
            cgroups[rank] = cg
            for majmin in disks:
                cg.throttle_reads(majmin, opts.swap_in_rate)
        result["cgroups"] = [str(d) for cg in cgroups if cg for d in cg.dirs]
        if opts.swap_in_rate:
            result["throttle"] = {"devices": disks, "read_bytes_per_s": opts.swap_in_rate}

    children: list[Child] = state["children"]

    def kill_all() -> list[str]:
        return [f"child pid {c.pid} still alive after SIGKILL (unkillable)" for c in kill_and_wait(children)]

    cleanup.push("children", kill_all)
    spec = opts.child_spec()
    for rank in range(opts.ranks):
        join = cgroups[rank].join_files() if cgroups[rank] else []
        children.append(spawn_child(spec, rank, run, prefix, join))
    wd = Watchdog(run, prefix, children, opts.method, opts.size // PAGE_SIZE * opts.ranks, interval=opts.interval,
                  stall_after=opts.stall_after, deadline=opts.deadline, on_tick=on_tick)
    state["wd"] = wd
    try:
        _drive(opts, wd, children, cgroups, result)
    finally:
        result["watchdog"] = wd.finish()


def _all(children: list[Child], *names: str) -> Callable[[], bool]:
    return lambda: all(c.has(*names) for c in children)


def _drive(opts: ReproOptions, wd: Watchdog, children: list[Child], cgroups: list, result: dict) -> None:
    # 1. setup: CUDA context, calibration, the region mapped
    stop = wd.wait(_all(children, "ready", "setup_failed"), deadline=min(filter(None, [wd.deadline, SETUP_TIMEOUT_S])))
    failed = [c for c in children if c.has("setup_failed")]
    if stop or failed:
        _finish_early(opts, wd, children, result, stop or "setup_failed")
        return
    cal = children[0].last["ready"].get("calibration")
    if cal and cal.get("seconds"):
        result["clean_rate_gib_s"] = cal["bytes"] / GiB / cal["seconds"]
        result["calibration"] = cal
        wd.clean_pages_s = cal["bytes"] / PAGE_SIZE / cal["seconds"] * len(children)
    # 2. prefault; then, for --swap-out, reclaim that much of each child's cgroup into swap
    wd.mark_region_base()
    if opts.prefault or opts.swap_out:
        if opts.swap_out and not opts.prefault:
            result["notes"].append("the region was touched anyway: --swap-out needs it resident first")
        wd.phase = "prefault"
        for c in children:
            c.send("prefault")
        stop = wd.wait(_all(children, "prefault_done", "error"), stall=True)
        if stop or any(c.has("error") for c in children):
            _finish_early(opts, wd, children, result, stop or "prefault_error")
            return
    if opts.swap_out:
        import threading
        from diag.process import read_status
        wd.phase = "swap-out"
        for c in children:
            c.send(f"pageout {opts.swap_out}")
        stop = wd.wait(_all(children, "pageout_done", "error"), stall=True)
        if stop or any(c.has("error") for c in children):
            _finish_early(opts, wd, children, result, stop or "pageout_error")
            return
        outcomes: list = [None] * len(children)

        def drop(i: int, cg: RunCgroup) -> None:
            outcomes[i] = cg.drop_swap_cache()

        # reclaim runs in the writing thread: keep it off the watchdog's thread
        threads = [threading.Thread(target=drop, args=(i, cg), daemon=True) for i, cg in enumerate(cgroups)]
        for t in threads:
            t.start()
        stop = wd.wait(lambda: not any(t.is_alive() for t in threads))
        if stop:
            _finish_early(opts, wd, children, result, stop)
            return
        swapped = []
        for c in children:
            st = read_status(c.pid)
            swapped.append(st.vm_swap_bytes if st else None)
        result["swapped_out_bytes"] = swapped
        result["swap_out_steps"] = outcomes
        if any(x is not None and x < 0.8 * opts.swap_out for x in swapped):
            result["notes"].append(f"asked for {format_bytes(opts.swap_out)} in swap per rank, the region has "
                                   + ", ".join(format_bytes(x) for x in swapped))
    # 3. pin, all ranks at the same moment
    wd.start_pin()
    stop = wd.wait(_all(children, "pin_done", "pin_failed", "error"), stall=True)
    wd.pin_running = False
    wd.pin_end_t = wd.now()
    wd.pinned_at_end = wd.tick()["vm"].get(wd.counter, 0)  # the counters right after the pin
    if stop:
        _finish_early(opts, wd, children, result, stop)
        return
    # 4. undo: unpin, unmap, exit
    wd.phase = "undo"
    for c in children:
        c.send("quit")
    stop = wd.wait(lambda: all(c.has("exit") or not c.alive for c in children), deadline=wd.now() + UNDO_TIMEOUT_S)
    if stop == "deadline":
        result["undo_kill"] = wd.kill_children("undo-timeout")
    for c in children:
        try:
            c.proc.wait(timeout=10)
        except Exception:
            pass
    _summarize(opts, wd, children, result, stop_reason=None)


def _finish_early(opts, wd: Watchdog, children: list[Child], result: dict, reason: str) -> None:
    result["stopped"] = {"reason": reason, "phase": wd.phase, "at_s": round(wd.now(), 3), "progress": wd.progress}
    if reason in ("deadline", "stall"):
        result["kill"] = wd.kill_children(reason)
    else:
        for c in children:
            if c.alive:
                c.send("quit")
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and any(c.alive and not c.has("exit") for c in children):
            wd.pump_events()
            time.sleep(0.05)
        if any(c.alive for c in children):
            result["kill"] = wd.kill_children("after-" + reason)
    _summarize(opts, wd, children, result, stop_reason=reason)


def _rank_result(opts: ReproOptions, c: Child, stop_reason: str | None) -> dict:
    r: dict[str, Any] = {"rank": c.rank, "pid": c.pid, "exit_status": c.poll()}
    if "prefault_done" in c.last:
        pf = c.last["prefault_done"]
        r["prefault"] = {k: pf.get(k) for k in ("seconds", "rate_gib_s", "threads", "method", "skipped")}
    if "pin_done" in c.last:
        ev = c.last["pin_done"]
        r.update(outcome="completed", seconds=ev["seconds"], chunks=ev.get("chunks"),
                 rate_gib_s=opts.size / GiB / ev["seconds"] if ev["seconds"] > 0 else None)
    elif "pin_failed" in c.last or "setup_failed" in c.last or "error" in c.last:
        ev = c.last.get("pin_failed") or c.last.get("setup_failed") or c.last.get("error")
        catalog, meaning = failure_catalog(ev, opts)
        r.update(outcome="failed", seconds=ev.get("seconds"), error={
            "call": ev.get("call"), "code": ev.get("code"), "name": ev.get("name"), "message": ev.get("error"),
            "catalog": catalog, "meaning": meaning}, chunks=ev.get("chunks"))
    elif stop_reason == "stall":
        r["outcome"] = "stalled"
    elif stop_reason == "deadline":
        r["outcome"] = "killed"
    else:
        status = c.poll()
        catalog_id, meaning = failure_catalog({"signal": -status if status and status < 0 else None}, opts)
        r.update(outcome="failed", error={"message": f"the child died before finishing (exit status {status}"
                                                    f"{': killed by signal ' + str(-status) if status and status < 0 else ''}"
                                                    "; OOM killer? see dmesg)", "catalog": catalog_id, "meaning": meaning})
    if c.unkillable:
        r["outcome"] = "unkillable"
    if "unpin_done" in c.last:
        r["unpin_s"] = c.last["unpin_done"]["seconds"]
    return r


def _summarize(opts: ReproOptions, wd: Watchdog, children: list[Child], result: dict, stop_reason) -> None:
    ranks = [_rank_result(opts, c, stop_reason) for c in children]
    result["ranks"] = ranks
    worst = max(ranks, key=lambda r: _SEVERITY.get(r["outcome"], 2))
    outcome = worst["outcome"]
    last = wd.samples[-1] if wd.samples else {"vm": {}}
    pinned = None
    if wd.pin_t is not None:
        at_end = wd.pinned_at_end if wd.pinned_at_end is not None else last["vm"].get(wd.counter, 0)
        pinned = min(at_end, result["expected_pages"])
    result["pinned_pages"] = pinned
    result["progress_counter"] = wd.source_counter
    done_secs = [r["seconds"] for r in ranks if r.get("outcome") == "completed" and r.get("seconds")]
    if outcome == "completed" and done_secs:
        seconds = max(done_secs)
        result["seconds"] = seconds
        result["rate_gib_s"] = opts.size * opts.ranks / GiB / seconds
        clean = result.get("clean_rate_gib_s")
        per_rank_rate = opts.size / GiB / seconds
        if clean and per_rank_rate * SLOW_FACTOR < clean:
            outcome = "slow"
            result["slowdown"] = clean / per_rank_rate
        elif clean:
            result["slowdown"] = clean / per_rank_rate
    elif wd.pin_t is not None:
        result["seconds"] = (wd.pin_end_t or wd.now()) - wd.pin_t
    result["outcome"] = outcome
    if wd.bound_counts:
        result["bound"] = max(wd.bound_counts, key=wd.bound_counts.get)
        result["bound_counts"] = wd.bound_counts
        result["bound_reason"] = getattr(wd, "first_bound", {}).get("reason")
    result["first_bound_at_s"] = round(wd.first_bound_at, 3) if wd.first_bound_at is not None else None
    if wd.eta_at_20 and result.get("seconds"):
        result["eta_at_20pct"] = wd.eta_at_20
        if outcome in ("completed", "slow"):
            result["eta_error"] = round((wd.eta_at_20["predicted_total_s"] - result["seconds"]) / result["seconds"], 4)
    if wd.pin_t is not None:
        pin_samples = [s for s in wd.samples if s["t"] >= wd.pin_t]
        if pin_samples:
            first = next((s for s in reversed(wd.samples) if s["t"] <= wd.pin_t), pin_samples[0])
            swapin = pin_samples[-1]["vm"].get("pswpin", 0) - first["vm"].get("pswpin", 0)
            span = max(1e-6, pin_samples[-1]["t"] - wd.pin_t)
            result["swapin_pages_during_pin"] = swapin
            result["swapin_pages_per_s"] = swapin / span
        foreign = last["vm"].get("nr_foll_pin_acquired", 0) - wd.pin_vm.get("nr_foll_pin_acquired", 0)
        if opts.method == "register" and foreign > result["expected_pages"] * 1.02:
            result["notes"].append(f"nr_foll_pin_acquired rose by {foreign:,} pages, more than this run pins: "
                                   "another pinner was active (the counter is system-wide)")
    result["verdict"] = verdict(opts, result)


def _verb(method: str) -> str:
    return {"register": "registered", "hostalloc": "allocated pinned by cudaHostAlloc", "mlock": "locked"}[method]


def verdict(opts: ReproOptions, r: dict) -> str:
    size = format_bytes(opts.size) + (f" x {opts.ranks} ranks" if opts.ranks > 1 else "")
    outcome = r["outcome"]
    progress = r.get("pinned_pages")
    pct = f"{100.0 * progress / r['expected_pages']:.0f}%" if progress is not None and r["expected_pages"] else "?"
    if outcome in ("completed", "slow"):
        head = f"{size} {_verb(opts.method)} in {format_duration(r['seconds'])} ({r['rate_gib_s']:.2f} GiB/s"
        if r.get("slowdown") and outcome == "slow":
            times = f"{r['slowdown']:.0f}x" if r["slowdown"] < 1000 else "over 1000x"
            head += f", {times} slower than this node's clean rate"
        head += ")"
        cause = _cause(opts, r)
        return head + (f": {cause}." if cause else ".")
    if outcome == "failed":
        rk = next(x for x in r["ranks"] if x["outcome"] == "failed")
        e = rk["error"]
        what = f"{e.get('call') or 'the pin'} of {format_bytes(opts.chunk or opts.size)} failed"
        when = f" after {format_duration(rk['seconds'])}" if rk.get("seconds") is not None else ""
        name = f": {e['name']}" if e.get("name") else f": {e.get('message')}"
        cat = f" (catalog {e['catalog']}: {e['meaning']})" if e.get("catalog") and e.get("meaning") else ""
        return what + when + name + cat + "."
    bound = f"bound {r['bound']}" + (f" ({r.get('bound_reason')})" if r.get("bound_reason") else "") if r.get("bound") else "bound unknown"
    if outcome == "stalled":
        return (f"stalled: no progress for {format_duration(opts.stall_after)} at {pct} of {size} ({bound}); "
                "all stacks and the dmesg tail were captured, then the child was killed.")
    if outcome == "killed":
        return (f"killed at the {format_duration(opts.deadline)} deadline at {pct} of {size} ({bound}); "
                "all stacks and the dmesg tail were captured first.")
    if outcome == "unkillable":
        return (f"the child is still alive after SIGKILL at {pct} of {size} ({bound}): it is stuck in the kernel; "
                "its stack is in the run directory.")
    return outcome


def _cause(opts: ReproOptions, r: dict) -> str | None:
    bound = r.get("bound")
    if bound == "swap-in":
        swapped = sum(x or 0 for x in r.get("swapped_out_bytes") or [])
        part = f"{format_bytes(swapped)} of the region was in swap and was" if swapped else "swapped pages were"
        rate = r.get("swapin_pages_per_s") or 0
        rate_text = f"{rate / 1000:,.0f}k" if rate >= 10000 else f"{rate:,.0f}"
        return f"{part} read back at {rate_text} pages/s"
    if bound == "fault-in/zeroing":
        return "the region was faulted in and zeroed during the pin" + ("" if opts.prefault else " (--no-prefault)")
    if bound == "compaction":
        return "huge-page faults stalled in direct compaction"
    if bound == "migration":
        return "pages were migrated out of movable/CMA memory before pinning"
    if bound == "driver":
        if opts.ranks > 1 and r.get("clean_rate_gib_s"):
            each = opts.size / GiB / r["seconds"]
            return (f"{opts.ranks} ranks at once ran at {each:.1f} GiB/s each against {r['clean_rate_gib_s']:.1f} "
                    "alone; the kernel pinned every page quickly and the ranks then queued in the driver while it "
                    "mapped them (catalog 7)")
        return "the kernel pinned every page quickly; the rest was the driver mapping them after pin_user_pages"
    if bound == "lock wait":
        return f"the pin waited on a lock ({r.get('bound_reason')})"
    return None
