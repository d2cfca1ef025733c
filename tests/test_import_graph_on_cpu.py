"""rlt_mono's modules import each other in layers, never in circles, and every such import is in plain sight.

The graph is read from the source with ``ast`` (nothing is imported): an edge ``a -> b`` for each ``import b``
or ``from b import name`` in module ``a``, at module level or inside a function, ``from package import name``
pointing at the submodule when ``name`` is one, relative imports resolved. A cycle fails the first test with
its modules in order; an rlt_mono import inside a function (which would hide an edge until the function runs)
fails the second, with one exception: the run and check functions of a stage (those a stage module's ``Stage(...)``
names) import the stage's heavy code in their body, when the stage runs. Those deferred imports are no edge of the
graph: nothing imports that code when the module loads, so they make no cycle and may reach up to the layer of the
stages' code. Third-party imports may sit inside functions (torch, transformers and vllm are imported where they
are needed, so ``python -m rlt_mono.cli --help`` stays quick: ``test_the_command_line_modules_import_no_torch``;
``import rlt_mono.stages``, every stage's declaration, loads none of them:
``test_the_stage_declarations_import_no_heavy_library``).

The layers (``LAYERS``; docs/METHOD.md, "Layers"), bottom to top; a module imports modules of its own layer and
of those below, never of one above (the layer test names each such import ``a -> b (layer x imports layer y)``):

- foundation: errors, config, runtime, read_source and the package's own ``__init__``: what any module may use.
- runs: ``runs/``, a run's folder: checkpoints, files written whole, locks, outputs, console, plots, README; it
  knows no model, dataset or stage (``data/`` writes its downloads with its locks and atomic writes).
- data: ``data/``, ``memory/``, ``placement``: models and rows by config group, the memory a run needs, where each
  role runs.
- rewards: ``rewards/``, the RLT reward: alignment, log-probs, its maths.
- rl: ``rl/``, the GRPO trainer and its wiring (build, trainer, vLLM adapter, swapper, LoRA).
- study: ``study/``, statistics over runs' outputs (intervals, eval statistics, diversity, arithmetic).
- declarations: ``stages/``: the registry ``STAGES`` (``stages/__init__``), ``Stage`` (``stages/base``), each stage's
  module (its declaration, the checks of its options, its run function), the pipeline's steps and folders
  (``stages/pipeline_steps``) and the light parts they share (sampling options, ``compare``); a new stage module
  lands here. The layers below are handed a stage's facts (the group it trains) by their callers.
- study over seeds: ``study/aggregate`` (and its ``__main__``), which reads the pipeline's step folders.
- stage code: the stages' heavy code (torch, transformers, TRL), which their run functions import: the SFT trainer,
  distill's and eval's runs, the sampler they share, the final model's save.
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
    ("study", ("study/",)),
    ("declarations", ("stages/",)),
    ("study over seeds", ("study/aggregate", "study/__main__")),
    ("stage code", ("stages/sft", "stages/distill_run", "stages/eval_run", "stages/sampler", "stages/final_model")),
    ("entry", ("launch", "config_check", "cli", "__main__")),
)
# The libraries a stage's declaration never loads (each stage's run function imports them when it runs).
HEAVY = ("torch", "transformers", "trl", "datasets", "vllm", "peft")


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from its ``__init__.py``)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, str | None]]:
    """The package modules ``name`` imports: ``(module, line, function)`` per import statement, ``function`` the
    outermost function it sits in (``Class.method`` for a method; None at module level or in a class body)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[tuple[str, int, str | None], None] = {}  # ordered, without repeats

    def visit(node: ast.AST, function: str | None, classes: tuple[str, ...] = ()) -> None:
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
                    found[(target, child.lineno, function)] = None
            if function is None and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, ".".join((*classes, getattr(child, "name", "<lambda>"))))
            else:
                visit(child, function, (*classes, child.name) if isinstance(child, ast.ClassDef) else classes)

    visit(ast.parse(path.read_text(), filename=str(path)), None)
    return list(found)


def stage_functions(path: Path) -> set[str]:
    """The functions a stage module's declarations name as their ``run`` and ``check`` (``Stage(..., run=f,
    check=g)`` at module level): the functions that may import the stage's heavy code in their body."""
    named = set()
    for statement in ast.parse(path.read_text(), filename=str(path)).body:
        call = getattr(statement, "value", None)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Stage":
            named |= {keyword.value.id for keyword in call.keywords
                      if keyword.arg in ("run", "check") and isinstance(keyword.value, ast.Name)}
    return named


def hidden_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int, str]]:
    """``(module, line, function)`` of each rlt_mono import inside a function of ``name``, but those inside a stage's
    run or check function (``stage_functions``)."""
    allowed = stage_functions(path)
    return [(target, line, function) for target, line, function in package_imports(name, path, modules)
            if function is not None and function not in allowed]


def import_graph() -> dict[str, set[str]]:
    """What importing each module imports: every package import but the deferred ones of a stage's run and check
    functions (``stage_functions``)."""
    modules = module_files()
    graph = {}
    for name, path in modules.items():
        deferred = stage_functions(path)
        graph[name] = {target for target, _, function in package_imports(name, path, modules)
                       if function is None or function not in deferred}
    return graph


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
    hidden = [f"{path.relative_to(ROOT.parent)}:{line}: {function} imports {target}"
              for name, path in modules.items() for target, line, function in hidden_imports(name, path, modules)]
    assert not hidden, ("rlt_mono imports inside functions (move each to the top of its file; only a stage's run and "
                        "check functions import its heavy code in their body):\n" + "\n".join(hidden))


