"""final/ of a sharded (fsdp2) run holds the weights in the dtype the run loaded the model in, not float32."""

import json
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from rlt_mono.stages.final_model import FINAL_DIR, save_final


def _float32_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    return LlamaForCausalLM(config).float()


class ShardedTrainer:
    """What save_final reads of an FSDP trainer whose master weights are float32 (one rank)."""

    is_fsdp_enabled = True

    def __init__(self, model):
        self.model = model
        self.args = SimpleNamespace(should_save=True)
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None)

    def save_model(self, folder):
        self.model.save_pretrained(folder, max_shard_size="10KB")  # several files and their index


@pytest.mark.parametrize(("stage", "dtypes", "expected"), [
    ("teacher_rlt", {"model": "bfloat16", "student": "float32"}, torch.bfloat16),
    ("student_sft", {"model": "bfloat16", "student": "float16"}, torch.float16),  # the group the stage trains
    ("teacher_sft", {"model": "float32", "student": "bfloat16"}, torch.float32),  # loaded as trained: as saved
])
def test_a_sharded_runs_final_weights_are_in_the_dtype_it_loaded(tmp_path, stage, dtypes, expected):
    model = _float32_model()
    OmegaConf.save({"stage": stage, **{group: {"dtype": dtype} for group, dtype in dtypes.items()}},
                   tmp_path / "config.yaml")
    final = save_final(ShardedTrainer(model), tmp_path)

    assert final == tmp_path / FINAL_DIR and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "final"]
    assert not list(final.glob(".*"))  # no file left aside
    files = sorted(final.glob("*.safetensors"))
    assert len(files) > 1
    saved = {name: tensor for path in files for name, tensor in load_file(path).items()}
    weights = model.state_dict()
    assert set(saved) == set(weights)
    for name, tensor in saved.items():
        assert tensor.dtype == expected and torch.equal(tensor, weights[name].to(expected)), name
    assert json.loads((final / "config.json").read_text())["dtype"] == str(expected).removeprefix("torch.")
    index = json.loads((final / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in saved.values())
    assert set(index["weight_map"]) == set(saved)
    reloaded = AutoModelForCausalLM.from_pretrained(final, dtype="auto")
    assert reloaded.dtype == expected
    assert torch.equal(reloaded.lm_head.weight, weights["lm_head.weight"].to(expected))
