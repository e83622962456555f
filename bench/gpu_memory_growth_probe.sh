#!/usr/bin/env bash
# How a GPU machine's VM shows memory that grows on demand (issue 22's question, asked on the kind
# that is lent): read-only, about 1 minute. Records, on a machine as it comes:
#   MemTotal/MemFree/MemAvailable; /sys/devices/system/memory (block size, blocks online/offline,
#   their zones); virtio devices and their drivers (virtio-mem is device id 0x0018, the balloon
#   0x0005) with virtio-mem's sysfs and the balloon's stats if present; "System RAM" in /proc/iomem;
#   /sys/firmware/memmap; the kernel log's lines on memory, hotplug, balloon and virtio;
# then touches 16 GiB in one process (released at its exit) and samples MemTotal and the online
# blocks every 0.5 s, to see whether MemTotal grows as memory is touched (on the two-GPU kind it
# was seen going from 31 GiB up). Touching 16 GiB of a 125 GiB node is far from its limit.
# Writes $OUT/memory_growth.txt; changes nothing but that process's own memory.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/memory_growth.txt") 2>&1
echo "== $(date -u +%FT%TZ) $(uname -r) nproc $(nproc)"
grep -E "^(MemTotal|MemFree|MemAvailable|HugePages_Total|Hugetlb):" /proc/meminfo
M=/sys/devices/system/memory
echo "== memory blocks: block_size_bytes $(cat $M/block_size_bytes 2>&1) auto_online_blocks $(cat $M/auto_online_blocks 2>&1)"
on=0; off=0; for b in $M/memory*; do s=$(cat $b/state 2>/dev/null); [ "$s" = online ] && on=$((on+1)) || off=$((off+1)); done
echo "blocks online $on, not online $off"
for b in $(ls -d $M/memory* | sort -V | sed -n '1p;$p'); do echo "$b: state $(cat $b/state 2>&1) zones $(cat $b/valid_zones 2>&1) removable $(cat $b/removable 2>&1)"; done
echo "== online_policy $(cat /sys/module/memory_hotplug/parameters/online_policy 2>&1)"
echo "== virtio devices"
for d in /sys/bus/virtio/devices/*; do
  [ -e "$d" ] || continue
  echo "$(basename $d): device $(cat $d/device 2>&1) vendor $(cat $d/vendor 2>&1) driver $(basename "$(readlink $d/driver 2>/dev/null)" 2>/dev/null)"
done
ls /sys/bus/virtio/drivers 2>&1 | tr '\n' ' '; echo
for d in /sys/bus/virtio/drivers/virtio_mem /sys/bus/virtio/drivers/virtio_balloon; do [ -d $d ] && { echo "$d:"; ls $d; }; done
ls /sys/module | grep -iE "virtio|balloon|mem_" | tr '\n' ' '; echo
echo "== balloon in /proc/vmstat (nr_balloon_pages: pages the balloon holds now), its features"
grep -i balloon /proc/vmstat
for d in /sys/bus/virtio/devices/*; do [ "$(cat $d/device 2>/dev/null)" = 0x0005 ] && echo "balloon $(basename $d) features $(cat $d/features)"; done
[ -r /sys/kernel/debug/virtio-balloon ] && cat /sys/kernel/debug/virtio-balloon
echo "== /proc/iomem System RAM (root reads the addresses)"
grep -i "system ram\|virtio\|hotplug" /proc/iomem | head -20
echo "== /sys/firmware/memmap"
for e in /sys/firmware/memmap/*; do [ -d "$e" ] && echo "$(cat $e/start) $(cat $e/end) $(cat $e/type)"; done 2>/dev/null | head -20
echo "== kernel log (memory, hotplug, balloon, virtio)"
dmesg 2>/dev/null | grep -iE "virtio_mem|virtio-mem|balloon|hotplug|memory: |Memory:|hot-add|memmap|e820|ACPI: SRAT|NUMA" | head -40
echo "== touching 16 GiB, MemTotal every 0.5 s"
python3 - <<'EOF' &
import mmap, time
n = 16 << 30
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
step = 1 << 30
for off in range(0, n, step):
    for p in range(off, off + step, 4096):
        m[p] = 1
    print(f"touched {(off + step) >> 30} GiB at {time.monotonic():.1f}", flush=True)
time.sleep(1)
EOF
py=$!
t0=$(date +%s.%N)
while kill -0 $py 2>/dev/null; do
  on=$(grep -l online $M/memory*/state 2>/dev/null | wc -l)
  printf "%6.1f s MemTotal %s kB MemFree %s kB blocks online %s balloon pages %s\n" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" \
    "$(awk '/^MemTotal/{print $2}' /proc/meminfo)" "$(awk '/^MemFree/{print $2}' /proc/meminfo)" "$on" "$(awk '/^nr_balloon_pages/{print $2}' /proc/vmstat)"
  sleep 0.5
done
wait $py
echo "== after"
grep -E "^(MemTotal|MemFree|MemAvailable):" /proc/meminfo
grep -i balloon /proc/vmstat
dmesg 2>/dev/null | grep -iE "virtio_mem|balloon|hotplug|memory" | tail -10
