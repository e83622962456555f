"""The swap of the memory a phase reads, not all of the process's VmSwap (pure: no I/O).

A process's VmSwap holds memory a pin or a copy never reads: on the H200 a PyTorch process
registering a 16 GiB tensor with 3 GiB of itself in swap kept 297 MiB of torch's and CUDA's own
memory in swap after the call, and an ETA that counted it was that much late. The sampler reads
the per-VMA `Swap:` of /proc/PID/smaps now and then (diag.watch.smaps; a reading is kept in the
sample as ``smaps_swap``: ``{"t", "ms", "vm_swap", "vmas": [[start, end, swap_bytes], ...]}``,
the VMAs with swap only, and VmSwap when it was read). From those readings:

- the region, when the call names it (mlock's address and length in /proc/PID/syscall): the
  VMAs inside that range;
- else the VMAs being drained: those whose swap fell between the phase's first reading and a
  later one by at least a twentieth of what all of them lost (a stray fault into the heap is no
  drain). Once a VMA drains it stays in the region.

Between readings the region's swap follows VmSwap: what VmSwap lost since the last reading came
out of the region (the memory outside it is not being read). A timeline without readings (older
runs, a process whose smaps cannot be read) has no region: the ETA then counts the whole VmSwap
and says so.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_smaps_swap", "RegionSwap", "DRAIN_SHARE", "WAIT_S"]

DRAIN_SHARE = 0.05   # a VMA drains when it lost at least this share of what all VMAs lost
WAIT_S = 3.0         # a phase waits this long for its region (two readings) before an ETA from VmSwap

_SWAP = re.compile(rb"\nSwap: +([1-9][0-9]*) kB")
_RANGE = re.compile(rb"([0-9a-f]+)-([0-9a-f]+) ")


def parse_smaps_swap(text: bytes) -> tuple[list[list[int]], int] | None:
    """([[start, end, swap_bytes], ...] for the VMAs with swap, VMAs in all); None for text that is
    not smaps (a VMA without its Swap or VmFlags line, a Swap line without its VMA, text cut
    inside a VMA). Only the
    VMAs with swap are looked at (a torch process has thousands of VMAs, 4 MB of smaps: a parse of
    every line took 160 ms on the CI machine): each block of smaps ends with its VmFlags line,
    so a VMA's range is the line after the VmFlags before its Swap line.

    >>> parse_smaps_swap(b"7f00-7f10 rw-p 0 0:0 0\\nSwap:  8 kB\\nVmFlags: rd\\n7f20-7f30 r--p 0 0:0 0\\nSwap: 0 kB\\nVmFlags: rd\\n")
    ([[32512, 32528, 8192]], 2)
    """
    count = text.count(b"\nVmFlags:") + text.startswith(b"VmFlags:")
    last = text.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if count != text.count(b"\nSwap:") or (text.strip() and not last.startswith(b"VmFlags:")):
        return None  # damaged, or cut short (a read past LIMIT): a VMA without its last line
    out = []
    for m in _SWAP.finditer(text):
        flags = text.rfind(b"VmFlags:", 0, m.start())
        head = 0 if flags < 0 else text.find(b"\n", flags) + 1
        r = _RANGE.match(text, head)
        if r is None or head > m.start():
            return None
        out.append([int(r.group(1), 16), int(r.group(2), 16), int(m.group(1)) * 1024])
    return out, count


def _overlap(vmas: list[list[int]], start: int, end: int) -> float:
    """Swap bytes of `vmas` inside [start, end), a VMA that straddles it counted pro rata."""
    total = 0.0
    for a, b, swap in vmas:
        lo, hi = max(a, start), min(b, end)
        if hi > lo and b > a:
            total += swap * (hi - lo) / (b - a)
    return total


def _proc(sample: dict, pid) -> dict:
    procs = sample.get("procs") or {}
    return procs.get(pid) or procs.get(str(pid)) or (procs.get(int(pid)) if str(pid).isdigit() else None) or {}


class RegionSwap:
    """The region of one process that a phase reads, and its swap, sample by sample."""

    def __init__(self, pid, tids=None):
        self.pid = pid
        self.tids = {str(t) for t in tids} if tids is not None else None
        self.first: dict | None = None            # the phase's first reading
        self.last: dict | None = None             # the latest reading
        self.ranges: list[tuple[int, int]] = []   # the region's address ranges
        self.named: tuple[int, int] | None = None  # mlock's (address, length)
        self.seen_readings = False                 # the samples carry smaps readings (or a wait for one)
        self.total0: int | None = None             # the region's swap at its first reading, bytes

    @property
    def known(self) -> bool:
        return bool(self.ranges)

    def feed(self, sample: dict) -> None:
        p = _proc(sample, self.pid)
        if not p:
            return
        if self.named is None:
            for tid, th in (p.get("threads") or {}).items():
                if (self.tids is None or str(tid) in self.tids) and th.get("syscall_addr") and th.get("syscall_len"):
                    self.named = (th["syscall_addr"], th["syscall_len"])
                    break
        if sample.get("regions") == "smaps":  # the sampler reads smaps for a process in a phase
            self.seen_readings = True
        reading = p.get("smaps_swap")
        if reading is None:
            return
        self.seen_readings = True
        if not isinstance(reading.get("vmas"), list) or not isinstance(reading.get("vm_swap"), int):
            return  # a wait for a reading, or one that failed
        if self.first is None:
            self.first = reading
        self.last = reading
        if self.named is not None:
            start, length = self.named
            self.ranges = [(start, start + length)]
        else:
            self._drained(self.first, reading)
        if self.ranges and self.total0 is None:
            self.total0 = int(self.swap_in(self.first))

    def _drained(self, first: dict, now: dict) -> None:
        drops = []
        for a, b, swap in first["vmas"]:
            drop = swap - _overlap(now["vmas"], a, b)
            if drop > 0:
                drops.append((a, b, drop))
        total = sum(d for _, _, d in drops)
        for a, b, drop in drops:
            if total > 0 and drop >= DRAIN_SHARE * total and (a, b) not in self.ranges:
                self.ranges.append((a, b))

    def swap_in(self, reading: dict) -> float:
        return sum(_overlap(reading["vmas"], a, b) for a, b in self.ranges)

    def left_bytes(self, vm_swap_now: int) -> int | None:
        """The region's swap now: its swap at the last reading, less what VmSwap lost since."""
        if not self.known or self.last is None:
            return None
        region = self.swap_in(self.last)
        fell = max(0, self.last["vm_swap"] - vm_swap_now)
        return int(max(0.0, min(float(vm_swap_now), region - fell)))

    def outside_bytes(self) -> int | None:
        """The process's swap outside the region at the last reading (VmSwap's share; smaps also
        counts shared memory's swap, which VmSwap does not)."""
        if not self.known or self.last is None:
            return None
        return int(max(0.0, self.last["vm_swap"] - self.swap_in(self.last)))

    def words(self) -> str:
        if self.named is not None:
            return "smaps, mlock's range"
        n = len(self.ranges)
        return f"smaps, {n} VMA{'s' if n != 1 else ''} draining"

    def summary(self) -> dict[str, Any] | None:
        if not self.known:
            return None
        return {"ranges": [[a, b] for a, b in self.ranges], "from": "mlock" if self.named else "draining",
                "swap_at_first_bytes": self.total0, "outside_bytes": self.outside_bytes()}
