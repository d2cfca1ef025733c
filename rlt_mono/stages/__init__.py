"""The stages of rlt_mono, one module each, named as the stage; ``STAGES`` is the registry ``rlt_mono.cli``
dispatches on.

Each module declares its ``STAGE`` (``rlt_mono.stages.base.Stage``: its run function as a "module:function"
string, the models it loads and trains, whether it keeps checkpoints and reads the dataset). Declarations import
nothing heavy, so ``python -m rlt_mono.cli --help`` and config errors stay quick.

A new stage: a module here declaring its ``STAGE``, its line below, and a run config (cfgs/run_cfg/) naming it.
"""

from rlt_mono.stages import distill, pipeline, student_sft, teacher_rlt, teacher_sft
from rlt_mono.stages import eval as eval_stage
from rlt_mono.stages.base import MODEL_GROUPS, Stage

STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    teacher_sft.STAGE,
    teacher_rlt.STAGE,
    distill.STAGE,
    student_sft.STAGE,
    eval_stage.STAGE,
    pipeline.STAGE,
)}

__all__ = ["MODEL_GROUPS", "STAGES", "Stage"]
