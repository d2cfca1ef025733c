"""What a stage declares: ``Stage``, the one interface every module of ``rlt_mono.stages`` fills in.

A declaration is light (no torch, no transformers): ``rlt_mono.cli`` reads it to check a run's keys before
anything heavy loads, and imports the stage's code only when it runs it (``Stage.load``).
"""

from __future__ import annotations

import importlib
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
    # "module:function" of its run: the function takes the composed config and returns the run folder. A string,
    # imported only when the stage runs, so that reading the registry costs no torch import.
    run: str
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
    # "module:function" that checks its own options in a composed config, loading nothing, and raises ConfigError
    # on a wrong one; the pipeline calls it for every step when it plans, so a typo in the last stage's options
    # stops the pipeline before its first stage, not hours in. None: nothing to check ahead.
    check: str | None = None

    def __post_init__(self) -> None:
        for field, value in (("run", self.run), ("check", self.check)):
            module, _, function = (value or "").partition(":")
            if value is not None and not (module and function):
                raise ValueError(f"Stage {self.name}: {field}={value!r} is not 'module:function'")
        if self.trains is not None and self.trains not in self.model_groups:
            raise ValueError(f"Stage {self.name}: trains={self.trains!r} is not in model_groups={self.model_groups}")
        if self.data_parallel and self.trains is None:
            raise ValueError(f"Stage {self.name}: data_parallel needs a model it trains (trains=None)")

    @property
    def model_groups(self) -> tuple[str, ...]:
        """The config groups of the models it loads, the trained one included."""
        return tuple(group for group in self.config_groups if group in MODEL_GROUPS)

    def load(self) -> Callable[[DictConfig], Path]:
        """The stage's run function, imported now (the one place a stage's code is imported by name)."""
        return _function(self.run)

    def check_config(self, cfg: DictConfig) -> None:
        """Run the stage's ``check`` on ``cfg`` (a ConfigError names what to fix); nothing when it has none."""
        if self.check is not None:
            _function(self.check)(cfg)


def _function(name: str) -> Callable:
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)
