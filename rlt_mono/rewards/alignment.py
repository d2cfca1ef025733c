r"""Exact token alignment between a teacher completion and the student chat that scores it.

The explanation is the prefix of the teacher's completion up to the closing explanation tag. Its token ids are
taken *as generated* and spliced into the student chat, so the student scores exactly the tokens the teacher
produced and the KL term compares log-probs of identical ids, position by position. Everything else in the
student chat is tokenised as the tokenizer tokenises the whole chat text (the *canonical* ids):

    text        = head + explanation + tail          head: chat up to the thought tag + explanation_prefix
                                                     tail: closing thought tag, solution, end of chat
    canonical   = encode(text)
    student_ids = canonical tokens of head + explanation_ids (generated) + canonical tokens of tail

This holds when ``encode(text)`` has a token boundary at both ends of the explanation. With a BPE that merges
across them (Qwen2 turns ``>\n\n`` + ``\n`` into ``>\n\n\n``, and ``.`` + ``<|end_of_thought|>`` into ``.<`` +
...) the side whose boundary is missing is encoded on its own instead; the sample is flagged ``noncanonical``.
Joining separately encoded pieces instead would give ids the tokenizer never produces for the text (``.`` ``<``
for ``.<``; ``>`` ``\n\n`` for ``>\n\n``), an input the student was never trained on, shifting every log-prob.
Cost: one tokenizer call per completion over the whole chat, batched (``align_samples``).

The solution span holds the canonical tokens lying wholly inside the solution text. A token straddling a
solution tag (``>\n\n`` for a solution starting with ``\n\n``, ``.<`` for one ending in ``.``) belongs to
neither and is not scored, as in the original RLT code, whose token search drops the same token.

Three more cases are counted rather than silently mis-scored:
- *trimmed*: a generated token straddles the closing tag (e.g. ``".<|"``). It is dropped from the scored
  explanation; its explanation-side characters stay in the student text, at the start of the tail.
- *retokenized*: the spliced student ids do not decode back to the student chat text (a tokenizer whose
  decode is not plain concatenation, or an explanation cut inside a UTF-8 character). The explanation is then
  re-encoded from its text for both models, and the teacher log-probs of that sample are recomputed on it.
- *noncanonical*: as above; also set for a tokenizer that does not encode text byte-exactly (then every piece is
  encoded on its own).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from transformers import PreTrainedTokenizerBase

from rlt_mono.data.prompts import PromptFormat

_EXPLANATION_SLOT = "\x00EXPLANATION\x00"
_SOLUTION_SLOT = "\x00SOLUTION\x00"


@dataclass(frozen=True)
class AlignedSample:
    """One completion, ready to be scored.

    ``explanation_ids`` are the teacher tokens scored by both models; ``student_ids[explanation_span]`` equals
    them and ``student_ids[solution_span]`` are the solution tokens (tags excluded). Spans are ``[start, end)``.
    ``explanation_text`` is the thought after the prefix as the student reads it (a trimmed token's characters
    included). ``noncanonical``: a boundary of the explanation where the rest of the chat could not keep the
    tokenizer's own ids (see the module docstring).
    """

    explanation_ids: list[int]
    student_ids: list[int]
    explanation_span: tuple[int, int]
    solution_span: tuple[int, int]
    explanation_text: str
    matched: bool
    trimmed: bool
    retokenized: bool
    noncanonical: bool = False


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
    table and ``len(tokenizer)`` is not free either (timings: docs/PERFORMANCE.md, "Figures once in the code").
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
    """Render the student chat once with placeholders and split it around them: ``(head, middle, after)``.

    ``head`` ends with the opening thought tag and the explanation prefix; ``middle`` runs from the closing thought
    tag to the opening solution tag; ``after`` from the closing solution tag to the end of the chat.
    """
    text = tokenizer.apply_chat_template(
        fmt.student_messages(question, _EXPLANATION_SLOT, _SOLUTION_SLOT), tokenize=False
    )
    head, rest = text.split(_EXPLANATION_SLOT)
    middle, after = rest.split(_SOLUTION_SLOT)
    return head, middle, after


# Chats are encoded with add_special_tokens=False: the chat template writes any BOS itself (the RLT code's
# tokenizer.encode(chat) adds a second one for tokenizers that add a BOS; Qwen2 adds none).
@lru_cache(maxsize=1024)
def _encode_cached(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    """Chat pieces repeat across a GRPO group (same question and solution): encode each once."""
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(_encode_cached(tokenizer, text))


@lru_cache(maxsize=8)
def _byte_lengths(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    return tuple(len(piece) for piece in _byte_table(tokenizer))


def _token_ends(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> list[int]:
    """Byte offset where each token ends, counted from the first token's start."""
    lengths = _byte_lengths(tokenizer)
    if token_ids and max(token_ids) >= len(lengths):
        return list(accumulate(len(piece) for piece in token_bytes(tokenizer, token_ids)))
    return list(accumulate(lengths[i] for i in token_ids))


