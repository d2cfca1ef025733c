"""What a stage declares: ``Stage``, the one interface every stage module of ``rlt_mono.stages`` fills in.

A stage module (``rlt_mono/stages/<stage>.py``) is light: it declares its ``Stage`` and holds the checks of its own
options and its run function, and imports no torch, transformers or TRL at its top, so that ``rlt_mono.cli`` reads
every declaration and checks a run's keys before anything heavy loads. Its run (and check) function imports the
stage's heavy code in its body, when the stage runs: the one import inside a function that
``tests/test_import_graph_on_cpu.py`` allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

# Every config group that names a model (cfgs/model, cfgs/student).
MODEL_GROUPS = ("model", "student")


@dataclass(frozen=True)
class Stage:
    """One stage of rlt_mono: the run config's ``stage`` key names it, ``python -m rlt_mono.cli`` runs it."""

    # The run config's ``stage`` value, and the name of the module of rlt_mono.stages that declares it.
    name: str
    # Its run: takes the composed config and returns the run folder.
    run: Callable[[DictConfig], Path]
    # The config groups its run configs compose (cfgs/<group>/); those of MODEL_GROUPS name the models it loads.
    config_groups: tuple[str, ...] = ()
    # The config group of the model it trains; None for a stage that trains nothing (a LoRA option on one of its
    # model_groups would be ignored, so rlt_mono.cli refuses it).
    trains: str | None = None
    # It keeps resumable checkpoints (resume_from_checkpoint means something to it); a stage without them
    # continues, or redoes its work, when it runs again with the same output_dir.
    keeps_checkpoints: bool = False
    # It reads the dataset of the ``data`` group (a pipeline's data=... reaches it).
    reads_data: bool = False
    # placement=dp can run it on several GPUs, one rank each (rlt_mono.launch); only stages that train can.
    data_parallel: bool = False
    # The config group of its training arguments (use_cpu, batch sizes, use_liger_kernel, optim): trainer (GRPO,
    # rlt_mono.rl) or sft (TRL's SFTTrainer); None for a stage that trains nothing.
    trainer_group: str | None = None
    # <trains>.lora_r > 0 trains LoRA adapters (rlt_mono.rl.lora); a stage that trains without them refuses it.
    trains_adapters: bool = False
    # It trains on completions it generates (GRPO): each rank holds the actor with its rollout engine (vLLM or
    # transformers' generate), a reference and a student.
    trains_on_rollouts: bool = False
    # memory=auto|speed plans its GPU memory (rlt_mono.memory.planner) and a placement=dp launch its ranks' CPU memory;
    # another stage warns that it ignores memory=auto|speed.
    plans_memory: bool = False
    # placement=auto picks placement=split (two data-parallel ranks) where its launcher sees two GPUs or more.
    may_split: bool = False
    # The config group of the options it samples explanations with outside training (SamplingOptions, read by
    # rlt_mono.stages.sampler: vLLM or transformers' generate; its vllm_kv_cache_gib sizes vLLM's KV cache); None for
    # a stage that samples nothing outside training.
    sampling_group: str | None = None
    # Checks its own options in a composed config, loading no model, and raises ConfigError on a wrong one; the
    # pipeline calls it for every step when it plans, so a typo in the last stage's options stops the pipeline
    # before its first stage, not hours in. None: nothing to check ahead.
    check: Callable[[DictConfig], object] | None = None
    # The runs it launches, each ``(step, run config, overrides)`` as its own command line: rlt_mono.cli composes and
    # checks each one as it checks a command line (unknown keys, types, ranges, the stage's check) before this stage
    # starts, so a wrong option of the last step is one line before the first step runs. None: it launches none.
    steps: Callable[[DictConfig], list[tuple[str, str, list[str]]]] | None = None

    def __post_init__(self) -> None:
        for field, value in (("run", self.run), ("check", self.check), ("steps", self.steps)):
            if not callable(value) and not (field != "run" and value is None):
                raise ValueError(f"Stage {self.name}: {field}={value!r} is not a function")
        if self.trains is not None and self.trains not in self.model_groups:
            raise ValueError(f"Stage {self.name}: trains={self.trains!r} is not in model_groups={self.model_groups}")
        if self.data_parallel and self.trains is None:
            raise ValueError(f"Stage {self.name}: data_parallel needs a model it trains (trains=None)")
        if (self.trainer_group is None) != (self.trains is None):
            raise ValueError(f"Stage {self.name}: trainer_group={self.trainer_group!r} and trains={self.trains!r}: a "
                             "stage that trains a model has the group of its training arguments, and only it")
        for field in ("trainer_group", "sampling_group"):
            group = getattr(self, field)
            if group is not None and group not in self.config_groups:
                raise ValueError(f"Stage {self.name}: {field}={group!r} is not in config_groups={self.config_groups}")
        for field in ("trains_adapters", "trains_on_rollouts", "plans_memory", "may_split"):
            if getattr(self, field) and self.trains is None:
                raise ValueError(f"Stage {self.name}: {field} needs a model it trains (trains=None)")
        if self.may_split and not self.data_parallel:
            raise ValueError(f"Stage {self.name}: may_split runs it data parallel (data_parallel=False)")

    @property
    def model_groups(self) -> tuple[str, ...]:
        """The config groups of the models it loads, the trained one included."""
        return tuple(group for group in self.config_groups if group in MODEL_GROUPS)

    def check_config(self, cfg: DictConfig) -> None:
        """Run the stage's ``check`` on ``cfg`` (a ConfigError names what to fix); nothing when it has none."""
        if self.check is not None:
            self.check(cfg)
