"""rlt_mono: train a Reinforcement-Learned Teacher with GRPO on one GPU.

Notebook use::

    import rlt_mono
    cfg = rlt_mono.compose("demo_tiny", ["trainer.max_steps=2"])
    trainer = rlt_mono.build_trainer(cfg)
    trainer.train()
    trainer.teacher_reward.last_scores   # the last batch of explanations with their reward breakdown
    rlt_mono.release_trainer(trainer)    # free memory before the next build
"""

from rlt_mono.build import build_trainer, release_trainer
from rlt_mono.config import ConfigError, RLTConfig, compose
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig

__all__ = [
    "ConfigError",
    "RLTConfig",
    "TeacherKLReward",
    "TeacherRewardConfig",
    "build_trainer",
    "compose",
    "release_trainer",
]
