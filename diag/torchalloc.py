"""What PyTorch's caching host allocator asks the driver for, by PyTorch version (catalog 18).

hostpin never imports torch here: it is heavy and often absent where hostpin runs. The rules are
written down from PyTorch's source, with the release each one holds from:

- `torch.empty(n, pin_memory=True)` and `Tensor.pin_memory()` allocate through the caching host
  allocator. From 1.11 it rounds every request up to a power of two, `c10::llvm::PowerOf2Ceil(size)`
  (aten/src/ATen/cuda/CachingHostAllocator.cpp `CachingHostAllocator::malloc`, 1.11-2.3; from 2.4
  aten/src/ATen/core/CachingHostAllocator.h `CachingHostAllocatorImpl::allocate`). 1.10 asked for
  the exact size (pytorch/pytorch#95823: an 8.1 GiB pinned tensor took +8,314 MiB of shmem on 1.10.1,
  +16,406 MiB on 1.13.1). The block goes to `cudaHostAlloc(ptr, roundSize, cudaHostAllocDefault)`.
- `pinned_use_cuda_host_register:True` (from 2.2, pytorch/pytorch#108488) takes `malloc(roundSize)`,
  touches one byte of every 4 KiB page in `pinned_num_register_threads` threads, then
  `cudaHostRegister`s the rounded size (`allocWithCudaHostRegister` in
  aten/src/ATen/cuda/CachingHostAllocator.cpp): anonymous memory, the whole rounded size resident.
- `pinned_use_background_threads` (event processing in a thread) changes no size.
- `pinned_reserve_segment_size_mb:N` pins one N MiB segment at the first pinned allocation and
  never frees it; requests that fit are carved from it (`get_reserve_segment`,
  `PinnedReserveSegment`). Its first release is not dated here: it is applied whenever given.
- `pinned_max_round_threshold_mb:N`: requests above N MiB are not rounded to a power of two (only
  aligned, to 512 B); `pinned_max_cached_size_mb:N`: blocks above it are freed, not cached
  (pytorch/pytorch#171662, January 2026; measured by others on 2.13). hostpin applies them from 2.13
  only: on older releases the option is not known to exist and the rounded figure is the larger one.
- Freed blocks stay pinned in the cache until `torch._C._host_emptyCache()`.
- The settings come from `PYTORCH_CUDA_ALLOC_CONF`; from 2.8 also from `PYTORCH_ALLOC_CONF`
  (c10/core/AllocatorConfig.cpp `AcceleratorAllocatorConfig`), whose CUDA options were ignored until
  2.11 (pytorch#183387: 2.9.1). Releases differ in which of the two wins when both are set; hostpin
  then plans with the larger request of the two (and, before 2.11, with and without PYTORCH_ALLOC_CONF).

An unknown version gets the rules of every release since 1.11 (rounding): it is the larger figure,
so a plan can refuse a launch that would have fit, never pass one that is OOM-killed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RULES", "AllocConf", "TorchRequest", "parse_version", "parse_alloc_conf", "power_of_2_ceil",
           "installed_version", "conf_from_env", "plan_request", "ENV_NAMES"]

MiB = 1 << 20
HOST_ALIGNMENT = 512               # kHostAlignment: what an unrounded request is aligned to
ENV_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# (first version, option or behaviour, what it does, source); the table the README shows
RULES: tuple[tuple[tuple[int, int], str, str, str], ...] = (
    ((1, 11), "rounding", "every pinned request rounded up to a power of two (PowerOf2Ceil) and "
     "cudaHostAlloc'd at that size; 1.10 and older: the exact size",
     "aten/src/ATen/cuda/CachingHostAllocator.cpp CachingHostAllocator::malloc (1.11-2.3), "
     "aten/src/ATen/core/CachingHostAllocator.h CachingHostAllocatorImpl::allocate (2.4-); pytorch#95823"),
    ((2, 2), "pinned_use_cuda_host_register", "malloc of the rounded size, every 4 KiB page touched in "
     "pinned_num_register_threads threads, then cudaHostRegister of the rounded size (anonymous memory)",
     "aten/src/ATen/cuda/CachingHostAllocator.cpp allocWithCudaHostRegister; pytorch#108488"),
    ((2, 2), "pinned_num_register_threads", "threads that touch and register the pages (a power of two); "
     "no size change", "c10/cuda/CUDAAllocatorConfig.cpp parsePinnedNumRegisterThreads"),
    ((0, 0), "pinned_reserve_segment_size_mb", "one segment of N MiB pinned at the first allocation, never "
     "freed; requests that fit are carved from it (first release not dated: applied whenever given)",
     "aten/src/ATen/cuda/CachingHostAllocator.cpp get_reserve_segment"),
    ((2, 8), "PYTORCH_ALLOC_CONF", "read besides PYTORCH_CUDA_ALLOC_CONF (which then warns it is deprecated); "
     "CUDA options given there were ignored until 2.11 (pytorch#183387), so 2.8-2.10 are planned with and without "
     "it, and with both names set the larger request is planned", "c10/core/AllocatorConfig.cpp "
     "AcceleratorAllocatorConfig; pytorch#167659, #183387"),
    ((2, 13), "pinned_max_round_threshold_mb", "requests above N MiB are not rounded, only aligned to 512 B",
     "aten/src/ATen/core/CachingHostAllocator.h allocate; pytorch#171662"),
    ((2, 13), "pinned_max_cached_size_mb", "blocks above N MiB are freed at once instead of cached; "
     "no size change", "aten/src/ATen/core/CachingHostAllocator.h free; pytorch#171662"),
)
_SINCE = {name: since for since, name, _, _ in RULES}
ALLOC_CONF_HONOURED = (2, 11)  # pytorch#183387: 2.9.1 read PYTORCH_ALLOC_CONF but ignored CUDA options in it


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a PyTorch version string, or None.

    >>> parse_version("2.11.0+cu130")
    (2, 11, 0)
    """
    m = re.match(r"\s*v?(\d{1,9})\.(\d{1,9})(?:\.(\d{1,9}))?", text or "", re.ASCII)  # no digit of another script
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def power_of_2_ceil(n: int) -> int:
    """c10::llvm::PowerOf2Ceil: the smallest power of two >= n (0 for 0).

    >>> power_of_2_ceil(5 << 30) == 8 << 30
    True
    """
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@dataclass
class AllocConf:
    """The pinned-memory settings of one PYTORCH_CUDA_ALLOC_CONF string."""
    text: str = ""
    use_host_register: bool = False
    register_threads: int = 1
    background_threads: bool = False
    reserve_segment_bytes: int = 0
    max_round_threshold_bytes: int | None = None
    max_cached_size_bytes: int | None = None
    other: dict[str, str] = field(default_factory=dict)


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise ValueError(f"{key} takes True or False, not {value!r} (PyTorch refuses anything else)")
    return value == "True"


