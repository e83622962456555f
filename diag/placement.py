"""Which GPU each rank uses: the one rule preflight's placement check and `repro register` share.

Rank i uses GPU i, wrapping past the last GPU (the local rank picks the device, as launchers such
as torchrun set it): on a one-GPU node every rank shares GPU 0, on two GPUs ranks 0, 2, 4 use
GPU 0 and ranks 1, 3, 5 GPU 1. `repro register --devices 0,1` names each rank's device instead
(one value: every rank's). GPU i is CUDA's device ordinal i, in CUDA's order (the probe's
`index`), among the devices this process can see.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["rank_device", "parse_devices", "devices_problem"]


def rank_device(rank: int, gpu_count: int, devices: Sequence[int] | None = None) -> int:
    """The CUDA device `rank` uses.

    >>> [rank_device(r, 2) for r in range(4)], rank_device(1, 1), rank_device(1, 2, [3]), rank_device(1, 2, [1, 0])
    ([0, 1, 0, 1], 0, 3, 0)
    """
    if devices:
        return devices[rank] if len(devices) > 1 else devices[0]
    return rank % gpu_count if gpu_count > 0 else 0


def parse_devices(text: str) -> list[int]:
    """`--devices 0,1`: CUDA device ordinals, one per rank. ValueError names what is wrong.

    >>> parse_devices("0,1"), parse_devices(" 2 ")
    ([0, 1], [2])
    """
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ValueError(f"{text!r} is not a list of devices; give one CUDA device number per rank, e.g. 0,1")
    bad = [item for item in items if not (item.isascii() and item.isdigit())]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a CUDA device number (0, 1, ...); e.g. --devices 0,1")
    devices = [int(item) for item in items]
    if any(d > 1023 for d in devices):  # CUDA numbers the devices a process sees from 0; no node has 1024
        raise ValueError(f"{max(devices)} is not a CUDA device number a node has; e.g. --devices 0,1")
    return devices


def devices_problem(devices: Sequence[int], ranks: int) -> str | None:
    """Why a --devices list does not fit --ranks (one per rank, or one for all), or None."""
    if len(devices) in (1, ranks):
        return None
    example = ",".join(str(i) for i in range(ranks)) if ranks <= 8 else "0,1,...," + str(ranks - 1)
    return (f"--devices names {len(devices)} devices for --ranks {ranks}: give one per rank "
            f"({example} puts rank i on GPU i) or one for all")
