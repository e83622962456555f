#!/usr/bin/env bash
# A short device call after changes to code that calls CUDA: every CUDA path once, small sizes.
set -u
source "$(dirname "$0")/gpu_setup.sh"
R=/tmp/rc; mkdir -p $R
{
  echo "== preflight with the CUDA probe"; $HP preflight --size 8GiB --out $R | head -3; echo "rc=${PIPESTATUS[0]}"
  echo "== register 4GiB thp prefault"; $HP repro register --size 4GiB --thp --out $R | head -3
  echo "== hostalloc 2GiB"; $HP repro register --size 2GiB --method hostalloc --out $R | head -3
  echo "== register twice"; $HP repro register --size 64MiB --register-twice --out $R | head -2
  echo "== readonly flags on a shared file"; $HP repro register --size 1GiB --source file:/var/tmp/hp-ro.bin --map shared --register-flags readonly --out $R | head -2
  echo "== staging, one repeat"; $HP repro staging --repeat 1 --out $R | head -2
  echo "== report of the last register run"; last=$(ls -td $R/*repro-register*/ | head -1); $HP report "$last" --format text | head -12
  echo "left:"; cat /proc/swaps; ls /sys/fs/cgroup | grep hostpin; ls /var/tmp | grep hostpin
} 2>&1 | tee "$OUT/recheck.txt"
