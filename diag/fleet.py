"""`hostpin compare` past a handful of runs: a fleet summary that reads the same at 10 nodes or 1,000.

Columns stop being readable after a few runs, so for many runs compare says: how many nodes per
verdict and which checks put them there; for each figure that differs, its spread (min, median,
max, or its values with counts) and the nodes that stand out from the majority, with their values;
and the groups of nodes that share kernel, driver and THP settings. The figures are the ones
compare shows in columns (compare.run_figures); nothing is read twice.

A number stands out when it is further from the median than both 3.5 robust standard deviations
(1.4826 x the median absolute deviation) and 10% of the median (and a small floor per unit, so that
0 vs 4 KiB of swap is not news). A value stands out when it is not the most common one.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from .compare import LABELS, _BYTES, _fmt, run_figures
from .runs import Run
from .safetext import one_line

__all__ = ["fleet_summary", "render_fleet"]

ABSENT = "(none)"        # the value of a figure a node did not record
SHOW_NODES = 4           # nodes named per line in text; --json lists every one
GROUP_LINES = 6
LINE_WIDTH = 120
# figures that are the run's identity or are shown elsewhere in the summary
_NOT_FIGURES = {"host", "verdict", "status"}
_FLOORS = {"bytes": 256 << 20, "swapin_pages_per_s": 100.0, "psi_some_avg10": 1.0, "unusable_index_order9": 0.05,
           "pin_seconds": 1.0}
_GROUP_KEYS = ("kernel", "driver", "thp_enabled", "thp_defrag")


def _hosts(runs: list[Run], figures: list[dict[str, Any]]) -> list[str]:
    return [one_line(f.get("host") or r.path.name) for r, f in zip(runs, figures)]


def _node_names(runs: list[Run], hosts: list[str]) -> list[str]:
    """The host name, or host:RUN where a host has several runs, or host:DIR/RUN where that is not enough."""
    names = list(hosts)
    for depth in (1, 2, 3):
        counts = Counter(names)
        if len(counts) == len(names):
            break
        names = [n if counts[n] == 1 else f"{h}:{'/'.join(r.path.parts[-depth:])}"
                 for n, h, r in zip(names, hosts, runs)]
    counts = Counter(names)
    return [n if counts[n] == 1 else f"{n}#{i + 1}" for i, n in enumerate(names)]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric(key: str, pairs: list[tuple[str, float]]) -> dict[str, Any]:
    values = sorted(v for _, v in pairs)
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    floor = _FLOORS["bytes"] if key in _BYTES else _FLOORS.get(key, 0.0)
    limit = max(3.5 * 1.4826 * mad, 0.10 * abs(median), floor)
    out = [(n, v) for n, v in pairs if abs(v - median) > limit]
    out.sort(key=lambda nv: -abs(nv[1] - median))
    return {"kind": "number", "min": values[0], "median": median, "max": values[-1],
            "outliers": [{"node": n, "value": v} for n, v in out]}


def _categorical(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    counts = Counter(str(v) for _, v in pairs)
    ranked = counts.most_common()
    majority = ranked[0][0]
    # a value a sizeable part of the fleet shares is a group (listed under groups), not an outlier;
    # a figure with a value per node (serials, addresses) has no majority to stand out from
    rare = max(2, len(pairs) // 20)
    out = [] if len(ranked) > max(3, len(pairs) // 2) else \
        [{"node": n, "value": str(v)} for n, v in pairs if str(v) != majority and counts[str(v)] <= rare]
    out.sort(key=lambda o: (counts[o["value"]], o["value"], o["node"]))
    return {"kind": "value", "majority": majority, "values": dict(ranked), "outliers": out}


def _doubts(r: Run) -> list[str]:
    """Why a run that was read cannot be vouched for: files that differ from its manifest, or no
    manifest.json at all (read from its journal: killed before it finished, or the manifest removed)."""
    out = list(r.problems)
    if r.partial and r.journal_only:
        out.insert(0, "no manifest.json: read from its journal (killed before it finished, or the manifest "
                      "was removed)")
    return out


def _figures(runs: list[Run], unreadable: list[dict[str, Any]]) -> tuple[list[Run], list[dict[str, Any]]]:
    """Each run's figures; a run whose records hold what compare cannot read joins `unreadable`."""
    kept, figures = [], []
    for r in runs:
        try:
            figures.append(run_figures(r))
            kept.append(r)
        except Exception as exc:  # a damaged value in one run must not hide the other 999
            unreadable.append({"path": r.source, "problem": f"its records could not be read "
                                                            f"({type(exc).__name__}: {exc})"})
    return kept, figures


