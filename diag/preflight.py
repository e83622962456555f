"""Run every check against a node (live or captured) for a plan, and decide; fail closed.

The verdict is `error` (exit 3) when any check crashed, read a damaged file, or lacked a
reading that decides this plan; otherwise `fail` (exit 1), `warn` or `pass` (exit 0; --strict
makes a warning exit 1)."""
from __future__ import annotations

import importlib
import platform
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from . import cuda as cuda_mod
from .checks import ERROR, FAIL, PASS, SKIP, STATUS_ORDER, WARN, Context, Plan, Verdict
from .checks.suite import all_checks
from .evidence import RunDir
from .exitcodes import EXIT_FAIL, EXIT_OK, EXIT_UNEVALUATED
from .facts import DAMAGED, NOT_CAPTURED, OK, live_node_probe, node_facts
from .results import CheckResult, PreflightResult
from .rootfs import Root, resolve_root
from .safetext import one_line
from .units import format_bytes

__all__ = ["run_preflight", "load_captured_cuda", "start_cuda_probe", "record_probe", "record_node_probe"]


NEEDS_PROBE = frozenset({"device", "cotenants", "numa", "iommu"})  # the checks that read the CUDA probe's result


def load_captured_cuda(root_dir: Path) -> tuple[dict | None, str]:
    """(CUDA facts a snapshot kept next to its tree, state): state is ok, not captured or damaged.
    The file is read without following a link (diag.confined): a planted link is damage."""
    import json
    from .confined import PathRefused, open_dir
    for base in (root_dir.parent, root_dir):
        try:
            with open_dir(base) as d:
                raw = d.read_bytes("probes/cuda.json")
        except FileNotFoundError:
            continue
        except (OSError, PathRefused):
            return None, DAMAGED
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return None, DAMAGED
        return (data, OK) if isinstance(data, dict) else (None, DAMAGED)
    return None, NOT_CAPTURED


def start_cuda_probe(timeout: float, started: cuda_mod.ProbeRun | None = None) -> tuple[threading.Thread, dict]:
    """Start the child probe now so that it runs while the checks read /proc (or take the one the
    command line started before its imports)."""
    run = started or cuda_mod.ProbeRun(timeout)
    return run.thread, run.box


def record_probe(run: RunDir | None, result: dict) -> None:
    if run is None:
        return
    run.add_json("probes/cuda.json", result, kind="probe", source="python -m diag.cuda probe",
                 duration_s=result.get("duration_s") or 0.0, returncode=result.get("returncode"),
                 timed_out=result.get("status") == "timeout")


def record_node_probe(run: RunDir | None, root: Root) -> dict | None:
    """Live: the page size, architecture and swap media, kept as probes/node.json."""
    if not root.live:
        return None
    probe = live_node_probe(root)
    if run is not None:
        run.add_json("probes/node.json", probe, kind="probe", source="sysconf, uname, stat of swap areas")
    return probe


def _error_result(plan: Plan, root_dir: Path, root: Root, run: RunDir | None, verdict: str, t0: float,
                  exit_code: int = EXIT_UNEVALUATED) -> PreflightResult:
    return PreflightResult(status="error", exit_code=exit_code, verdict=verdict,
                           plan={**plan.__dict__, "describe": plan.describe()}, root=str(root_dir), live=root.live,
                           run_dir=str(run.path) if run else None, errors=[verdict],
                           duration_s=round(time.monotonic() - t0, 3))


