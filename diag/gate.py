"""A preflight result as the machines that act on it read it: one short line and an exit code.

A Slurm prolog puts the line into the node's drain reason (`scontrol ... reason="$line"`), and
node-problem-detector's custom plugins must print one short line and exit 0 (OK), 1 (problem) or
2 (unknown). Every line starts with "hostpin: ", so that a script can tell a node hostpin drained
from one an administrator drained, and holds only printable ASCII without quotes.

>>> short_line({"status": "fail", "checks": [{"id": "headroom", "status": "fail", "summary": "x",
...     "evidence": {"binding": "MemAvailable", "binding_bytes": 38 << 30, "need_with_tables_bytes": 101798205849}}]})
'hostpin: headroom 38 GiB < 94.8 GiB'
"""
from __future__ import annotations

import re
from typing import Any

from .exitcodes import EXIT_FAIL, EXIT_OK
from .units import format_bytes

__all__ = ["PREFIX", "LINE_LIMIT", "short_line", "npd_exit_code", "NPD_OK", "NPD_PROBLEM", "NPD_UNKNOWN",
           "unevaluated_line"]

PREFIX = "hostpin: "
LINE_LIMIT = 80  # node-problem-detector's default max_output_length; also what `sinfo -R` users read
NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
_UNSAFE = re.compile(r"[^\x20-\x7e]|[\"'`$\\]")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", _UNSAFE.sub(" ", str(text))).strip()


def _fit(text: str, limit: int) -> str:
    text = _clean(text)
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    word = cut.rsplit(" ", 1)[0].rstrip(" ,;:(")
    return (word if len(word) >= limit // 2 else cut) + "..."


def _check_phrase(check: dict[str, Any], result: dict[str, Any]) -> str:
    """The finding of one check in a few words, with its numbers where the check gives them."""
    ev = check.get("evidence") or {}
    # the typed result's fields (schema 2) first; a schema-1 record kept them in the evidence only
    need = result.get("need_bytes") if result.get("need_bytes") is not None else ev.get("need_with_tables_bytes")
    if check["id"] == "headroom" and need is not None:
        binding = result.get("binding") or ev.get("binding")
        what = "cgroup headroom" if "cgroup" in str(binding) else "headroom"
        have = result.get("binding_bytes") if result.get("binding_bytes") is not None else ev.get("binding_bytes") or 0
        margin = result.get("margin_bytes") if result.get("margin_bytes") is not None else ev.get("margin_bytes") or 0
        if check["status"] == "warn":
            return f"headroom leaves {format_bytes(max(0, have - need))} < margin {format_bytes(margin)}"
        return f"{what} {format_bytes(have)} < {format_bytes(need)}"
    summary = _clean(check.get("summary") or check.get("status", ""))
    head = re.split(r";|: (?=[a-z])", summary, maxsplit=1)[0]
    return f"{check['id']}: {head if len(head) >= 12 else summary}"


def short_line(result: dict[str, Any], limit: int = LINE_LIMIT) -> str:
    """One line, at most `limit` characters, starting "hostpin: ": the first failure (or warning) with
    its numbers and the other checks that failed, or that the plan fits."""
    status = result.get("status")
    checks = result.get("checks") or []
    if status not in ("pass", "warn", "fail"):
        errors = [c for c in checks if c.get("status") == "error"]
        if errors:  # the check that could not judge, and why, before anything else
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            return unevaluated_line(f"{errors[0]['id']}: {errors[0].get('summary') or 'error'}", limit - len(more)) + more
        return unevaluated_line(result.get("verdict") or "not evaluated", limit)
    bad = [c for c in checks if c.get("status") == status] if status in ("fail", "warn") else []
    if not bad:
        plan = (result.get("plan") or {}).get("describe")
        return _fit(PREFIX + (f"ok: can pin {plan}" if plan and (result.get("plan") or {}).get("size_bytes")
                              else "ok"), limit)
    first = _check_phrase(bad[0], result)
    strict = status == "warn" and result.get("exit_code") == EXIT_FAIL
    if status == "warn":
        first = ("warning (strict): " if strict else "warning: ") + first
    others = [c["id"] for c in bad[1:]]
    tail = f" (+{', '.join(others)})" if others else ""
    room = limit - len(PREFIX) - len(tail)
    if room < 24:  # too many others to name: count them instead
        tail = f" (+{len(others)} more)"
        room = limit - len(PREFIX) - len(tail)
    return PREFIX + _fit(first, room) + tail


def unevaluated_line(why: str, limit: int = LINE_LIMIT) -> str:
    """'hostpin: not evaluated: CAUSE', the cause first: what hostpin was evaluating (this node, a
    tree's path) is dropped, and a file's path is cut to the file."""
    why = re.sub(r"^(cannot evaluate this node|cannot evaluate whether this node can pin [^:]*|could not evaluate "
                 r"\S+|internal error): ", "", _clean(why))
    why = re.sub(r"^(\w+): (?:damaged reading|(not captured)): ", lambda m: f"{m[1]}: {m[2] or 'damaged'} ", why)
    why = re.sub(r"\S*?/((?:proc|sys)/\S+)", r"\1", why)  # the file, not where the tree was
    why = re.sub(r"\bsys/fs/cgroup/\S*?(memory\.\w+)", r"cgroup \1", why)  # which cgroup: in the run
    why = re.sub(r"(?<![\w.])/(?:[^\s/]+/)+([^\s/]+)",  # any other path: its name, unless '..' is what is wrong
                 lambda m: m[0] if "/../" in m[0] else m[1], why)
    why = re.sub(r"^Invalid value for (--[\w-]+) ?: ", r"\1: ", why)  # click's words, quotes already gone
    why = re.sub(r"^cannot read the configuration file ", "site file ", why)
    return PREFIX + _fit(f"not evaluated: {why}", limit - len(PREFIX))


def npd_exit_code(result: dict[str, Any]) -> int:
    """node-problem-detector's plugin contract: 0 OK, 1 problem, 2 unknown. A warning is OK unless the
    gate was made strict (then preflight's own exit code is already 1)."""
    code = result.get("exit_code")
    if code == EXIT_OK:
        return NPD_OK
    if code == EXIT_FAIL:
        return NPD_PROBLEM
    return NPD_UNKNOWN
