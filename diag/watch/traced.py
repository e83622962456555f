"""`--trace` in a watch: start the kernel tracer (diag.trace), and put its budgets into the result.

Without root, tracefs or a needed tracepoint, the watch goes on sampling and says why; it
never fails for that.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..exitcodes import EXIT_REFUSED
from ..trace import CAUSES, Tracer, TraceUnavailable, attach_budgets, pick_pinner
from ..units import format_bytes

__all__ = ["start_trace", "finish_trace", "budget_text", "BOUND_CAUSE", "refuse_trace_without_root"]

# the sampled bound and the budget's term that measures the same thing
BOUND_CAUSE = {"swap-in": "io", "file-read": "io", "fault-in/zeroing": "cpu", "compaction": "compaction",
               "migration": "migration", "reclaim": "reclaim", "lock wait": "lock_wait", "driver-lock": "lock_wait",
               "cpu": "cpu", "driver": "cpu", "iommu": "cpu"}
# driver and iommu: the driver's own work after pin_user_pages (mapping the pages) runs on the pinning
# thread's CPU; the trace sees it as cpu (measured on the H200: a prefaulted 47 GiB register, 2.11 s of
# its 2.13 s on a CPU, tests/fixtures/h200-trace-register-prefaulted)


def refuse_trace_without_root() -> None:
    """--trace needs root: one line and EXIT_REFUSED, before anything is set up."""
    import os

    import click
    if os.geteuid() != 0:
        exc = click.ClickException("--trace needs root (it creates tracefs instances): run as root, or leave "
                                   "--trace out")
        exc.exit_code = EXIT_REFUSED
        raise exc


def start_trace(run: Any, pids: Iterable[int], t0: float, notes: list[str],
                devices: Iterable[str] = ()) -> Tracer | None:
    try:
        return Tracer.start(run, list(pids), t0, devices=devices)
    except TraceUnavailable as exc:
        notes.append(f"--trace: {exc}; the bound is sampled only")
        return None


def budget_text(b: dict) -> str:
    """One line of a budget, its largest terms first.

    >>> budget_text({"wall_s": 3.1, "causes": {"io": 2.8, "cpu": 0.2, "other": 0.1}, "explained": 0.96,
    ...              "io": {"requests": 1529, "bytes": 50069504, "devices": {"254:0": 1529}}})
    'of the 3.1 s, io 2.80 s (1529 reads, 47.8 MiB, 32 KiB each, on 254:0), cpu 0.20 s, other 0.10 s; 96% measured'
    """
    causes = b.get("causes") or {}
    io = b.get("io") or {}
    parts = []
    for c in sorted(causes, key=lambda c: -(causes[c] or 0)):
        s = causes[c] or 0
        if s < 0.005 and c != "other":
            continue
        text = f"{c} {s:.2f} s"
        if c == "io" and io.get("requests"):
            each = io["bytes"] / io["requests"] if io.get("requests") else 0
            devs = ", ".join(io.get("devices") or {})
            lat = (io.get("sleep_latency") or {}).get("p50_ms")
            text += (f" ({io['requests']} reads, {format_bytes(io['bytes'])}, {format_bytes(each)} each"
                     + (f", median sleep {lat:.2f} ms" if lat else "") + (f", on {devs}" if devs else "") + ")")
        parts.append(text)
    explained = b.get("explained")
    tail = f"; {round(100 * explained)}% measured" if explained is not None else ""
    unseen, wall = b.get("unseen_s") or 0, b.get("wall_s") or 0
    if wall and unseen >= 0.05 * wall:
        tail += f" (cpu includes {unseen:.2f} s after a wakeup or preemption whose switch back was not recorded)"
    return f"of the {b.get('wall_s', 0):.1f} s, " + ", ".join(parts) + tail


def _disagreement(bound: str | None, b: dict) -> str | None:
    causes = b.get("causes") or {}
    want = BOUND_CAUSE.get(bound or "")
    if not want or not causes:
        return None
    top = max((c for c in causes if c != "runqueue"), key=lambda c: causes[c] or 0)
    if top == want:
        return None
    wall = b.get("wall_s") or 0
    share = 100 * (causes.get(want) or 0) / wall if wall else 0
    return (f"the sampled bound ({bound}) and the trace disagree: the trace measured {top} for the most time, "
            f"{want} for {share:.0f}% of the phase")


def finish_trace(tracer: Tracer | None, result: Any) -> None:
    """Stop the tracer, give every phase its time_budget, and quote the main phase's in the verdict."""
    if tracer is None:
        return
    summary = tracer.stop()
    attach_budgets(result.phases, tracer)
    result.trace = summary
    result.notes.extend(summary.get("notes") or [])
    for xid in summary.get("xids") or []:
        code = xid.get("xid") or xid.get("code")
        result.notes.append(f"Xid {code if code is not None else '?'} from the NVIDIA driver during the watch: "
                            f"{xid.get('text', '')}")
    for p in summary.get("cleanup_problems") or []:
        result.notes.append(f"--trace: {p}")
    main = result.main_phase
    b = getattr(main, "time_budget", None) if main is not None else None
    if b:
        result.verdict = (result.verdict.rstrip(".") + f". Trace: {budget_text(b)}")
        if b.get("dropped"):
            result.verdict += f" ({b['dropped']} events lost)"
        other = _disagreement(main.bound, b)
        if other:
            result.verdict += f"; {other}"
        result.verdict += "."


assert set(BOUND_CAUSE.values()) <= set(CAUSES)


def _busiest(tracer: Tracer, pid: int, start_s: float, end_s: float) -> dict | None:
    """The budget of the process's thread that did the pin (diag.trace.budget.pick_pinner)."""
    tids = sorted(t for t in tracer.tids if t == pid or _in_process(t, pid, tracer))
    return pick_pinner({tid: tracer.budget(tid, start_s, end_s) for tid in tids})


def _in_process(tid: int, pid: int, tracer: Tracer) -> bool:
    return tid in tracer.threads_of.get(pid, ())


def reproduction_budgets(tracer: Tracer | None, pids: list[int], start_s: float | None, end_s: float | None,
                         result: dict) -> None:
    """`repro register --trace`: stop the tracer, put each rank's pin budget into result["phases"],
    the first rank's into result["time_budget"], and quote it in the verdict."""
    if tracer is None:
        return
    summary = tracer.stop()
    result["trace"] = summary
    result["notes"].extend(summary.get("notes") or [])
    result["notes"].extend(f"--trace: {p}" for p in summary.get("cleanup_problems") or [])
    if start_s is None or end_s is None:
        return
    phases = []
    for pid in pids:
        b = _busiest(tracer, pid, start_s, end_s)
        phases.append({"pid": pid, "tid": b["tid"] if b else None, "started_s": round(start_s, 3),
                       "seconds": round(end_s - start_s, 3), "time_budget": b})
    result["phases"] = phases
    b = phases[0]["time_budget"] if phases else None
    result["time_budget"] = b
    if b and result.get("verdict"):
        result["verdict"] = result["verdict"].rstrip(".") + f". Trace: {budget_text(b)}"
        if b.get("dropped"):
            result["verdict"] += f" ({b['dropped']} events lost)"
        other = _disagreement(result.get("bound"), b)
        result["verdict"] += (f"; {other}" if other else "") + "."
