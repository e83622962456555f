"""hostpin's observing half: readers of /proc and /sys, the CUDA probe, preflight checks,
the evidence store and rendering. Nothing in diag changes the machine; diag never imports repro."""

__version__ = "0.1.0"
