"""``SamplingOptions``: how a teacher samples explanations, the fields the ``distill`` and ``eval`` config groups share
(``DistillConfig``, ``EvalConfig``). Light, so that the stage modules declare their groups without importing the
sampler (``rlt_mono.stages.sampler``, torch and transformers) that reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingOptions:
    """How the teacher samples explanations (fields shared by ``cfgs/distill`` and ``cfgs/eval``)."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 4096
    rows_per_batch: int = 64
    vllm_gpu_memory_utilization: float = 0.5
    vllm_enforce_eager: bool = True
    vllm_kv_cache_gib: float | None = None
    left_align_padding: bool = True

    def __post_init__(self) -> None:
        for name in ("vllm_enforce_eager", "left_align_padding"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("max_new_tokens", "rows_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {self.vllm_gpu_memory_utilization}")
        if self.vllm_kv_cache_gib is not None and not self.vllm_kv_cache_gib > 0:
            raise ValueError(f"vllm_kv_cache_gib must be > 0 GiB (null: vLLM sizes it by profiling), got "
                             f"{self.vllm_kv_cache_gib}")
