"""Exit codes of every hostpin command, named in one place.

One table for every command (preflight, snapshot, report, bundle, compare, repro register,
repro staging, repro cleanup); the README's exit-code table is this one:

====  ==========================================================================================
code  meaning
====  ==========================================================================================
0     done: nothing failed (preflight warnings allowed unless --strict; a pin completed or was
      slow; a report, bundle, comparison or cleanup made; `watch --pid`: every pin returned and
      the process was quiet for --quiet-after seconds or exited, or with --until pin the pin
      returned)
1     a check failed (preflight; --strict: a warning), a reproduction failed, stalled, was killed
      at its deadline or is unkillable, or `watch --pid` ended first (--deadline came first, a pin
      ended without returning: the process exited or died inside it, or no pin or load was seen).
      Only these: never an input that could not be read nor an output that could not be written,
      and a failure stays 1 whatever could not be written.
2     bad command line: a one-line error names the value (a size that is not one, a path that
      does not exist, options that contradict each other, -o inside the run being read, a
      --json-file refused before the command runs: a link, a device, a run's file, the site file)
3     could not read or evaluate the input, or could not write the output: an unreadable or
      damaged tree, run, manifest, result or bundle (truncated, corrupt, hostile, over the
      limits), no GPU for a CUDA-only command, no torch in the --python of `repro register
      --allocator torch`, an --out / -o / --prometheus / --json-file that cannot be written, a
      run directory that cannot be made or fills up (the evidence is lost), a result that cannot
      reach stdout, no descriptors or TMPDIR space left to read runs, a leftover that `repro
      cleanup` could not remove; `watch --pid`: the outcome is unknown (the process vanished
      between two samples inside a pin). One line names what and why. The verdict is decided
      first and still printed: an output that could not be written makes a pass 3, never a
      failure.
4     refused for safety: not enough headroom (--force), or leftovers of killed runs on the node
      (`hostpin repro cleanup`, or --ignore-leftovers); --trace without root
126   `watch -- CMD`: CMD cannot be run (as a shell says it)
127   `watch -- CMD`: no such command
130   interrupted (Ctrl-C or SIGTERM), everything set up removed
====  ==========================================================================================

`watch -- CMD` otherwise exits with CMD's own exit code (128+N when signal N ended it), whatever
could not be written: evidence it could not keep is a warning on stderr. A message that cannot
reach stderr (a full disk under `2>>log`, /dev/full) never changes any exit code.

No input prints a traceback; HOSTPIN_DEBUG=1 shows one for an unexpected internal error
(which otherwise exits 3 naming where it happened).
"""

EXIT_OK = 0            # nothing failed (warnings allowed unless --strict)
EXIT_FAIL = 1          # a check failed, a reproduction ended in failure/stall/kill, watch ended first
EXIT_USAGE = 2         # bad command line: a one-line error names the value
EXIT_UNEVALUATED = 3   # the input could not be read or evaluated, or the output not written
EXIT_REFUSED = 4       # repro refused for safety (headroom, leftovers) without its override
EXIT_INTERRUPTED = 130
EXIT_CMD_NOT_EXECUTABLE = 126  # `hostpin watch -- CMD`: CMD cannot be run (as a shell says it)
EXIT_CMD_NOT_FOUND = 127       # `hostpin watch -- CMD`: no such command
