#!/usr/bin/env bash
# `hostpin watch --pid` on a loader that pins, reads and pins again, on the H200 (under 5 minutes): one torch
# process, watched from before its first step, pin_memory()s a 2 GiB tensor, reads 2 GiB of its own swapped
# memory (swap reads at 48 MB/s through io.max of its cgroup), then pin_memory()s another 2 GiB. Look for the
# phases hostalloc, copy-from-swap (not a pin), hostalloc, each beside the target's own step, the copy's ETA at
# 20%, and the watch's quiet end ~5 s after the last step. Details: the .py beside it.
# Writes $OUT/summary.txt, $OUT/watch_loader.log, $OUT/watch-loader-run.tar.gz (the watch's run directory and
# the target's target.json: a replay fixture).
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/lpr-runs; rm -rf "$R" "$R.pid"; mkdir -p "$R"
cleanup() {
    # whatever a killed run may have left (only this script's own names)
    for d in /sys/fs/cgroup/hostpin-*lpr-* /sys/fs/cgroup/*/hostpin-*lpr-*; do
        [ -d "$d" ] || continue
        for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done  # only our target
        for _ in 1 2 3 4 5; do rmdir "$d" 2>/dev/null && break; sleep 1; done
    done
    # the driver's swap file is named for its pid: hostpin-swap-PID-*
    local pid; pid=$(cat "$R.pid" 2>/dev/null)
    if [ -n "$pid" ]; then
        for s in $(awk -v p="hostpin-swap-$pid-" 'NR>1 && index($1, p) {print $1}' /proc/swaps); do
            swapoff "$s" && rm -f "$s"
        done
        rm -f /var/tmp/hostpin-swap-"$pid"-*
    fi
    rm -rf "$R" "$R.pid"
}
trap cleanup EXIT
timeout 290 python3 bench/gpu_watch_loader_pin_read_pin.py --runs "$R" --summary "$OUT/summary.txt" --budget 280 \
    --pidfile "$R.pid" 2>&1 \
    | tee "$OUT/watch_loader.log"
echo "rc=${PIPESTATUS[0]}"
tar -czf "$OUT/watch-loader-run.tar.gz" -C "$R" . 2>&1 | tail -2
ls -la "$OUT"
cat "$OUT/summary.txt" 2>/dev/null
true