def run_preflight(plan: Plan, root_path: Path | str = "/", run: RunDir | None = None, cuda: str = "probe",
                  cuda_timeout: float = cuda_mod.DEFAULT_TIMEOUT_S, skip: tuple[str, ...] = (),
                  sample_s: float = 1.0, strict: bool = False, pid: str | int = "self",
                  cgroup_path: str | None = None, swap_rate: float | None = None,
                  probe: cuda_mod.ProbeRun | None = None, warm: tuple[str, ...] = ()) -> PreflightResult:
    """cuda: 'probe' (child process), 'off' (--no-cuda), or 'captured' (read from the snapshot);
    swap_rate: bytes per second the swap device gives a pin, when the user measured it; probe: the
    probe's child when the caller started it already (cuda 'probe' on the live node); warm: modules
    the caller imports after the verdict (its rendering), imported while the probe is still running.
    Raises CgroupError when a --pid or --cgroup that was asked for cannot be found."""
    t0 = time.monotonic()
    root_dir = resolve_root(root_path)
    root = Root(root_dir, run=run)
    probe_thread = box = None
    cuda_result, cuda_skip, cuda_state = None, None, OK
    if cuda == "probe" and root.live:
        probe_thread, box = start_cuda_probe(cuda_timeout, started=probe)
    elif cuda == "off":
        cuda_skip, cuda_state = "CUDA probe off (--no-cuda)", OK
    else:
        cuda_result, cuda_state = load_captured_cuda(root_dir)
        if cuda_result is None:
            cuda_skip = ("no CUDA facts in this capture (hostpin snapshot keeps them in probes/cuda.json)"
                         if cuda_state == NOT_CAPTURED else "the capture's probes/cuda.json is damaged")
    record_node_probe(run, root)
    ctx = Context(root, plan, cuda=cuda_result, cuda_skip_reason=cuda_skip, sample_s=sample_s, strict=strict,
                  pid=pid, cgroup_path=cgroup_path, swap_rate_override=swap_rate, cuda_state=cuda_state)

    def join_probe() -> None:
        nonlocal probe_thread
        if probe_thread is not None:
            needed = time.time()
            for name in warm:  # the wait's idle time: what the caller would import after it, serially
                if not probe_thread.is_alive():
                    break
                try:
                    importlib.import_module(name)
                except Exception:  # the caller's own import says what is wrong, where it needs it
                    pass
            probe_thread.join()
            ctx.cuda = box["result"]
            if isinstance(ctx.cuda.get("parent_at"), dict):  # where the command waited on the child
                ctx.cuda["parent_at"].update(needed=round(needed, 4), joined=round(time.time(), 4))
            probe_thread = None

    def record_live_probe() -> None:  # once the checks are done: how long those after the wait took
        if box is not None and isinstance(ctx.cuda, dict):
            if isinstance(ctx.cuda.get("parent_at"), dict):
                ctx.cuda["parent_at"]["checks_done"] = round(time.time(), 4)
            record_probe(run, ctx.cuda)

    if ctx.meminfo is None or ctx.meminfo.total_bytes is None or ctx.state("meminfo") != OK:
        join_probe()
        record_live_probe()
        damaged = ctx.meminfo is not None and (ctx.state("meminfo") in (OK, DAMAGED))
        what = ctx.describe("meminfo") if ctx.state("meminfo") != OK else \
            f"{ctx.root.display('proc/meminfo')} is damaged: it has no readable MemTotal line"
        # a meminfo that is there but damaged is the tree's fault, not the --root's
        hint = ("capture the node again (hostpin snapshot)" if damaged else
                "--root must point at a captured tree (a hostpin snapshot run directory, or a directory holding "
                "proc/ and sys/)")
        return _error_result(plan, root_dir, root, run, f"cannot evaluate this node: {what}; {hint}", t0)
    ctx.cgroup  # a --pid/--cgroup that cannot be found is the caller's error, before any check runs

    by_id: dict[str, Verdict] = {}
    registry = all_checks()
    # the checks that read the probe's result run last, so that the others overlap the child
    for check in sorted(registry, key=lambda c: c.id in NEEDS_PROBE):
        if check.id in skip:
            by_id[check.id] = Verdict(SKIP, "skipped on request (--skip)")
            continue
        if check.id in NEEDS_PROBE:
            join_probe()
        try:
            verdict = check.run(ctx)
            if verdict.status not in STATUS_ORDER:
                raise ValueError(f"status {verdict.status!r}")
        except Exception as exc:  # a check bug must not pass the gate: it is an error, loudly
            where = traceback.extract_tb(exc.__traceback__)[-1]
            verdict = Verdict(ERROR, f"check crashed: {type(exc).__name__}: {exc} at {Path(where.filename).name}:"
                                     f"{where.lineno} (please report this)",
                              "report it with the run directory; --skip this check to accept the gap")
        by_id[check.id] = verdict
    join_probe()
    record_live_probe()
    verdicts: list[tuple[Any, Verdict]] = [(c, by_id[c.id]) for c in registry]  # the registry's order, as before

    verdicts.sort(key=lambda cv: STATUS_ORDER[cv[1].status])
    checks = [CheckResult(id=c.id, title=c.title, status=v.status, summary=v.summary, remedy=v.remedy,
                          catalog=list(c.catalog), predicted=sorted(set(v.predicted)), missing=list(v.missing),
                          evidence=v.evidence) for c, v in verdicts]
    statuses = {v.status for _, v in verdicts}
    status = ERROR if ERROR in statuses else FAIL if FAIL in statuses else WARN if WARN in statuses else PASS
    exit_code = {ERROR: EXIT_UNEVALUATED, FAIL: EXIT_FAIL}.get(status, EXIT_FAIL if strict and status == WARN else EXIT_OK)
    verdict_text = _verdict(plan, verdicts, status)
    if strict and status == WARN:
        verdict_text += " (--strict: warnings fail)"
    facts = node_facts(ctx)
    head = next((c for c in checks if c.id == "headroom"), None)
    swap = next((c for c in checks if c.id == "swap"), None)
    frag = next((c for c in checks if c.id == "fragmentation"), None)
    hev = head.evidence if head else {}
    sev = swap.evidence if swap else {}
    result = PreflightResult(
        status=status, exit_code=exit_code, verdict=verdict_text, plan={**plan.__dict__, "describe": plan.describe()},
        root=str(root_dir), live=root.live, run_dir=str(run.path) if run else None,
        host=socket.gethostname() if root.live else facts.get("host"), kernel=ctx.release, machine=ctx.machine,
        page_size=ctx.page_size, page_size_source=ctx.page.source, checks=checks, facts=facts, torch=plan.torch,
        cuda={k: ctx.cuda.get(k) for k in ("status", "message", "driver_version", "duration_s")}
        if isinstance(ctx.cuda, dict) else None,
        binding=hev.get("binding"), binding_dir=hev.get("binding_dir"), binding_bytes=hev.get("binding_bytes"),
        need_bytes=hev.get("need_cgroup_bytes") if hev.get("binding") == "cgroup" else hev.get("need_with_tables_bytes"),
        margin_bytes=hev.get("margin_bytes"), predicted_pin_seconds=sev.get("predicted_pin_seconds"),
        swap_used_bytes=sev.get("swap_used_bytes", facts.get("swap_used_bytes")),
        swapin_pages_per_s=(sev.get("swapin_now") or {}).get("pages_per_s") if sev.get("swap_total_bytes")
        else (0.0 if swap and swap.status != ERROR else None),
        free_huge_bytes=(frag.evidence or {}).get("free_huge_bytes") if frag else None,
        catalog_predicted=sorted({e for c in checks for e in c.predicted}),
        errors=[f"{c.id}: {c.summary}" for c in checks if c.status == ERROR],
        not_captured=sorted({m for c in checks for m in c.missing}),
        duration_s=round(time.monotonic() - t0, 3))
    if not root.live:
        result.machine = ctx.machine
    return result


