"""Stage ``eval``: held-out accuracy of a student, and of a teacher through the frozen student (``eval.json``).

Its run is ``rlt_mono.evaluate`` (which also holds ``python -m rlt_mono.evaluate compare|rescore``). Run config:
cfgs/run_cfg/eval.yaml. It keeps no checkpoints: run again with the same output_dir, it redoes its results.
The module is named as the stage; it shadows the builtin only as ``rlt_mono.stages.eval``.
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="eval",
    run="rlt_mono.evaluate:run_eval",
    config_groups=("model", "student", "data", "reward", "placement", "logging", "eval"),
    reads_data=True,
    check="rlt_mono.evaluate:check_options",
)
