#!/usr/bin/env bash
# The swap-in ETA of `hostpin watch --pid` on the H200 (under 300 s): a swapped 16 GiB PyTorch
# cudaHostRegister (3 GiB of the process in swap at 48 MB/s) watched with and without --size, and
# Tensor.pin_memory() of the same (the copy from swap). Look for: each swap-in phase's first ETA
# and ETA at 20% of its work "[within 10%]", a basis "pages of the region still in swap (smaps, ...)
# at ... pages/s (its swap reads)", ~297 MiB outside the region, and the smaps read cost (ms, VMAs).
# Details: the .py beside it. Writes $OUT/summary.txt, $OUT/watch_eta.log, $OUT/watch-eta-runs.tar.gz.
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/eta-runs; rm -rf "$R"; mkdir -p "$R"
timeout 290 python3 bench/gpu_watch_eta_region_swap.py --runs "$R" --summary "$OUT/summary.txt" 2>&1 \
    | tee "$OUT/watch_eta.log"
echo "rc=${PIPESTATUS[0]}"
tar -czf "$OUT/watch-eta-runs.tar.gz" -C "$R" . 2>&1 | tail -2
rm -rf "$R"
# whatever a killed run may have left (only the names these cases use)
for s in $(awk 'NR>1 && $1 ~ /hostpin-/ {print $1}' /proc/swaps); do swapoff "$s" && rm -f "$s"; done
for d in /sys/fs/cgroup/hostpin-*wl-*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
ls -la "$OUT"
cat "$OUT/summary.txt" 2>/dev/null
true
