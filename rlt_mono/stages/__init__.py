"""The stages of rlt_mono and ``STAGES``, the registry ``rlt_mono.cli`` dispatches on.

Each stage is a module here named as the stage (``teacher_sft``, ``teacher_rlt``, ``distill``, ``student_sft``,
``eval``, ``pipeline``) that declares its ``STAGE`` (``rlt_mono.stages.base.Stage``: its run and check functions,
the config groups it reads, the models it loads and trains, ...). A stage module is light: its heavy code (torch,
transformers, TRL; e.g. ``sft``, ``distill_run``, ``eval_run``) is imported by its run function when the stage runs,
so ``python -m rlt_mono.cli --help`` and config errors stay quick. This package, ``base``, ``pipeline_steps`` and the
stage modules are the layer of declarations, below the study over seeds and the stages' code (the layers:
``tests/test_import_graph_on_cpu.py``).

A new stage: its module here (its ``STAGE`` and its run function), its entry below (two lines: the module imported,
its ``STAGE`` listed), its config group (cfgs/<group>/) if it has options, a run config (cfgs/run_cfg/) naming it,
and its row in README_MONO_GPU.md's table of stages; nothing else (tests/test_new_stage_on_cpu.py adds one, and
checks that the table lists every stage in the registry's order).
"""

from rlt_mono.stages import distill, pipeline, student_sft, teacher_rlt, teacher_sft
from rlt_mono.stages import eval as evaluate
from rlt_mono.stages.base import MODEL_GROUPS, Stage

# In the method's order (the order messages list them in).
STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    teacher_sft.STAGE,
    teacher_rlt.STAGE,
    distill.STAGE,
    student_sft.STAGE,
    evaluate.STAGE,
    pipeline.STAGE,
)}


def adapter_stages() -> str:
    """The stages that train LoRA adapters (``Stage.trains_adapters``), by name, for messages: "teacher_rlt" today."""
    return " and ".join(name for name, stage in STAGES.items() if stage.trains_adapters)


__all__ = ["MODEL_GROUPS", "STAGES", "Stage", "adapter_stages"]
