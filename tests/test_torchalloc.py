"""PyTorch's caching host allocator (catalog 18): the rules by version (diag.torchalloc), preflight
--allocator torch on captured H200 trees, and repro register --allocator torch without torch (CI never
has torch: the torch paths must say so and exit 3)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from diag import catalog, torchalloc
from diag.torchalloc import MiB, parse_alloc_conf, plan_request, power_of_2_ceil

from conftest import FIXTURES, REPO, hostpin

GiB = 1 << 30
SNAP = FIXTURES / "h200-fc-snapshot-1201"   # hostpin snapshot of the H200 (125 GiB MemAvailable, cgroup v2)
CGROUP = "/process_api/dd18d96db30614496cd45cdec5d82103"   # the snapshot's own cgroup (memory.max in the tree)
TABLES = catalog.DRIVER_BYTES_PER_PAGE


def gib(x: float) -> int:
    from diag.units import parse_size
    return parse_size(f"{x}GiB")


# (version, settings, size, chunk) -> (what PyTorch asks the driver for per rank, method)
RULES = [
    ("1.10.2", "", gib(47.2), None, gib(47.2), "hostalloc"),            # before the rounding: the exact size
    ("1.11.0", "", gib(47.2), None, 64 * GiB, "hostalloc"),              # PowerOf2Ceil from 1.11
    ("2.11.0", "", gib(5), None, 8 * GiB, "hostalloc"),
    ("2.11.0", "", gib(4.1), None, 8 * GiB, "hostalloc"),                # just above a power of two: nearly 2x
    ("2.11.0", "", gib(3.9), None, 4 * GiB, "hostalloc"),                # just below: ~3% more
    ("2.11.0", "", 4 * GiB, None, 4 * GiB, "hostalloc"),                 # a power of two stays
    ("2.11.0", "", gib(47.2), 8 * GiB, 48 * GiB, "hostalloc"),           # each call rounded: 5 x 8 + 7.2 -> 8
    ("2.1.0", "pinned_use_cuda_host_register:True", gib(5), None, 8 * GiB, "hostalloc"),  # not read before 2.2
    ("2.2.0", "pinned_use_cuda_host_register:True,pinned_num_register_threads:8", gib(5), None, 8 * GiB,
     "register"),                                                        # malloc + cudaHostRegister, still rounded
    ("2.13.0", "pinned_max_round_threshold_mb:1024", gib(5), None, gib(5), "hostalloc"),   # above it: 512 B aligned
    ("2.13.0", "pinned_max_round_threshold_mb:1024", 512 * MiB + 1, None, GiB, "hostalloc"),  # below it: rounded
    ("2.11.0", "pinned_reserve_segment_size_mb:8192", gib(5), None, 8 * GiB, "hostalloc"),    # carved from reserve
    ("2.11.0", "pinned_reserve_segment_size_mb:8192", gib(10), None, 24 * GiB, "hostalloc"),  # reserve + 16 GiB
    (None, "", gib(5), None, 8 * GiB, "hostalloc"),                      # unknown: every release since 1.11
    ("2.11.0", "expandable_segments:True,roundup_power2_divisions:[256:1,>:4],backend:native", gib(5), None,
     8 * GiB, "hostalloc"),                                              # device-allocator options change nothing
]


@pytest.mark.parametrize("version, conf, size, chunk, want, method", RULES)
def test_rules_by_version(version, conf, size, chunk, want, method):
    confs = {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}
    req = plan_request(size, chunk, version=version, confs=confs)
    assert (req.request_bytes, req.method) == (want, method)
    assert sum(req.call_bytes) == want
    if version is None:
        assert any("not known" in n for n in req.notes)


def test_threshold_aligns_to_512_bytes():
    req = plan_request(5 * GiB + 1, version="2.13.0", confs={"PYTORCH_CUDA_ALLOC_CONF": "pinned_max_round_threshold_mb:1"})
    assert req.request_bytes == 5 * GiB + 512


def test_alloc_conf_names_by_version():
    # PYTORCH_ALLOC_CONF is read from 2.8, its CUDA options honoured from 2.11 (before: planned with and
    # without it); when both names are set and differ the larger request is planned
    register = "pinned_use_cuda_host_register:True"
    reserve = {"PYTORCH_ALLOC_CONF": "pinned_reserve_segment_size_mb:65536"}
    old = plan_request(gib(5), version="2.7.1", confs=reserve)
    assert old.request_bytes == 8 * GiB and any("2.8" in n for n in old.notes)
    assert plan_request(gib(5), version="2.9.1", confs=reserve).request_bytes == 64 * GiB   # the larger of the two
    shrink = {"PYTORCH_ALLOC_CONF": "pinned_max_round_threshold_mb:1024"}
    assert plan_request(gib(5), version="2.13.0", confs=shrink).request_bytes == gib(5)   # honoured: exact
    new = plan_request(gib(5), version="2.11.0", confs={"PYTORCH_ALLOC_CONF": register})
    assert new.method == "register" and not any("183387" in n for n in new.notes)
    maybe = plan_request(gib(5), version="2.9.1", confs={"PYTORCH_ALLOC_CONF": register})
    assert any("183387" in n for n in maybe.notes)
    both = plan_request(gib(5), version="2.11.0", confs={"PYTORCH_CUDA_ALLOC_CONF": register,
                                                          "PYTORCH_ALLOC_CONF": "pinned_reserve_segment_size_mb:16384"})
    assert both.request_bytes == 16 * GiB and both.conf_source == "PYTORCH_ALLOC_CONF"
    assert any("differ" in n for n in both.notes)


@pytest.mark.parametrize("text", ["pinned_use_cuda_host_register:yes", "pinned_num_register_threads:3",
                                  "pinned_num_register_threads:256", "pinned_reserve_segment_size_mb:1.5",
                                  "pinned_use_background_threads"])
def test_settings_pytorch_refuses(text):
    with pytest.raises(ValueError):
        parse_alloc_conf(text)


def test_power_of_2_ceil_edges():
    assert [power_of_2_ceil(n) for n in (0, 1, 2, 3, 4096, 4097)] == [0, 1, 2, 4, 4096, 8192]
    assert power_of_2_ceil((1 << 39) - 1) == 1 << 39   # 300 GiB-ish asks for 512 GiB: the 512 GiB per call rule


def test_parse_version():
    assert torchalloc.parse_version("2.11.0+cu130") == (2, 11, 0)
    assert torchalloc.parse_version("2.13.0a0+git1234") == (2, 13, 0)
    assert torchalloc.parse_version("nightly") is None


# -- preflight on the H200's captured tree -------------------------------------------------------
@pytest.fixture
def preflight(tmp_path):
    import os
    env = {k: v for k, v in os.environ.items() if k not in torchalloc.ENV_NAMES}

    def run(*args: str, extra_env: dict | None = None, root=SNAP) -> tuple[subprocess.CompletedProcess, dict | None]:
        r = hostpin("preflight", "--root", str(root), "--json", "--out", str(tmp_path / "runs"), *args,
                    env=dict(env, **(extra_env or {})))
        try:
            return r, json.loads(r.stdout)
        except ValueError:
            return r, None
    return run


def _need(per_rank: int, ranks: int) -> int:
    return per_rank * ranks + -(-per_rank // 4096) * ranks * TABLES


def test_preflight_torch_rounding_fails_where_the_raw_plan_passes(preflight):
    """MemAvailable 125 GiB: 2 x 47.2 GiB fits by CUDA (94.4 GiB), not through PyTorch (2 x 64 GiB)."""
    r, cuda = preflight("--size", "47.2GiB", "--ranks", "2")
    assert r.returncode == 0 and cuda["status"] in ("pass", "warn"), r.stdout
    assert cuda["need_bytes"] == _need(gib(47.2), 2) and cuda["torch"] is None
    r, torch = preflight("--size", "47.2GiB", "--ranks", "2", "--allocator", "torch", "--torch-version", "2.11.0")
    assert r.returncode == 1 and torch["status"] == "fail", r.stdout
    assert torch["need_bytes"] == _need(64 * GiB, 2)
    head = torch["checks"][0]
    assert head["id"] == "headroom" and 18 in head["predicted"]
    assert head["summary"].startswith("47.2 GiB asks PyTorch for 64 GiB pinned: 2 x 64 GiB")
    assert "PyTorch 2.11.0 (--torch-version)" in torch["verdict"] and "PowerOf2Ceil" in torch["verdict"]
    assert torch["torch"]["request_bytes"] == 64 * GiB and torch["plan"]["method"] == "hostalloc"


def test_preflight_torch_passes_where_the_rounded_plan_fits(preflight):
    r, d = preflight("--size", "30GiB", "--ranks", "2", "--allocator", "torch", "--torch-version", "2.11.0")
    assert r.returncode == 0 and d["status"] in ("pass", "warn"), r.stdout
    assert d["need_bytes"] == _need(32 * GiB, 2)
    assert "30 GiB asks PyTorch for 32 GiB pinned: 2 x 32 GiB" in d["verdict"]
    # PyTorch 1.10 does not round: the same plan as CUDA's
    r, d = preflight("--size", "47.2GiB", "--ranks", "2", "--allocator", "torch", "--torch-version", "1.10.2")
    assert r.returncode == 0 and d["need_bytes"] == _need(gib(47.2), 2), r.stdout


def test_preflight_torch_in_a_cgroup(preflight, tree):
    """The GPU machine's case as a tree: the snapshot's own cgroup given memory.max 110G (an edge built from
    the real capture): 2 x 47.2 GiB passes by CUDA and fails through PyTorch, in the cgroup's terms."""
    t = tree(SNAP)
    t.write(f"sys/fs/cgroup{CGROUP}/memory.max", str(110 << 30) + "\n")
    base = ("--size", "47.2GiB", "--ranks", "2", "--cgroup", CGROUP)
    r, cuda = preflight(*base, root=t.base)
    assert r.returncode == 0 and cuda["binding"] == "cgroup", r.stdout
    r, torch = preflight(*base, "--allocator", "torch", "--torch-version", "2.11.0", root=t.base)
    assert r.returncode == 1 and torch["binding"] == "cgroup", r.stdout
    from diag.checks.memory import CGROUP_BYTES_PER_PAGE
    assert torch["need_bytes"] == 2 * 64 * GiB + 2 * (64 * GiB // 4096) * CGROUP_BYTES_PER_PAGE
    assert torch["need_bytes"] > torch["binding_bytes"] > cuda["need_bytes"]


def test_preflight_torch_per_call_rules_use_the_rounded_size(preflight):
    """300 GiB asks PyTorch for one 512 GiB cudaHostAlloc: the driver's 2^27-page limit (catalog 3)."""
    r, d = preflight("--size", "300GiB", "--allocator", "torch", "--torch-version", "2.11.0")
    driver = next(c for c in d["checks"] if c["id"] == "driver")
    assert driver["status"] == "fail" and 3 in driver["predicted"], driver
    r, d = preflight("--size", "300GiB")
    assert next(c for c in d["checks"] if c["id"] == "driver")["status"] == "pass"


def test_preflight_torch_settings_from_the_environment(preflight):
    r, d = preflight("--size", "5GiB", "--allocator", "torch", "--torch-version", "2.11.0",
                     extra_env={"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True"})
    assert d["plan"]["method"] == "register" and d["torch"]["conf_source"] == "PYTORCH_CUDA_ALLOC_CONF"
    assert d["need_bytes"] == _need(8 * GiB, 1) and "cudaHostRegister" in d["verdict"]
    r, d = preflight("--size", "5GiB", "--allocator", "torch", "--torch-version", "2.11.0",
                     "--alloc-conf", "pinned_reserve_segment_size_mb:16384",
                     extra_env={"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True"})
    assert d["plan"]["method"] == "hostalloc" and d["torch"]["request_bytes"] == 16 * GiB  # --alloc-conf wins


def test_preflight_reads_the_installed_version_without_importing_torch(preflight, tmp_path):
    """A torch distribution's metadata beside hostpin and no torch module: the version is read, nothing
    imported (an import would fail: there is no torch package, only its dist-info)."""
    site = tmp_path / "site"
    dist = site / "torch-1.10.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 1.10.2\n")
    r, d = preflight("--size", "47.2GiB", "--ranks", "2", "--allocator", "torch",
                     extra_env={"PYTHONPATH": str(site)})
    assert d["torch"]["version"] == "1.10.2", r.stdout + r.stderr
    assert "installed beside hostpin" in d["torch"]["version_source"]
    assert d["need_bytes"] == _need(gib(47.2), 2)   # 1.10: no rounding