def _boundary(ends: list[int], offset: int) -> int | None:
    """Index of the first token starting at byte ``offset``, or None if a token straddles it."""
    if offset == 0:
        return 0
    index = bisect_left(ends, offset)
    return index + 1 if index < len(ends) and ends[index] == offset else None


@dataclass(frozen=True)
class _Context:
    """Token ids of the student chat around the explanation: ``head_ids`` + explanation + ``tail_ids``."""

    head_ids: list[int]
    tail_ids: list[int]
    solution_span: tuple[int, int]  # within tail_ids
    noncanonical: bool


def _context(
    tokenizer: PreTrainedTokenizerBase,
    head: str,
    body: str,
    tail: tuple[str, str, str],
    canonical: list[int] | None,
) -> _Context:
    """Canonical ids of the chat around ``body`` in ``text = head + body + before_solution + solution + after``.

    ``tail`` is ``(before_solution, solution, after)``; ``canonical`` is ``encode(text)``, or None for a tokenizer
    that does not encode text byte-exactly (e.g. its normalizer rewrites the text): then byte offsets mean nothing,
    and every piece is encoded on its own, the solution by itself so that its span is exact.
    """
    before_solution, solution, after = tail
    tail_text = before_solution + solution + after
    if canonical is None:
        parts = [_encode(tokenizer, part) for part in tail]
        solution_span = (len(parts[0]), len(parts[0]) + len(parts[1]))
        return _Context(_encode(tokenizer, head), [i for part in parts for i in part], solution_span, True)
    start = len(head.encode())
    end = start + len(body.encode())
    ends = _token_ends(tokenizer, canonical)
    first_body, first_tail = _boundary(ends, start), _boundary(ends, end)
    head_ids = canonical[:first_body] if first_body is not None else _encode(tokenizer, head)
    if first_tail is not None:
        tail_ids, tail_ends = canonical[first_tail:], [e - end for e in ends[first_tail:]]
    else:
        tail_ids = _encode(tokenizer, tail_text)
        tail_ends = _token_ends(tokenizer, tail_ids)
    solution_start = len(before_solution.encode())
    solution_span = _tokens_inside(tail_ends, solution_start, solution_start + len(solution.encode()))
    return _Context(head_ids, tail_ids, solution_span, first_body is None or first_tail is None)


def _tokens_inside(ends: list[int], start: int, end: int) -> tuple[int, int]:
    """``[first, last)`` of the tokens whose bytes lie wholly in ``[start, end)``; ``ends`` as ``_token_ends``."""
    first = 0 if start == 0 else bisect_left(ends, start) + 1  # token k starts at ends[k - 1]
    last = bisect_right(ends, end)
    return first, max(first, last)


def align_sample(
    tokenizer: PreTrainedTokenizerBase,
    fmt: PromptFormat,
    question: str,
    solution: str,
    completion_ids: list[int],
    stop_ids: set[int],
) -> AlignedSample:
    """Build the student chat for one teacher completion with exact explanation and solution spans."""
    return align_samples(tokenizer, fmt, [question], [solution], [completion_ids], stop_ids)[0]


