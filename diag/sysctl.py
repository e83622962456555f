"""The vm and hung-task sysctls that matter for pinning: /proc/sys/vm/*, /proc/sys/kernel/hung_task_*."""
from __future__ import annotations

from .parsing import ParsedDict, to_int
from .rootfs import Root

__all__ = ["VM_SYSCTLS", "HUNG_TASK_SYSCTLS", "read_vm_sysctls", "read_hung_task"]

VM_SYSCTLS = ("swappiness", "overcommit_memory", "overcommit_ratio", "compaction_proactiveness",
              "extfrag_threshold", "min_free_kbytes", "watermark_scale_factor", "zone_reclaim_mode",
              "max_map_count", "page-cluster")
HUNG_TASK_SYSCTLS = ("hung_task_timeout_secs", "hung_task_panic", "hung_task_warnings",
                     "hung_task_check_count")


def _read_ints(root: Root, base: str, names) -> ParsedDict:
    """One integer per sysctl; None when absent (named in root.missing) or damaged (named in `.bad`)."""
    out = ParsedDict()
    for name in names:
        text = root.read_text(f"{base}/{name}")
        value = to_int(text.split()[0]) if text and text.split() else None
        if text is not None and value is None:
            out.bad.append(f"{name}: {text.strip()[:20]!r}")
        out[name] = value
    return out


def read_vm_sysctls(root: Root) -> ParsedDict:
    """None for a sysctl this kernel lacks (compaction_proactiveness: since 5.9)."""
    return _read_ints(root, "proc/sys/vm", VM_SYSCTLS)


def read_hung_task(root: Root) -> ParsedDict:
    """None throughout when CONFIG_DETECT_HUNG_TASK=n."""
    return _read_ints(root, "proc/sys/kernel", HUNG_TASK_SYSCTLS)
