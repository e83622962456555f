#!/usr/bin/env bash
# One device call for issue 4: the staging-memory runs the issue asks for.
set -u
source "$(dirname "$0")/gpu_setup.sh"
RUNS=/tmp/sruns; mkdir -p $RUNS
st() { local name=$1; shift; echo; echo "=== $name: $*"; $HP repro staging --out $RUNS/$name "$@" --json >"$RUNS/$name.json" 2>"$RUNS/$name.err"; echo "rc=$?";
       python3 -c "
import json,sys; sys.path.insert(0,'.')
from repro.render import render_staging
print(render_staging(json.load(open('$RUNS/$name.json'))))"; }
{
  date; nvidia-smi -L
  st defaults
  st threads1 --threads 1
  st threads64 --threads 64 --bytes 3GiB
  st both --direction both
  st repeat5 --repeat 5
  st hold --repeat 2 --hold 10
} 2>&1 | tee "$OUT/report-4.txt"
tar czf "$OUT/staging-runs.tgz" -C $RUNS .
