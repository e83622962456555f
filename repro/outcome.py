"""What a reproduction came to: each rank's outcome, the run's figures and its verdict sentence,
and the typed result (diag.reproresult.ReproRegisterResult) built from them.

Reads what the supervisor and its tracker kept (diag.watch.tracker.summary) and the children's
events; writes nothing.
"""
from __future__ import annotations

import os
from typing import Any

from diag import catalog
from diag.exitcodes import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, EXIT_UNEVALUATED
from diag.nvidia import read_nvidia
from diag.pagesize import live_page_size
from diag.reproresult import PinError, PrefaultFigures, RankResult, ReproRegisterResult
from diag.rootfs import Root
from diag.units import GiB, format_bytes, format_duration
from diag.watch.render import cause_sentence

from .children import Child

__all__ = ["SLOW_FACTOR", "OUTCOMES", "build_result", "exit_code_for", "failure_catalog", "summarize", "verdict"]

SLOW_FACTOR = 4.0  # completed at less than a quarter of this node's clean rate: "slow"
OUTCOMES = ("completed", "slow", "failed", "stalled", "killed", "unkillable", "refused", "interrupted",
            "unevaluated")
_SEVERITY = {"completed": 0, "slow": 1, "failed": 2, "stalled": 3, "killed": 4, "unkillable": 5}


def exit_code_for(outcome: str) -> int:
    return {"completed": EXIT_OK, "slow": EXIT_OK, "refused": EXIT_REFUSED, "interrupted": EXIT_INTERRUPTED,
            "unevaluated": EXIT_UNEVALUATED}.get(outcome, EXIT_FAIL)


def failure_catalog(ev: dict, opts) -> tuple[int | None, str | None]:
    """The catalog entry (diag/catalog.py, the same rules preflight decides with) a failed pin matches."""
    nv = read_nvidia(Root("/"))
    ctx = catalog.PinContext(method=opts.method, register_flags=opts.register_flags, source=opts.source, map=opts.map,
                             per_call_bytes=opts.chunk or opts.size, page_size=live_page_size(),
                             release=os.uname().release,
                             driver_version=nv.version.version if nv.loaded and nv.version else None,
                             machine=os.uname().machine)
    found = catalog.diagnose_failed_pin(ev, ctx)
    return found.as_tuple() if found else (None, None)


def _rank_result(opts, c: Child, stop_reason: str | None) -> RankResult:
    rank = RankResult(rank=c.rank, pid=c.pid, device=c.device, exit_status=c.poll(), outcome="failed")
    if "prefault_done" in c.last:
        pf = c.last["prefault_done"]
        rank.prefault = PrefaultFigures(**{k: pf.get(k) for k in ("seconds", "rate_gib_s", "threads", "method",
                                                                   "skipped")})
    if "pin_done" in c.last:
        ev = c.last["pin_done"]
        rank.outcome, rank.seconds, rank.chunks = "completed", ev["seconds"], ev.get("chunks")
        rank.rate_gib_s = opts.size / GiB / ev["seconds"] if ev["seconds"] > 0 else None
    elif "pin_failed" in c.last or "setup_failed" in c.last or "error" in c.last:
        ev = c.last.get("pin_failed") or c.last.get("setup_failed") or c.last.get("error")
        entry, meaning = failure_catalog(ev, opts)
        rank.seconds, rank.chunks = ev.get("seconds"), ev.get("chunks")
        rank.error = PinError(call=ev.get("call"), code=ev.get("code"), name=ev.get("name"), message=ev.get("error"),
                              catalog=entry, meaning=meaning)
    elif stop_reason == "stall":
        rank.outcome = "stalled"
    elif stop_reason == "deadline":
        rank.outcome = "killed"
    else:
        status = c.poll()
        signal = -status if status and status < 0 else None
        catalog_id, meaning = failure_catalog({"signal": signal}, opts)
        rank.error = PinError(message=f"the child died before finishing (exit status {status}"
                                      f"{': killed by signal ' + str(signal) if signal else ''}; OOM killer? see dmesg)",
                              catalog=catalog_id, meaning=meaning)
    if c.unkillable:
        rank.outcome = "unkillable"
    if "unpin_done" in c.last:
        rank.unpin_s = c.last["unpin_done"]["seconds"]
    return rank


def build_result(record: dict[str, Any]) -> ReproRegisterResult:
    """The run's typed result, from what the reproduction recorded as it went (repro.register's
    record); its exit code follows from the outcome. A field of the wrong type is a bug here:
    ResultDamaged names it."""
    result = ReproRegisterResult.from_dict(record)
    result.upgraded_from = None
    result.exit_code = exit_code_for(result.outcome)
    return result


