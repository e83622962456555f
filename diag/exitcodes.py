"""Exit codes of every hostpin command, named in one place."""

EXIT_OK = 0            # nothing failed (warnings allowed unless --strict)
EXIT_FAIL = 1          # a check failed, or a reproduction ended in failure/stall/kill
EXIT_USAGE = 2         # bad command line: a one-line error names the value
EXIT_UNEVALUATED = 3   # the node could not be evaluated (unreadable tree, no GPU for a CUDA-only command)
EXIT_REFUSED = 4       # repro refused for safety (not enough headroom) without --force
EXIT_INTERRUPTED = 130
EXIT_CMD_NOT_EXECUTABLE = 126  # `hostpin watch -- CMD`: CMD cannot be run (as a shell says it)
EXIT_CMD_NOT_FOUND = 127       # `hostpin watch -- CMD`: no such command
