"""Memory hotplug policy: where hot-added memory goes (a Movable zone defeats long-term pins).

Reads /sys/devices/system/memory/auto_online_blocks, /sys/module/memory_hotplug/parameters/
online_policy (since 5.16) and the cmdline's memhp_default_state, movable_node, movablecore
and kernelcore.
"""
from __future__ import annotations

from dataclasses import dataclass

from .kernel import read_cmdline
from .rootfs import Root

__all__ = ["HotplugPolicy", "read_hotplug_policy"]


@dataclass
class HotplugPolicy:
    auto_online_blocks: str | None     # offline | online | online_kernel | online_movable
    online_policy: str | None          # contig-zones | auto-movable
    memhp_default_state: str | None
    movable_node: bool
    movablecore: str | None
    kernelcore: str | None

    @property
    def hot_added_goes_movable(self) -> bool:
        return (self.auto_online_blocks == "online_movable" or self.memhp_default_state == "online_movable"
                or self.online_policy == "auto-movable")

    @property
    def movable_on_cmdline(self) -> list[str]:
        out = []
        if self.movable_node:
            out.append("movable_node")
        if self.movablecore:
            out.append(f"movablecore={self.movablecore}")
        if self.kernelcore:
            out.append(f"kernelcore={self.kernelcore}")
        return out


def read_hotplug_policy(root: Root) -> HotplugPolicy:
    def one(rel: str) -> str | None:
        text = root.read_text(rel)
        return text.strip() if text is not None else None

    cmdline = read_cmdline(root) or {}
    return HotplugPolicy(
        auto_online_blocks=one("sys/devices/system/memory/auto_online_blocks"),
        online_policy=one("sys/module/memory_hotplug/parameters/online_policy"),
        memhp_default_state=cmdline.get("memhp_default_state"),
        movable_node="movable_node" in cmdline,
        movablecore=cmdline.get("movablecore"),
        kernelcore=cmdline.get("kernelcore"),
    )
