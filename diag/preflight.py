"""Run every check against a node (live or captured) for a plan, and decide."""
from __future__ import annotations

import platform
import socket
import threading
import time
from pathlib import Path
from typing import Any

from . import cuda as cuda_mod
from .checks import FAIL, PASS, SKIP, STATUS_ORDER, WARN, Context, Plan, Verdict, all_checks
from .evidence import RunDir
from .exitcodes import EXIT_FAIL, EXIT_OK, EXIT_UNEVALUATED
from .rootfs import Root, resolve_root
from .units import format_bytes

__all__ = ["run_preflight", "load_captured_cuda", "start_cuda_probe"]


def load_captured_cuda(root_dir: Path) -> dict | None:
    """The CUDA facts a snapshot kept next to its tree (RUN/probes/cuda.json), if any: a JSON
    object read without following a link (diag.confined), else None."""
    from .confined import read_json_object
    for base in (root_dir.parent, root_dir):
        found = read_json_object(base, "probes/cuda.json")
        if found is not None:
            return found
    return None


def start_cuda_probe(timeout: float) -> tuple[threading.Thread, dict]:
    """Start the child probe now so that it runs while the checks read /proc."""
    box: dict[str, Any] = {}

    def work() -> None:
        box["started"] = time.time()
        box["result"] = cuda_mod.probe_in_child(timeout)

    thread = threading.Thread(target=work, name="cuda-probe", daemon=True)
    thread.start()
    return thread, box


def record_probe(run: RunDir | None, result: dict) -> None:
    if run is None:
        return
    run.add_json("probes/cuda.json", result, kind="probe", source="python -m diag.cuda probe",
                 duration_s=result.get("duration_s") or 0.0, returncode=result.get("returncode"),
                 timed_out=result.get("status") == "timeout")


def run_preflight(plan: Plan, root_path: Path | str = "/", run: RunDir | None = None, cuda: str = "probe",
                  cuda_timeout: float = cuda_mod.DEFAULT_TIMEOUT_S, skip: tuple[str, ...] = (),
                  sample_s: float = 1.0) -> dict[str, Any]:
    """cuda: 'probe' (child process), 'off' (--no-cuda), or 'captured' (read from the snapshot)."""
    t0 = time.monotonic()
    root_dir = resolve_root(root_path)
    root = Root(root_dir, run=run)
    probe_thread = box = None
    cuda_result, cuda_skip = None, None
    if cuda == "probe" and root.live:
        probe_thread, box = start_cuda_probe(cuda_timeout)
    elif cuda == "off":
        cuda_skip = "CUDA probe off (--no-cuda)"
    else:
        cuda_result = load_captured_cuda(root_dir)
        if cuda_result is None:
            cuda_skip = "no CUDA facts in this capture (hostpin snapshot keeps them in probes/cuda.json)"

    ctx = Context(root, plan, cuda=cuda_result, cuda_skip_reason=cuda_skip, sample_s=sample_s)
    result: dict[str, Any] = {
        "tool": "hostpin", "command": "preflight", "plan": {**plan.__dict__, "describe": plan.describe()},
        "root": str(root_dir), "live": root.live, "run_dir": str(run.path) if run else None,
        "host": socket.gethostname() if root.live else None,
        "kernel": None, "checks": [],
    }
    if ctx.meminfo is None or ctx.meminfo.total_bytes is None:
        if probe_thread:
            probe_thread.join()
        result.update(status="error", exit_code=EXIT_UNEVALUATED,
                      verdict=f"cannot evaluate this node: {ctx.why_missing('meminfo')} is unreadable; "
                              "--root must point at a captured tree (a hostpin snapshot run directory, "
                              "or a directory holding proc/ and sys/)")
        result["duration_s"] = round(time.monotonic() - t0, 3)
        return result
    result["kernel"] = ctx.release
    result["machine"] = platform.machine() if root.live else None

    results: list[tuple[Any, Verdict]] = []
    for check in all_checks():
        if check.id in skip:
            results.append((check, Verdict(SKIP, "skipped on request (--skip)")))
            continue
        if check.id == "device" and probe_thread is not None:
            probe_thread.join()
            ctx.cuda = box["result"]
            record_probe(run, ctx.cuda)
            probe_thread = None
        try:
            verdict = check.run(ctx)
        except Exception as exc:  # a check bug must not hide the others; say so loudly
            verdict = Verdict(SKIP, f"check crashed: {type(exc).__name__}: {exc} (please report this)")
        results.append((check, verdict))
    if probe_thread is not None:
        probe_thread.join()
        ctx.cuda = box["result"]
        record_probe(run, ctx.cuda)

    results.sort(key=lambda cv: STATUS_ORDER[cv[1].status])
    result["checks"] = [{"id": c.id, "title": c.title, "catalog": list(c.catalog), "status": v.status,
                         "summary": v.summary, "remedy": v.remedy, "evidence": v.evidence} for c, v in results]
    statuses = {v.status for _, v in results}
    status = FAIL if FAIL in statuses else WARN if WARN in statuses else PASS
    result["status"] = status
    result["exit_code"] = EXIT_FAIL if status == FAIL else EXIT_OK
    result["verdict"] = _verdict(plan, results, status)
    from .facts import node_facts
    result["facts"] = node_facts(root)
    if ctx.cuda is not None:
        result["cuda"] = {k: ctx.cuda.get(k) for k in ("status", "message", "driver_version", "duration_s")}
    result["duration_s"] = round(time.monotonic() - t0, 3)
    return result


def _verdict(plan: Plan, results, status: str) -> str:
    fails = [c.id for c, v in results if v.status == FAIL]
    warns = [c.id for c, v in results if v.status == WARN]
    what = (f"pin {plan.ranks} x {format_bytes(plan.size_bytes)} by {plan.method}" if plan.size_bytes
            else f"node state for {plan.method} (no --size given)")
    if status == FAIL:
        first = next(v for c, v in results if v.status == FAIL)
        return f"this node cannot {what} now: {first.summary} (failed: {', '.join(fails)})"
    if status == WARN:
        return f"this node can {what}, with warnings: {', '.join(warns)}"
    if plan.size_bytes:
        return f"this node can {what} now"
    return f"nothing wrong in the {what}"
