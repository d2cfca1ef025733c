"""Stage ``teacher_rlt``: GRPO on the teacher with the RLT reward.

Its run is ``rlt_mono.teacher_rlt`` (the trainer: ``rlt_mono.rl.build``, ``rlt_mono.rl.trainer``). Run config:
cfgs/run_cfg/teacher_rlt_mono.yaml (demo_tiny on the CPU).
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="teacher_rlt",
    run="rlt_mono.teacher_rlt:run_teacher_rlt",
    config_groups=("model", "student", "data", "reward", "trainer", "placement", "logging"),
    trains="model",
    keeps_checkpoints=True,
    reads_data=True,
    data_parallel=True,
)
