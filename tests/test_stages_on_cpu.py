"""The stage registry (``rlt_mono.stages``): each stage's code is a module of ``rlt_mono/stages/`` named as the stage
(the two SFT stages share ``sft``), its ``Stage`` declared in the registry with a run function that resolves; reading
the registry imports no heavy library."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlt_mono.stages import STAGES, Stage

STAGES_DIR = Path(__file__).resolve().parents[1] / "rlt_mono" / "stages"


def test_each_stage_runs_the_module_of_the_stages_folder_named_after_it():
    runs = {name: stage.run.partition(":")[0] for name, stage in STAGES.items()}
    assert runs == {"teacher_sft": "rlt_mono.stages.sft", "teacher_rlt": "rlt_mono.stages.teacher_rlt",
                    "distill": "rlt_mono.stages.distill", "student_sft": "rlt_mono.stages.sft",
                    "eval": "rlt_mono.stages.eval", "pipeline": "rlt_mono.stages.pipeline"}
    assert all((STAGES_DIR / f"{module.rpartition('.')[2]}.py").is_file() for module in runs.values())
    assert all(name == stage.name for name, stage in STAGES.items())


@pytest.mark.parametrize("name", sorted(STAGES))
def test_each_stage_runs_a_function_of_its_config(name):
    assert callable(STAGES[name].load())


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
    with pytest.raises(ValueError, match="module:function"):
        Stage(name="x", run="rlt_mono.stages.sft")
    with pytest.raises(ValueError, match=r"check='rlt_mono.stages.distill' is not 'module:function'"):
        Stage(name="x", run="rlt_mono.stages.distill:run_distill", check="rlt_mono.stages.distill")
    with pytest.raises(ValueError, match="trains='student' is not in model_groups"):
        Stage(name="x", run="rlt_mono.stages.sft:run_sft", config_groups=("model", "data"), trains="student")
    with pytest.raises(ValueError, match="data_parallel needs a model it trains"):
        Stage(name="x", run="rlt_mono.stages.distill:run_distill", config_groups=("model", "data"), data_parallel=True)


def test_placement_dp_runs_exactly_the_stages_declared_data_parallel():
    from rlt_mono import launch

    assert set(launch.DP_STAGES) == {"teacher_sft", "teacher_rlt", "student_sft"}
    assert all(STAGES[name].trains for name in launch.DP_STAGES)


def test_the_registry_imports_no_heavy_library():
    probe = ("import sys\nimport rlt_mono.stages\n"
             "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'trl', 'datasets') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]"
