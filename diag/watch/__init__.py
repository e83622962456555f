"""Watching a pin while it happens, read-only: the observing half of hostpin's watchdog.

    sampler   reads the node and any process (status, io, threads' stat, stacks, syscalls)
    frames    what a kernel stack says: the bound it names, whether it is inside a pin
    bounds    the bound over a window of samples, with its evidence; the ETA
    tracker   one pin phase: progress, rate, bound and ETA, sample by sample (pure)
    phases    pin phases noticed in any thread; book: one tracker per phase
    timeline  the timeline and stacks files of a run directory
    attach    `hostpin watch --pid`; launch: `hostpin watch -- CMD`
    result, render, cli

diag.watch only reads: it never signals, traces or stops what it watches. repro drives its
own children with it (repro.supervisor) and keeps the acting parts.
"""
