#!/usr/bin/env bash
# hostpin watch on pins hostpin did not start, on the H200, in one go (under 8 minutes): `hostpin watch --pid` on an independent
# cuda-bindings process registering 16 GiB with 4 GiB in swap (throttled, ~1 min); the 16 GiB
# MAP_PRIVATE file case with its page cache dropped (repro --read-rate); a 47 GiB cudaHostAlloc
# watched with per-process progress (launcher form and --pid); a prefaulted 47 GiB register's
# driver phase. Writes $OUT/summary.txt, $OUT/gpu_watch_attach.log, $OUT/watch-attach-runs.tar.gz.
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/i10runs; rm -rf "$R"; mkdir -p "$R"
timeout 440 python3 bench/gpu_watch_attach.py --runs "$R" --summary "$OUT/summary.txt" 2>&1 | tee "$OUT/gpu_watch_attach.log"
echo "rc=${PIPESTATUS[0]}"
tar -czf "$OUT/watch-attach-runs.tar.gz" -C "$R" . 2>&1 | tail -2
ls -la "$OUT"
# whatever a killed case may have left (only hostpin's own names)
for s in $(awk 'NR>1 && $1 ~ /hostpin-/ {print $1}' /proc/swaps); do swapoff "$s" && rm -f "$s"; done
for d in /sys/fs/cgroup/hostpin-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
rm -f /var/tmp/hostpin-i10-16g.bin
true
