#!/usr/bin/env bash
# Run several GPU-machine scripts in one device call: bench/gpu_run.sh SECONDS:SCRIPT [SECONDS:SCRIPT ...]
# Each script gets its own empty $OUT (under /tmp), a wall-clock limit, and comes back as two files:
# $OUT/NAME.log (its stdout and stderr) and $OUT/NAME.tgz (what it wrote), since only 8 files return.
set -u
cd "$(dirname "$0")/.."
real_out=${OUT:?OUT is not set}
export PYTHONUNBUFFERED=1
pip install -q --no-deps --no-build-isolation -e . >"$real_out/install.log" 2>&1 || echo "install failed: see install.log"
python3 -c 'import setuptools, sys; print("setuptools", setuptools.__version__, "python", sys.version.split()[0])' >>"$real_out/install.log" 2>&1
for spec in "$@"; do
    limit=${spec%%:*}; script=${spec#*:}; name=$(basename "$script"); name=${name%.*}
    sub=/tmp/gpuout-$name; rm -rf "$sub"; mkdir -p "$sub"
    start=$(date +%s)
    OUT=$sub timeout -k 10 "$limit" bash -c "case $script in *.py) python3 $script;; *) bash $script;; esac" >"$real_out/$name.log" 2>&1
    rc=$?
    echo "== $name: rc $rc in $(( $(date +%s) - start )) s" | tee -a "$real_out/$name.log"
    tar -C "$sub" -czf "$real_out/$name.tgz" . 2>/dev/null
    tail -n 25 "$real_out/$name.log"
done
