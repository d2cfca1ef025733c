"""Token alignment between the teacher completion and the student chat: exact spans, edge cases."""

import pytest

from rlt_mono.prompts import PromptFormat, end_tag
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


def _stop_ids(tokenizer):
    return {tokenizer.eos_token_id, tokenizer.pad_token_id}


def test_closed_explanation_keeps_the_generated_ids(tokenizer):
    explanation = "3 * 4 = 12. So Tom has 12 apples."
    ids = _completion(tokenizer, explanation + end_tag("explanation")) + [tokenizer.eos_token_id]
    sample = align_sample(tokenizer, FMT, QUESTION, SOLUTION, ids, _stop_ids(tokenizer))
    assert sample.matched and not sample.trimmed and not sample.retokenized
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
    assert sample.matched and sample.explanation_ids == []
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
