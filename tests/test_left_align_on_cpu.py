"""rlt_mono.rl.left_align: padded passes without a mask (left-aligned rows) give the masked run's outputs, and the
decoder's layers really get no mask; rows with holes, cached calls and non-rotary models are left alone."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2Model

from rlt_mono.rl import left_align


def test_left_aligned_counts_leading_pads_and_refuses_a_row_with_a_hole():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert left_align.left_aligned(mask).tolist() == [2, 0, 6, 0]
    assert left_align.left_aligned(torch.tensor([[0, 1, 1, 0, 1, 1]])) is None


@pytest.fixture
def hooked(student):
    model = copy.deepcopy(student)
    assert left_align.install(model.get_decoder())
    return model


def _layer_masks(model):
    seen = []
    handle = model.get_decoder().layers[0].register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
    return seen, handle


def _batch(tokenizer):
    texts = ["a much longer sequence of several words here", "short one", "x y z w"]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows) + 3
    left = [0, 3, 1]  # leading pads per row; the rest of the row after its tokens is right padding
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, pad) in enumerate(zip(rows, left)):
        ids[i, pad : pad + len(row)] = torch.tensor(row)
        mask[i, pad : pad + len(row)] = 1
    return ids, mask


def test_hooked_decoder_matches_the_masked_run_at_real_positions_without_a_mask(tokenizer, student, hooked):
    ids, mask = _batch(tokenizer)
    with torch.no_grad():
        plain_seen, handle = _layer_masks(student)
        plain = student(input_ids=ids, attention_mask=mask, use_cache=False).logits
        handle.remove()
        hooked_seen, handle = _layer_masks(hooked)
        aligned = hooked(input_ids=ids, attention_mask=mask, use_cache=False).logits
        handle.remove()
    assert plain_seen[0] is not None and hooked_seen == [None]  # the layers ran causal-only, with no padding mask
    real = mask.bool()
    assert torch.allclose(aligned[real], plain[real], atol=1e-4)
    assert not torch.allclose(aligned[~real], plain[~real], atol=1e-4)  # pads moved: their values are not kept


def test_holes_cached_calls_and_explicit_positions_keep_the_mask(tokenizer, hooked):
    ids, mask = _batch(tokenizer)
    holed = mask.clone()
    holed[0, 2] = 0  # a hole inside row 0
    for kwargs in ({"attention_mask": holed, "use_cache": False}, {"attention_mask": mask, "use_cache": True},
                   {"attention_mask": mask}, {"attention_mask": mask, "use_cache": False,
                                              "position_ids": torch.arange(ids.shape[1])[None]}):
        seen, handle = _layer_masks(hooked)
        with torch.no_grad():
            hooked(input_ids=ids, **kwargs)
        handle.remove()
        assert seen[0] is not None, kwargs


def test_a_model_without_rotary_positions_is_not_hooked():
    decoder = GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32))
    assert not left_align.install(decoder)
    assert not decoder._forward_pre_hooks


def test_the_trainer_hooks_policy_reference_and_student_unless_turned_off(tmp_path):
    from rlt_mono import build_trainer, compose, release_trainer

    for enabled in (True, False):
        trainer = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path / str(enabled)}",
                                                      f"trainer.left_align_padding={enabled}"]))
        try:
            decoders = [m.get_decoder() for m in (trainer.model, trainer.ref_model,
                                                  trainer.teacher_reward.student_model)]
            assert [bool(getattr(d, "_rlt_left_align_hooks", False)) for d in decoders] == [enabled] * 3
        finally:
            release_trainer(trainer)
