"""The student reads the explanation the way the RLT student did: the Stratos chat, character for character, and
the tokenizer's own ids everywhere but the teacher's generated explanation, checked with a real Qwen2.5 tokenizer.

With Qwen2's BPE the RLT tags are plain text, so ``>\\n\\n``, ``.<`` and ``>\\n\\n\\n`` are single tokens and how the
chat is cut before encoding matters; the tiny embedded tokenizer (tags as added tokens) cannot show any of it.
"""

import hashlib
import unicodedata

import pytest
import torch
from qwen2_tokenizer import qwen2_tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlt_mono.data.prompts import STUDENT_SYSTEM_PROMPT, PromptFormat, end_tag
from rlt_mono.rewards import TeacherKLReward
from rlt_mono.rewards.alignment import align_sample, align_samples

FMT = PromptFormat()
QUESTION = "Tom has 3 bags of 4 apples. How many apples does he have?"
EXPLANATION = "Each bag holds 4 apples and there are 3 bags.\n\nSo Tom has 3 * 4 = 12 apples.\n\n"
SOLUTION = "\n\nTom has $3 \\times 4 = \\boxed{12}$ apples.\n\n"  # Bespoke-Stratos style: padded inside the tags


@pytest.fixture(scope="module")
def qwen():
    return qwen2_tokenizer()


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _generated(tokenizer, explanation, *, close=True):
    """Teacher ids as a Qwen teacher emits them: the canonical tokens of its text, then EOS."""
    return _ids(tokenizer, explanation + (end_tag("explanation") if close else "")) + [tokenizer.eos_token_id]


def _stops(tokenizer):
    return {tokenizer.eos_token_id, tokenizer.pad_token_id}


# ---------------------------------------------------------------- the strings


def test_student_turn_is_the_stratos_turn_rlt_built():
    # RLT's student turn: the thought is everything between the teacher's explanation tags, the prefilled
    # "\n\n" included, then "\n\n" and the solution as the data has it.
    expected = (
        "<|begin_of_thought|>\n\n" + EXPLANATION + "<|end_of_thought|>\n\n"
        "<|begin_of_solution|>" + SOLUTION + "<|end_of_solution|>"
    )
    assert FMT.student_completion(EXPLANATION, SOLUTION) == expected


def test_student_system_prompt_is_the_bespoke_stratos_one():
    assert STUDENT_SYSTEM_PROMPT.startswith("Your role as an assistant involves thoroughly exploring questions")
    assert STUDENT_SYSTEM_PROMPT.endswith("Now, try to solve the following question through the above guidelines:")
    assert "{thought with steps separated with '\\n\\n'}" in STUDENT_SYSTEM_PROMPT  # a backslash, then n
    assert hashlib.sha256(STUDENT_SYSTEM_PROMPT.encode()).hexdigest() == (
        "6490a490932e93a0712ec83d53b79036a10059ccdbf786e088ac9c247aa19141"
    )


def test_student_chat_with_qwen_template_is_the_original_string(qwen):
    rendered = qwen.apply_chat_template(FMT.student_messages(QUESTION, EXPLANATION, SOLUTION), tokenize=False)
    assert rendered == (
        "<|im_start|>system\n" + STUDENT_SYSTEM_PROMPT + "<|im_end|>\n"
        "<|im_start|>user\n" + QUESTION + "<|im_end|>\n"
        "<|im_start|>assistant\n<|begin_of_thought|>\n\n" + EXPLANATION + "<|end_of_thought|>\n\n"
        "<|begin_of_solution|>" + SOLUTION + "<|end_of_solution|><|im_end|>\n"
    )


def test_teacher_prefill_ends_with_the_prefix_the_student_reads():
    prefill = FMT.teacher_prefill(SOLUTION)
    assert prefill == "<|begin_of_solution|>" + SOLUTION + "<|end_of_solution|>\n\n<|begin_of_explanation|>\n\n"
    assert FMT.student_completion(EXPLANATION, SOLUTION).startswith("<|begin_of_thought|>" + FMT.explanation_prefix)


def test_a_bespoke_stratos_turn_splits_into_columns_that_rebuild_it():
    turn = ("<|begin_of_thought|>\n\nOkay, 3 bags of 4.\n\n3 * 4 = 12.\n\n<|end_of_thought|>\n\n"
            "<|begin_of_solution|>\n\nThe answer is $\\boxed{12}$.\n\n<|end_of_solution|>")
    explanation, solution = FMT.split_student_completion(turn)
    assert explanation == "Okay, 3 bags of 4.\n\n3 * 4 = 12.\n\n"  # what the RLT teacher learns to write
    assert solution == "\n\nThe answer is $\\boxed{12}$.\n\n"  # padding kept, as RLT keeps it
    assert FMT.student_completion(explanation, solution) == turn
    assert FMT.split_student_completion("no tags") == (None, None)


# ---------------------------------------------------------------- the ids


