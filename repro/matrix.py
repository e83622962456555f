"""`hostpin repro register --matrix`: methods x THP x prefault at one size, one child each.

The comparison a user makes before choosing how to hold a table. cudaHostAlloc allocates its
own pages, so THP and prefault do not apply to it: it is one row. Without an NVIDIA driver
the CUDA rows are listed as skipped, with the reason.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from diag.evidence import RunDir
from diag.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_REFUSED
from diag.nvidia import read_nvidia
from diag.rootfs import Root

from diag.report import matrix_verdict

from .outcome import build_result
from .register import ReproOptions, run_repro

__all__ = ["run_matrix", "matrix_cases"]


def matrix_cases() -> list[tuple[str, bool | None, bool]]:
    cases = []
    for method in ("register", "mlock"):
        for thp in (True, False):
            for prefault in (True, False):
                cases.append((method, thp, prefault))
    cases.append(("hostalloc", None, False))
    return cases


def run_matrix(base: ReproOptions, run: RunDir) -> dict[str, Any]:
    from diag.facts import node_facts
    facts = node_facts(Root("/", run=run))
    gpu = read_nvidia(Root("/")).loaded
    rows = []
    for method, thp, prefault in matrix_cases():
        name = f"{method}-thp{'on' if thp else 'off' if thp is False else 'na'}-pf{'on' if prefault else 'off'}"
        row: dict[str, Any] = {"case": name, "method": method, "thp": {True: "on", False: "off"}.get(thp, "n/a"),
                               "prefault": ("on" if prefault else "off") if method != "hostalloc" else "n/a"}
        if method != "mlock" and not gpu:
            row.update(outcome="skipped", verdict="no NVIDIA driver / no GPU")
            rows.append(row)
            continue
        opts = dataclasses.replace(base, method=method, thp=thp, prefault=prefault, ranks=1,
                                   register_flags="default", swap_out=None, swap_in_rate=None, make_swap=None)
        result = build_result(run_repro(opts, run, prefix=f"cases/{name}/"))
        row.update({k: getattr(result, k) for k in ("outcome", "seconds", "rate_gib_s", "bound", "verdict",
                                                    "clean_rate_gib_s", "first_bound_at_s")})
        prefault = result.ranks[0].prefault if result.ranks else None
        row["prefault_s"] = prefault.seconds if prefault else None
        rows.append(row)
        if result.outcome == "interrupted":
            break
    outcomes = {r["outcome"] for r in rows}
    code = EXIT_OK
    if outcomes & {"failed", "stalled", "killed", "unkillable", "interrupted"}:
        code = EXIT_FAIL
    elif outcomes <= {"refused", "skipped"}:
        code = EXIT_REFUSED
    return {"tool": "hostpin", "command": "repro register --matrix", "size": base.size, "rows": rows,
            "run_dir": str(run.path), "exit_code": code, "facts": facts,
            "outcome": "completed" if code == EXIT_OK else "failed" if code == EXIT_FAIL else "refused",
            "verdict": matrix_verdict(rows, base.size)}
