"""Stage ``pipeline``: every stage in order, each a subprocess in its own folder, with the study's controls.

Its run is ``rlt_mono.pipeline`` (steps and folders: ``rlt_mono.pipeline_steps``). Run config:
cfgs/run_cfg/pipeline_smollm2.yaml. It keeps no checkpoints of its own: run again with the same output_dir, it
continues where it stopped.
"""

from rlt_mono.stages.base import Stage

STAGE = Stage(
    name="pipeline",
    run="rlt_mono.pipeline:run_pipeline",
    # it reads no group itself; a data option it sets is handed to the stages that read data
    config_groups=("data",),
)