def _mb(key: str, value: str) -> int:
    # c10 reads it with stoul into a size_t of bytes: ASCII digits only, and no more than 2^64 bytes
    if not (value.isascii() and value.isdigit()) or len(value) > 20 or int(value) * MiB >= 1 << 64:
        raise ValueError(f"{key} takes a whole number of MiB below 2^44 (a size_t of bytes), not {value[:40]!r}")
    return int(value) * MiB


def parse_alloc_conf(text: str | None) -> AllocConf:
    """The pinned-memory options of an allocator settings string, as c10's lexer splits it
    (`key:value` pairs separated by commas; a bracketed list is one value). ValueError names a
    value PyTorch would refuse.

    >>> parse_alloc_conf("expandable_segments:True,pinned_use_cuda_host_register:True").use_host_register
    True
    """
    conf = AllocConf(text=text or "")
    body = (text or "").replace(" ", "")
    for item in re.findall(r"[^,\[\]]+(?:\[[^\]]*\])?", body):
        key, sep, value = item.partition(":")
        if not key:
            continue
        if not sep:
            raise ValueError(f"{key!r} has no value (expected key:value)")
        if key in ("pinned_use_cuda_host_register", "pinned_use_hip_host_register"):
            conf.use_host_register = _bool(key, value)
        elif key == "pinned_num_register_threads":
            n = int(value) if value.isascii() and value.isdigit() and len(value) < 5 else 0
            if n < 1 or n & (n - 1) or n > 128:
                raise ValueError(f"pinned_num_register_threads takes a power of two up to 128, not {value!r}")
            conf.register_threads = n
        elif key == "pinned_use_background_threads":
            conf.background_threads = _bool(key, value)
        elif key == "pinned_reserve_segment_size_mb":
            conf.reserve_segment_bytes = _mb(key, value)
        elif key == "pinned_max_round_threshold_mb":
            conf.max_round_threshold_bytes = _mb(key, value)
        elif key == "pinned_max_cached_size_mb":
            conf.max_cached_size_bytes = _mb(key, value)
        else:
            conf.other[key] = value
    return conf


