"""A step written in the weights' own dtype (rlt_mono.runs.precision): the share of bfloat16 weights it moves, and
the warning the RL and SFT stages give when most of each step would round away."""

import logging
from types import SimpleNamespace

import torch
from torch import nn

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.runs.precision import update_share, warn_if_steps_round_away
from rlt_mono.stages.sft import build_sft

WARNING = "a step of {args}.learning_rate={lr} changes"


def _linear(values: list[float], dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([values]))
    return layer.to(dtype)


def test_the_share_is_of_the_weights_a_step_moves_once_rounded_to_their_dtype():
    # bfloat16 keeps 8 significant bits: 1.0 and 0.5 move only for steps over 2^-9 and 2^-10 of them; 0.001 (spacing
    # 2^-17 = 7.6e-6 there) moves by 5e-6, rounded to the next value down; 1e-6 moves
    layer = _linear([1.0, 0.5, 0.001, 1e-6], torch.bfloat16)
    assert update_share(layer, 5e-6) == 0.5
    assert update_share(layer, 1e-2) == 1.0
    # a float32 layer keeps any step: no share to give; frozen weights are not trained
    assert update_share(_linear([1.0, 0.5, 0.001, 1e-6], torch.float32), 5e-6) is None
    frozen = _linear([1.0, 0.5, 0.001, 1e-6], torch.bfloat16).requires_grad_(False)
    assert update_share(frozen, 5e-6) is None
    # tensors weigh by their size: a 2-weight tensor all moving beside the 4-weight one half moving: 4 of 6
    both = nn.ModuleList([layer, _linear([1e-6, 1e-6], torch.bfloat16)])
    assert abs(update_share(both, 5e-6) - 4 / 6) < 1e-9


def test_the_share_is_what_torchs_adamw_moves_in_a_step():
    """AdamW's first step is the learning rate times the gradient's sign: on bfloat16 weights of a pretrained-like
    spread it moves exactly the weights update_share counts, and on float32 ones all of them."""
    torch.manual_seed(0)
    weights = torch.randn(64, 64) * 0.02
    for dtype in (torch.bfloat16, torch.float32):
        layer = nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            layer.weight.copy_(weights)
        layer = layer.to(dtype)
        before = layer.weight.detach().clone()
        predicted = update_share(layer, 5e-6)
        layer.weight.grad = torch.ones_like(layer.weight)  # a step of -5e-6 on every weight
        torch.optim.AdamW(layer.parameters(), lr=5e-6, weight_decay=0.0).step()
        moved = (layer.weight.detach() != before).float().mean().item()
        if dtype == torch.float32:
            assert predicted is None and moved == 1.0
        else:
            assert moved == predicted and 0.0 < moved < 0.3


def _trainer(model: nn.Module, fsdp: bool = False) -> SimpleNamespace:
    return SimpleNamespace(model=model, args=SimpleNamespace(learning_rate=5e-6), is_fsdp_enabled=fsdp)


def test_the_warning_names_the_share_and_the_keys_that_fix_it(caplog):
    quantized = _linear([1.0, 0.5, 0.25, 1e-6], torch.bfloat16)
    quantized.is_loaded_in_4bit = True  # a 4-bit base model's adapters: their dtype is not model.dtype's
    with caplog.at_level(logging.WARNING, logger="rlt_mono.runs.precision"):
        warn_if_steps_round_away(_trainer(_linear([1.0, 0.5, 0.25, 1e-6], torch.bfloat16)), "model", "trainer")
        warn_if_steps_round_away(_trainer(_linear([1.0, 0.5, 0.001, 1e-6], torch.bfloat16)), "model", "trainer")
        # under FSDP accelerate trains float32 copies of the weights: nothing to warn of
        warn_if_steps_round_away(_trainer(_linear([1.0, 0.5, 0.25, 1e-6], torch.bfloat16), fsdp=True), "model", "t")
        warn_if_steps_round_away(_trainer(quantized), "model", "trainer")
    assert [r.getMessage() for r in caplog.records] == [
        "model.dtype=bfloat16: a step of trainer.learning_rate=5e-06 changes 25% of the trained weights; the rest of "
        "each step rounds away in bfloat16: load them in float32 (model.dtype=float32; trainer.bf16=true still "
        "computes in bfloat16) if memory allows, or raise the learning rate",
        "model.dtype=bfloat16: a step of trainer.learning_rate=5e-06 changes 25% of the trained weights; the rest of "
        "each step rounds away in bfloat16: raise trainer.learning_rate"]


def test_the_rl_stage_warns_for_bfloat16_teacher_weights_and_not_for_float32(tmp_path, caplog):
    for dtype in ("bfloat16", "float32"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlt_mono.runs.precision"):
            trainer = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / dtype}", f"model.dtype={dtype}",
                                                          "trainer.learning_rate=1e-7"]))
            release_trainer(trainer)
        warned = [r.getMessage() for r in caplog.records]
        if dtype == "float32":
            assert warned == []
        else:
            assert len(warned) == 1 and warned[0].startswith(
                f"model.dtype=bfloat16: {WARNING.format(args='trainer', lr='1e-07')}")


def test_the_sft_stage_warns_in_its_own_keys(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlt_mono.runs.precision"):
        build_sft(compose("student_sft", ["size=tiny", f"output_dir={tmp_path / 'run'}", "data=embedded",
                                          "sft.explanation_column=reasoning_trace", "student.dtype=bfloat16",
                                          "sft.learning_rate=1e-7"]))
    warned = [r.getMessage() for r in caplog.records]
    expected = f"student.dtype=bfloat16: {WARNING.format(args='sft', lr='1e-07')}"
    assert len(warned) == 1 and warned[0].startswith(expected)
