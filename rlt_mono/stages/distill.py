"""Stage ``distill``: the trained teacher writes explanations for the dataset's questions (``distill.jsonl``).

Its run is ``rlt_mono.distill``. Run config: cfgs/run_cfg/distill.yaml. It keeps no checkpoints: run again with
the same output_dir, it continues where it stopped.
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="distill",
    run="rlt_mono.distill:run_distill",
    config_groups=("model", "student", "data", "reward", "placement", "logging", "distill"),
    reads_data=True,
    check="rlt_mono.distill:check_options",
)
