"""The layering contract: diag never imports repro, the layers run one way, no module imports
one that imports it back.

Two halves: import-linter's contracts in pyproject.toml (run here, so CI keeps them), and what
import-linter does not check, read from every module's source: every import statement counts,
also one inside a function (moving an import into a function leaves the dependency where it was).
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("diag", "repro")

# From the top down; a module imports only modules of its own rank or below.
COMMAND_LINES = {"repro.cli": 4, "diag.cli": 2, "diag.watch.cli": 2}  # and diag.commands: diag's verbs, one module each
SHARED_CLI = {"diag.cliopts", "diag.config"}  # click options every command line shares
# The map of the kernel (STYLE.md): each reads its /proc or /sys files and parses them. They sit
# on the bottom with the plumbing, and import nothing that interprets, decides or renders.
PLUMBING = {"diag", "diag.parsing", "diag.units", "diag.rootfs", "diag.confined", "diag.evidence",
            "diag.exitcodes", "diag.safetext"}  # safetext: escaping foreign text, imports nothing of ours
READERS = {"diag.buddyinfo", "diag.cgroup", "diag.cuda", "diag.gpuprocs", "diag.hotplug", "diag.iommu",
           "diag.kernel", "diag.limits", "diag.meminfo", "diag.numa", "diag.nvidia", "diag.pagesize",
           "diag.process", "diag.psi", "diag.swap", "diag.sysctl", "diag.thp", "diag.vmstat", "diag.zoneinfo"}


def rank(module: str) -> int:
    if module in COMMAND_LINES:
        return COMMAND_LINES[module]
    if module == "diag.commands" or module.startswith("diag.commands."):
        return COMMAND_LINES["diag.cli"]
    if module.startswith("repro"):
        return 3
    return 1 if module in SHARED_CLI else 0


def modules(root: Path = REPO, packages=PACKAGES) -> dict[str, tuple[Path, bool]]:
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


def import_graph(root: Path = REPO, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, for every import statement anywhere in its source;
    `from pkg import name` counts as importing pkg.name where that is a module."""
    mods = modules(root, packages)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_pkg) in mods.items():
        deps: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            for target in targets:
                if target in mods and target != name:
                    deps.setdefault(target, node.lineno)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\n")
    (pkg / "sub" / "b.py").write_text("import pkg.a\nfrom . import c\n")
    (pkg / "sub" / "c.py").write_text("")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub": 2, "pkg.sub.b": 2}   # inside a function
    assert graph["pkg.sub"] == {"pkg": 1, "pkg.a": 1}            # `from .. import a`: the module pkg.a
    assert graph["pkg.sub.b"] == {"pkg.a": 1, "pkg.sub": 2, "pkg.sub.c": 2}
    assert cycles(graph) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]
    assert "diag.preflight" in import_graph()["diag.commands.preflight"]  # imported inside the preflight command
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(import_graph())
    assert not found, "import cycles (each a set of modules that import each other, directly or not): " + \
        "; ".join(" <-> ".join(c) for c in found)


def test_diag_never_imports_repro():
    graph = import_graph()
    bad = [f"{m} imports {d} (line {line})" for m, deps in graph.items() if m.split(".")[0] == "diag"
           for d, line in deps.items() if d.split(".")[0] == "repro"]
    assert not bad, bad


def test_the_layers_run_one_way():
    """repro's command line, repro, the two command lines of diag, their shared options, the library:
    nothing imports a layer above its own (library code returns data; only command lines print)."""
    graph = import_graph()
    bad = [f"{m} (rank {rank(m)}) imports {d} (rank {rank(d)}, line {line})"
           for m, deps in graph.items() for d, line in deps.items() if rank(d) > rank(m)]
    assert not bad, bad


def test_the_kernel_readers_import_nothing_above_them():
    graph = import_graph()
    missing = (READERS | PLUMBING) - set(graph)
    assert not missing, f"named in the contract but not modules: {sorted(missing)}"
    bad = [f"{m} imports {d} (line {line})" for m in sorted(READERS | PLUMBING - {"diag"})
           for d, line in graph[m].items()
           if d not in PLUMBING | (READERS if m in READERS else set())]
    assert not bad, bad


@pytest.mark.skipif(shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("lint-imports") is None,
                    reason="import-linter is not installed (pip install -e '.[test]')")
def test_import_linter_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    proc = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
