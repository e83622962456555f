"""repro's pinning children: start one, read its events, send it commands, kill it.

Each child is `python -m repro.pinner SPEC_JSON` in its own process group, joined to the
run's cgroups before it allocates anything, reporting every step as one JSON line on a pipe
and taking commands on stdin. `kill_and_wait` never blocks for longer than it is told: a
child stuck in the kernel that outlives SIGKILL is marked unkillable and left to the report.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from diag.cuda import child_env
from diag.evidence import RunDir

__all__ = ["Child", "spawn_child", "kill_and_wait", "CHILD_RSS_BYTES", "CHILD_RSS_CUDA_BYTES", "child_rss_bytes"]

# What one pinning child costs beside its region (VmHWM beyond a 256 MiB region, measured by
# bench/gpu_child_rss_and_foreign_text.sh): --method mlock 14.9 MiB on the CI machine and 17.3 MiB on the
# H200; register and hostalloc 133.2 MiB on the H200 (the CUDA context's host memory). The headroom check
# counts it per rank, with some room above the figures measured.
CHILD_RSS_BYTES = 24 << 20        # an mlock child: an interpreter with json and ctypes loaded
CHILD_RSS_CUDA_BYTES = 160 << 20  # a child that creates a CUDA context (register, hostalloc, PyTorch)


def child_rss_bytes(method: str) -> int:
    """What one child of this method holds beside its region."""
    return CHILD_RSS_BYTES if method == "mlock" else CHILD_RSS_CUDA_BYTES


class Child:
    """One pinning child: its process, event pipe and command pipe."""

    def __init__(self, rank: int, proc: subprocess.Popen, events_fd: int, log_rel: str):
        self.rank = rank
        self.proc = proc
        self.pid = proc.pid
        self.events_fd = events_fd
        self.log_rel = log_rel
        self._buf = b""
        self.events: list[dict] = []
        self.last: dict[str, dict] = {}  # event name -> latest event
        self.exit_status: int | None = None
        self.killed = False
        self.unkillable = False

    def read_events(self) -> list[dict]:
        new = []
        while True:
            try:
                chunk = os.read(self.events_fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            self._buf += chunk
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                ev = {"event": "garbled", "raw": line.decode(errors="replace")}
            ev["rank"] = self.rank
            self.events.append(ev)
            self.last[ev["event"]] = ev
            new.append(ev)
        return new

    def has(self, *names: str) -> bool:
        return any(n in self.last for n in names)

    def send(self, command: str) -> bool:
        try:
            self.proc.stdin.write((command + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def poll(self) -> int | None:
        if self.exit_status is None:
            rc = self.proc.poll()
            if rc is not None:
                self.exit_status = rc
        return self.exit_status

    @property
    def device(self) -> int | None:
        """The CUDA device the child said it uses (None: --method mlock opens none, or it failed first)."""
        return (self.last.get("cuda_ready") or self.last.get("setup_failed") or {}).get("device")

    @property
    def alive(self) -> bool:
        return self.poll() is None


def spawn_child(spec: dict, rank: int, run: RunDir, prefix: str, join_files: list[str]) -> Child:
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    spec = dict(spec, events_fd=w_fd, rank=rank)
    log_rel = f"{prefix}child-{rank}.log"
    log = run.create_file(log_rel)  # O_EXCL inside the run, never through a link

    def preexec() -> None:
        os.setpgrp()  # Ctrl-C reaches the watchdog only; the watchdog decides what the child does
        for path in join_files:  # join the run's cgroups before allocating anything
            with open(path, "w") as fh:
                fh.write("0")

    python = spec.get("python")
    if python and python != sys.executable:
        # the launcher's interpreter: hostpin's directory goes last on its path, so that its own packages
        # (torch and what torch needs) win over anything installed beside hostpin
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        argv = [python, "-c", "import runpy, sys; sys.path.append(sys.argv.pop(1)); "
                "runpy.run_module('repro.pinner', run_name='__main__')", here, json.dumps(spec)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
    else:
        argv, env = [sys.executable, "-m", "repro.pinner", json.dumps(spec)], child_env()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, pass_fds=(w_fd,), preexec_fn=preexec,
                            env=env)
    os.close(w_fd)
    log.close()
    return Child(rank, proc, r_fd, log_rel)


def kill_and_wait(children: list[Child], wait_s: float = 10.0) -> list[Child]:
    """SIGKILL each live child's process group, wait at most wait_s; the ones still alive are
    marked unkillable and returned (a task stuck in the kernel, e.g. frozen, outlives SIGKILL)."""
    for child in children:
        if child.alive:
            child.killed = True
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(c.alive for c in children):
        time.sleep(0.05)
    stuck = [c for c in children if c.alive]
    for c in stuck:
        c.unkillable = True
    return stuck
