"""Stage ``teacher_sft``: supervised fine-tuning of the teacher on the data's reasoning traces (RLT's warm-up).

The SFT machinery, shared with ``student_sft``, is ``rlt_mono.sft``. Run config: cfgs/run_cfg/teacher_sft.yaml.
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="teacher_sft",
    run="rlt_mono.sft:run_sft",
    config_groups=("model", "data", "sft", "logging"),
    trains="model",
    keeps_checkpoints=True,
    reads_data=True,
    data_parallel=True,
)
