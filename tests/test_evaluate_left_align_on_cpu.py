"""The eval stage hooks its student with rlt_mono.left_align unless ``eval.left_align_padding=false``: the student's
padded scoring passes then reach its decoder's layers without a mask, and every figure is the unhooked run's."""

import json

import pytest
import torch

from rlt_mono import evaluate
from rlt_mono.config import ConfigError, compose
from rlt_mono.evaluate import ROWS_FILE, run_eval

pytestmark = pytest.mark.usefixtures("one_thread")

SCORES = ("r_ss", "r_kl", "match_penalty", "total", "solution_log_prob")


def _run(tmp_path, monkeypatch, enabled: bool) -> tuple[list[dict], list[dict]]:
    """``run_eval`` on the tiny pair at ``eval.left_align_padding=enabled``: its rows, and per student decoder call
    without a cache (the scoring passes): whether its batch was padded and the mask its first layer got."""
    calls = []
    load = evaluate.load_stage_models

    def spying(*args, **kwargs):
        models = load(*args, **kwargs)
        decoder = models.student.get_decoder()

        def called(_module, _args, kw):  # prepended: the caller's mask, before any left-align hook changes it
            mask = kw.get("attention_mask")
            calls.append({"scoring": kw.get("use_cache") is False,
                          "padded": isinstance(mask, torch.Tensor) and not bool(mask.bool().all())})

        def first_layer(_module, _args, kw):
            calls[-1].setdefault("layer_mask", kw.get("attention_mask"))

        decoder.register_forward_pre_hook(called, with_kwargs=True, prepend=True)
        decoder.layers[0].register_forward_pre_hook(first_layer, with_kwargs=True)
        return models

    monkeypatch.setattr(evaluate, "load_stage_models", spying)
    out = tmp_path / f"left_align_{enabled}"
    run_eval(compose("eval", ["size=tiny", f"output_dir={out}", "data.max_rows=3", "eval.max_new_tokens=24",
                              "eval.student_max_new_tokens=16", "eval.bootstrap_resamples=50",
                              f"eval.left_align_padding={enabled}"]))
    rows = [json.loads(line) for line in (out / ROWS_FILE).read_text().splitlines()]
    return rows, [c for c in calls if c["scoring"]]


def test_eval_hooks_its_student_unless_turned_off_and_scores_the_same(tmp_path, monkeypatch):
    on_rows, on_calls = _run(tmp_path, monkeypatch, True)
    off_rows, off_calls = _run(tmp_path, monkeypatch, False)
    padded_on = [c for c in on_calls if c["padded"]]
    padded_off = [c for c in off_calls if c["padded"]]
    assert padded_on and len(padded_on) == len(padded_off)  # the reward and solution log-prob passes were padded
    assert all(c["layer_mask"] is None for c in padded_on)  # hooked: the layers ran causal-only, no padding mask
    assert all(c["layer_mask"] is not None for c in padded_off)  # unhooked: the padding mask reached the layers
    # The same explanations and answers (the teacher and generation are untouched), scored the same.
    assert [r["explanation"] for r in on_rows] == [r["explanation"] for r in off_rows]
    assert [r["student_output"] for r in on_rows] == [r["student_output"] for r in off_rows]
    on, off = (torch.tensor([[r[k] for k in SCORES] for r in rows], dtype=torch.float64)
               for rows in (on_rows, off_rows))
    assert torch.allclose(on, off, atol=1e-5), (on, off)


def test_eval_left_align_padding_must_be_a_bool(tmp_path):
    with pytest.raises(ConfigError, match="eval: left_align_padding must be true or false, got 'maybe'"):
        run_eval(compose("eval", ["size=tiny", f"output_dir={tmp_path}", "eval.left_align_padding=maybe"]))
