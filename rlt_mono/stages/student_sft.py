"""Stage ``student_sft``: supervised fine-tuning of the student on distilled explanations (or raw traces).

The SFT machinery, shared with ``teacher_sft``, is ``rlt_mono.sft``. Run config: cfgs/run_cfg/student_sft.yaml.
It reads the distilled rows (``data=custom data.source=...``), not the dataset a pipeline's data=... names.
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="student_sft",
    run="rlt_mono.sft:run_sft",
    config_groups=("student", "data", "sft", "logging"),
    trains="student",
    keeps_checkpoints=True,
    data_parallel=True,
)
