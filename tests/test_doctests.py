"""The >>> examples in the readers' docstrings are part of the contract: run them."""
import doctest
import importlib

import pytest

MODULES = ["diag.units", "diag.meminfo", "diag.vmstat", "diag.buddyinfo", "diag.zoneinfo", "diag.swap",
           "diag.psi", "diag.kernel", "diag.thp", "diag.limits", "diag.cgroup", "diag.nvidia", "diag.process",
           "repro.staging", "diag.parsing", "diag.pagesize", "diag.catalog", "diag.gpuprocs", "diag.memacct", "diag.torchalloc",
           "diag.trace.parse", "diag.trace.budget", "diag.trace.tracefs", "diag.trace.session", "diag.watch.traced",
           "diag.placement", "diag.watch.regions"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