@dataclass(frozen=True)
class _Draft:
    """A completion split into its explanation and the student chat text around it."""

    explanation_ids: list[int]
    leftover: str
    matched: bool
    trimmed: bool
    head: str
    body: str  # decode(explanation_ids)
    middle: str
    solution: str
    after: str

    @property
    def text(self) -> str:
        return self.head + self.body + self.leftover + self.middle + self.solution + self.after


def align_samples(
    tokenizer: PreTrainedTokenizerBase,
    fmt: PromptFormat,
    questions: list[str],
    solutions: list[str],
    completion_ids: list[list[int]],
    stop_ids: set[int],
) -> list[AlignedSample]:
    """``align_sample`` for a batch: the student chats are encoded in one tokenizer call (parallel in Rust)."""
    drafts = []
    for question, solution, ids in zip(questions, solutions, completion_ids, strict=True):
        explanation_ids, leftover, matched, trimmed = split_explanation(
            tokenizer, list(ids), fmt.explanation_end, stop_ids
        )
        head, middle, after = _student_template(tokenizer, fmt, question)
        body = tokenizer.decode(explanation_ids)
        drafts.append(_Draft(explanation_ids, leftover, matched, trimmed, head, body, middle, solution, after))
    encoded = _encode_batch(tokenizer, [d.text for d in drafts])
    return [_assemble(tokenizer, draft, canonical) for draft, canonical in zip(drafts, encoded, strict=True)]


def _encode_batch(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=False)["input_ids"]``; through the Rust tokenizer's offset-free batch
    call where there is one (``tokenizers`` >= 0.21; faster on long chats: docs/PERFORMANCE.md)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not texts:
        return []
    if hasattr(backend, "encode_batch_fast"):
        return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _decodes_to(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], text: str) -> bool:
    """``decode(token_ids) == text`` for a byte-level vocabulary, without a decode call."""
    return b"".join(token_bytes(tokenizer, token_ids)).decode("utf-8", errors="replace") == text


def _assemble(tokenizer: PreTrainedTokenizerBase, draft: _Draft, canonical: list[int]) -> AlignedSample:
    explanation_ids = draft.explanation_ids
    explanation_text = draft.body + draft.leftover
    text = draft.text
    tail = (draft.leftover + draft.middle, draft.solution, draft.after)
    context = _context(tokenizer, draft.head, draft.body, tail, canonical)
    student_ids = context.head_ids + explanation_ids + context.tail_ids
    retokenized = not _decodes_to(tokenizer, student_ids, text)
    if retokenized and b"".join(token_bytes(tokenizer, canonical)) != text.encode():
        canonical = None  # not a byte-exact tokenizer: the offsets used above were wrong, not the explanation
        context = _context(tokenizer, draft.head, draft.body, tail, canonical)
        student_ids = context.head_ids + explanation_ids + context.tail_ids
        retokenized = not _decodes_to(tokenizer, student_ids, text)
    if retokenized:  # the text is the same; the trimmed token's characters join the re-encoded explanation
        explanation_ids = _encode(tokenizer, explanation_text)
        context = _context(tokenizer, draft.head, explanation_text, (draft.middle, draft.solution, draft.after),
                           canonical)
        student_ids = context.head_ids + explanation_ids + context.tail_ids
    e0, e1 = len(context.head_ids), len(context.head_ids) + len(explanation_ids)
    return AlignedSample(
        explanation_ids=explanation_ids,
        student_ids=student_ids,
        explanation_span=(e0, e1),
        solution_span=(e1 + context.solution_span[0], e1 + context.solution_span[1]),
        explanation_text=explanation_text,
        matched=draft.matched,
        trimmed=draft.trimmed,
        retokenized=retokenized,
        noncanonical=context.noncanonical,
    )
