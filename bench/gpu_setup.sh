# Sourced by the bench/gpu_*.sh scripts: install hostpin offline on the GPU machine's image
# (python3 3.12 with cuda-bindings, click, psutil, tabulate there) and set OUT and HP.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# pyproject.toml's SPDX license needs setuptools >= 77; the offline install uses the image's own
python3 -c 'import setuptools; print("setuptools", setuptools.__version__)' 2>&1 | tee "$OUT/setuptools.txt"
# HP runs from this source tree, so a failed install (an older setuptools) is reported, not fatal
INSTALLED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { INSTALLED=0; echo "hostpin: the editable install failed (running from the source tree):"; grep -m3 -i "error" "$OUT/install.log"; }
HP="python3 -m repro.cli"