def test_a_stage_module_imports_its_code_in_its_run_and_check_functions_alone(tmp_path):
    """The one exception: the functions a ``Stage(...)`` names as its run and check; an import inside any other
    function of the same module, or of a module that declares no stage, is still reported."""
    stage = tmp_path / "stage.py"
    stage.write_text("from rlt_mono.stages.base import Stage\n\n"
                     "def run(cfg):\n    from rlt_mono.stages.sft import run_sft\n    return run_sft(cfg)\n\n"
                     "def check(cfg):\n    from rlt_mono.rewards import TeacherRewardConfig\n\n"
                     "def load_rows():\n    from rlt_mono.runs import checkpoints\n\n"
                     "class Reader:\n    def read(self):\n        from rlt_mono.errors import UserError\n\n"
                     "STAGE = Stage(name='x', run=run, check=check)\n")
    other = tmp_path / "other.py"
    other.write_text("def run(cfg):\n    from rlt_mono.stages.sft import run_sft\n")
    modules = {**module_files(), "rlt_mono.stages.x": stage, "rlt_mono.y": other}
    assert stage_functions(stage) == {"run", "check"}
    assert hidden_imports("rlt_mono.stages.x", stage, modules) == [
        ("rlt_mono.runs.checkpoints", 11, "load_rows"), ("rlt_mono.errors", 15, "Reader.read")]
    assert hidden_imports("rlt_mono.y", other, modules) == [("rlt_mono.stages.sft", 2, "run")]


def test_the_command_line_modules_import_no_torch():
    """``python -m rlt_mono.cli --help``, config errors and ``python -m rlt_mono.memory.planner`` need neither torch nor
    transformers: the modules they import keep those inside the functions that use them."""
    probe = ("import sys\nimport rlt_mono.memory.planner, rlt_mono.launch, rlt_mono.cli\n"
             "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'trl') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_stage_declarations_import_no_heavy_library():
    """``import rlt_mono.stages`` imports every stage's module (the registry) and none of ``HEAVY``; so does each
    stage module imported alone, and each declares its stages."""
    probe = ("import importlib, sys\nname = sys.argv[1]\nmodule = importlib.import_module(name)\n"
             "from rlt_mono.stages import STAGES\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
             "print(sorted({stage.run.__module__ for stage in STAGES.values()}))")
    from rlt_mono.stages import STAGES

    stage_modules = sorted({stage.run.__module__ for stage in STAGES.values()})
    assert len(stage_modules) == len(STAGES) >= 6
    for name in ("rlt_mono.stages", *stage_modules):
        loaded = subprocess.run([sys.executable, "-c", probe, name], capture_output=True, text=True, timeout=120,
                                check=True)
        assert loaded.stdout.splitlines() == ["[]", str(stage_modules)], name


def test_every_module_has_a_layer_and_every_layer_entry_a_module():
    modules = module_files()
    unplaced = sorted(name for name, path in modules.items() if layer_of(path) is None)
    assert not unplaced, f"modules in no layer (add each to LAYERS in {Path(__file__).name}): {unplaced}"
    entries = [entry for _, layer in LAYERS for entry in layer]
    assert len(entries) == len(set(entries)), f"an entry in two layers: {sorted(entries)}"
    stale = [entry for entry in entries if not (ROOT / entry).is_dir() and not (ROOT / f"{entry}.py").is_file()]
    assert not stale, f"LAYERS names what rlt_mono does not hold: {stale}"


def deferred_upward_imports(modules: dict[str, Path], layer: Callable[[str], int]) -> list[str]:
    """Each import inside a stage's run or check function (``stage_functions``) of a module above the stages' code
    (the entry points: launch, cli; ``layer``: a module's index in ``LAYERS``): a stage may reach its heavy code
    when it runs, never what runs it."""
    ceiling = next(i for i, (name, _) in enumerate(LAYERS) if name == "stage code")
    found = []
    for name, path in sorted(modules.items()):
        deferred = stage_functions(path)
        for target, line, function in package_imports(name, path, modules):
            if function in deferred and target in modules and layer(target) > ceiling:
                found.append(f"{name}:{line}: {function} imports {target} (layer {LAYERS[layer(target)][0]})")
    return found


def test_a_stage_run_function_reaches_no_higher_than_the_stages_code(tmp_path):
    modules = module_files()
    found = deferred_upward_imports(modules, lambda name: layer_of(modules[name]))
    assert not found, "a stage's run or check function imports an entry point:\n" + "\n".join(found)
    # the check itself: a made-up stage whose run imports the command line, and whose check imports sft (allowed)
    made_up = tmp_path / "made_up.py"
    made_up.write_text("from rlt_mono.stages.base import Stage\n\ndef run(cfg):\n    from rlt_mono.cli import main\n\n"
                       "def check(cfg):\n    from rlt_mono.stages.sft import run_sft\n\n"
                       "STAGE = Stage(name='x', run=run, check=check)\n")
    both = {**modules, "rlt_mono.stages.made_up": made_up}
    declarations = next(i for i, (name, _) in enumerate(LAYERS) if name == "declarations")
    found = deferred_upward_imports(both, lambda name: declarations if name == "rlt_mono.stages.made_up"
                                    else layer_of(modules[name]))
    assert found == ["rlt_mono.stages.made_up:4: run imports rlt_mono.cli (layer entry)"]


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
