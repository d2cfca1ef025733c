"""A real pretrained model through the stages on CPU: SmolLM2-135M-Instruct from its PyPI package (GGUF,
dequantized once), teacher SFT, then two GRPO steps with the RLT reward scored by the same model frozen.

Slow on a 2-core machine (minutes), so it runs only with ``RLT_MONO_SLOW=1``:
``RLT_MONO_SLOW=1 python -m pytest -q tests/test_smollm2_stages_on_cpu.py``.
The quick checks of the same model (fetch, conversion, a greedy answer) run in CI: test_pretrained_on_cpu.py.
"""

import json
import os

import pytest
import torch

from rlt_mono.config import compose
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics

pytestmark = pytest.mark.skipif(os.environ.get("RLT_MONO_SLOW") != "1", reason="slow: set RLT_MONO_SLOW=1")

SFT = ["model=smollm2_135m_instruct", "model.dtype=float32", "logging=local", "sft=tiny_cpu", "sft.max_steps=2",
       "sft.per_device_train_batch_size=2", "sft.gradient_accumulation_steps=1", "sft.per_device_eval_batch_size=4",
       "sft.learning_rate=3.0e-5", "sft.max_length=512", "data.eval_rows=4", "data.embedded_rows=64"]
RL = ["student=smollm2_135m_instruct", "model.gguf_file=null", "model.dtype=float32", "student.dtype=float32",
      "trainer.max_steps=2", "trainer.per_device_train_batch_size=4", "trainer.gradient_accumulation_steps=1",
      "trainer.steps_per_generation=1", "trainer.num_generations=2", "trainer.max_completion_length=16",
      "trainer.save_steps=2", "trainer.plot_metrics=false", "data.embedded_rows=64"]


def test_smollm2_sft_then_two_rl_steps(tmp_path):
    from safetensors.torch import load_file

    from rlt_mono.stages.sft import run_sft
    from rlt_mono.stages.teacher_rlt import run_teacher_rlt

    torch.set_num_threads(1)
    sft_dir = run_sft(compose("teacher_sft", [*SFT, f"output_dir={tmp_path / 'sft'}"]))
    summary = json.loads((sft_dir / "sft_summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout_loss_after"] < summary["heldout_loss_before"]

    rl_dir = run_teacher_rlt(compose("demo_tiny", [*RL, f"model.model_name_or_path={sft_dir / 'final'}",
                                                   f"output_dir={tmp_path / 'rl'}"]))
    rows = read_metrics(rl_dir / METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(abs(r["teacher_reward/total"] - r["reward"]) < 1e-4 for r in rows)
    before = load_file(sft_dir / "final" / "model.safetensors")
    after = load_file(rl_dir / "final" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)  # GRPO moved the teacher
