"""`hostpin report`: a run rendered for a bug report (Markdown) or a terminal (text).

Verdict first, then the facts that matter for it, the tables, the key kernel stack, and the
raw evidence in collapsed sections, cut short enough to paste into a GitHub issue (under
GitHub's 65,536-character limit), saying what was left out and where it is.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from tabulate import tabulate

from .facts import FACT_LABELS
from .reproresult import ReproRegisterResult
from .runs import Run
from .safetext import longest_fence, md_cell, one_line, printable
from .units import format_bytes, format_duration

__all__ = ["render_report", "key_stack", "matrix_verdict", "staging_body", "MAX_CHARS"]

MAX_CHARS = 50_000       # the whole report
RAW_BLOCK_CHARS = 3_000  # one raw file in a collapsed section
_BYTES_FACTS = {"mem_total_bytes", "mem_available_bytes", "swap_total_bytes", "swap_used_bytes", "free_order9_bytes"}


def _fact_value(key: str, value: Any) -> str:
    if value is None:
        return "not captured"
    if key in _BYTES_FACTS:
        return format_bytes(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def key_stack(run: Run) -> tuple[str, str] | None:
    """(where it came from, the stack) for the pinning thread: a kill's stack file, else the
    stack seen most often in the timeline while the pin was in D state or in kernel paths."""
    for entry in run.manifest.get("entries", []) if run.command != "watch" else []:  # a watch: its timeline
        if entry.get("kind") == "stacks" and not entry.get("skipped"):
            text = run.read_text(entry["path"], limit=1 << 20)
            if text is None:
                continue
            sections = text.split("### ")
            busy = [s for s in sections[1:] if " state D " in s or "do_swap_page" in s or "pin_user_pages" in s]
            chosen = (busy or sections[1:] or [text])[0]
            return entry["path"], "### " + chosen.strip() if busy or sections[1:] else chosen
    from .watch.frames import in_pin_path, stack_bound
    counts: Counter = Counter()
    last: dict[str, list[str]] = {}  # a timeline writes a thread's frames only when they change
    for sample in run.read_jsonl("timeline.jsonl"):
        pinning = "pin" in (sample.get("phase"), (sample.get("progress") or {}).get("phase"))
        for proc in sample.get("procs", {}).values():
            for tid, th in proc.get("threads", {}).items():
                frames = last[tid] = th.get("frames") or last.get(tid) or []
                if pinning and frames and (th.get("state") == "D" or in_pin_path(frames)):
                    counts[tuple(frames)] += 1
    named = Counter({f: n for f, n in counts.items() if stack_bound(list(f))[0]})  # stacks that name a cause
    if named or counts:
        frames, n = (named or counts).most_common(1)[0]
        return f"timeline.jsonl (seen in {n} samples)", "\n".join(frames)
    return None


def _facts_table(run: Run, md: bool) -> str:
    facts = run.facts()
    rows = [[FACT_LABELS[k], _fact_value(k, facts.get(k))] for k in FACT_LABELS if k in facts]
    plan = run.result.get("plan", {}).get("describe") or _plan_of(run.result)
    if plan:
        rows.append(["plan", plan])
    rows.append(["command", " ".join(map(str, run.manifest.get("argv", [])[1:])) or run.command])
    end = run.manifest.get("finished") or (f"partial, {run.ended}" if run.partial else "not finished")
    rows.append(["run", f"{run.manifest.get('started') or '?'} .. {end}"])
    safe = md_cell if md else one_line  # every value came from the run: anyone's text
    return tabulate([[label, safe(value)] for label, value in rows], headers=["fact", "value"],
                    tablefmt="github" if md else "simple", disable_numparse=True)


def _plan_of(result: dict) -> str | None:
    o = result.get("options")
    need = ("repeat", "bursts", "bytes", "direction") if o and "threads" in o else ("size", "method", "source", "map")
    if not o or any(k not in o for k in need) or not isinstance(o.get("bytes", o.get("size")), int):
        return None  # not the options hostpin records (a forged or older result): no plan line
    if "threads" in o:
        return f"{o['repeat']} repeats x {o['bursts']} bursts of {format_bytes(o['bytes'])} over {o['threads']} threads, {o['direction']}"
    thp = "on" if o.get("thp") is True else "off" if o.get("thp") is False else "policy default"
    extra = "".join([f", chunk {format_bytes(o['chunk'])}" if _size(o.get("chunk")) else "",
                     f", swap-out {format_bytes(o['swap_out'])}" if _size(o.get("swap_out")) else "",
                     f", swap-in limited to {format_bytes(o['swap_in_rate'])}/s" if _size(o.get("swap_in_rate")) else ""])
    return (f"{o.get('ranks', 1)} x {format_bytes(o['size'])} by {o['method']} (source {o['source']}/{o['map']}, "
            f"THP {thp}, prefault {o.get('prefault')}{extra})")


def _size(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def matrix_verdict(rows: list[dict], size: int) -> str:
    """Per method, the best and the worst way to hold the region, with the rates."""
    parts = []
    for method in ("register", "hostalloc", "mlock"):
        done = [x for x in rows if x["method"] == method and x.get("rate_gib_s")]
        if not done:
            skipped = [x for x in rows if x["method"] == method and x.get("outcome") == "skipped"]
            if skipped:
                parts.append(f"{method}: skipped ({skipped[0].get('verdict')})")
            continue
        best = max(done, key=lambda x: x["rate_gib_s"])
        worst = min(done, key=lambda x: x["rate_gib_s"])
        text = f"{method} {best['rate_gib_s']:.1f} GiB/s"
        if method != "hostalloc":
            text += f" with THP {best['thp']} and prefault {best['prefault']}"
        if worst is not best:
            text += (f", {worst['rate_gib_s']:.1f} with THP {worst['thp']} and prefault {worst['prefault']}"
                     + (f" ({worst['bound']})" if worst.get("bound") else ""))
        parts.append(text)
    failed = [x["case"] for x in rows if x.get("outcome") not in ("completed", "slow", "skipped")]
    head = f"{format_bytes(size)} per case: " if size else ""
    return head + "; ".join(parts) + (f"; failed: {', '.join(failed)}" if failed else "")


def _section(title: str, body: str, md: bool) -> str:
    return (f"## {title}\n\n{body}\n" if md else f"{title}\n{'-' * len(title)}\n{body}\n")


def _preflight_body(r: dict, md: bool) -> str:
    fmt = "github" if md else "simple"
    safe = md_cell if md else one_line
    checks = [c for c in r.get("checks", []) if isinstance(c, dict)]
    bad = [[safe(str(c.get("status")).upper()), safe(c.get("id")), safe(c.get("summary")), safe(c.get("remedy") or "")]
           for c in checks if c.get("status") in ("error", "fail", "warn")]
    good = [[safe(c["status"]), safe(c.get("id")), safe(c.get("summary"))] for c in checks
            if c.get("status") in ("pass", "skip")]
    out = ""
    if bad:
        out += tabulate(bad, headers=["", "check", "finding", "remedy"], tablefmt=fmt,
                        maxcolwidths=None if md else [None, None, 60, 40]) + "\n\n"
    else:
        out += "No check failed or warned.\n\n"
    if good:
        table = tabulate(good, headers=["", "check", "finding"], tablefmt=fmt,
                         maxcolwidths=None if md else [None, None, 100])
        out += (f"<details><summary>{len(good)} checks passed or were skipped</summary>\n\n{table}\n\n</details>\n"
                if md else table + "\n")
    return out


def _repro_body(run: Run, md: bool) -> str:
    if not run.result:  # killed before it wrote its result: the timeline and stacks below are what there is
        return "No result: the run did not finish.\n"
    r = ReproRegisterResult.from_dict(run.result)  # the run was read whole: its fields have their types
    fmt = "github" if md else "simple"
    safe = md_cell if md else one_line  # a bundle's result is foreign text: no cell, heading or beacon of its own
    rows = []
    for key, label, fn in (("outcome", "outcome", str), ("seconds", "pin time", format_duration),
                           ("rate_gib_s", "rate", lambda v: f"{v:.2f} GiB/s"),
                           ("clean_rate_gib_s", "this node's clean rate", lambda v: f"{v:.2f} GiB/s"),
                           ("slowdown", "slower than clean", lambda v: f"{v:.0f}x"),
                           ("bound", "bound", str), ("bound_reason", "why", str),
                           ("first_bound_at_s", "bound named after", lambda v: f"{v:.1f} s"),
                           ("eta_error", "ETA at 20% vs the real end", lambda v: f"{100 * v:+.1f}%"),
                           ("swapin_pages_per_s", "swap-in during the pin", lambda v: f"{v:,.0f} pages/s")):
        if getattr(r, key) is not None:
            rows.append([label, safe(fn(getattr(r, key)))])
    if r.swapped_out_bytes:
        rows.append(["in swap before the pin", ", ".join(format_bytes(x) for x in r.swapped_out_bytes if x is not None)])
    if r.pinned_pages is not None:
        of = f" of {r.expected_pages:,}" if r.expected_pages is not None else ""
        rows.append(["pinned", f"{r.pinned_pages:,}{of} pages ({safe(str(r.progress_counter))})"])
    if r.stopped:
        eta = r.stopped.progress.get("eta_s")
        at = f" at {r.stopped.at_s:.1f} s" if r.stopped.at_s is not None else ""
        rows.append(["stopped", safe(f"{r.stopped.reason} in phase {r.stopped.phase}{at}")
                     + (f"; ETA then {format_duration(eta)}" if isinstance(eta, (int, float)) and eta else "")])
    if r.watchdog:
        cpu, samples = r.watchdog.get("watchdog_cpu_pct_of_core"), r.watchdog.get("samples")
        if isinstance(cpu, (int, float)):
            rows.append(["watchdog cost", f"{cpu:.2f}% of one core, {samples} samples"])
    out = tabulate(rows, headers=["figure", "value"], tablefmt=fmt) + "\n"
    if len(r.ranks) > 1 or any(rk.error for rk in r.ranks):
        table = [[rk.rank, safe(rk.outcome), format_duration(rk.seconds), f"{rk.rate_gib_s:.2f}" if rk.rate_gib_s else "",
                  safe((rk.error.name or rk.error.message or "") if rk.error else ""),
                  safe(rk.error.catalog or "" if rk.error else "")] for rk in r.ranks]
        out += "\n" + tabulate(table, headers=["rank", "outcome", "pin", "GiB/s", "error", "catalog"], tablefmt=fmt) + "\n"
    for note in r.notes:
        out += f"\nnote: {safe(note)}\n"
    return out


def _matrix_body(r: dict, md: bool) -> str:
    table = [[x["method"], x["thp"], x["prefault"], format_duration(x.get("seconds")),
              f"{x['rate_gib_s']:.2f}" if x.get("rate_gib_s") else "", x["outcome"], x.get("bound") or ""]
             for x in r.get("rows", [])]
    return tabulate(table, headers=["method", "THP", "prefault", "seconds", "GiB/s", "outcome", "bound"],
                    tablefmt="github" if md else "simple") + "\n"


def _mib(n, signed: bool = True) -> str:
    if n is None:
        return "n/a"
    v = round(n / (1 << 20))
    return f"{v:+d}" if signed and v else str(v)


def _legacy_staging_body(r: dict, md: bool) -> str:
    """Runs recorded before per-CPU free lists were counted (no schema): their table, said to be uncorrected."""
    s = r.get("summary") or {}
    if not s.get("repeats"):
        return "No repeat finished.\n"
    mib = 1 << 20

    def med(st):
        return "n/a" if st.get("median") is None else f"{st['median'] / mib:+.0f}"

    def rng(st):
        return "n/a" if st.get("min") is None else f"{st['min'] / mib:+.0f}..{st['max'] / mib:+.0f}"

    rows = []
    for side in ("pageable", "pinned"):
        f = s["sides"][side]
        thr = f["throughput_gb_s"]["median"]
        rows.append([side, med(f["first_bytes"]), rng(f["first_bytes"]), med(f["later_mean_bytes"]),
                     med(f["hidden_total_bytes"]), rng(f["hidden_total_bytes"]), f"{thr:.1f}" if thr else "n/a"])
    out = tabulate(rows, headers=["side", "after 1st burst MiB", "range", "each later burst MiB", "hidden total MiB",
                                  "range", "GB/s"], tablefmt="github" if md else "simple") + "\n"
    out += ("\nRecorded before hostpin counted the per-CPU free lists: these figures are uncorrected "
            "(MemTotal - MemAvailable moves by this much on its own), nothing in them is attributed to the driver, "
            "and no --reserve is derived from them. Measure again with this version.\n")
    return out


_PLACES = ("vmalloc", "shmem", "kernel", "unevictable", "pins", "cgroup", "cgroup_anon", "cgroup_shmem", "cgroup_file",
           "cgroup_kernel", "cgroup_vmalloc", "cgroup_percpu", "iommu", "deferred_split")


def staging_body(r: dict, md: bool) -> str:
    """The staging measurement: per side what stayed, beyond the control, the noise, where it sits,
    the corrections, reset/exit, and the --reserve advice (the command and the report)."""
    if "summary" in r and "schema_version" not in r:
        return _legacy_staging_body(r, md)
    sides = r.get("sides") or {}
    if not r.get("repeats") or not sides:
        return "No repeat finished.\n"
    fmt = "github" if md else "simple"
    rows = []
    for side, f in sides.items():
        lo, hi = f["retained_range_bytes"]
        b = f.get("beyond_control_range_bytes")
        thr = f.get("throughput_gb_s")
        rows.append([side, _mib(f["retained_bytes"]), f"{_mib(lo)}..{_mib(hi)}",
                     _mib(f.get("beyond_control_bytes")) + (f" ({_mib(b[0])}..{_mib(b[1])})" if b else ""),
                     "±" + ("n/a" if f["noise_bytes"] is None else f"{f['noise_bytes'] / (1 << 20):.1f}"),
                     "yes" if f.get("attributed") else "no",
                     _mib(f.get("uncorrected_bytes")), f"{thr:.1f}" if thr else "n/a"])
    out = tabulate(rows, headers=["side", "retained MiB", "range", "beyond control", "noise", "driver's",
                                  "uncorrected MiB", "GB/s"], tablefmt=fmt) + "\n"
    read = [k for k in _PLACES if any(f["attribution"].get(k) is not None for f in sides.values())]
    moved = [k for k in read if any(abs(f["attribution"].get(k) or 0) >= (1 << 19) for f in sides.values())]
    if moved:
        where = [[side] + [_mib(f["attribution"].get(k)) for k in moved] for side, f in sides.items()]
        out += "\nWhere it sits (change over the side's bursts, median of repeats, MiB):\n\n"
        out += tabulate(where, headers=["side"] + moved, tablefmt=fmt) + "\n"
    if read:
        still = [k for k in read if k not in moved]
        out += (f"\n{'Also read, each' if moved else 'Where it could sit, each'} within ±0.5 MiB: "
                + ", ".join(still) + ".\n") if still else ""
    g = r.get("figures") or {}
    rows = r.get("corrections") or []
    pcp = [c["per_cpu_lists_bytes"] for c in rows if c.get("per_cpu_lists_bytes") is not None]
    boost = [c["watermark_boost_bytes"] for c in rows if c.get("watermark_boost_bytes")]
    settled = g.get("steps_settled") or [0, 0]
    settle_s = sorted(c["settle_s"] for c in rows if c.get("settle_s") is not None)
    out += "\nCorrections: per burst, "
    out += (f"the per-CPU free lists moved {_mib(min(pcp))}..{_mib(max(pcp))} MiB (subtracted)" if pcp
            else "no per-CPU list counts")
    out += f", the watermark boost {_mib(min(boost))}..{_mib(max(boost))} MiB" if boost else ", no watermark boost"
    out += (f"; {settled[0]} of {settled[1]} readings settled"
            + (f" (median {settle_s[len(settle_s) // 2]:.2f} s)" if settle_s else "") + ".\n")
    seen = g.get("seen") or {}
    if seen:
        out += ("Seen during the bursts (reported, not subtracted): "
                + ", ".join(f"{k} {v:+,}" for k, v in sorted(seen.items())) + ".\n")
    if g.get("stat_drift_bound_bytes"):
        out += (f"The per-CPU counters were read unfolded (not root?): each may be off by up to "
                f"{_mib(g['stat_drift_bound_bytes'], False)} MiB.\n")
    for key, label in (("reset_left_bytes", "left after teardown (buffers freed, cudaDeviceReset if CUDA ran) vs "
                                             "before the context"),
                       ("exit_left_bytes", "left after the process exited vs before it started"),
                       ("hold_returned_bytes", "came back during the hold"),
                       ("baseline_drift_bytes", "drift between the two baselines")):
        st = g.get(key)
        if st and st.get("median") is not None:
            out += f"{label}: {_mib(st['median'])} MiB (range {_mib(st['min'])}..{_mib(st['max'])})\n"
    out += f"{r['repeats']} repeats, each a fresh process; noise = the control arm's largest total plus what the readings still moved.\n"
    if r.get("reserve_hint"):
        out += f"\napply: {r['reserve_hint']}\n"
    return out


def _raw_blocks(run: Run, md: bool, budget: int) -> tuple[str, list[str]]:
    """Collapsed raw files, most useful first, until the budget is spent; the rest is named."""
    wanted = ["result.json", "stacks", "commands/dmesg", "events.jsonl", "root/proc/meminfo", "root/proc/buddyinfo",
              "root/proc/swaps", "root/sys/kernel/mm/transparent_hugepage/enabled",
              "root/sys/kernel/mm/transparent_hugepage/defrag", "root/proc/driver/nvidia/version",
              "probes/cuda.json", "root/proc/pressure/memory", "root/proc/cmdline"]
    # files added after the run (an earlier report, its picture) are not evidence: leaving them out
    # keeps the report a function of what the run recorded
    entries = [e for e in run.manifest.get("entries", []) if not e.get("skipped") and e.get("kind") != "dir"
               and not e.get("added_after_run")]
    chosen, seen = [], set()
    for prefix in wanted:
        for e in entries:
            if (e["path"] == prefix or e["path"].startswith(prefix)) and e["path"] not in seen:
                chosen.append(e)
                seen.add(e["path"])
    out, spent, left_out = "", 0, []
    for e in chosen:
        journal = e["path"].endswith(".jsonl")
        # read no more than a block needs (the end of a journal says most)
        text = run.read_text(e["path"], limit=64 * RAW_BLOCK_CHARS, tail=journal)
        if text is None:
            continue
        cut = len(text) > RAW_BLOCK_CHARS
        if journal and cut:
            text = "\n".join(text.splitlines()[-20:])
        more = (e["size"] if e["size"] > 64 * RAW_BLOCK_CHARS else len(text)) - RAW_BLOCK_CHARS
        body = text[:RAW_BLOCK_CHARS] + (f"\n... ({more:,} more characters in {e['path']})"
                                         if len(text) > RAW_BLOCK_CHARS else "")
        if spent + len(body) > budget:
            left_out.append(e["path"])
            continue
        spent += len(body)
        if md:
            fence = longest_fence(body)  # a fence inside the file must not close this one
            out += (f"<details><summary>{md_cell(e['path'])} ({format_bytes(e['size'])})</summary>\n\n{fence}\n"
                    f"{body}\n{fence}\n\n</details>\n")
        else:
            out += f"--- {one_line(e['path'])} ---\n{body}\n"
    shown = {e["path"] for e in chosen} - set(left_out)
    left_out += [e["path"] for e in entries if e["path"] not in shown]
    return out, left_out


def budgets_of(r: dict) -> list[dict]:
    """The phases of a result that carry a --trace time budget (watch, or repro register)."""
    return [p for p in r.get("phases") or [] if isinstance(p, dict) and isinstance(p.get("time_budget"), dict)]


def _budget_body(r: dict, md: bool, picture: str | None) -> str:
    fmt = "github" if md else "simple"
    out = []
    for ph in budgets_of(r):
        b = ph["time_budget"]
        wall = b.get("wall_s") or 0
        from .trace.budget import CAUSES
        causes = b.get("causes") or {}
        rows = [[c, f"{causes[c]:.3f}", f"{100 * causes[c] / wall:.1f}%" if wall else ""]
                for c in sorted(causes, key=lambda c: CAUSES.index(c) if c in CAUSES else len(CAUSES))]
        head = (f"pid {ph.get('pid')} thread {b.get('tid')}, {wall:.2f} s from {ph.get('started_s')} s: "
                f"{round(100 * (b.get('explained') or 0))}% measured, {b.get('dropped', 0)} events lost")
        out.append(head + "\n\n" + tabulate(rows, headers=["cause", "seconds", "of the phase"], tablefmt=fmt) + "\n")
        io = b.get("io") or {}
        if io.get("requests"):
            rq, sl = io.get("request_latency") or {}, io.get("sleep_latency") or {}
            lat = [["request issue to completion", rq.get("count"), rq.get("p50_ms"), rq.get("p90_ms"),
                    rq.get("p99_ms"), rq.get("max_ms")],
                   ["the thread's I/O sleeps", sl.get("count"), sl.get("p50_ms"), sl.get("p90_ms"), sl.get("p99_ms"),
                    sl.get("max_ms")]]
            who = "its own" if io.get("basis") == "thread" else "on its devices, whoever issued them"
            out.append(f"I/O ({who}): {io['requests']:,} read requests, {format_bytes(io.get('bytes'))}, on "
                       f"{', '.join(io.get('devices') or {}) or '?'}\n\n"
                       + tabulate(lat, headers=["latency", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"],
                                  tablefmt=fmt) + "\n")
    if picture:
        out.append(f"![time budget]({picture})\n" if md else f"picture: {picture}\n")
    return "\n".join(out)


def render_report(run: Run, fmt: str = "markdown", picture: str | None = None,
                  budget_picture: str | None = None) -> str:
    md = fmt == "markdown"
    r = run.result
    status = run.status
    if run.command == "repro register --matrix" and r.get("rows") and not r.get("verdict"):
        # recorded before matrix runs carried a verdict: derive it from the rows
        r = dict(r, verdict=matrix_verdict(r["rows"], r.get("size") or 0))
        bad = [x for x in r["rows"] if x.get("outcome") not in ("completed", "slow", "skipped")]
        status = "failed" if bad else "completed"
    if run.command == "repro staging" and r.get("summary") and "schema_version" not in r:
        r = dict(r, verdict="UNCORRECTED, recorded before hostpin counted the per-CPU free lists: " + str(r.get("verdict")))
    title = one_line(f"hostpin {run.command}: {str(status).upper()}")
    verdict = one_line(r.get("verdict")) if r.get("verdict") else (
        f"partial, {one_line(run.ended)}: the run {'has not' if run.running else 'stopped before it'} finished and left no "
        "result; the timeline, stacks and files it wrote are below" if run.partial
        else "(no verdict: the run did not finish; see manifest.jsonl)")
    parts = [f"# {md_cell(title)}\n\n**{md_cell(verdict)}**\n" if md else f"{title}\n{'=' * len(title)}\n{verdict}\n"]
    if run.partial:
        note = f"partial run, {md_cell(run.ended) if md else one_line(run.ended)}: the entries its journal has were verified"
        if run.unrecorded:
            note += ("; written but not recorded before it ended (kept as they are): "
                     + ", ".join(map(md_cell if md else one_line, run.unrecorded[:8]))
                     + (" ..." if len(run.unrecorded) > 8 else ""))
        parts.append(("> **Note:** " if md else "NOTE: ") + note + "\n")
    if run.problems:
        parts.append(("> **Warning:** " if md else "WARNING: ") + "the evidence does not match its manifest: "
                     + "; ".join(map(md_cell if md else one_line, run.problems[:5])) + "\n")
    parts.append(_section("Facts", _facts_table(run, md), md))
    command = run.command
    if command == "preflight":
        parts.append(_section("Checks", _preflight_body(r, md), md))
    elif command == "repro register --matrix":
        parts.append(_section("Matrix", _matrix_body(r, md), md))
    elif command == "repro register":
        parts.append(_section("Result", _repro_body(run, md), md))
        if picture:
            parts.append(_section("Timeline", f"![pin timeline]({picture})\n" if md else f"picture: {picture}\n", md))
        stack = key_stack(run)
        if stack:
            where, text = stack
            block = _fenced(text, where) if md else f"{text}\n(from {one_line(where)})\n"
            parts.append(_section("Kernel stack", block, md))
    elif command == "watch":
        from .watch.render import watch_body
        parts.append(_section("Result", watch_body(r, md), md))
        stack = key_stack(run)
        if stack:
            block = _fenced(stack[1], stack[0]) if md else f"{stack[1]}\n(from {one_line(stack[0])})\n"
            parts.append(_section("Kernel stack", block, md))
    if command in ("repro register", "watch") and budgets_of(r):
        parts.append(_section("Time budget (--trace)", _budget_body(r, md, budget_picture), md))
    if command == "repro staging":
        parts.append(_section("Staging memory", staging_body(r, md), md))
    elif command == "snapshot":
        parts.append(_section("Snapshot", f"{r.get('files')} files captured, {r.get('skipped')} skipped; CUDA: "
                                          f"{(r.get('cuda') or {}).get('status', 'not probed')}\n", md))
    used = sum(len(p) for p in parts)
    raw, left_out = _raw_blocks(run, md, max(2_000, MAX_CHARS - used - 2_000))
    if raw:
        parts.append(_section("Raw evidence", raw, md))
    tail = f"{len(left_out)} more files are in the run directory and its manifest" if left_out else "nothing was left out"
    parts.append(("---\n" if md else "") + f"Run: {_code(run.source) if md else one_line(run.source)} ({tail}). "
                 "Made by hostpin; every file is listed with its sha256 in manifest.json.\n")
    return printable("\n".join(parts))  # no control character from the run reaches the page


def _code(text: str) -> str:
    ticks = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)  # more than any run inside
    return f"{ticks} {one_line(text)} {ticks}" if "`" in text else f"`{one_line(text)}`"


def _fenced(text: str, where: str) -> str:
    fence = longest_fence(text)
    return f"{fence}\n{text}\n{fence}\n\nfrom {md_cell(where)}\n"
