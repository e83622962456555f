"""`hostpin repro register`: pin a region for real, under the supervisor, and say what happened.

This module is the orchestration, a list of steps (STEPS) that one driver runs in order
(repro.driver): set up what the run needs (a swap file, memory and io cgroups, a read throttle
on the device behind the region), start one pinning child per rank (repro.children) and its
watchdog (repro.supervisor, sampling them with diag.watch), then setup, the file's page cache
dropped, prefault, swap-out, pin, unpin. Each step registers the undo of what it set up, and
the driver undoes it all in reverse on every exit path. What the run came to is repro.outcome's.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from diag import catalog
from diag.checks import FAIL, WARN, Context, Plan
from diag.checks.memory import headroom
from diag.evidence import RunDir
from diag.facts import node_facts
from diag.nvidia import read_nvidia
from diag.process import read_status
from diag.rootfs import Root
from diag.units import GiB, PAGE_SIZE, format_bytes
from diag.pagesize import live_page_size
from diag.placement import devices_problem

from diag.leftovers import cgroup_name
from diag.watch.traced import reproduction_budgets, start_trace

from .cgroups import CgroupError, RunCgroup, block_device_for, file_device
from .children import Child, child_rss_bytes, kill_and_wait, spawn_child
from .cleanup import leftovers_refusal
from .driver import Driver
from .filecache import FileCacheError, evict
from .outcome import OUTCOMES, SLOW_FACTOR, exit_code_for, failure_catalog, summarize
from .region import FileSourceError, existing_file_flags
from .supervisor import Supervisor
from .swapfile import SwapError, SwapFile, active_swaps

__all__ = ["ReproOptions", "check_torch", "run_repro", "exit_code_for", "SLOW_FACTOR", "OUTCOMES", "failure_catalog",
           "throttle_devices"]

SETUP_TIMEOUT_S = 180.0   # CUDA context creation and calibration
UNDO_TIMEOUT_S = 300.0    # cudaFreeHost of tens of GiB takes seconds; munlock of a swap-bound region more


class ReproError(RuntimeError):
    """A reproduction that cannot be set up on this node; the message says what to do."""


class ReproUsageError(ValueError):
    """Options that contradict each other; the message names them and what works."""


@dataclass
class ReproOptions:
    size: int
    method: str = "register"
    register_flags: str = "default"
    source: str = "anon"
    map: str = "private"
    thp: bool | None = None
    prefault: bool = True
    chunk: int | None = None
    ranks: int = 1
    swap_out: int | None = None
    swap_in_rate: int | None = None
    read_rate: int | None = None
    make_swap: int | None = None
    swap_dir: str = "/var/tmp"
    deadline: float | None = 1800.0
    stall_after: float = 120.0
    interval: float = 0.5
    force: bool = False
    device: int | None = None         # --device N: every rank's CUDA device
    devices: list[int] | None = None  # --devices 0,1: each rank's (one value: every rank's); neither: rank i -> GPU i
    calibrate: bool = True
    register_twice: bool = False
    prefault_threads: int = field(default_factory=lambda: max(1, min(16, os.cpu_count() or 1)))
    margin: str = "5%"
    ignore_leftovers: bool = False
    allocator: str = "cuda"          # torch: the child pins through PyTorch (catalog 18)
    torch_call: str | None = None    # empty | pin_memory | register (torch.cuda.cudart().cudaHostRegister)
    python: str | None = None        # the interpreter the child runs under (the launcher's, with torch)
    torch_version: str | None = None  # what that interpreter's torch says it is (checked before the run)
    trace: bool = False                # --trace: the kernel tracer measures the pin's time budget

    @property
    def uses_gpu(self) -> bool:
        return self.method in ("register", "hostalloc")

    @property
    def device_list(self) -> list[int] | None:
        """The devices given, one per rank or one for all; None: rank i uses GPU i (diag.placement)."""
        if self.devices:
            return list(self.devices)
        return None if self.device is None else [self.device]

    @property
    def file_path(self) -> str | None:
        return self.source[5:] if self.source.startswith("file:") else None

    @property
    def throttle_rate(self) -> int | None:
        return self.read_rate or self.swap_in_rate

    @property
    def torch_request(self):
        """What PyTorch asks the driver for per rank (diag.torchalloc), for --allocator torch."""
        if self.allocator != "torch":
            return None
        from diag import torchalloc
        return torchalloc.plan_request(self.size, self.chunk, version=self.torch_version,
                                       version_source="the child's interpreter",
                                       confs=torchalloc.conf_from_env(os.environ),
                                       conf_source="hostpin's environment (the child inherits it)")

    @property
    def driver_method(self) -> str:
        """How the driver pins: PyTorch's settings decide for torch.empty and Tensor.pin_memory()
        (pinned_use_cuda_host_register: malloc + cudaHostRegister, pins outstanding, else cudaHostAlloc)."""
        if self.allocator == "torch" and self.torch_call != "register":
            return self.torch_request.method
        return self.method

    @property
    def pinned_size(self) -> int:
        """Per rank, what the driver pins: the size, or PyTorch's rounded request."""
        if self.allocator == "torch" and self.torch_call != "register":
            return self.torch_request.request_bytes
        return self.size

    def child_spec(self) -> dict:
        return {"size": self.size, "method": self.method, "register_flags": self.register_flags,
                "allocator": self.allocator, "torch_call": self.torch_call, "python": self.python,
                "source": self.source, "map": self.map, "thp": self.thp, "chunk": self.chunk,
                "devices": self.device_list, "calibrate": self.calibrate, "register_twice": self.register_twice,
                "prefault_threads": self.prefault_threads,
                "prefault_piece": 256 << 20}


