"""rlt_mono: train a Reinforcement-Learned Teacher with GRPO on one GPU.

Notebook use::

    import rlt_mono
    cfg = rlt_mono.compose("demo_tiny", ["trainer.max_steps=2"])
    trainer = rlt_mono.build_trainer(cfg)
    trainer.train()
    trainer.teacher_reward.last_scores   # the last batch of explanations with their reward breakdown
    rlt_mono.release_trainer(trainer)    # free memory before the next build

Names are imported on first use, so ``python -m rlt_mono.cli --help`` and config errors need no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ConfigError": "rlt_mono.config",
    "compose": "rlt_mono.config",
    "UserError": "rlt_mono.errors",
    "RLTConfig": "rlt_mono.rl.grpo_config",
    "TeacherKLReward": "rlt_mono.rewards",
    "TeacherRewardConfig": "rlt_mono.rewards",
    "build_trainer": "rlt_mono.rl.build",
    "release_trainer": "rlt_mono.rl.build",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlt_mono' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
