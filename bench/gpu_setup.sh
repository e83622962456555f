# Sourced by the bench/gpu_*.sh scripts: install hostpin offline on the GPU machine's image
# (python3 3.12 with cuda-bindings, click, psutil, tabulate there) and set OUT and HP.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
HP="python3 -m repro.cli"
