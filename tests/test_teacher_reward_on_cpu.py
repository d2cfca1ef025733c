"""TeacherKLReward with real (tiny) models: batched scoring equals a plain per-sample computation."""

import copy

import pytest
import torch

from rlt_mono.data.prompts import PromptFormat, end_tag
from rlt_mono.rewards import TeacherKLReward, TeacherRewardConfig, check_shared_vocabulary
from rlt_mono.rewards.log_probs import range_log_probs

FMT = PromptFormat()
ROWS = [
    ("Ann has 2 boxes of 5 pens. How many pens?", "The answer is 10.", "2 * 5 = 10. So 10 pens."),
    ("A car drives 3 hours at 40 km per hour. How far?", "The answer is 120.", "3 * 40 = 120."),
    ("Bob had 9 cards and gave away 4. How many are left?", "The answer is 5.", "9 - 4 = 5. Bob keeps 5 cards, "
     "because giving away 4 of 9 leaves 5."),
]


def _batch(tokenizer, closed=(True, True, False)):
    prompts, completion_ids = [], []
    for (question, solution, explanation), close in zip(ROWS, closed):
        prompts.append(tokenizer.apply_chat_template(FMT.teacher_messages(question, solution), tokenize=False,
                                                     continue_final_message=True))
        text = explanation + (end_tag("explanation") if close else "")
        completion_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    return dict(
        prompts=prompts,
        completions=[tokenizer.decode(ids) for ids in completion_ids],
        completion_ids=completion_ids,
        question=[r[0] for r in ROWS],
        solution=[r[1] for r in ROWS],
    )


