"""The stages of rlt_mono and ``STAGES``, the registry ``rlt_mono.cli`` dispatches on.

Each stage's code is a module here, named as the stage (``teacher_rlt``, ``distill``, ``eval``, ``pipeline``; the
two SFT stages share ``sft``); its declaration below (``rlt_mono.stages.base.Stage``) names its run function as a
"module:function" string, the models it loads and trains, whether it keeps checkpoints and reads the dataset.
Declarations import nothing heavy, so ``python -m rlt_mono.cli --help`` and config errors stay quick: a stage's
code is imported only when it runs (``Stage.load``). This file, ``base`` and ``pipeline_steps`` are the layer of
declarations, below ``rlt_mono.study`` and the stages' code (the layers: ``tests/test_import_graph_on_cpu.py``).

A new stage: its module here, its declaration in ``STAGES``, and a run config (cfgs/run_cfg/) naming it.
"""

from rlt_mono.stages.base import MODEL_GROUPS, Stage

STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    # Supervised fine-tuning of the teacher on the data's reasoning traces (RLT's warm-up).
    # Run config: cfgs/run_cfg/teacher_sft.yaml.
    Stage(
        name="teacher_sft",
        run="rlt_mono.stages.sft:run_sft",
        config_groups=("model", "data", "sft", "logging"),
        trains="model",
        keeps_checkpoints=True,
        reads_data=True,
        data_parallel=True,
    ),
    # GRPO on the teacher with the RLT reward (the trainer: rlt_mono.rl). Run config:
    # cfgs/run_cfg/teacher_rlt_mono.yaml (demo_tiny on the CPU).
    Stage(
        name="teacher_rlt",
        run="rlt_mono.stages.teacher_rlt:run_teacher_rlt",
        config_groups=("model", "student", "data", "reward", "trainer", "placement", "logging"),
        trains="model",
        keeps_checkpoints=True,
        reads_data=True,
        data_parallel=True,
    ),
    # The trained teacher writes explanations for the dataset's questions (distill.jsonl). Run config:
    # cfgs/run_cfg/distill.yaml. It keeps no checkpoints: run again with the same output_dir, it continues where it
    # stopped.
    Stage(
        name="distill",
        run="rlt_mono.stages.distill:run_distill",
        config_groups=("model", "student", "data", "reward", "placement", "logging", "distill"),
        reads_data=True,
        check="rlt_mono.stages.distill:check_options",
    ),
    # Supervised fine-tuning of the student on distilled explanations (or raw traces). Run config:
    # cfgs/run_cfg/student_sft.yaml. It reads the distilled rows (data=custom data.source=...), not the dataset a
    # pipeline's data=... names.
    Stage(
        name="student_sft",
        run="rlt_mono.stages.sft:run_sft",
        config_groups=("student", "data", "sft", "logging"),
        trains="student",
        keeps_checkpoints=True,
        data_parallel=True,
    ),
    # Held-out accuracy of a student, and of a teacher through the frozen student (eval.json); the module also holds
    # python -m rlt_mono.stages.eval compare|rescore. Run config: cfgs/run_cfg/eval.yaml. It keeps no checkpoints:
    # run again with the same output_dir, it redoes its results.
    Stage(
        name="eval",
        run="rlt_mono.stages.eval:run_eval",
        config_groups=("model", "student", "data", "reward", "placement", "logging", "eval"),
        reads_data=True,
        check="rlt_mono.stages.eval:check_options",
    ),
    # Every stage in order, each a subprocess in its own folder, with the study's controls (steps and folders:
    # rlt_mono.stages.pipeline_steps). Run config: cfgs/run_cfg/pipeline_smollm2.yaml. It keeps no checkpoints of
    # its own: run again with the same output_dir, it continues where it stopped.
    Stage(
        name="pipeline",
        run="rlt_mono.stages.pipeline:run_pipeline",
        # it reads no group itself; a data option it sets is handed to the stages that read data
        config_groups=("data",),
    ),
)}

__all__ = ["MODEL_GROUPS", "STAGES", "Stage"]
