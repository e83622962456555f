"""diag's verbs of the `hostpin` command, one module each (preflight, snapshot, report, bundle,
compare); diag.cli puts them in its group, beside diag.watch.cli's watch. What they share is
diag.cliopts: no verb's module imports another, nor diag.cli."""
