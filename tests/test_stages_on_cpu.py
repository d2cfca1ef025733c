"""The stage registry (``rlt_mono.stages``): each stage is declared by a module of ``rlt_mono/stages/`` named as the
stage, whose ``STAGE`` the registry lists, with run and check functions of that module (reading the registry imports
no heavy library: tests/test_import_graph_on_cpu.py)."""

import ast
from pathlib import Path

import pytest

from rlt_mono.data.rows import SPLITS
from rlt_mono.stages import STAGES, Stage
from rlt_mono.stages.pipeline import PIPELINE_STAGES
from rlt_mono.stages.pipeline_steps import ORDER

PACKAGE = Path(__file__).resolve().parents[1] / "rlt_mono"


def test_each_stage_is_declared_by_the_module_of_the_stages_folder_named_after_it():
    assert list(STAGES) == ["teacher_sft", "teacher_rlt", "distill", "student_sft", "eval", "pipeline"]
    for name, stage in STAGES.items():
        assert stage.name == name
        assert stage.run.__module__ == f"rlt_mono.stages.{name}", name
        assert stage.check is None or stage.check.__module__ == stage.run.__module__, name


def test_the_pipeline_runs_the_declared_stages_in_its_order():
    assert tuple(PIPELINE_STAGES) == ORDER
    assert all(PIPELINE_STAGES[name] is STAGES[name] for name in ORDER)


def test_distill_and_eval_check_their_options_without_loading_a_model():
    from rlt_mono.config import ConfigError, compose

    assert {name for name, stage in STAGES.items() if stage.check} == {"distill", "eval"}
    for name in ("distill", "eval"):
        STAGES[name].check_config(compose(name, ["size=tiny"]))  # the defaults pass
        for option in ("left_align_padding", "vllm_enforce_eager"):
            with pytest.raises(ConfigError, match=f"^{name}: {option} must be true or false, got 'no way'$"):
                STAGES[name].check_config(compose(name, ["size=tiny", f"{name}.{option}=no way"]))
    STAGES["teacher_sft"].check_config(compose("teacher_sft", ["size=tiny", "sft.max_steps=-7"]))  # no check: none


def test_a_stage_declaration_is_checked():
    def run(cfg):
        return cfg

    with pytest.raises(ValueError, match=r"^Stage x: run='run_sft' is not a function$"):
        Stage(name="x", run="run_sft")
    with pytest.raises(ValueError, match=r"^Stage x: check='check_options' is not a function$"):
        Stage(name="x", run=run, check="check_options")
    with pytest.raises(ValueError, match="trains='student' is not in model_groups"):
        Stage(name="x", run=run, config_groups=("model", "data"), trains="student")
    with pytest.raises(ValueError, match="data_parallel needs a model it trains"):
        Stage(name="x", run=run, config_groups=("model", "data"), data_parallel=True)
    assert Stage(name="x", run=run).check is None


def test_placement_dp_runs_exactly_the_stages_declared_data_parallel():
    from rlt_mono import launch

    assert set(launch.DP_STAGES) == {"teacher_sft", "teacher_rlt", "student_sft"}
    assert all(STAGES[name].trains for name in launch.DP_STAGES)



def _stage_expression(node) -> bool:
    """``x.stage``, ``x.get("stage")``, ``x["stage"]`` or a name ``stage``: a stage's name, read from a config."""
    if isinstance(node, ast.Attribute):
        return node.attr == "stage"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "stage"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "stage"
    return isinstance(node, ast.Name) and node.id == "stage"


def _strings(node) -> set[str]:
    """The string literals ``node`` is, or holds as a tuple, list or set of literals, or as a dict literal's keys, or
    as the argument of ``frozenset(...)``, ``set(...)`` or ``tuple(...)``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 \
            and node.func.id in ("frozenset", "set", "tuple"):
        return _strings(node.args[0])
    items = (node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set)
             else [node])
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _named_strings(tree) -> dict[str, set[str]]:
    """Each name the module binds to string literals (``TRAINS = ("teacher_sft", "student_sft")``, a dict literal's
    keys): name -> those strings, over every binding of it."""
    named: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name) and (strings := _strings(node.value)):
                named.setdefault(target.id, set()).update(strings)
    return named


def _case_values(pattern) -> list:
    """The values a ``case`` pattern compares its subject with (``case "distill" | "eval"``, ``case TRAINS.x``)."""
    return [node.value for node in ast.walk(pattern) if isinstance(node, ast.MatchValue)]


def stage_name_comparisons(source: str, stage_names: set[str]) -> list[str]:
    """Each place in ``source`` that tells stages apart by name, as its line: a comparison (``==``, ``in``, ...) or a
    ``match`` whose ``case`` is a value, with a stage expression on one side and a string literal on the other (or a
    name bound to string literals with a stage's name among them); a lookup of a stage expression in a dict literal
    with string keys, or in a name bound to one with a stage's name among them (``{"distill": f}.get(cfg.stage)``);
    and a comparison or ``case`` of anything with a stage's name (but the names that are also a data split,
    "eval": ``split == "eval"`` compares no stage)."""
    tree = ast.parse(source)
    named = _named_strings(tree)
    only_stages = stage_names - set(SPLITS)

    def stage_strings(node) -> set[str]:  # a literal's strings, or a bound name's stage names
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return _strings(node) or named.get(name, set()) & stage_names

    def tells_apart(operands) -> bool:
        literals = set().union(*map(_strings, operands))
        return bool(literals & only_stages) or (any(map(_stage_expression, operands)) and any(
            stage_strings(op) for op in operands if not _stage_expression(op)))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and tells_apart([node.left, *node.comparators]):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Match):
            found += [f"{case.pattern.lineno}: match {ast.unparse(node.subject)}: case {ast.unparse(case.pattern)}"
                      for case in node.cases if tells_apart([node.subject, *_case_values(case.pattern)])]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and _stage_expression(node.args[0]) and stage_strings(node.func.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Subscript) and _stage_expression(node.slice) and stage_strings(node.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.partition(":")[0]))


def stage_name_literals(source: str, stage_names: set[str]) -> list[tuple[int, str]]:
    """Each string literal of ``source`` that is a stage's name (but the names that are also a data split, "eval",
    a word as common for the split and for ``ast.parse(mode="eval")``), as (line, name)."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in stage_names - set(SPLITS))


