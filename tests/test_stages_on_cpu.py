"""The stage registry (``rlt_mono.stages``): each stage is declared by a module of ``rlt_mono/stages/`` named as the
stage, whose ``STAGE`` the registry lists, with run and check functions of that module (reading the registry imports
no heavy library: tests/test_import_graph_on_cpu.py)."""

import pytest

from rlt_mono.stages import STAGES, Stage
from rlt_mono.stages.pipeline import PIPELINE_STAGES
from rlt_mono.stages.pipeline_steps import ORDER


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