def installed_version() -> str | None:
    """The torch distribution's version in this interpreter's metadata, without importing torch."""
    from importlib import metadata
    from .safetext import one_line
    try:
        version = metadata.version("torch")
        return one_line(version) if version is not None else None  # a file's text: shown, never obeyed
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a damaged dist-info: no version rather than a crash
        return None


def conf_from_env(environ: dict[str, str]) -> dict[str, str]:
    """The allocator settings variables that are set, by name."""
    return {name: environ[name] for name in ENV_NAMES if environ.get(name)}


@dataclass
class TorchRequest:
    """One rank's pinned allocation through PyTorch, as the driver sees it."""
    size_bytes: int                 # what the launcher asks PyTorch for (per rank)
    request_bytes: int              # what PyTorch asks the driver for (per rank), reserve included
    call_bytes: list[int]           # each driver call (cudaHostAlloc / cudaHostRegister)
    method: str                     # hostalloc | register
    version: str | None
    version_source: str
    rules: list[str]                # the rules applied, in words
    conf: str | None
    conf_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def per_call_bytes(self) -> int:
        return max(self.call_bytes, default=0)

    @property
    def rounded(self) -> bool:
        return self.request_bytes != self.size_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"size_bytes": self.size_bytes, "request_bytes": self.request_bytes, "call_bytes": self.call_bytes,
                "per_call_bytes": self.per_call_bytes, "method": self.method, "version": self.version,
                "version_source": self.version_source, "rules": self.rules, "conf": self.conf,
                "conf_source": self.conf_source, "notes": self.notes}


def _calls(size: int, chunk: int | None) -> list[int]:
    if not chunk or chunk >= size:
        return [size]
    return [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])


