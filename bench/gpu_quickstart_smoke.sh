#!/usr/bin/env bash
# The README quick start on the GPU machine, with the file-safety and stuck-registration cases, about 6 minutes:
#   1  bench/gpu_file_safety_leftovers.sh (user files read-only, leftovers after SIGKILL, partial runs, cgroup v2)
#   2  bench/gpu_watch_stuck.py (the stuck file registration and its control, watched)
#   3  the README's quick start and report on this node: preflight with the CUDA probe (table and
#      --format line), a 4 GiB register watched by `hostpin watch -- CMD`, and its report
# Writes $OUT/final.tar.gz (every output) and prints the summaries.
set -u
source "$(dirname "$0")/gpu_setup.sh"
F=/tmp/final; rm -rf $F; mkdir -p $F
OUT=$F/file-safety timeout 330 bash bench/gpu_file_safety_leftovers.sh > $F/file-safety.txt 2>&1; echo "file-safety rc=$?"; grep '^CASE' $F/file-safety.txt
timeout 300 python3 bench/gpu_watch_stuck.py $F/stuck > $F/stuck.txt 2>&1; echo "stuck rc=$?"; tail -12 $F/stuck.txt
{
  $HP preflight --size 47.2GiB --ranks 2 --out $F/runs; echo "preflight rc=$?"
  $HP preflight --size 47.2GiB --ranks 2 --format line --out $F/runs; echo "line rc=$?"
  $HP watch --heartbeat 2 --out $F/runs -- $HP repro register --size 4GiB --thp --out $F/runs; echo "watch rc=$?"
  r=$(ls -d $F/runs/*repro-register* | head -1); $HP report "$r" --format text --no-picture | head -40; echo "report rc=$?"
  $HP repro cleanup --dry-run
} > $F/smoke.txt 2>&1; cat $F/smoke.txt | cut -c1-220
tar -C /tmp -czf "$OUT/final.tar.gz" final