def fleet_summary(runs: list[Run], unreadable: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Verdict counts, the figures that differ with their spread and outliers, and node groups.
    `unreadable` ([{path, problem}]): the runs that could not be read, listed with why."""
    unreadable = list(unreadable or [])
    runs, figures = _figures(runs, unreadable)
    hosts = _hosts(runs, figures)
    names = _node_names(runs, hosts)
    verdicts: dict[str, dict[str, Any]] = {}
    for name, f in zip(names, figures):
        v = verdicts.setdefault(one_line(f.get("status") or "unknown"), {"count": 0, "nodes": [], "checks": {}})
        v["count"] += 1
        v["nodes"].append(name)
        for key, status in f.items():
            if key.startswith("check ") and status == f.get("status") and status != "pass":
                v["checks"].setdefault(key[6:], []).append(name)
    order = {"fail": 0, "error": 1, "unevaluated": 1, "warn": 2}
    verdicts = dict(sorted(verdicts.items(), key=lambda kv: (order.get(kv[0], 3), -kv[1]["count"])))
    for v in verdicts.values():
        v["checks"] = dict(sorted(v["checks"].items(), key=lambda kv: (-len(kv[1]), kv[0])))

    keys: list[str] = []
    for f in figures:
        keys += [k for k in f if k not in keys and k not in _NOT_FIGURES]
    differ, equal = [], []
    for key in keys:
        pairs = [(n, f[key]) for n, f in zip(names, figures) if f.get(key) is not None]
        if not pairs:
            continue
        absent = [n for n, f in zip(names, figures) if f.get(key) is None]
        same = len({str(v) for _, v in pairs}) <= 1
        if same and not absent:
            if not key.startswith("check "):
                equal.append(LABELS.get(key, key))
            continue
        entry = {"key": key, "label": LABELS.get(key, key), "nodes": len(pairs), "missing": len(absent),
                 "absent": absent}
        if same or not all(_is_number(v) for _, v in pairs):
            # a figure some nodes lack differs: "none" is one more value, rare like any other
            entry.update(_categorical(pairs + [(n, ABSENT) for n in absent]))
        else:
            entry.update(_numeric(key, pairs))
            if len(absent) <= max(2, len(names) // 20):
                entry["outliers"] += [{"node": n, "value": ABSENT} for n in absent]
        differ.append(entry)
    # per-check statuses are the verdict section's business; keep them out of the figure lines
    checks = [d for d in differ if d["key"].startswith("check ")]
    differ = [d for d in differ if not d["key"].startswith("check ")]

    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, f in zip(names, figures):
        groups[tuple(f.get(k) for k in _GROUP_KEYS)].append(name)
    group_list = [{**dict(zip(_GROUP_KEYS, key)), "count": len(nodes), "nodes": nodes}
                  for key, nodes in sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))]

    standout: dict[str, list[str]] = defaultdict(list)
    for d in differ:
        for o in d["outliers"]:
            standout[o["node"]].append(d["label"])
    return {"mode": "fleet", "runs": len(runs), "nodes": len(set(hosts)),
            "verdicts": verdicts, "differ": differ, "check_spread": checks, "equal": equal,
            "groups": group_list, "stand_out": dict(sorted(standout.items(), key=lambda kv: (-len(kv[1]), kv[0]))),
            "unverified": [{"node": n, "path": r.source, "read": True, "problems": _doubts(r)[:3]}
                           for n, r in zip(names, runs) if _doubts(r)]
            + [{"node": u["path"], "path": u["path"], "read": False, "problems": [u["problem"]]} for u in unreadable],
            "unreadable": len(unreadable),
            "sources": {n: r.source for n, r in zip(names, runs)}}


def _names(nodes: list[str], n: int = SHOW_NODES) -> str:
    more = len(nodes) - n
    return ", ".join(nodes[:n]) + (f" +{more} more" if more > 0 else "")


def _value_text(key: str, value: Any) -> str:
    return _fmt(key, value) if _is_number(value) else str(value)


def _figure_line(d: dict[str, Any]) -> tuple[str, str]:
    key = d["key"]
    if d["kind"] == "number":
        spread = " / ".join(_fmt(key, d[k]) for k in ("min", "median", "max"))
    else:
        values = list(d["values"].items())
        rest = len(values) - 2
        spread = "; ".join(f"{v} on {c}" for v, c in values[:2])
        if rest > 0:
            spread += f"; +{rest} more value{'s' if rest > 1 else ''}"
    if d.get("missing"):
        spread += f" ({d['missing']} without it)"
    outs = d["outliers"]
    shown = ", ".join(f"{o['node']} {_value_text(key, o['value'])}" for o in outs[:SHOW_NODES])
    if len(outs) > SHOW_NODES:
        shown += f" +{len(outs) - SHOW_NODES} more"
    return spread, shown


def render_fleet(summary: dict[str, Any], fmt: str = "text") -> str:
    md = fmt == "markdown"
    h = "## " if md else ""
    counts = ", ".join(f"{v['count']} {k.upper()}" for k, v in summary["verdicts"].items())
    nodes = f"{summary['nodes']} node{'s' if summary['nodes'] != 1 else ''}"
    bad = summary.get("unreadable") or 0
    lost = f"; {bad} more could not be read (listed below)" if bad else ""
    lines = [("# " if md else "") + f"hostpin compare: {summary['runs']} runs from {nodes}: {counts}{lost}",
             f"(fleet summary; --columns shows one column per run, --json every node)", ""]
    lines.append(f"{h}verdicts")
    width = max([5] + [len(s) for s in summary["verdicts"]])
    for status, v in summary["verdicts"].items():
        checks = ", ".join(f"{c} {len(n)}" for c, n in list(v["checks"].items())[:5])
        nodes = "" if status == "pass" else f": {_names(v['nodes'])}"
        lines.append(f"  {status.upper():<{width}} {v['count']:>5}" + (f"  {checks}" if checks else "") + nodes)
    changed = [u["node"] for u in summary["unverified"] if u.get("read", True)]
    if changed:
        lines.append(f"  {len(changed)} runs cannot be vouched for (changed since written, or no manifest.json; "
                     f"--json says which): {_names(changed)}")
    lines.append("")
    unread = [u for u in summary["unverified"] if not u.get("read", True)]
    if unread:
        lines.append(f"{h}could not be read ({len(unread)}): not in the counts above")
        for u in unread[:SHOW_NODES * 2]:
            lines.append(one_line(f"  {u['path']}: {u['problems'][0]}"))
        if len(unread) > SHOW_NODES * 2:
            lines.append(f"  ... {len(unread) - SHOW_NODES * 2} more (--json lists them)")
        lines.append("")
    if summary["differ"]:
        lines.append(f"{h}figures that differ: min / median / max (or values), then the nodes that stand out")
        rows = [(d["label"], *_figure_line(d)) for d in summary["differ"]]
        w0 = max(len(r[0]) for r in rows)
        w1 = min(max(len(r[1]) for r in rows), 40)
        for label, spread, shown in rows:
            line = f"  {label:<{w0}}  {spread:<{w1}}  {shown}".rstrip()
            if len(line) <= LINE_WIDTH:
                lines.append(line)
            else:  # the nodes on a line of their own, under the spread
                lines.append(f"  {label:<{w0}}  {spread}")
                if shown:
                    lines.append(f"  {'':<{w0}}  -> {shown}")
    else:
        lines.append("every figure is equal on every node")
    if summary["equal"]:
        lines.append("")
        import textwrap
        lines += textwrap.wrap(f"equal on every node: {', '.join(summary['equal'])}", LINE_WIDTH,
                               subsequent_indent="  ")
    if summary["stand_out"]:
        lines.append("")
        lines.append(f"{h}nodes that stand out ({len(summary['stand_out'])})")
        for node, labels in list(summary["stand_out"].items())[:8]:
            lines.append(f"  {node}: {', '.join(labels)}")
        if len(summary["stand_out"]) > 8:
            lines.append(f"  ... {len(summary['stand_out']) - 8} more (--json lists them)")
    lines.append("")
    groups = summary["groups"]
    lines.append(f"{h}groups by kernel, driver, THP enabled/defrag ({len(groups)})")
    for g in groups[:GROUP_LINES]:
        what = ", ".join(str(g[k]) if g[k] is not None else "?" for k in ("kernel", "driver")) + \
            f", THP {g['thp_enabled'] or '?'}/{g['thp_defrag'] or '?'}"
        nodes = f": {_names(g['nodes'])}" if g["count"] <= SHOW_NODES else ""
        lines.append(f"  {g['count']:>5}  {what}{nodes}")
    if len(groups) > GROUP_LINES:
        rest = groups[GROUP_LINES:]
        lines.append(f"  {sum(g['count'] for g in rest):>5}  in {len(rest)} smaller groups (--json lists them)")
    text = "\n".join(lines) + "\n"
    return text if not md else text.replace("\n  ", "\n- ")
