"""Every preflight check: the check modules, imported so that each registers, in one list.

A new check module is added to the import below; diag.checks (the registry) never imports one.
"""
from __future__ import annotations

from . import _REGISTRY, Check
from . import cotenants, fragmentation, leftovers, memory, platform  # noqa: F401  (registration on import)

__all__ = ["all_checks"]


def all_checks() -> list[Check]:
    return list(_REGISTRY)