def _check_canonical(tokenizer, sample, explanation_text, solution, *, expect_noncanonical=False):
    """Every id outside the explanation is the tokenizer's own id for the whole student text."""
    text = tokenizer.apply_chat_template(FMT.student_messages(QUESTION, explanation_text, solution), tokenize=False)
    assert tokenizer.decode(sample.student_ids) == text
    e0, e1 = sample.explanation_span
    assert sample.student_ids[e0:e1] == sample.explanation_ids
    assert sample.noncanonical == expect_noncanonical
    if not expect_noncanonical:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        start = text.index("<|begin_of_thought|>" + FMT.explanation_prefix) + len("<|begin_of_thought|>\n\n")
        end = start + len(tokenizer.decode(sample.explanation_ids))
        before = [i for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if b <= start]
        after = [i for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if a >= end]
        assert sample.student_ids[:e0] == before
        assert sample.student_ids[e1:] == after
        assert len(before) + len(after) + (e1 - e0) == len(sample.student_ids)


def test_stratos_solution_ids_are_canonical_and_skip_the_tag_straddling_token(qwen):
    ids = _generated(qwen, EXPLANATION)
    sample = align_sample(qwen, FMT, QUESTION, SOLUTION, ids, _stops(qwen))
    assert sample.matched and not sample.trimmed and not sample.retokenized
    assert sample.explanation_ids == ids[: len(sample.explanation_ids)]  # the generated ids, as generated
    _check_canonical(qwen, sample, EXPLANATION, SOLUTION)
    s0, s1 = sample.solution_span
    tokens = qwen.convert_ids_to_tokens(sample.student_ids[s0 - 1 : s1 + 1])
    # ">\n\n" is one token (the tag's ">" and the solution's padding): it belongs to neither and is not scored,
    # like the token RLT's span search drops; the solution's closing ".\n\n" is wholly inside, so it is.
    assert tokens[0] == ">ĊĊ" and tokens[-2] == ".ĊĊ" and tokens[-1] == "<"
    assert qwen.decode(sample.student_ids[s0:s1]) == SOLUTION.removeprefix("\n\n")


def test_solution_ending_in_a_period_keeps_the_merged_period_tag_token(qwen):
    solution = "The answer is 12."
    sample = align_sample(qwen, FMT, QUESTION, solution, _generated(qwen, "3 * 4 = 12"), _stops(qwen))
    _check_canonical(qwen, sample, "3 * 4 = 12", solution)
    s0, s1 = sample.solution_span
    assert qwen.convert_ids_to_tokens(sample.student_ids[s1 : s1 + 1]) == [".<"]  # not "." then "<"
    assert qwen.decode(sample.student_ids[s0:s1]) == "The answer is 12"


def test_explanation_ending_in_a_period_is_trimmed_and_the_rest_stays_canonical(qwen):
    explanation = "3 * 4 = 12. So Tom has 12 apples."
    ids = _generated(qwen, explanation)  # Qwen emits ".<" across the closing tag
    sample = align_sample(qwen, FMT, QUESTION, "12", ids, _stops(qwen))
    assert sample.trimmed and not sample.noncanonical
    assert sample.explanation_text == explanation
    e1 = sample.explanation_span[1]
    assert qwen.convert_ids_to_tokens(sample.student_ids[e1 : e1 + 1]) == [".<"]
    _check_canonical(qwen, sample, explanation, "12")


def test_explanation_starting_with_a_newline_is_flagged_noncanonical(qwen):
    # The whole text would tokenise ">\n\n\n" as one token straddling the prefix and the explanation: the
    # generated "\n" must stay, so the prefix side is encoded on its own and the sample is counted.
    explanation = "\nFirst, 3 * 4 = 12"
    ids = _generated(qwen, explanation)
    sample = align_sample(qwen, FMT, QUESTION, SOLUTION, ids, _stops(qwen))
    _check_canonical(qwen, sample, explanation, SOLUTION, expect_noncanonical=True)
    e0 = sample.explanation_span[0]
    assert qwen.convert_ids_to_tokens(sample.student_ids[e0 - 1 : e0 + 1]) == [">ĊĊ", "Ċ"]
    assert sample.explanation_ids == ids[: len(sample.explanation_ids)]


def test_teacher_ids_that_split_a_merge_are_flagged_noncanonical(qwen):
    # A teacher may emit "." then "<|" where the tokenizer would write ".<": the explanation keeps its ".".
    ids = _ids(qwen, "3 * 4 = 12") + _ids(qwen, ".") + _ids(qwen, end_tag("explanation")) + [qwen.eos_token_id]
    sample = align_sample(qwen, FMT, QUESTION, SOLUTION, ids, _stops(qwen))
    assert not sample.trimmed
    _check_canonical(qwen, sample, "3 * 4 = 12.", SOLUTION, expect_noncanonical=True)
    assert qwen.convert_ids_to_tokens(sample.explanation_ids[-1:]) == ["."]


def test_empty_explanation_is_canonical_with_an_empty_span(qwen):
    sample = align_sample(qwen, FMT, QUESTION, SOLUTION, _generated(qwen, ""), _stops(qwen))
    assert sample.matched and sample.explanation_ids == []
    assert sample.explanation_span[0] == sample.explanation_span[1]
    _check_canonical(qwen, sample, "", SOLUTION)


