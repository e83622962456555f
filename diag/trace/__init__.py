"""The kernel tracer behind `--trace`: where every second of a pin went, measured in the kernel.

This is the one part of diag that changes kernel state, the exception MISSION's rule "diag
never changes the machine" names: it creates its own tracefs instances
(`/sys/kernel/tracing/instances/hostpin-<pid>-<n>`), and mounts tracefs at /sys/kernel/tracing
if it was not mounted; it removes both afterwards, on every exit path (a finally, an atexit
hook; what a SIGKILL leaves is a stale instance that `hostpin repro cleanup` and the
leftovers check know by its owner pid being dead). It never touches the global trace buffer
or another tracer's instances. Nothing else in diag gets this exception.

    tracefs   the mount, the instances, their events and filters, stale instances
    parse     trace_pipe text -> events (pure)
    budget    events -> a thread's time budget over a phase (pure), attach_budgets
    session   a trace of a watch: instances, readers, the raw trace in the run, the ledger
"""
from .budget import CAUSES, Ledger, attach_budgets, budget_from_events, classify_stack, pick_pinner
from .parse import Event, parse_lines, parse_text
from .session import Tracer, TraceUnavailable, buffer_kb
from .tracefs import PREFIX, TRACEFS, remove_instance, stale_instances

__all__ = ["CAUSES", "Ledger", "attach_budgets", "budget_from_events", "classify_stack", "pick_pinner", "Event", "parse_lines",
           "parse_text", "Tracer", "TraceUnavailable", "buffer_kb", "PREFIX", "TRACEFS", "remove_instance",
           "stale_instances"]
