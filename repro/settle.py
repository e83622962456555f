"""Settled readings of the memory accounting (diag.memacct), for the staging measurement.

Before each reading the per-CPU vmstat diffs are folded into the global counters by reading
/proc/sys/vm/stat_refresh (root only; the kernel runs on every CPU the same
refresh_cpu_vm_stats it runs each vm.stat_interval, mm/vmstat.c vmstat_refresh). Readings
repeat every `gap_s` until two consecutive corrected in-use figures agree within `tolerance`
bytes, and the page-reporting counters a patched kernel exposes did not move between them, or
until `max_s` has passed: the settle state says which, how long it took and what was left
(residue: the difference between the last two readings).

The gap is longer than a free page reporting pass: on the CI VM a pass held 64-128 MiB out of
MemFree for 20-85 ms, every 2 s after a large free.
"""
from __future__ import annotations

import time
from typing import Any

from diag.memacct import corrected_in_use, in_use, reading
from diag.rootfs import Root, read_bounded

__all__ = ["Settler", "fold_vm_stats", "rss_by_mapping"]

STAT_REFRESH = "/proc/sys/vm/stat_refresh"


def fold_vm_stats() -> bool:
    """Fold the per-CPU counter diffs now; False where the kernel or our rights do not allow it."""
    try:
        read_bounded(STAT_REFRESH, 16)
        return True
    except OSError:
        return False


def rss_by_mapping() -> dict[str, int]:
    """Rss of this process by kind of mapping, from /proc/self/smaps (bytes), and LazyFree:
    pages given back with MADV_FREE that are still mapped (MemAvailable already counts them)."""
    out = {"anon": 0, "nvidia": 0, "shmem": 0, "file": 0, "other": 0}
    lazy = 0
    kind = "other"
    with open("/proc/self/smaps") as fh:
        for line in fh:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split()
                path = parts[5] if len(parts) > 5 else ""
                if not path or path.startswith("[anon") or path in ("[heap]", "[stack]"):
                    kind = "anon"
                elif path.startswith("/dev/nvidia"):
                    kind = "nvidia"
                elif path.startswith(("/dev/shm", "/memfd:", "/SYSV")):
                    kind = "shmem"
                elif path.startswith("/"):
                    kind = "file"
                else:
                    kind = "other"
            elif first == "Rss:":
                out[kind] += int(line.split()[1]) * 1024
            elif first == "LazyFree:":
                lazy += int(line.split()[1]) * 1024
    out["total"] = sum(out.values())
    out["lazyfree"] = lazy
    return out


class Settler:
    def __init__(self, root: Root | None = None, cgroup: tuple[int, str] | None = None, tolerance: int = 1 << 20,
                 max_s: float = 3.0, gap_s: float = 0.15, fold: bool = True):
        self.root = root or Root("/")
        self.cgroup = cgroup
        self.tolerance, self.max_s, self.gap_s = tolerance, max_s, gap_s
        self.fold = fold and fold_vm_stats()

    def read(self) -> dict[str, Any]:
        if self.fold:
            fold_vm_stats()
        r = reading(self.root, self.cgroup)
        r["t"] = time.monotonic()
        return r

    @staticmethod
    def _figure(r: dict[str, Any]) -> int | None:
        value = corrected_in_use(r)
        return value if value is not None else in_use(r)

    def settle(self) -> dict[str, Any]:
        """{'reading': the last reading, 'settle': {settled, seconds, readings, residue_bytes, folded},
        'rss': this process's RSS by kind of mapping, read right after the last reading}."""
        t0 = time.monotonic()
        prev = self.read()
        n, settled, residue = 1, False, None
        while True:
            time.sleep(self.gap_s)
            cur = self.read()
            n += 1
            a, b = self._figure(prev), self._figure(cur)
            residue = abs(b - a) if a is not None and b is not None else None
            quiet = prev.get("page_reporting") == cur.get("page_reporting")
            if residue is not None and residue <= self.tolerance and quiet:
                settled = True
                break
            prev = cur
            if time.monotonic() - t0 >= self.max_s:
                break
        return {"reading": cur, "settle": {"settled": settled, "seconds": round(time.monotonic() - t0, 3),
                                           "readings": n, "residue_bytes": residue, "folded": self.fold},
                "rss": rss_by_mapping()}