def _merges_across(tokenizer, text, start, end):
    """Whether ``encode(text)`` has a token running across character ``start`` or ``end``."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return any(a < start < b or a < end < b for a, b in offsets)


@pytest.mark.parametrize(
    "explanation", ["é ∑ 😀 = naïve", "  two spaces first", "ends with spaces  ", "tab\t", "\n\nstep", "x"]
)
def test_other_boundaries_are_canonical_or_counted(qwen, explanation):
    sample = align_sample(qwen, FMT, QUESTION, SOLUTION, _generated(qwen, explanation), _stops(qwen))
    assert not sample.retokenized
    text = qwen.apply_chat_template(FMT.student_messages(QUESTION, sample.explanation_text, SOLUTION), tokenize=False)
    start = len(qwen.apply_chat_template(FMT.student_messages(QUESTION, "\x00", SOLUTION), tokenize=False)
                .split("\x00")[0])
    merged = _merges_across(qwen, text, start, start + len(qwen.decode(sample.explanation_ids)))
    _check_canonical(qwen, sample, sample.explanation_text, SOLUTION, expect_noncanonical=merged)


def test_scored_span_is_the_generated_ids_with_or_without_the_prefix(qwen):
    ids = _generated(qwen, EXPLANATION)
    with_prefix = align_sample(qwen, FMT, QUESTION, SOLUTION, ids, _stops(qwen))
    without = align_sample(qwen, PromptFormat(explanation_prefix=""), QUESTION, SOLUTION, ids, _stops(qwen))
    assert with_prefix.explanation_ids == without.explanation_ids == ids[: len(with_prefix.explanation_ids)]
    for sample in (with_prefix, without):
        e0, e1 = sample.explanation_span
        assert sample.student_ids[e0:e1] == sample.explanation_ids
    # The prefix adds its "\n\n" to the thought tag's last token: ">" becomes ">\n\n", one token either way.
    assert qwen.convert_ids_to_tokens(with_prefix.student_ids[with_prefix.explanation_span[0] - 1]) == ">ĊĊ"
    assert qwen.convert_ids_to_tokens(without.student_ids[without.explanation_span[0] - 1]) == ">"


def test_text_the_tokenizer_rewrites_is_flagged_not_mis_scored(qwen):
    # Qwen2 normalises to NFC: a question with a combining accent does not encode byte-exactly, so no offset in its
    # tokens can be trusted; every piece is encoded on its own and both flags say so.
    question = "Cafe\u0301 sells 3 bags of 4 apples. How many apples?"
    ids = _generated(qwen, "So 3 * 4 = 12")
    sample = align_sample(qwen, FMT, question, "12", ids, _stops(qwen))
    assert sample.noncanonical and sample.retokenized
    text = qwen.apply_chat_template(FMT.student_messages(question, "So 3 * 4 = 12", "12"), tokenize=False)
    assert qwen.decode(sample.student_ids) == unicodedata.normalize("NFC", text)
    e0, e1 = sample.explanation_span
    s0, s1 = sample.solution_span
    assert qwen.decode(sample.student_ids[e0:e1]) == "So 3 * 4 = 12" and qwen.decode(sample.student_ids[s0:s1]) == "12"


def test_batched_alignment_equals_one_by_one(qwen):
    explanations = [EXPLANATION, "\nnewline first", "", "3 * 4 = 12."]
    completions = [_generated(qwen, e) for e in explanations]
    batch = align_samples(qwen, FMT, [QUESTION] * 4, [SOLUTION] * 4, completions, _stops(qwen))
    assert batch == [align_sample(qwen, FMT, QUESTION, SOLUTION, ids, _stops(qwen)) for ids in completions]


# ---------------------------------------------------------------- the metric


def test_reward_logs_the_noncanonical_fraction_with_qwen_ids(qwen):
    config = Qwen2Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=1024)
    torch.manual_seed(0)
    student = Qwen2ForCausalLM(config).eval()
    explanations = [EXPLANATION, "\nnewline first", "", "3 * 4 = 12"]
    completion_ids = [_generated(qwen, e) for e in explanations]
    teacher_log_probs = [torch.full((len(ids),), -1.0) for ids in completion_ids]
    metrics = {}
    reward = TeacherKLReward(student, qwen)
    totals = reward(prompts=[""] * 4, completions=[qwen.decode(i) for i in completion_ids],
                    completion_ids=completion_ids, question=[QUESTION] * 4, solution=[SOLUTION] * 4,
                    teacher_log_probs=teacher_log_probs, log_metric=metrics.__setitem__)
    assert len(totals) == 4 and all(t == t for t in totals)  # no NaN
    assert metrics["alignment/noncanonical_frac"] == pytest.approx(1 / 4)
    assert [row["noncanonical"] for row in reward.last_scores] == [False, True, False, False]
    assert [row["question"] for row in reward.last_scores] == [QUESTION] * 4
    assert [row["solution"] for row in reward.last_scores] == [SOLUTION] * 4
