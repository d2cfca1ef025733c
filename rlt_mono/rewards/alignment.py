"""Exact token alignment between a teacher completion and the student chat that scores it.

The explanation is the prefix of the teacher's completion up to the closing explanation tag. Its token
ids are taken *as generated* and spliced into the student chat, so the student scores exactly the tokens
the teacher produced and the KL term compares log-probs of identical ids, position by position:

    student_ids = encode(chat prefix up to the thought tag) + explanation_ids
                  + encode(rest of the thought + closing tags + opening solution tag)
                  + encode(solution) + encode(closing solution tag + end of chat)

Two cases are handled and counted rather than silently mis-scored:
- *trimmed*: a generated token straddles the closing tag (e.g. ``".<|"`` merged by BPE). It is dropped from
  the scored explanation; its explanation-side characters are re-encoded into the student suffix.
- *retokenized*: the spliced student ids do not decode back to the student chat text (a tokenizer whose
  decode is not plain concatenation). The explanation is then re-encoded from its text for both models, and
  the teacher log-probs of that sample are recomputed on the re-encoded ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from transformers import PreTrainedTokenizerBase

from rlt_mono.prompts import PromptFormat

_EXPLANATION_SLOT = "\x00EXPLANATION\x00"
_SOLUTION_SLOT = "\x00SOLUTION\x00"


@dataclass(frozen=True)
class AlignedSample:
    """One completion, ready to be scored.

    ``explanation_ids`` are the teacher tokens scored by both models; ``student_ids[explanation_span]`` equals
    them and ``student_ids[solution_span]`` are the solution tokens (tags excluded). Spans are ``[start, end)``.
    """

    explanation_ids: list[int]
    student_ids: list[int]
    explanation_span: tuple[int, int]
    solution_span: tuple[int, int]
    explanation_text: str
    matched: bool
    trimmed: bool
    retokenized: bool


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_bytes(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> list[bytes]:
    """The raw bytes each token stands for, so partial UTF-8 characters are located exactly."""
    table = _byte_table(tokenizer)
    return [table[i] if i < len(table) else tokenizer.decode([i]).encode() for i in token_ids]


@lru_cache(maxsize=8)
def _byte_table(tokenizer: PreTrainedTokenizerBase) -> tuple[bytes, ...]:
    """Bytes of every id, built once per tokenizer (ids added later fall back to ``decode``).

    Per-call lookups are slow with many added tokens: ``added_tokens_decoder`` copies the whole added-token
    table (0.4 s for a vocabulary padded with 150K added tokens) and ``len(tokenizer)`` takes 18 ms.
    """
    added = {i: t.content.encode() for i, t in tokenizer.added_tokens_decoder.items()}
    decoder = _byte_decoder()
    table = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if token_id in added:
            table.append(added[token_id])
        elif piece is not None and all(ch in decoder for ch in piece):
            table.append(bytes(decoder[ch] for ch in piece))
        else:  # not a byte-level vocabulary: fall back to decoding the token alone
            table.append(tokenizer.decode([token_id]).encode())
    return tuple(table)


def split_explanation(
    tokenizer: PreTrainedTokenizerBase, completion_ids: list[int], end_tag: str, stop_ids: set[int]
) -> tuple[list[int], str, bool, bool]:
    """Find the explanation inside a teacher completion.

    Returns ``(explanation_ids, leftover_text, matched, trimmed)``: the whole tokens before the closing tag,
    the text of a token straddling the tag that precedes it (empty unless trimmed), whether the tag was found,
    and whether a straddling token was dropped. Without the tag the whole completion, minus trailing
    end-of-sequence/padding tokens, is the explanation ("scored as if the tag were appended").
    """
    ids = list(completion_ids)
    while ids and ids[-1] in stop_ids:
        ids.pop()
    pieces = token_bytes(tokenizer, ids)
    joined = b"".join(pieces)
    tag_at = joined.find(end_tag.encode())
    if tag_at < 0:
        return ids, "", False, False
    consumed, n_tokens = 0, 0
    for piece in pieces:
        if consumed + len(piece) > tag_at:
            break
        consumed += len(piece)
        n_tokens += 1
    leftover = joined[consumed:tag_at].decode("utf-8", errors="replace")
    return ids[:n_tokens], leftover, True, consumed < tag_at


@lru_cache(maxsize=64)
def _student_template(tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat, question: str) -> tuple[str, str, str]:
    """Render the student chat once with placeholders and split it around them."""
    text = tokenizer.apply_chat_template(
        fmt.student_messages(question, _EXPLANATION_SLOT, _SOLUTION_SLOT), tokenize=False
    )
    before, rest = text.split(_EXPLANATION_SLOT)
    middle, after = rest.split(_SOLUTION_SLOT)
    return before, middle, after


@lru_cache(maxsize=1024)
def _encode_cached(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    """Chat pieces repeat across a GRPO group (same question and solution): encode each once."""
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(_encode_cached(tokenizer, text))


def align_sample(
    tokenizer: PreTrainedTokenizerBase,
    fmt: PromptFormat,
    question: str,
    solution: str,
    completion_ids: list[int],
    stop_ids: set[int],
) -> AlignedSample:
    """Build the student chat for one teacher completion with exact explanation and solution spans."""
    explanation_ids, leftover, matched, trimmed = split_explanation(
        tokenizer, completion_ids, fmt.explanation_end, stop_ids
    )
    explanation_text = tokenizer.decode(explanation_ids) + leftover
    before, middle, after = _student_template(tokenizer, fmt, question)
    expected_text = before + explanation_text + middle + solution + after
    head, solution_ids, tail = _encode(tokenizer, before), _encode(tokenizer, solution), _encode(tokenizer, after)

    def assemble(expl_ids: list[int], expl_leftover: str) -> tuple[list[int], tuple[int, int], tuple[int, int]]:
        middle_ids = _encode(tokenizer, expl_leftover + middle)
        e1 = len(head) + len(expl_ids)
        s0 = e1 + len(middle_ids)
        ids = head + expl_ids + middle_ids + solution_ids + tail
        return ids, (len(head), e1), (s0, s0 + len(solution_ids))

    student_ids, explanation_span, solution_span = assemble(explanation_ids, leftover)
    # Same test as decode(student_ids) == expected_text for a byte-level vocabulary, without a decode call.
    decoded = b"".join(token_bytes(tokenizer, student_ids)).decode("utf-8", errors="replace")
    retokenized = decoded != expected_text
    if retokenized:
        explanation_ids = _encode(tokenizer, explanation_text)
        student_ids, explanation_span, solution_span = assemble(explanation_ids, "")
    return AlignedSample(
        explanation_ids=explanation_ids,
        student_ids=student_ids,
        explanation_span=explanation_span,
        solution_span=solution_span,
        explanation_text=explanation_text,
        matched=matched,
        trimmed=trimmed,
        retokenized=retokenized,
    )
