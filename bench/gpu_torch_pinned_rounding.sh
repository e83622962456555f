#!/usr/bin/env bash
# PyTorch's pinned rounding on the GPU machine (catalog 18), under 420 s, nothing changed on the GPU:
#   - 4.1 GiB (just above 4 GiB: PyTorch pins 8) and 7.5 GiB (just below 8: pins 8) at 2 and 3 ranks, each
#     in a cgroup v2 whose memory.max lies between hostpin's raw-CUDA need and its PyTorch need, and once
#     above both: `hostpin preflight --allocator cuda|torch --cgroup DIR` then real torch ranks inside it
#     (torch.empty(n, dtype=torch.uint8, pin_memory=True), nothing else); memory.events oom_kill,
#     memory.peak, the margin in bytes, agree yes/no;
#   - pinned_use_cuda_host_register:True the same way, and alone: RssAnon vs RssShmem growth, pins
#     outstanding (nr_foll_pin_acquired - released) per rank; the same through PYTORCH_ALLOC_CONF, and
#     pinned_max_round_threshold_mb:1024 (does this torch know them?);
#   - `hostpin repro register --allocator torch --method pin_memory` of 16 GiB with 2 GiB in swap.
# Writes $OUT/torch-rounding.txt (all printed), $OUT/torch-rounding.json, $OUT/torch-runs.tar.gz.
set -u
source "$(dirname "$0")/gpu_setup.sh"
W=/tmp/hptorch; rm -rf "$W"; mkdir -p "$W"
cleanup() {  # the driver removes its own cgroups; this catches a driver killed by the timeout
  for d in /sys/fs/cgroup/hp-torch-*; do
    [ -d "$d" ] || continue
    [ -e "$d/cgroup.kill" ] && echo 1 > "$d/cgroup.kill" 2>/dev/null
    sleep 0.5; rmdir "$d" 2>/dev/null
  done
  $HP repro cleanup >/dev/null 2>&1   # a swap file or cgroup of a reproducer that was killed
}
trap cleanup EXIT INT TERM
timeout -k 5 400 python3 bench/gpu_torch_pinned_rounding.py 2>&1 | tee "$OUT/torch-rounding.txt"
echo "driver exit ${PIPESTATUS[0]}"
find "$W/runs" -maxdepth 2 \( -name result.json -o -name manifest.json \) 2>/dev/null \
  | tar -czf "$OUT/torch-runs.tar.gz" -T - 2>/dev/null
rm -rf "$W"
ls -la "$OUT"