def _request(calls: list[int], conf: AllocConf, v: tuple[int, int, int] | None,
             known: bool) -> tuple[list[int], int, list[str]]:
    """(driver calls, pinned bytes, rules in words) for one settings string."""
    rules: list[str] = []
    rounds = not known or v >= _SINCE["rounding"]
    threshold = conf.max_round_threshold_bytes
    if threshold is not None and not (known and v >= _SINCE["pinned_max_round_threshold_mb"]):
        rules.append("pinned_max_round_threshold_mb ignored: not in this release as far as hostpin knows "
                     "(applied from 2.13); the rounded size is planned, the larger figure")
        threshold = None
    out = []
    for c in calls:
        if not rounds:
            out.append(c)
        elif threshold is not None and c > threshold:
            out.append(-(-c // HOST_ALIGNMENT) * HOST_ALIGNMENT)
        else:
            out.append(power_of_2_ceil(c))
    if not rounds:
        rules.append("exact size (PyTorch < 1.11 does not round)")
    elif threshold is not None:
        rules.append(f"power of two up to pinned_max_round_threshold_mb ({threshold // MiB} MiB), "
                     "512 B alignment above it")
    else:
        rules.append("rounded up to a power of two (PowerOf2Ceil, PyTorch >= 1.11)")
    pinned, calls_made = 0, []
    reserve = conf.reserve_segment_bytes
    if reserve:
        left = reserve
        calls_made.append(reserve)
        for c in out:
            if c <= left:
                left -= c
            else:
                calls_made.append(c)
        rules.append(f"a {reserve // MiB} MiB reserve segment pinned at the first allocation and never freed "
                     "(pinned_reserve_segment_size_mb); requests that fit are carved from it")
    else:
        calls_made = out
    pinned = sum(calls_made)
    return calls_made, pinned, rules


def plan_request(size_bytes: int, chunk_bytes: int | None = None, version: str | None = None,
                 version_source: str = "not known", confs: dict[str, str] | None = None,
                 conf_source: str = "none set") -> TorchRequest:
    """What a rank that pins size_bytes through PyTorch (in calls of chunk_bytes) asks the driver for.
    confs: the settings strings by variable name (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF, or
    '--alloc-conf'). ValueError names a setting PyTorch would refuse."""
    v = parse_version(version)
    known = v is not None
    notes: list[str] = []
    confs = dict(confs or {})
    if not known:
        notes.append(f"PyTorch version {'not known' if version is None else repr(version) + ' not understood'}: "
                     "the rules of every release since 1.11 are applied (rounding to a power of two), the larger "
                     "figure; give --torch-version to say which")
    uncertain = False
    if "PYTORCH_ALLOC_CONF" in confs and known and v < _SINCE["PYTORCH_ALLOC_CONF"]:
        notes.append("PYTORCH_ALLOC_CONF is ignored: PyTorch reads it from 2.8 only")
        confs.pop("PYTORCH_ALLOC_CONF")
    elif "PYTORCH_ALLOC_CONF" in confs and (not known or v < ALLOC_CONF_HONOURED):
        uncertain = "PYTORCH_CUDA_ALLOC_CONF" not in confs
        notes.append("PYTORCH_ALLOC_CONF: releases before 2.11 could ignore CUDA options given there "
                     "(pytorch#183387): planned with and without it, the larger request")
    parsed = {name: parse_alloc_conf(text) for name, text in confs.items()}
    if known:  # a release that does not know a key refuses the whole string at its first pinned allocation
        for name, conf in parsed.items():
            for key, given in (("pinned_max_round_threshold_mb", conf.max_round_threshold_bytes),
                               ("pinned_max_cached_size_mb", conf.max_cached_size_bytes)):
                if given is not None and v < _SINCE[key]:
                    raise ValueError(
                        f"PyTorch {version} refuses {key} in {name or 'the settings'} (\"Unrecognized key '{key}' "
                        f"in CUDA allocator config\", measured on 2.11): the launcher fails at its first pinned "
                        f"allocation; the key is read from {'.'.join(map(str, _SINCE[key]))}")
    calls = _calls(size_bytes, chunk_bytes)
    candidates = []
    options = list(parsed.items()) + ([("", AllocConf())] if uncertain or not parsed else [])
    for name, conf in options:
        made, pinned, rules = _request(calls, conf, v, known)
        register = conf.use_host_register and (not known or v >= _SINCE["pinned_use_cuda_host_register"])
        candidates.append((pinned, name, conf, made, rules, register))
    pinned, name, conf, made, rules, register = max(candidates, key=lambda c: c[0])
    if len(candidates) > 1 and len({c[2].text for c in candidates}) > 1:
        notes.append(f"both {' and '.join(parsed)} are set and differ; PyTorch releases differ in which wins: "
                     f"the larger request is planned ({name})")
    if conf.use_host_register and not register:
        rules.append("pinned_use_cuda_host_register ignored (PyTorch reads it from 2.2)")
    if register:
        rules.append(f"pinned_use_cuda_host_register: malloc + touch every page in {conf.register_threads} "
                     "thread(s) + cudaHostRegister of the same size (anonymous memory)")
    else:
        rules.append("cudaHostAlloc (shared memory, RssShmem)")
    if conf.max_cached_size_bytes is not None and known and v >= _SINCE["pinned_max_cached_size_mb"]:
        rules.append(f"blocks above {conf.max_cached_size_bytes // MiB} MiB are freed, not cached")
    else:
        notes.append("a freed block stays pinned in PyTorch's cache until torch._C._host_emptyCache()")
    return TorchRequest(size_bytes=size_bytes, request_bytes=pinned, call_bytes=made,
                        method="register" if register else "hostalloc", version=version,
                        version_source=version_source, rules=rules, conf=conf.text or None,
                        conf_source=(name or conf_source) if conf.text else conf_source, notes=notes)