# The string literals equal to a stage's name that a module outside rlt_mono/stages/ may hold, each with why: none
# is a branch on a stage (stage_name_comparisons checks those modules as any other).
STAGE_NAMES_ALLOWED = {
    ("rlt_mono/config_check.py", "distill"): "the rules of the config group distill's options, by group",
    ("rlt_mono/study/aggregate.py", "teacher_sft"): "the pipeline's step of that name, whose folder the study reads "
                                                    "(TEACHER_SFT_STEP), and study.json's key for its summary",
    ("rlt_mono/study/aggregate.py", "teacher_rlt"): "the pipeline's step of that name, whose folder the study reads "
                                                    "(RL_STEP)",
    ("rlt_mono/study/aggregate.py", "student_sft"): "the pipeline's step of that name, whose folder the study reads "
                                                    "(STUDENT_ARMS)",
}


def _modules_outside_the_stages_folder() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if "stages" not in path.relative_to(PACKAGE).parts[:1]]


def test_no_module_outside_the_stages_folder_compares_stage_names():
    """Stage-specific behaviour outside rlt_mono/stages/ reads a fact of the stage's declaration (STAGES[cfg.stage]),
    or is handed it by its caller; a name compared there would leave a new stage out."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in _modules_outside_the_stages_folder()
             for line in stage_name_comparisons(path.read_text(), set(STAGES))]
    assert not found, "stage names compared outside rlt_mono/stages/:\n" + "\n".join(found)


def test_no_module_outside_the_stages_folder_holds_a_stage_name_but_those_allowed():
    """A stage's name written outside rlt_mono/stages/ is a stage-specific branch in waiting; the few that name
    something else of the same name are listed with why (STAGE_NAMES_ALLOWED), and each still is."""
    held = {(str(path.relative_to(PACKAGE.parent)), line, name) for path in _modules_outside_the_stages_folder()
            for line, name in stage_name_literals(path.read_text(), set(STAGES))}
    found = sorted(f"{module}:{line}: {name!r}" for module, line, name in held
                   if (module, name) not in STAGE_NAMES_ALLOWED)
    assert not found, "stage names outside rlt_mono/stages/ (branch on a fact of STAGES[...] instead):\n" + \
        "\n".join(found)
    assert set(STAGE_NAMES_ALLOWED) == {(module, name) for module, _, name in held}, "an allowed name is gone"


def test_stage_names_told_apart_are_found_in_a_made_up_source():
    made_up = '''\
TRAINS = ("teacher_sft", "student_sft")
ROUTES = {"distill": 1, "eval": 2}
if cfg.stage == "teacher_rlt": pass
if cfg.get("stage") != "pipeline": pass
if stage in ("distill", "eval"): pass
if name == "student_sft": pass
if split == "eval": pass
if cfg.stage in DP_STAGES and STAGES[cfg.stage].plans_memory: pass
match cfg.stage:
    case "distill":
        pass
    case TRAINS.x | "eval":
        pass
    case _:
        pass
match split:
    case "eval":
        pass
if cfg.stage in TRAINS: pass
route = {"distill": run_distill, "eval": run_eval}.get(cfg.stage)
route = ROUTES[stage] + ROUTES.get(cfg["stage"]) + STAGES[cfg.stage].trains
'''
    assert stage_name_comparisons(made_up, set(STAGES)) == [
        "3: cfg.stage == 'teacher_rlt'", "4: cfg.get('stage') != 'pipeline'", "5: stage in ('distill', 'eval')",
        "6: name == 'student_sft'", "10: match cfg.stage: case 'distill'",
        "12: match cfg.stage: case TRAINS.x | 'eval'", "19: cfg.stage in TRAINS",
        "20: {'distill': run_distill, 'eval': run_eval}.get(cfg.stage)",
        "21: ROUTES[stage]", "21: ROUTES.get(cfg['stage'])"]
    assert stage_name_literals(made_up, set(STAGES)) == [
        (1, "student_sft"), (1, "teacher_sft"), (2, "distill"), (3, "teacher_rlt"), (4, "pipeline"), (5, "distill"),
        (6, "student_sft"), (10, "distill"), (20, "distill")]


def test_a_package_is_read_from_the_source_python_imports_beside_a_module_of_its_name(tmp_path, monkeypatch):
    """``rlt_mono.stages.eval`` is a package (its ``__main__`` runs ``python -m rlt_mono.stages.eval``); a stale
    ``eval.py`` beside it, as a build folder may hold from an older layout, is read by neither Python nor
    ``rlt_mono.read_source`` (the config defaults of ``EvalConfig`` are read from the source)."""
    import importlib

    from rlt_mono.read_source import module_constant, module_file

    package = tmp_path / "made_up_pkg"
    (package / "mod").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("WHERE = 'module'\n")
    (package / "mod" / "__init__.py").write_text("WHERE = 'package'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_file("made_up_pkg.mod") == package / "mod" / "__init__.py"
    assert module_constant("made_up_pkg.mod", "WHERE") == importlib.import_module("made_up_pkg.mod").WHERE == "package"
    assert module_file("rlt_mono.stages.eval") == PACKAGE / "stages" / "eval" / "__init__.py"
