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
    """The string literals ``node`` is, or holds as a tuple, list or set of literals."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def stage_name_comparisons(source: str, stage_names: set[str]) -> list[str]:
    """Each comparison in ``source`` of a stage expression with a string literal, or of anything with a stage's name
    (but the names that are also a data split, "eval": ``split == "eval"`` compares no stage), as its source line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = set().union(*map(_strings, operands))
            if (any(map(_stage_expression, operands)) and literals) or literals & (stage_names - set(SPLITS)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_stages_folder_compares_stage_names():
    """Stage-specific behaviour outside rlt_mono/stages/ reads a fact of the stage's declaration (STAGES[cfg.stage]),
    or is handed it by its caller; a name compared there would leave a new stage out."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             if "stages" not in path.relative_to(PACKAGE).parts[:1]
             for line in stage_name_comparisons(path.read_text(), set(STAGES))]
    assert not found, "stage names compared outside rlt_mono/stages/:\n" + "\n".join(found)
    made_up = ('if cfg.stage == "teacher_rlt": pass\nif cfg.get("stage") != "pipeline": pass\n'
               'if stage in ("distill", "eval"): pass\nif name == "student_sft": pass\nif split == "eval": pass\n'
               'if cfg.stage in DP_STAGES and STAGES[cfg.stage].plans_memory: pass\n')
    assert stage_name_comparisons(made_up, set(STAGES)) == [
        "1: cfg.stage == 'teacher_rlt'", "2: cfg.get('stage') != 'pipeline'", "3: stage in ('distill', 'eval')",
        "4: name == 'student_sft'"]


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
