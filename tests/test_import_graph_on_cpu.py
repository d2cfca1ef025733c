"""rlt_mono's modules import each other in floors, never in circles, and every such import is in plain sight.

The graph is read from the source with ``ast`` (nothing is imported): an edge ``a -> b`` for each ``import b``
or ``from b import name`` in module ``a``, at module level or inside a function, ``from package import name``
pointing at the submodule when ``name`` is one, relative imports resolved. A cycle fails the first test with
its modules in order; an rlt_mono import inside a function (which would hide an edge until the function runs)
fails the second. Third-party imports may sit inside functions (torch, transformers and vllm are imported where
they are needed, so ``python -m rlt_mono.cli --help`` stays quick: the third test).
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "rlt_mono"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from its ``__init__.py``)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """The package modules ``name`` imports: ``(module, line, inside a function)`` per import statement."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[tuple[str, int, bool], None] = {}  # ordered, without repeats

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # from . import x / from ..y import z
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in child.names]
            for target in targets:
                while target and target not in modules:  # import a.b.c where only a.b is ours: a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found[(target, child.lineno, in_function)] = None
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return list(found)


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: {target for target, _, _ in package_imports(name, path, modules)} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], set[str]]]:
    """Each strongly connected component of more than one module (Tarjan), with one of its cycles as
    ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [(_cycle_in(graph, component), component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node] & component):
                if other == start:
                    return paths[node] + [start]
                if other not in paths:
                    paths[other] = paths[node] + [other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def test_the_import_graph_has_no_cycles():
    graph = import_graph()
    assert len(graph) > 40 and graph[f"{PACKAGE}.cli"], "the walk found the package's modules and their imports"
    found = cycles(graph)
    assert not found, "import cycles in rlt_mono (move what the modules share into a lower one):\n" + "\n".join(
        f"{' -> '.join(cycle)} (the modules in circles: {', '.join(sorted(component))})"
        for cycle, component in found)


def test_no_package_import_sits_inside_a_function():
    modules = module_files()
    hidden = [f"{path.relative_to(ROOT.parent)}:{line}: imports {target}"
              for name, path in modules.items()
              for target, line, in_function in package_imports(name, path, modules) if in_function]
    assert not hidden, "rlt_mono imports inside functions (move each to the top of its file):\n" + "\n".join(hidden)


def test_the_command_line_modules_import_no_torch():
    """``python -m rlt_mono.cli --help``, config errors and ``python -m rlt_mono.memory.planner`` need neither torch nor
    transformers: the modules they import keep those inside the functions that use them."""
    probe = ("import sys\nimport rlt_mono.memory.planner, rlt_mono.launch, rlt_mono.cli\n"
             "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'trl') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_package_top_holds_at_most_ten_modules():
    """The package's top keeps the entry points and the bottom floor (cli, launch, config, errors, ...); everything
    else lives in a folder named by its layer (data/, memory/, runs/, rl/, rewards/, stages/, study/)."""
    top = sorted(path.name for path in ROOT.glob("*.py") if path.name != "__init__.py")
    assert len(top) <= 10, f"{len(top)} modules at rlt_mono's top (at most 10; move the rest into a folder): {top}"
    folders = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    assert {"data", "memory", "rl", "rewards", "runs", "stages", "study"} <= set(folders), folders