def validate(opts: ReproOptions) -> None:
    if opts.devices is not None:
        if opts.device is not None:
            raise ReproUsageError("--device and --devices are the same choice twice: give --devices (one device per "
                                  "rank, or one for all)")
        why = devices_problem(opts.devices, opts.ranks)
        if why:
            raise ReproUsageError(why)
    if opts.allocator == "torch":
        if opts.torch_call not in ("empty", "pin_memory", "register"):
            raise ReproUsageError("--allocator torch takes --method hostalloc (torch.empty(..., pin_memory=True)), "
                                  "pin_memory (Tensor.pin_memory() of a region) or register "
                                  "(torch.cuda.cudart().cudaHostRegister of a tensor's storage)")
        if opts.register_twice:
            raise ReproUsageError("--register-twice goes with --allocator cuda")
        opts.calibrate = False  # the calibration pins through cuda-bindings, which the launcher's python may lack
    elif opts.torch_call is not None or opts.python is not None:
        raise ReproUsageError("--method pin_memory and --python go with --allocator torch")
    if opts.swap_out is not None:
        if opts.swap_out > opts.size:
            raise ReproUsageError(f"--swap-out {format_bytes(opts.swap_out)} is larger than --size "
                             f"{format_bytes(opts.size)}; push at most the region out")
        if opts.method == "hostalloc" and opts.torch_call != "pin_memory":
            raise ReproUsageError("--swap-out does not apply to --method hostalloc (the driver allocates its own "
                             "pages, which are never swapped)")
        if opts.source not in ("anon", "shm"):
            raise ReproUsageError("--swap-out needs --source anon or shm (file pages are written back, not swapped)")
    if opts.register_flags != "default" and opts.method != "register":
        raise ReproUsageError("--register-flags applies to --method register only")
    if opts.source.startswith("file:"):  # an existing file is the user's: read-only, never written
        try:
            opts.register_flags = existing_file_flags(opts.source[5:], opts.size, opts.method, opts.register_flags,
                                                      opts.map)
        except FileSourceError as exc:
            raise ReproUsageError(str(exc)) from None
    for name, value, example in (("--chunk", opts.chunk, "64GiB"), ("--size", opts.size, "47GiB")):
        if value is not None and value % PAGE_SIZE:  # the value named, and the nearest that is one
            up = -(-value // PAGE_SIZE) * PAGE_SIZE
            raise ReproUsageError(f"{name} {value:,} bytes is not a multiple of the {PAGE_SIZE // 1024} KiB page "
                                  f"({up} is), e.g. {example}")
    if opts.read_rate and opts.swap_in_rate and opts.read_rate != opts.swap_in_rate:
        raise ReproUsageError("--read-rate and --swap-in-rate differ; give one (--swap-in-rate is --read-rate for "
                              "a region in swap)")
    if opts.read_rate and opts.method == "hostalloc" and opts.torch_call != "pin_memory":
        raise ReproUsageError("--read-rate does not apply to --method hostalloc (the driver's pages are never read "
                              "from a device)")
    if opts.read_rate and opts.file_path and not os.path.isfile(opts.file_path):
        raise ReproUsageError(f"--read-rate with --source file:PATH needs an existing file with data on disk: "
                              f"{opts.file_path} does not exist (a file this run created would be sparse, and "
                              "reading it touches no disk)")


TORCH_CHECK_TIMEOUT_S = 120.0  # importing torch reads hundreds of MiB of libraries from a cold disk


TORCH_CHECK_OUTPUT = 1 << 20  # what the version check may print before it is stopped


def _run_bounded(argv: list[str], timeout: float, limit: int) -> tuple[int | None, str, str]:
    """(exit status, stdout's tail, stderr's tail) of argv, read from pipes as it prints: past `limit`
    bytes in all, or past `timeout`, it is killed (status None). Only the last 4 KiB of each stream is
    kept, and nothing limits the files the program itself writes (torch's own caches)."""
    import selectors
    import subprocess
    import time
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    tails = {proc.stdout: b"", proc.stderr: b""}
    total, deadline, over = 0, time.monotonic() + timeout, None
    with selectors.DefaultSelector() as sel:
        for f in tails:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map() and over is None:
            left = deadline - time.monotonic()
            if left <= 0:
                over = "timeout"
                break
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                total += len(chunk)
                tails[key.fileobj] = (tails[key.fileobj] + chunk)[-4096:]
                if total > limit:
                    over = "output"
    if over:
        proc.kill()
    status = proc.wait()
    for f in tails:
        f.close()
    if over == "timeout":
        raise TimeoutError
    text = {f: t.decode("utf-8", "replace") for f, t in tails.items()}
    return (None if over else status), text[proc.stdout], (f"printed more than {limit >> 20} MiB" if over
                                                          else text[proc.stderr])


def check_torch(python: str) -> str:
    """torch.__version__ as PATH's interpreter imports it (never in this process). ReproError
    "PyTorch is not importable by PATH" when it cannot."""
    from types import SimpleNamespace
    try:  # read from pipes as it prints: an interpreter that prints without end costs no memory here
        rc, out, err = _run_bounded([python, "-c", "import torch; print(torch.__version__)"],
                                    TORCH_CHECK_TIMEOUT_S, TORCH_CHECK_OUTPUT)
        proc = SimpleNamespace(returncode=1 if rc is None else rc, stdout=out, stderr=err)
    except TimeoutError:
        raise ReproError(f"PyTorch is not importable by {python}: `import torch` took more than "
                         f"{TORCH_CHECK_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise ReproError(f"PyTorch is not importable by {python}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise ReproError(f"PyTorch is not importable by {python}: {last}; give --python the launcher's "
                         "interpreter (the one that has torch)")
    version = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    from diag.torchalloc import parse_version
    if parse_version(version) is None:  # the plan is made by version: a line that is none plans nothing
        from diag.safetext import one_line  # the interpreter's words: shown, never obeyed
        raise ReproError(f"PyTorch is not importable by {python}: torch.__version__ printed "
                         f"{one_line(version[:80])!r}, not a version; give --python the launcher's interpreter "
                         "(the one that has torch)")
    return version


def throttle_devices(opts: ReproOptions, swaps: list[str]) -> list[str]:
    """The whole disks whose reads are throttled for the children: the file's disk for a file
    source (--read-rate), the disks of the swap devices for a region in swap."""
    if not opts.throttle_rate:
        return []
    devices = set()
    if opts.read_rate and opts.file_path:
        try:
            devices.add(file_device(opts.file_path))
        except CgroupError as exc:
            raise ReproError(str(exc)) from None
    if opts.swap_in_rate or not opts.file_path:
        if not swaps:
            raise ReproError("the node has no swap: add --make-swap SIZE (a temporary swap file, removed "
                             "afterwards)")
        devices |= {block_device_for(dev) for dev in swaps}
    return sorted(devices)


def safety(opts: ReproOptions) -> dict | None:
    """A refusal (with the numbers) when the node cannot take the run, else None."""
    req = opts.torch_request
    plan = Plan(size_bytes=opts.size, ranks=opts.ranks, method=opts.driver_method, thp=opts.thp, margin=opts.margin,
                chunk_bytes=opts.chunk, allocator=opts.allocator,
                torch=req.to_dict() if req is not None and opts.torch_call != "register" else None,
                # each child's own RSS, and for Tensor.pin_memory() the source resident beside its pinned copy
                reserve_bytes=child_rss_bytes(opts.driver_method) + (opts.size if opts.torch_call == "pin_memory" else 0))
    ctx = Context(Root("/"), plan, sample_s=0)
    verdict = headroom(ctx)
    if verdict.status in (FAIL, WARN):
        return {"check": "headroom", "summary": verdict.summary, "evidence": verdict.evidence}
    if opts.swap_out:
        free_swap = (ctx.meminfo.swap_free_bytes or 0) + (opts.make_swap or 0)
        need = opts.swap_out * opts.ranks
        if free_swap < need * 1.05:
            return {"check": "swap", "summary": f"--swap-out needs {format_bytes(need)} of swap, the node has "
                                                f"{format_bytes(free_swap)} free (counting --make-swap); "
                                                "add or enlarge --make-swap SIZE",
                    "evidence": {"swap_free_bytes": ctx.meminfo.swap_free_bytes, "make_swap": opts.make_swap}}
    return None


@dataclass
class RunState:
    """What a run's steps share: its options and directory, the result they fill, their undo
    (repro.driver), and what each has set up for the ones after it."""
    opts: ReproOptions
    run: RunDir
    prefix: str
    on_tick: Callable[[dict], None] | None
    result: dict[str, Any]
    undo: Callable[[str, Callable[[], list[str] | None]], None]
    swaps: list[str] = field(default_factory=list)         # the node's active swap devices
    disks: list[str] = field(default_factory=list)         # the whole disks whose reads are throttled
    cgroups: list[RunCgroup | None] = field(default_factory=list)  # one per rank, or None
    children: list[Child] = field(default_factory=list)
    sup: Supervisor | None = None
    tracer: Any = None


def run_repro(opts: ReproOptions, run: RunDir, prefix: str = "",
              on_tick: Callable[[dict], None] | None = None) -> dict[str, Any]:
    validate(opts)
    page = live_page_size()
    result: dict[str, Any] = {
        "tool": "hostpin", "command": "repro register", "options": asdict(opts), "run_dir": str(run.path),
        "outcome": None, "bound": None, "seconds": None, "rate_gib_s": None, "pinned_pages": None,
        "expected_pages": opts.pinned_size // page * opts.ranks, "page_size": page, "first_bound_at_s": None,
        "eta_error": None, "ranks": [], "notes": [],
    }
    if opts.allocator == "torch":
        _plan_torch(opts, result)
    if opts.method == "mlock" and opts.device_list is not None:
        result["notes"].append("--method mlock opens no GPU: the devices given are not used")
    if opts.uses_gpu and not read_nvidia(Root("/")).loaded:
        result.update(outcome="unevaluated", verdict="no NVIDIA driver / no GPU on this node: --method "
                      f"{opts.method} needs one; --method mlock reproduces the kernel side without a GPU")
        return result
    refusal = None if opts.ignore_leftovers else leftovers_refusal()
    refusal = refusal or (None if opts.force else safety(opts))
    if refusal:
        result.update(outcome="refused", refusal=refusal, verdict=f"refused: {refusal['summary']}; nothing was "
                      f"allocated ({refusal.get('override', '--force')} runs it anyway)")
        return result
    driver = Driver(STEPS)
    state = RunState(opts, run, prefix, on_tick, result, driver.undo)
    try:
        driver.run(state, finish=lambda stop: _finish(state, stop), close=lambda: _close(state),
                   interrupted=lambda signal_name: _interrupted(state, signal_name))
    finally:
        result["cleanup"] = driver.log
        problems = [p for step in result["cleanup"] for p in step["problems"]]
        if problems:
            result["notes"].append("cleanup could not undo everything: " + "; ".join(problems))
    if result["outcome"] == "interrupted":
        result["verdict"] = (f"interrupted by {result['interrupted_by']}; children killed and everything set up "
                             "was removed" + ("" if not problems else " except: " + "; ".join(problems)))
    return result


def _plan_torch(opts: ReproOptions, result: dict) -> None:
    """--allocator torch: the child's torch version, and what PyTorch will ask the driver for."""
    opts.torch_version = check_torch(opts.python or sys.executable)
    result["options"]["torch_version"] = opts.torch_version
    req = opts.torch_request
    result["torch"] = req.to_dict()
    call = {"empty": "torch.empty(pin_memory=True)", "pin_memory": "Tensor.pin_memory()",
            "register": "torch.cuda.cudart().cudaHostRegister"}[opts.torch_call]
    result["notes"].append(
        f"through PyTorch {opts.torch_version} ({opts.python or sys.executable}): {call} of "
        f"{format_bytes(opts.size)} per rank" + (" registers exactly that (a tensor over the region)"
                                                  if opts.torch_call == "register" else
                                                  f" asks the driver for {format_bytes(req.request_bytes)} "
                                                  f"({'; '.join(req.rules)})"))


# -- the steps, in the order they run (STEPS, at the end); each returns None or why the run stops --------
def record_node(r: RunState) -> None:
    """The node before, in the evidence (root/...); a matrix records it once, before its first case."""
    if not r.prefix:
        r.result["facts"] = node_facts(Root("/", run=r.run))


def make_swap_file(r: RunState) -> None:
    if not r.opts.make_swap:
        return
    try:
        swap = SwapFile(r.opts.swap_dir, r.opts.make_swap).create()
    except SwapError as exc:
        raise ReproError(str(exc)) from None
    r.undo(f"swap file {swap.path}", swap.remove)
    r.result["swap_file"] = str(swap.path)


def find_devices(r: RunState) -> None:
    """The swap devices the region goes out to, and the disks to throttle."""
    r.swaps = active_swaps()
    if r.opts.swap_out and not r.swaps:
        raise ReproError("the node has no swap: add --make-swap SIZE (a temporary swap file, removed afterwards)")
    r.disks = throttle_devices(r.opts, r.swaps)


def make_cgroups(r: RunState) -> None:
    """One memory (and io) cgroup per rank, for --swap-out's reclaim and for the read throttle."""
    opts = r.opts
    r.cgroups = [None] * opts.ranks
    if not (opts.swap_out or r.disks):
        return
    for rank in range(opts.ranks):
        try:
            cg = RunCgroup(cgroup_name(os.getpid(), abs(hash(r.prefix)) % 10000, rank)).create(want_io=bool(r.disks))
        except (CgroupError, OSError) as exc:
            raise ReproError(f"cannot create a cgroup for the run: {exc} (needs root)") from None
        r.undo(f"cgroup {', '.join(map(str, cg.dirs))}", cg.remove)
        r.cgroups[rank] = cg
    r.result["cgroups"] = [str(d) for cg in r.cgroups if cg for d in cg.dirs]


def throttle_reads(r: RunState) -> None:
    """Each rank's reads from the disks (the file's, the swap's) at --read-rate; removing the
    cgroup lifts it."""
    if not r.disks:
        return
    for cg in r.cgroups:
        for majmin in r.disks:
            try:
                cg.throttle_reads(majmin, r.opts.throttle_rate)
            except CgroupError as exc:
                raise ReproError(f"cannot throttle reads from {majmin}: {exc}") from None
    r.result["throttle"] = {"devices": r.disks, "read_bytes_per_s": r.opts.throttle_rate}


def start_children(r: RunState) -> None:
    """One pinning child per rank, each in its rank's cgroups before it allocates anything."""
    children = r.children
    r.undo("children", lambda: [f"child pid {c.pid} still alive after SIGKILL (unkillable)"
                                for c in kill_and_wait(children)])
    spec = r.opts.child_spec()
    for rank in range(r.opts.ranks):
        join = r.cgroups[rank].join_files() if r.cgroups[rank] else []
        children.append(spawn_child(spec, rank, r.run, r.prefix, join))


def start_watchdog(r: RunState) -> None:
    opts = r.opts
    r.sup = Supervisor(r.run, r.prefix, r.children, opts.driver_method, opts.pinned_size * opts.ranks,
                       interval=opts.interval, stall_after=opts.stall_after, deadline=opts.deadline,
                       on_tick=r.on_tick)


def start_tracer(r: RunState) -> None:
    """--trace: the kernel tracer on the children (diag.watch.traced), its instances removed at the end."""
    if not r.opts.trace:
        return
    tracer = r.tracer = start_trace(r.run, r.sup.pids, r.sup.t0, r.result["notes"], devices=r.disks)
    if tracer is not None:
        r.undo("tracefs instances", lambda: tracer.stop().get("cleanup_problems") or [])


def wait_ready(r: RunState) -> str | None:
    """Setup in the children: the CUDA context, the calibration, the region mapped."""
    sup = r.sup
    stop = sup.wait(lambda: all(c.has("ready", "setup_failed") for c in r.children),
                    deadline=min(filter(None, [sup.deadline, SETUP_TIMEOUT_S])))
    if stop or any(c.has("setup_failed") for c in r.children):
        return stop or "setup_failed"
    cal = r.children[0].last["ready"].get("calibration")
    if cal and cal.get("seconds"):
        r.result["clean_rate_gib_s"] = cal["bytes"] / GiB / cal["seconds"]
        r.result["calibration"] = cal
        sup.clean_pages_s = cal["bytes"] / sup.page / cal["seconds"] * len(r.children)
    return None


def drop_file_cache(r: RunState) -> None:
    """--read-rate of a file: the pin must read the file from its disk, at the throttled rate."""
    opts = r.opts
    if not (opts.read_rate and opts.file_path):
        return
    try:
        r.result["file_cache"] = evict(opts.file_path)
    except (FileCacheError, OSError) as exc:
        raise ReproError(f"cannot drop {opts.file_path} from the page cache: {exc}") from None


def prefault(r: RunState) -> str | None:
    r.sup.mark_region_base()
    opts = r.opts
    if not (opts.prefault or opts.swap_out):
        return None
    if opts.swap_out and not opts.prefault:
        r.result["notes"].append("the region was touched anyway: --swap-out needs it resident first")
    return r.sup.command_all("prefault", "prefault", done="prefault_done", failed="prefault_error")


def page_out(r: RunState) -> str | None:
    """--swap-out: each child writes that much of its region to swap (MADV_PAGEOUT)."""
    if not r.opts.swap_out:
        return None
    return r.sup.command_all("swap-out", f"pageout {r.opts.swap_out}", done="pageout_done", failed="pageout_error")


def reclaim_swap_cache(r: RunState) -> str | None:
    """--swap-out: the pages written out leave the swap cache (each rank's cgroup reclaims them), so
    that the pin reads them back from the device."""
    opts = r.opts
    if not opts.swap_out:
        return None
    outcomes: list = [None] * len(r.children)

    def drop(i: int, cg: RunCgroup) -> None:
        outcomes[i] = cg.drop_swap_cache()

    # reclaim runs in the writing thread: keep it off the supervisor's thread
    threads = [threading.Thread(target=drop, args=(i, cg), daemon=True) for i, cg in enumerate(r.cgroups)]
    for t in threads:
        t.start()
    stop = r.sup.wait(lambda: not any(t.is_alive() for t in threads))
    if stop:
        return stop
    swapped = [_swapped_bytes(c, cg) for c, cg in zip(r.children, r.cgroups)]
    r.result["swapped_out_bytes"] = swapped
    r.result["swap_out_steps"] = outcomes
    if any(x is not None and x < 0.8 * opts.swap_out for x in swapped):
        r.result["notes"].append(f"asked for {format_bytes(opts.swap_out)} in swap per rank, the region has "
                                 + ", ".join(format_bytes(x) for x in swapped))
    return None


def _swapped_bytes(c: Child, cg: RunCgroup | None) -> int | None:
    st = read_status(c.pid)
    own = st.vm_swap_bytes if st else None
    try:  # the cgroup counts a shared-memory region's swap too, which VmSwap does not
        in_cgroup = cg.swap_bytes() if cg is not None else None
    except (OSError, ValueError):
        in_cgroup = None
    if (own, in_cgroup) == (None, None):
        return None
    return max(x for x in (own, in_cgroup, -1) if x is not None)


def pin(r: RunState) -> str | None:
    """All ranks at the same moment, sampled until each has pinned or failed."""
    sup = r.sup
    sup.start_pin()
    stop = sup.wait(lambda: all(c.has("pin_done", "pin_failed", "error") for c in r.children), stall=True)
    sup.end_pin()
    return stop


def unpin(r: RunState) -> None:
    """Unpin, unmap, exit; a child that takes longer than UNDO_TIMEOUT_S is killed."""
    kill = r.sup.quit_children(UNDO_TIMEOUT_S)
    if kill is not None:
        r.result["undo_kill"] = kill


STEPS = (record_node, make_swap_file, find_devices, make_cgroups, throttle_reads, start_children, start_watchdog,
         start_tracer, wait_ready, drop_file_cache, prefault, page_out, reclaim_swap_cache, pin, unpin)


# -- the driver's ends (repro.driver.Driver.run) --------------------------------------------------------
def _finish(r: RunState, stop: str | None) -> None:
    """Every step ran, or one stopped the run: the children are stopped, then the result is made."""
    if stop:
        r.result.update(r.sup.stop_children(stop))
    summarize(r.opts, r.sup, r.result, stop_reason=stop)


def _close(r: RunState) -> None:
    """However the steps ended: the watchdog's figures, and the trace's budget of the pin."""
    if r.sup is None:
        return
    r.result["watchdog"] = r.sup.finish()
    reproduction_budgets(r.tracer, r.sup.pids, r.sup.pin_t, r.sup.pin_end_t, r.result)


def _interrupted(r: RunState, signal_name: str) -> None:
    r.result["outcome"] = "interrupted"
    r.result["interrupted_by"] = signal_name
    if r.sup is not None and any(c.alive for c in r.children):
        r.result["kill"] = r.sup.kill_children("interrupted", wait_s=10.0)
