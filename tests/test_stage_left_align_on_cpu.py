"""The distill and eval stages hook their student and teacher with rlt_mono.rl.left_align unless
``<stage>.left_align_padding=false``: padded scoring passes then reach the decoders' layers without a mask, and
every figure is the unhooked run's."""

import json

import pytest
import torch

from rlt_mono.config import ConfigError, compose
from rlt_mono.stages import distill_run, eval_run
from rlt_mono.stages.distill import DISTILL_FILE, run_distill
from rlt_mono.stages.eval import ROWS_FILE, run_eval

pytestmark = pytest.mark.usefixtures("one_thread")

SCORES = ("r_ss", "r_kl", "match_penalty", "total")
STAGES = {  # stage: (its code's module, run, rows file, overrides, scores and texts its rows hold)
    "eval": (eval_run, run_eval, ROWS_FILE, ["eval.max_new_tokens=24", "eval.student_max_new_tokens=16",
                                             "eval.bootstrap_resamples=50"],
             (*SCORES, "solution_log_prob"), ("explanation", "student_output")),
    "distill": (distill_run, run_distill, DISTILL_FILE, ["distill.max_new_tokens=24", "distill.samples_per_question=2",
                                                   "data.max_rows=8"],
                SCORES, ("explanation",)),
}


def _run(tmp_path, monkeypatch, stage: str, enabled: bool) -> tuple[list[dict], list[dict]]:
    """``stage`` on the tiny pair at ``<stage>.left_align_padding=enabled``: its rows, and per student or teacher
    decoder call without a cache (the scoring passes): the model, whether its batch was padded and the mask its
    first layer got."""
    module, run, rows_file, overrides, _, _ = STAGES[stage]
    calls = []
    load = module.load_stage_models

    def spying(*args, **kwargs):
        models = load(*args, **kwargs)
        for name in ("student", "teacher"):
            decoder = getattr(models, name).get_decoder()

            def called(_module, _args, kw, name=name):  # prepended: the caller's mask, before any left-align hook
                mask = kw.get("attention_mask")
                calls.append({"model": name, "scoring": kw.get("use_cache") is False,
                              "padded": isinstance(mask, torch.Tensor) and not bool(mask.bool().all())})

            def first_layer(_module, _args, kw):
                calls[-1].setdefault("layer_mask", kw.get("attention_mask"))

            decoder.register_forward_pre_hook(called, with_kwargs=True, prepend=True)
            decoder.layers[0].register_forward_pre_hook(first_layer, with_kwargs=True)
        return models

    monkeypatch.setattr(module, "load_stage_models", spying)
    out = tmp_path / f"{stage}_left_align_{enabled}"
    run(compose(stage, ["size=tiny", f"output_dir={out}", "data.max_rows=3", *overrides,
                        f"{stage}.left_align_padding={enabled}"]))
    rows = [json.loads(line) for line in (out / rows_file).read_text().splitlines()]
    return rows, [c for c in calls if c["scoring"]]


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_stage_hooks_its_student_and_teacher_unless_turned_off_and_scores_the_same(stage, tmp_path,
                                                                                       monkeypatch):
    on_rows, on_calls = _run(tmp_path, monkeypatch, stage, True)
    off_rows, off_calls = _run(tmp_path, monkeypatch, stage, False)
    for model in ("student", "teacher"):
        padded_on = [c for c in on_calls if c["padded"] and c["model"] == model]
        padded_off = [c for c in off_calls if c["padded"] and c["model"] == model]
        assert padded_on and len(padded_on) == len(padded_off), model  # the reward's passes were padded
        assert all(c["layer_mask"] is None for c in padded_on), model  # hooked: causal only, no padding mask
        assert all(c["layer_mask"] is not None for c in padded_off), model  # unhooked: the mask reached the layers
    # The same texts (generation is untouched), scored the same.
    _, _, _, _, scores, texts = STAGES[stage]
    for key in texts:
        assert [r[key] for r in on_rows] == [r[key] for r in off_rows], key
    on, off = (torch.tensor([[r[k] for k in scores] for r in rows], dtype=torch.float64)
               for rows in (on_rows, off_rows))
    assert torch.allclose(on, off, atol=1e-5), (on, off)


@pytest.mark.parametrize("stage", list(STAGES))
def test_left_align_padding_must_be_a_bool(stage, tmp_path):
    run = STAGES[stage][1]
    with pytest.raises(ConfigError, match=f"{stage}: left_align_padding must be true or false, got 'maybe'"):
        run(compose(stage, ["size=tiny", f"output_dir={tmp_path}", f"{stage}.left_align_padding=maybe"]))
