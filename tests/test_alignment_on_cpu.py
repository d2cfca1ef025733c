"""Token alignment between the teacher completion and the student chat: exact spans, edge cases."""

import pytest

from rlt_mono.data.prompts import PromptFormat, begin_tag, end_tag
from rlt_mono.rewards.alignment import align_sample, split_explanation, token_bytes

FMT = PromptFormat()
QUESTION = "Tom has 3 bags of 4 apples. How many apples?"
SOLUTION = "The answer is 12."


def _completion(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _check_spans(tokenizer, sample, explanation_text):
    student_text = tokenizer.apply_chat_template(
        FMT.student_messages(QUESTION, explanation_text, SOLUTION), tokenize=False
    )
    assert tokenizer.decode(sample.student_ids) == student_text
    e0, e1 = sample.explanation_span
    s0, s1 = sample.solution_span
    assert sample.student_ids[e0:e1] == sample.explanation_ids
    assert tokenizer.decode(sample.student_ids[s0:s1]) == SOLUTION
    assert sample.explanation_text == explanation_text
    # The student reads the thought after the explanation prefix, as the teacher wrote it after its own.
    assert tokenizer.decode(sample.student_ids[:e0]).endswith(begin_tag("thought") + FMT.explanation_prefix)
    if not sample.noncanonical:  # outside the explanation: the tokenizer's own ids for the whole text
        encoded = tokenizer(student_text, add_special_tokens=False, return_offsets_mapping=True)
        start = len(tokenizer.decode(sample.student_ids[:e0]))
        end = start + len(tokenizer.decode(sample.explanation_ids))
        kept = [i for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if b <= start or a >= end]
        assert sample.student_ids[:e0] + sample.student_ids[e1:] == kept


def _stop_ids(tokenizer):
    return {tokenizer.eos_token_id, tokenizer.pad_token_id}


def test_closed_explanation_keeps_the_generated_ids(tokenizer):
    explanation = "3 * 4 = 12. So Tom has 12 apples."
    ids = _completion(tokenizer, explanation + end_tag("explanation")) + [tokenizer.eos_token_id]
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert sample.matched and not sample.trimmed and not sample.retokenized and not sample.noncanonical
    assert sample.explanation_ids == _completion(tokenizer, explanation)
    assert sample.explanation_ids == ids[: len(sample.explanation_ids)]  # a prefix of the teacher's tokens
    _check_spans(tokenizer, sample, explanation)


def test_missing_closing_tag_scores_everything_before_eos(tokenizer):
    explanation = "3 * 4 = 12 and then"
    ids = _completion(tokenizer, explanation) + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert not sample.matched
    assert sample.explanation_ids == _completion(tokenizer, explanation)
    _check_spans(tokenizer, sample, explanation)


def test_first_closing_tag_ends_the_explanation_and_other_tags_stay_inside(tokenizer):
    explanation = f"a {end_tag('thought')} b <|begin_of_explanation|> c"
    text = explanation + end_tag("explanation") + " trailing " + end_tag("explanation")
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, _completion(tokenizer, text), _stop_ids(tokenizer))
    assert sample.matched
    assert sample.explanation_text == explanation
    _check_spans(tokenizer, sample, explanation)


def test_empty_explanation_gives_empty_span(tokenizer):
    ids = _completion(tokenizer, end_tag("explanation")) + [tokenizer.eos_token_id]
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert sample.matched and sample.explanation_ids == [] and not sample.noncanonical
    assert sample.explanation_span[0] == sample.explanation_span[1]
    _check_spans(tokenizer, sample, "")


@pytest.mark.parametrize("explanation", ["é ∑ 😀 = naïve", "  \n 3 * 4 = 12 \n\n", "\t"])
def test_unicode_and_boundary_whitespace_survive_exactly(tokenizer, explanation):
    ids = _completion(tokenizer, explanation + end_tag("explanation"))
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert sample.matched and not sample.retokenized
    _check_spans(tokenizer, sample, explanation)


def test_token_straddling_the_closing_tag_is_trimmed_and_counted(tokenizer):
    # A multi-byte vocabulary token "xyz..." followed by more text; take a closing tag that starts inside it.
    vocab = tokenizer.get_vocab()
    token_id = next(i for t, i in sorted(vocab.items(), key=lambda kv: kv[1])
                    if len(token_bytes(tokenizer, [i])[0]) >= 3 and token_bytes(tokenizer, [i])[0].isalpha())
    piece = token_bytes(tokenizer, [token_id])[0].decode()
    lead = _completion(tokenizer, "12 ")
    tail = _completion(tokenizer, "END")
    tag = piece[1:] + "END"  # begins one byte into the straddling token
    ids, leftover, matched, trimmed = split_explanation(tokenizer, lead + [token_id] + tail, tag, set())
    assert matched and trimmed
    assert ids == lead  # the straddling token is not scored
    assert leftover == piece[:1]  # its explanation-side text is kept for the student


def test_token_bytes_concatenate_to_the_text(tokenizer):
    text = "Ünïcode ✓ and 😀 bytes"
    ids = _completion(tokenizer, text)
    assert b"".join(token_bytes(tokenizer, ids)).decode() == text


def test_a_merge_across_the_prefix_is_counted(tokenizer):
    # The tags are added tokens here, so only a prefix can merge with the explanation: with a " " prefix the whole
    # text has "ĠS" where the teacher wrote "S". The teacher's ids stay, the prefix is encoded on its own, and the
    # sample is flagged (the Qwen2 cases are in test_student_format_on_cpu.py).
    fmt = PromptFormat(explanation_prefix=" ")
    explanation = "So 3 * 4 = 12"
    ids = _completion(tokenizer, explanation + end_tag("explanation"))
    sample = align_sample(tokenizer, fmt, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert sample.noncanonical and not sample.retokenized
    assert sample.explanation_ids == _completion(tokenizer, explanation)
    text = tokenizer.apply_chat_template(fmt.student_messages(QUESTION, explanation, SOLUTION), tokenize=False)
    assert tokenizer.decode(sample.student_ids) == text
    assert "ĠS" in tokenizer.convert_ids_to_tokens(_completion(tokenizer, text))