def _plain_log_probs(model, ids, start, end, temperature):
    """Reference: one unpadded forward, full logits."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    return logits.log_softmax(-1)[start - 1 : end - 1].gather(-1, torch.tensor(ids[start:end])[:, None])[:, 0]


def test_batched_reward_matches_per_sample_computation(tokenizer, student, teacher):
    config = TeacherRewardConfig(micro_batch_size=2)
    reward = TeacherKLReward(student, tokenizer, config, teacher_model=teacher, teacher_temperature=0.7)
    metrics = {}
    batch = _batch(tokenizer)
    totals = reward(**batch, log_metric=lambda name, value: metrics.setdefault(name, value))

    for i, scored in enumerate(reward.last_scores):
        question, solution, explanation = ROWS[i]
        expl_ids = tokenizer(explanation, add_special_tokens=False)["input_ids"]
        student_text = tokenizer.apply_chat_template(FMT.student_messages(question, explanation, solution),
                                                     tokenize=False)
        prefix = tokenizer.apply_chat_template(FMT.student_messages(question, "\x00", solution),
                                               tokenize=False).split("\x00")[0]
        head = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        student_ids = head + expl_ids + tokenizer(student_text[len(prefix) + len(explanation):],
                                                  add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(student_ids) == student_text
        # solution tokens: locate them by text (they sit between the solution tags)
        sol_ids = tokenizer(solution, add_special_tokens=False)["input_ids"]
        s0 = next(j for j in range(len(student_ids) - 1, -1, -1) if student_ids[j : j + len(sol_ids)] == sol_ids)
        lp_s = _plain_log_probs(student, student_ids, s0, s0 + len(sol_ids), 0.7)
        lp_t_student = _plain_log_probs(student, student_ids, len(head), len(head) + len(expl_ids), 0.7)
        prompt_ids = tokenizer(batch["prompts"][i])["input_ids"]
        lp_t_teacher = _plain_log_probs(teacher, prompt_ids + expl_ids, len(prompt_ids),
                                        len(prompt_ids) + len(expl_ids), 0.7)
        k = lp_t_teacher - lp_t_student
        expected = (lp_s.mean() + 0.01 * lp_s.min()) - (3 * k.mean() + 0.03 * k.max())
        expected += 0.0 if i < 2 else -1.0  # third completion never closes the explanation
        assert totals[i] == pytest.approx(float(expected), abs=1e-4)
        assert scored["total"] == pytest.approx(totals[i])
        assert scored["unmatched"] == (i == 2)
        assert (scored["question"], scored["solution"]) == (question, solution)  # samples.jsonl shows the problem
        assert scored["explanation"] == explanation and not scored["noncanonical"]

    assert metrics["alignment/unmatched_frac"] == pytest.approx(1 / 3)
    assert metrics["alignment/noncanonical_frac"] == 0.0
    for key in ("teacher_reward/r_ss/mean", "teacher_reward/r_ss/min", "teacher_reward/r_kl/mean",
                "teacher_reward/r_kl/max", "teacher_reward/r_ss", "teacher_reward/r_kl",
                "teacher_reward/match_penalty", "teacher_reward/total"):
        assert key in metrics
    assert metrics["teacher_reward/total"] == pytest.approx(sum(totals) / 3, abs=1e-5)
    assert metrics["teacher_reward/match_penalty"] == pytest.approx(-1 / 3)


def test_reused_teacher_log_probs_skip_the_teacher_forward(tokenizer, student, teacher):
    batch = _batch(tokenizer)
    computed = TeacherKLReward(student, tokenizer, teacher_model=teacher, teacher_temperature=0.7)(**batch)
    # TRL's policy log-probs cover every completion token; the reward takes the explanation prefix.
    full = []
    for prompt, ids in zip(batch["prompts"], batch["completion_ids"]):
        prompt_ids = tokenizer(prompt)["input_ids"]
        full.append(_plain_log_probs(teacher, prompt_ids + ids, len(prompt_ids), len(prompt_ids) + len(ids), 0.7))
    reused = TeacherKLReward(student, tokenizer, teacher_model=None)(**batch, teacher_log_probs=full)
    assert reused == pytest.approx(computed, abs=1e-4)


def test_range_log_probs_is_padding_invariant(tokenizer, student):
    seqs = [tokenizer(t)["input_ids"] for t in ("short one", "a much longer sequence of several words here", "x")]
    ranges = [(1, len(s)) for s in seqs]
    batched = range_log_probs(student, seqs, ranges, temperature=1.0, micro_batch_size=3,
                              pad_token_id=tokenizer.pad_token_id)
    for seq, (start, end), lp in zip(seqs, ranges, batched):
        assert lp.shape == (end - start,)
        assert torch.allclose(lp, _plain_log_probs(student, seq, start, end, 1.0), atol=1e-5)


@pytest.mark.parametrize("kernel", [True, False])
def test_decoder_path_scores_only_the_spans_in_one_fused_call_per_micro_batch(tokenizer, student, monkeypatch,
                                                                              kernel):
    from trl.kernels import ChunkedLogProbFunction

    from rlt_mono.rewards import log_probs as module

    monkeypatch.setattr(module, "fused_kernel_on", lambda device: kernel)  # True: a GPU's path, run on the CPU

    seqs = [tokenizer(t)["input_ids"] for t in ("short one here", "a much longer sequence of several words here",
                                                  "x y z", "one more row")]
    ranges = [(3, len(seqs[0])), (6, len(seqs[1]) - 2), (2, 2), (1, 2)]  # mid-sequence spans and an empty one
    fused_rows, head_calls = [], []
    original = ChunkedLogProbFunction.apply

    def counting_apply(hidden, *args):
        fused_rows.append(hidden.shape[0])
        return original(hidden, *args)

    monkeypatch.setattr(ChunkedLogProbFunction, "apply", counting_apply)
    hook = student.lm_head.register_forward_hook(lambda *_: head_calls.append(1))
    try:
        fused = range_log_probs(student, seqs, ranges, temperature=0.7, micro_batch_size=2,
                                pad_token_id=tokenizer.pad_token_id)
    finally:
        hook.remove()
    # longest first: micro-batches {1, 0} and {3, 2}; each hands the kernel exactly its spans' predictors
    spans_tokens = [(len(seqs[1]) - 2 - 6) + (len(seqs[0]) - 3), 1 + 0]
    assert fused_rows == (spans_tokens if kernel else [])
    # fused: the head module never builds (positions, vocabulary) logits; plain: once per micro-batch with spans
    assert len(head_calls) == (0 if kernel else 2)
    for seq, (start, end), lp in zip(seqs, ranges, fused):
        assert lp.shape == (end - start,) and lp.dtype == torch.float32
        assert torch.allclose(lp, _plain_log_probs(student, seq, start, end, 0.7), atol=1e-5)


def test_whole_forward_keeps_only_the_spanned_logits_and_matches_the_decoder_path(tokenizer, student):
    seqs = [tokenizer(t)["input_ids"] for t in ("short one here", "a much longer sequence of several words here",
                                                  "x y z")]
    ranges = [(3, len(seqs[0])), (6, len(seqs[1]) - 2), (2, 2)]  # mid-sequence spans and an empty one
    kept = []
    hook = student.lm_head.register_forward_hook(lambda _m, args, _out: kept.append(args[0].shape[1]))
    try:
        whole = range_log_probs(student, seqs, ranges, temperature=0.7, micro_batch_size=3,
                                pad_token_id=tokenizer.pad_token_id, whole_forward=True)
    finally:
        hook.remove()
    # logits at positions 2 (predicting token 3, the first span's start) up to the last span end's predictor, not
    # the whole padded width
    assert kept == [max(len(seqs[0]), len(seqs[1]) - 2) - 1 - 2] and kept[0] < len(seqs[1])
    for seq, (start, end), lp in zip(seqs, ranges, whole):
        assert lp.shape == (end - start,)
        assert torch.allclose(lp, _plain_log_probs(student, seq, start, end, 0.7), atol=1e-5)


def test_sharded_teacher_runs_as_many_forwards_as_the_busiest_rank_with_the_same_rewards(tokenizer, student,
                                                                                          teacher):
    batch = _batch(tokenizer)
    config = TeacherRewardConfig(micro_batch_size=2)
    plain = TeacherKLReward(student, tokenizer, config, teacher_model=teacher)(**batch)
    sharded = TeacherKLReward(student, tokenizer, config, teacher_model=teacher)
    asked = []

    def busiest_rank(forwards):  # another rank runs 3 teacher forwards
        asked.append(forwards)
        return 3

    sharded.sharded_teacher = busiest_rank
    forwards = []
    hook = teacher.register_forward_hook(lambda _m, args, kwargs, _out: forwards.append(kwargs["input_ids"].shape[0]),
                                         with_kwargs=True)
    try:
        rewards = sharded(**batch)
    finally:
        hook.remove()
    assert asked == [2]  # 3 completions in micro-batches of 2
    assert forwards == [2, 2, 2]  # the 3 completions and 3 one-token fillers, through the model's forward
    assert rewards == pytest.approx(plain, abs=1e-5)


def test_student_with_another_vocabulary_is_rejected(tokenizer, student):
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<|not_in_teacher|>"])
    with pytest.raises(ValueError, match="does not share the teacher's vocabulary"):
        check_shared_vocabulary(tokenizer, other, student, teacher_name="t", student_name="s")
    with pytest.raises(ValueError, match="does not share the teacher's vocabulary"):
        TeacherKLReward(student, tokenizer, student_tokenizer=other)


def test_missing_teacher_is_a_clear_error(tokenizer, student):
    with pytest.raises(ValueError, match="needs teacher log-probs"):
        TeacherKLReward(student, tokenizer)(**_batch(tokenizer))
