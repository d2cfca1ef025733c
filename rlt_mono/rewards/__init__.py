"""The RLT teacher reward: maths (pure tensors), token alignment, and the TRL reward function."""

from rlt_mono.rewards.teacher_kl import TeacherKLReward, TeacherRewardConfig, check_shared_vocabulary

__all__ = ["TeacherKLReward", "TeacherRewardConfig", "check_shared_vocabulary"]