def test_preflight_unknown_version_says_so(preflight):
    r, d = preflight("--size", "5GiB", "--allocator", "torch")
    if d["torch"]["version"] is not None:
        pytest.skip("a torch distribution is installed beside hostpin here")
    assert "version not known" in d["verdict"] and d["torch"]["request_bytes"] == 8 * GiB


@pytest.mark.parametrize("args", [("--torch-version", "2.11"), ("--alloc-conf", "x:y"),
                                  ("--allocator", "torch", "--torch-version", "latest"),
                                  ("--allocator", "torch", "--alloc-conf", "pinned_use_cuda_host_register:1"),
                                  ("--allocator", "torch", "--method", "register")])
def test_preflight_torch_usage_errors(preflight, args):
    r, _ = preflight("--size", "5GiB", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


# -- repro register --allocator torch without torch ------------------------------------------------
def _has_torch(python: str) -> bool:
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


@pytest.mark.parametrize("method", ["hostalloc", "pin_memory", "register"])
def test_repro_torch_not_importable_exits_3(tmp_path, method):
    if _has_torch(sys.executable):
        pytest.skip("this interpreter has torch (CI never installs it)")
    r = hostpin("repro", "register", "--allocator", "torch", "--method", method, "--size", "64MiB",
                "--out", str(tmp_path / "runs"), "--json")
    assert r.returncode == 3, r.stderr
    data = json.loads(r.stdout)
    assert data["outcome"] == "unevaluated"
    assert f"PyTorch is not importable by {sys.executable}" in data["verdict"]
    assert f"PyTorch is not importable by {sys.executable}" in r.stderr and "Traceback" not in r.stderr


def test_repro_torch_python_option(tmp_path):
    python3 = shutil.which("python3")
    if python3 is None or _has_torch(python3):
        pytest.skip("no python3 without torch here")
    r = hostpin("repro", "register", "--allocator", "torch", "--method", "hostalloc", "--size", "64MiB",
                "--python", python3, "--out", str(tmp_path / "runs"))
    assert r.returncode == 3 and f"PyTorch is not importable by {python3}" in r.stderr, r.stderr
    for args in (("--method", "pin_memory"), ("--python", python3), ("--allocator", "torch", "--method", "mlock"),
                 ("--allocator", "torch", "--method", "hostalloc", "--matrix"),
                 ("--allocator", "torch", "--method", "hostalloc", "--register-twice"),
                 ("--allocator", "torch", "--python", str(REPO / "README.md"))):
        r = hostpin("repro", "register", "--size", "64MiB", *args, "--out", str(tmp_path / "runs"))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_release_before_2_13_refuses_the_threshold_keys():
    """Measured on the H200 (torch 2.11.0+cu130, bench/gpu_torch_pinned_rounding.sh): a rank with
    PYTORCH_CUDA_ALLOC_CONF=pinned_max_round_threshold_mb:1024 died at torch.empty(..., pin_memory=True)
    with "ValueError: Unrecognized key 'pinned_max_round_threshold_mb' in CUDA allocator config." and
    pinned nothing, where hostpin had said PASS. A known release that lacks the key is refused; an
    unknown release still plans the rounded size (the larger figure)."""
    for key in ("pinned_max_round_threshold_mb:1024", "pinned_max_cached_size_mb:64"):
        with pytest.raises(ValueError, match="Unrecognized key"):
            plan_request(gib(5), version="2.11.0", confs={"PYTORCH_CUDA_ALLOC_CONF": key})
        plan_request(gib(5), version="2.13.0", confs={"PYTORCH_CUDA_ALLOC_CONF": key})
    req = plan_request(gib(5), version=None, confs={"PYTORCH_CUDA_ALLOC_CONF": "pinned_max_round_threshold_mb:1024"})
    assert req.request_bytes == 8 * GiB