def _verdict(plan: Plan, results, status: str) -> str:
    fails = [c.id for c, v in results if v.status == FAIL]
    warns = [c.id for c, v in results if v.status == WARN]
    errors = [c.id for c, v in results if v.status == ERROR]
    what = (f"pin {plan.ranks} x {format_bytes(plan.size_bytes)} by {plan.method}" if plan.size_bytes
            else f"pin by {plan.method} (node state only, no --size given)")
    if plan.torch and plan.size_bytes:
        what = (f"pin {plan.ranks} x {format_bytes(plan.size_bytes)} through PyTorch ({format_bytes(plan.pinned_bytes)} "
                f"pinned each by {plan.method})")
    text = _verdict_text(plan, results, status, what, errors, fails, warns)
    head = next((v for c, v in results if c.id == "headroom"), None)
    if plan.torch and plan.size_bytes and status in (PASS, WARN) and head is not None and head.status != SKIP:
        text += f" ({head.summary})"  # in words: what PyTorch asks for, against what
    return text + _torch_rules(plan)


def _torch_rules(plan: Plan) -> str:
    """The PyTorch rules the plan was judged by, and their version range (catalog 18)."""
    t = plan.torch
    if not t:
        return ""
    # foreign text (the job's PYTORCH_CUDA_ALLOC_CONF, a dist-info's version): one line, or a LF forges one
    version = f"PyTorch {one_line(t['version'])} ({t['version_source']})" if t.get("version") else \
        "PyTorch version not known"
    shown = one_line(t["conf"] or "")
    shown = shown if len(shown) <= 300 else f"{shown[:300]}... ({len(shown):,} characters; all of it in the JSON)"
    conf = f"{t['conf_source']}={shown}" if t.get("conf") else f"allocator settings: {t['conf_source']}"
    return (f"; {version}, {conf}: " + "; ".join(t["rules"])
            + "".join(f"; {n}" for n in t.get("notes") or []))


def _verdict_text(plan: Plan, results, status: str, what: str, errors, fails, warns) -> str:
    if status == ERROR:
        first = next(v for c, v in results if v.status == ERROR)
        return (f"cannot evaluate whether this node can {what}: {errors[0]}: {first.summary} "
                f"(not evaluated: {', '.join(errors)})")
    if status == FAIL:
        first = next(v for c, v in results if v.status == FAIL)
        return f"this node cannot {what} now: {first.summary} (failed: {', '.join(fails)})"
    if status == WARN:
        return f"this node can {what}, with warnings: {', '.join(warns)}"
    if plan.size_bytes:
        return f"this node can {what} now"
    return f"nothing wrong in the node's state to {what}"
