#!/usr/bin/env bash
# `hostpin watch --pid` on whole PyTorch loads on the H200 (under 7 minutes): Tensor.pin_memory() of a
# 16 GiB tensor with 3 GiB in swap (the pinned allocation, then the copy's swap-in at 48 MB/s); the same
# from a cold 4 GiB file (file-read); a swapped 16 GiB cudaHostRegister watched with and without --size
# (the VmSwap-based ETA at 20%, and the swap left when the call returned). Details: the .py beside it.
# Writes $OUT/summary.txt, $OUT/watch_whole_load.log, $OUT/watch-whole-load-runs.tar.gz (the timelines).
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/wl-runs; rm -rf "$R"; mkdir -p "$R"
timeout 410 python3 bench/gpu_watch_whole_load.py --runs "$R" --summary "$OUT/summary.txt" 2>&1 \
    | tee "$OUT/watch_whole_load.log"
echo "rc=${PIPESTATUS[0]}"
tar -czf "$OUT/watch-whole-load-runs.tar.gz" -C "$R" . 2>&1 | tail -2
rm -rf "$R"
# whatever a killed run may have left (only this script's own names)
for s in $(awk 'NR>1 && $1 ~ /hostpin-/ {print $1}' /proc/swaps); do swapoff "$s" && rm -f "$s"; done
for d in /sys/fs/cgroup/hostpin-*wl-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
rm -f /var/tmp/hostpin-wl-*.bin
ls -la "$OUT"
cat "$OUT/summary.txt" 2>/dev/null
true
