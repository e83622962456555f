"""hostpin's acting half: reproducers that pin memory under chosen conditions, watched by a
watchdog, and that undo everything they did on every exit path. Builds on diag."""
import sys as _sys

# The `hostpin` command (the console script, or `python -m repro.cli`) imports this package
# first: a Ctrl-C from here until repro.cli takes over exits quietly (nothing is set up yet, so
# nothing is undone). _signal, not signal: signal imports enum, itself long enough to be hit.
_argv = list(getattr(_sys, "orig_argv", None) or _sys.argv)  # orig_argv: the interpreter's own (3.10+)
if (_argv and _argv[0].rsplit("/", 1)[-1] == "hostpin") or any(
        a == "-m" and b == "repro.cli" for a, b in zip(_argv, _argv[1:])) or (
        _sys.argv and _sys.argv[0].rsplit("/", 1)[-1] == "hostpin"):
    import _signal
    import os as _os

    # `preflight --format line|npd` answers in one line on stdout whatever happens (npd: exit 2, unknown)
    _gate = None
    if "preflight" in _sys.argv[1:2]:
        for _i, _a in enumerate(_sys.argv):
            if _a == "--":
                break
            if _a == "--format" and _i + 1 < len(_sys.argv):
                _gate = _sys.argv[_i + 1]
            elif _a.startswith("--format="):
                _gate = _a.split("=", 1)[1]

    def _interrupted_at_start_up(signum, frame):
        if _gate in ("line", "npd"):
            _os.write(1, b"hostpin: not evaluated: interrupted\n")
        _os.write(2, b"hostpin: interrupted\n")
        _os._exit(2 if _gate == "npd" else 130)

    _signal.signal(_signal.SIGINT, _interrupted_at_start_up)
    _signal.signal(_signal.SIGTERM, _interrupted_at_start_up)
    _signal.signal(_signal.SIGHUP, _interrupted_at_start_up)