def summarize(opts, sup, result: dict, stop_reason: str | None) -> None:
    """Fill the result from the ranks' events and the pin's tracker."""
    ranks = [_rank_result(opts, c, stop_reason) for c in sup.children]
    result["ranks"] = ranks
    outcome = max(ranks, key=lambda r: _SEVERITY.get(r.outcome, 2)).outcome
    tr = sup.tracker
    summary = tr.summary() if tr is not None else {}
    result["pinned_pages"] = summary.get("pinned_pages")
    result["progress_counter"] = {"pins": "pins outstanding (nr_foll_pin_acquired - nr_foll_pin_released)",
                                  "shmem": "RssShmem", "node-shmem": "the node's Shmem (system-wide)",
                                  "resident": "VmRSS"}.get(summary.get("progress_basis"),
                                                                                  summary.get("progress_basis"))
    done_secs = [r.seconds for r in ranks if r.outcome == "completed" and r.seconds]
    if outcome == "completed" and done_secs:
        seconds = max(done_secs)
        result["seconds"] = seconds
        result["rate_gib_s"] = opts.size * opts.ranks / GiB / seconds
        clean = result.get("clean_rate_gib_s")
        per_rank_rate = opts.size / GiB / seconds
        if clean:
            result["slowdown"] = clean / per_rank_rate
            if per_rank_rate * SLOW_FACTOR < clean:
                outcome = "slow"
    elif sup.pin_t is not None:
        result["seconds"] = (sup.pin_end_t or sup.now()) - sup.pin_t
    result["outcome"] = outcome
    if summary.get("bound"):
        result.update(bound=summary["bound"], bound_counts=summary["bound_counts"],
                      bound_reason=summary["bound_reason"], bound_evidence=summary["bound_reason"],
                      bound_frame=summary["bound_frame"], catalog=summary["catalog"])
    result["first_bound_at_s"] = summary.get("first_bound_at_s")
    if summary.get("shared_counters"):
        result["notes"] += summary["shared_counters"]
    eta20 = summary.get("eta_at_20pct")
    if eta20 and result.get("seconds"):
        result["eta_at_20pct"] = eta20
        if outcome in ("completed", "slow"):
            result["eta_error"] = round((eta20["predicted_total_s"] - result["seconds"]) / result["seconds"], 4)
    if tr is not None:
        figures = summary.get("figures") or {}
        span = max(1e-6, figures.get("seconds") or result.get("seconds") or 1e-6)
        # the children's own swap-in (VmSwap); a shared-memory region's swap is not in VmSwap: system-wide then
        swapin = figures.get("swapped_in_bytes", 0) // sup.page or figures.get("system_swapin_pages", 0)
        result["swapin_pages_during_pin"] = swapin
        result["swapin_pages_per_s"] = swapin / span
        result["pin_figures"] = figures
        pins = figures.get("pins_outstanding_delta") or 0
        if opts.method == "register" and pins > result["expected_pages"] * 1.02:
            result["notes"].append(f"pins outstanding rose by {pins:,} pages, more than this run pins: another "
                                   "long-term pinner was active (nr_foll_pin_* are system-wide)")
    if result.get("file_cache"):
        result["file_cache"]["read_during_pin_bytes"] = (result.get("pin_figures") or {}).get("read_bytes")
    result["verdict"] = verdict(opts, result)


_TORCH_VERBS = {"empty": "allocated by torch.empty(pin_memory=True)", "pin_memory": "pinned by Tensor.pin_memory()",
                "register": "registered by torch.cuda.cudart().cudaHostRegister"}


def _verb(method: str) -> str:
    return {"register": "registered", "hostalloc": "allocated pinned by cudaHostAlloc", "mlock": "locked"}[method]


def verdict(opts, r: dict) -> str:
    size = format_bytes(opts.size) + (f" x {opts.ranks} ranks" if opts.ranks > 1 else "")
    outcome = r["outcome"]
    progress = r.get("pinned_pages")
    pct = f"{100.0 * progress / r['expected_pages']:.0f}%" if progress is not None and r["expected_pages"] else "?"
    if outcome in ("completed", "slow"):
        verb = _TORCH_VERBS.get(getattr(opts, "torch_call", None)) or _verb(opts.method)
        head = f"{size} {verb} in {format_duration(r['seconds'])} ({r['rate_gib_s']:.2f} GiB/s"
        if r.get("slowdown") and outcome == "slow":
            times = f"{r['slowdown']:.0f}x" if r["slowdown"] < 1000 else "over 1000x"
            head += f", {times} slower than this node's clean rate"
        head += ")"
        cause = _cause(opts, r)
        copy = _pin_memory_copy(opts, r)
        if copy:
            r["copy_from_swap"] = copy
            cause = (f"{cause}; " if cause else "") + copy["words"]
        return head + (f": {cause}." if cause else ".")
    if outcome == "failed":
        failed = [x for x in r["ranks"] if x.outcome == "failed"]
        # the rank whose call failed, not one that was stopped because of it ("died before finishing")
        rk = next((x for x in failed if x.error and x.error.call), failed[0])
        e = rk.error or PinError()
        if e.call == "cudaSetDevice":  # the rank's GPU, before anything was allocated
            said = e.message or "cudaSetDevice failed"
            said = said if said.startswith("rank ") else f"rank {rk.rank}: {said}"
            return said + (f" (cudaSetDevice: {e.name})" if e.name and e.name not in said else "") + "."
        what = f"{e.call or 'the pin'} of {format_bytes(opts.chunk or opts.size)} failed"
        when = f" after {format_duration(rk.seconds)}" if rk.seconds is not None else ""
        name = f": {e.name}" if e.name else f": {e.message}"
        cat = f" (catalog {e.catalog}: {e.meaning})" if e.catalog and e.meaning else ""
        return what + when + name + cat + "."
    bound = (f"bound {r['bound']}" + (f" ({r.get('bound_reason')})" if r.get("bound_reason") else "")
             if r.get("bound") else "bound unknown")
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


