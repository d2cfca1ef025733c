"""rlt_mono's modules import each other in layers, never in circles, and every such import is in plain sight.

The graph is read from the source with ``ast`` (nothing is imported): an edge ``a -> b`` for each ``import b``
or ``from b import name`` in module ``a``, at module level or inside a function, ``from package import name``
pointing at the submodule when ``name`` is one, relative imports resolved. A cycle fails the first test with
its modules in order; an rlt_mono import inside a function (which would hide an edge until the function runs)
fails the second. Third-party imports may sit inside functions (torch, transformers and vllm are imported where
they are needed, so ``python -m rlt_mono.cli --help`` stays quick: the third test).

The layers (``LAYERS``; docs/METHOD.md, "Layers"), bottom to top; a module imports modules of its own layer and
of those below, never of one above (the layer test names each such import ``a -> b (layer x imports layer y)``):

- foundation: errors, config, runtime, read_source and the package's own ``__init__``: what any module may use.
- runs: ``runs/``, a run's folder: checkpoints, files written whole, locks, outputs, console, plots, README; it
  knows no model, dataset or stage (``data/`` writes its downloads with its locks and atomic writes).
- data: ``data/``, ``memory/``, ``placement``: models and rows by config group, the memory a run needs, where each
  role runs.
- rewards: ``rewards/``, the RLT reward: alignment, log-probs, its maths.
- rl: ``rl/``, the GRPO trainer and its wiring (build, trainer, vLLM adapter, swapper, LoRA).
- declarations: ``stages/__init__`` (the registry ``STAGES``), ``stages/base`` (``Stage``) and
  ``stages/pipeline_steps`` (the pipeline's steps and folders): light declarations, placed below the study, which
  reads the steps' folders, and above ``rl/``: the RL build, checkpoints and the layers below are handed a stage's
  facts (the group it trains) by their callers.
- study: ``study/``, statistics over runs' outputs (intervals, the study over seeds, diversity, arithmetic).
- stages: ``stages/``, each stage's code and the parts stages share (sampler, final_model, eval_compare).
- entry: launch, config_check, cli, ``__main__``: the command line and the data-parallel launcher.

Each module also imports its package's ``__init__`` (Python runs it first), so that edge is checked too: the
declarations' folder ``stages/`` keeps its ``__init__`` in the lower layer.
"""

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

PACKAGE = "rlt_mono"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
# Bottom to top (the module docstring says what each holds). An entry is a module's file under rlt_mono/ without
# ".py" ("stages/base"), or a folder ("runs/": every module under it); a module's own file entry wins over its folder.
LAYERS = (
    ("foundation", ("__init__", "errors", "config", "runtime", "read_source")),
    ("runs", ("runs/",)),
    ("data", ("data/", "memory/", "placement")),
    ("rewards", ("rewards/",)),
    ("rl", ("rl/",)),
    ("declarations", ("stages/__init__", "stages/base", "stages/pipeline_steps")),
    ("study", ("study/",)),
    ("stages", ("stages/",)),
    ("entry", ("launch", "config_check", "cli", "__main__")),
)


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


def layer_of(path: Path) -> int | None:
    """The index in ``LAYERS`` of the module in file ``path``: its file's entry, else its deepest folder's."""
    name = path.relative_to(ROOT).with_suffix("").as_posix()
    entries = {entry: i for i, (_, layer) in enumerate(LAYERS) for entry in layer}
    folders = [name[:end + 1] for end in range(len(name)) if name[end] == "/"]
    for entry in (name, *reversed(folders)):
        if entry in entries:
            return entries[entry]
    return None


def upward_imports(graph: dict[str, set[str]], layer: Callable[[str], int]) -> list[str]:
    """Each import in ``graph`` of a module of a higher layer (``layer``: a module's index in ``LAYERS``), and each
    module's own package when that is higher (Python runs a package's ``__init__`` before any of its modules), as
    ``a -> b (layer x imports layer y)``."""
    found = []
    for name in sorted(graph):
        package = name.rpartition(".")[0]
        for target in sorted(graph[name] | ({package} if package else set())):
            if layer(target) > layer(name):
                found.append(f"{name} -> {target} (layer {LAYERS[layer(name)][0]} imports layer "
                             f"{LAYERS[layer(target)][0]})")
    return found


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


def test_every_module_has_a_layer_and_every_layer_entry_a_module():
    modules = module_files()
    unplaced = sorted(name for name, path in modules.items() if layer_of(path) is None)
    assert not unplaced, f"modules in no layer (add each to LAYERS in {Path(__file__).name}): {unplaced}"
    entries = [entry for _, layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries)), f"an entry in two layers: {sorted(entries)}"
    stale = [entry for entry in entries if not (ROOT / entry).is_dir() and not (ROOT / f"{entry}.py").is_file()]
    assert not stale, f"LAYERS names what rlt_mono does not hold: {stale}"


def test_no_module_imports_a_module_of_a_higher_layer():
    modules = module_files()
    upward = upward_imports(import_graph(), lambda name: layer_of(modules[name]))
    assert not upward, ("imports of a higher layer (move what the lower module needs down, or have its caller hand "
                        "it over):\n" + "\n".join(upward))
    # the check itself, on a made-up graph: an import of a higher layer, and a package whose __init__ is higher
    index = {name: i for i, (name, _) in enumerate(LAYERS)}
    layers = {"p": index["foundation"], "p.runs": index["entry"], "p.runs.checkpoints": index["runs"],
              "p.stages": index["declarations"], "p.errors": index["foundation"]}
    assert upward_imports({"p.runs.checkpoints": {"p.stages", "p.errors"}}, layers.__getitem__) == [
        "p.runs.checkpoints -> p.runs (layer runs imports layer entry)",
        "p.runs.checkpoints -> p.stages (layer runs imports layer declarations)",
    ]


def test_the_package_top_holds_at_most_ten_modules():
    """The package's top keeps the entry points and the bottom floor (cli, launch, config, errors, ...); everything
    else lives in a folder named by its layer (data/, memory/, runs/, rl/, rewards/, stages/, study/)."""
    top = sorted(path.name for path in ROOT.glob("*.py") if path.name != "__init__.py")
    assert len(top) <= 10, f"{len(top)} modules at rlt_mono's top (at most 10; move the rest into a folder): {top}"
    folders = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    assert {"data", "memory", "rl", "rewards", "runs", "stages", "study"} <= set(folders), folders