def _pin_memory_copy(opts, r: dict) -> dict | None:
    """Tensor.pin_memory() is a pinned allocation and then a copy that reads the source: swap read
    back during the call is the copy's, in the process's own faults (catalog 19), not the pin's.
    Measured on the H200 (torch 2.11): 16 GiB with 2 GiB in swap, the call's samples split 18
    fault-in/zeroing (the cudaHostAlloc) and 10 swap-in (the copy)."""
    if getattr(opts, "torch_call", None) != "pin_memory":
        return None
    pages = r.get("swapin_pages_during_pin") or 0
    page = r.get("page_size") or 4096
    if pages * page < (1 << 20):
        return None
    rate = r.get("swapin_pages_per_s") or 0
    samples = (r.get("bound_counts") or {}).get("swap-in", 0)
    rate_text = f"{rate / 1000:,.0f}k" if rate >= 10000 else f"{rate:,.0f}"
    words = (f"then the copy from its source read {format_bytes(pages * page)} back from swap ({pages:,} pages at "
             f"{rate_text} pages/s over the call; swap-in in the process's own faults, not the pin"
             + (f", {samples} samples" if samples else "") + ", catalog 19)")
    return {"swapped_in_bytes": pages * page, "swapin_pages": pages, "swap_in_samples": samples, "catalog": 19,
            "words": words}


def _cause(opts, r: dict) -> str | None:
    bound = r.get("bound")
    figures = r.get("pin_figures") or {}
    if bound == "swap-in":
        swapped = sum(x or 0 for x in r.get("swapped_out_bytes") or [])
        part = f"{format_bytes(swapped)} of the region was in swap and was" if swapped else "swapped pages were"
        rate = r.get("swapin_pages_per_s") or 0
        rate_text = f"{rate / 1000:,.0f}k" if rate >= 10000 else f"{rate:,.0f}"
        return f"{part} read back at {rate_text} pages/s"
    if bound == "file-read":
        read = figures.get("read_bytes")
        span = figures.get("seconds") or r.get("seconds")
        rate = f" ({format_bytes(read)} at {read / (1 << 20) / span:,.1f} MiB/s)" if read and span else ""
        copy = "; each page of the private mapping was then copied" if opts.map == "private" else ""
        return f"the region was read from {opts.source[5:] if opts.source.startswith('file:') else 'its file'}{rate}{copy}"
    if bound == "fault-in/zeroing":
        if getattr(opts, "torch_call", None) in ("pin_memory", "empty") and opts.method == "hostalloc":
            return "PyTorch's pinned block was allocated and zeroed by cudaHostAlloc during the call"
        return "the region was faulted in and zeroed during the pin" + ("" if opts.prefault else " (--no-prefault)")
    if bound == "reclaim":
        return "each allocation waited on memory reclaim" + (
            " in the run's memory cgroup" if "mem_cgroup" in str(r.get("bound_frame")) else "")
    if bound == "driver-lock":
        if opts.ranks > 1 and r.get("clean_rate_gib_s"):
            each = opts.size / GiB / r["seconds"]
            return (f"{opts.ranks} ranks at once ran at {each:.1f} GiB/s each against {r['clean_rate_gib_s']:.1f} "
                    "alone, queued on the driver's lock (catalog 7)")
        return "the pin queued on the driver's lock (catalog 7)"
    if bound == "driver":
        if opts.ranks > 1 and r.get("clean_rate_gib_s"):
            each = opts.size / GiB / r["seconds"]
            return (f"{opts.ranks} ranks at once ran at {each:.1f} GiB/s each against {r['clean_rate_gib_s']:.1f} "
                    "alone; the kernel pinned every page quickly and the ranks then queued in the driver while it "
                    "mapped them (catalog 7)")
        return "the kernel pinned every page quickly; the rest was the driver mapping them after pin_user_pages"
    if bound == "lock wait":
        return f"the pin waited on a lock ({r.get('bound_reason')})"
    return cause_sentence(bound, figures)
