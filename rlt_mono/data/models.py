"""Models by config group: the folder a ``model`` or ``student`` group names, and its tokenizer, config and weights.

Shared by every stage that loads a model (``rlt_mono.rl.build``, ``rlt_mono.stages.sft``, ``rlt_mono.stages.sampler``)
and by the data-parallel launcher (``rlt_mono.launch``), which makes each model's folder once before its ranks start.
A name resolves to a local folder or a hub id: ``embedded:teacher`` / ``embedded:student`` to the tiny pair built
locally (``rlt_mono.data.embedded``), a ``gguf_file`` to its dequantized folder (``rlt_mono.data.pretrained``). Each
mistake (no such folder, a run folder instead of its ``final/``, a model that cannot be loaded) is a one-line
``ConfigError`` naming the config key. transformers is imported by the functions that load, so the launcher's
module (imported by ``python -m rlt_mono.cli``) does not import torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from rlt_mono.config import ConfigError, default_cache_dir
from rlt_mono.data.embedded import embedded_model_path, is_embedded
from rlt_mono.data.pretrained import materialize
from rlt_mono.runs.checkpoints import saved_stage

logger = logging.getLogger(__name__)


def model_path(group: DictConfig, seed: int, name: str) -> str:
    """The folder or hub id to load for config group ``name`` (``model`` or ``student``), GGUF files included."""
    return resolve_model_path(group.model_name_or_path, seed, f"{name}.model_name_or_path",
                              gguf_file=group.gguf_file, dtype=group.dtype)


def resolve_model_path(name_or_path: str, seed: int, key: str = "model.model_name_or_path",
                       gguf_file: str | None = None, dtype: str = "bfloat16") -> str:
    """``embedded:teacher`` / ``embedded:student`` -> the locally built tiny pair; with ``gguf_file`` (a path or
    ``pypi:<name>``) -> its dequantized folder (``rlt_mono.data.pretrained``); a local path must exist; a hub id is
    returned unchanged."""
    if name_or_path is None:
        raise ConfigError(f"{key}=null: this stage loads that model: set {key}=<a model folder or hub id>")
    if gguf_file is not None:
        return materialize(name_or_path, gguf_file, dtype, group=key.split(".")[0])
    if is_embedded(name_or_path):
        return embedded_model_path(name_or_path, key)
    if _looks_like_path(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise ConfigError(f"{key}={name_or_path}: no such folder (a local model is a folder with config.json; "
                          "a hub id looks like org/name)")
    if _looks_like_path(name_or_path):
        folder = Path(name_or_path).expanduser()
        if not (folder / "config.json").is_file() and (folder / "final" / "config.json").is_file():
            raise ConfigError(f"{key}={name_or_path}: a run folder, not a model; its trained model is in final/: "
                              f"set {key}={folder / 'final'}")
        return str(folder)
    return name_or_path


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or Path(name).exists()


def load_tokenizer(path: str, key: str):
    """The tokenizer at ``path``, with eos as the pad token when it has none."""
    from transformers import AutoTokenizer  # here: importing transformers imports torch (see the docstring)

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        raise ConfigError(f"{key}={path}: cannot load its tokenizer ({_first_line(err)}); check the id or "
                          "folder (this machine may have no network to the model hub)") from err
    if tokenizer.pad_token is None:
        logger.info("tokenizer has no pad token: using eos %r", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_config(path: str, key: str):
    """The model config at ``path`` (no weights loaded)."""
    from transformers import AutoConfig  # here: importing transformers imports torch (see the docstring)

    try:
        return AutoConfig.from_pretrained(path)
    except OSError as err:
        raise ConfigError(f"{key}={path}: cannot load its config ({_first_line(err)}); check the id or folder "
                          "(this machine may have no network to the model hub)") from err


def load_model(path: str, key: str, **kwargs):
    """The model at ``path``; a folder or download it cannot load, or whose weights are cut short or damaged, is one
    ``ConfigError`` line naming the folder and what to do (``remake_weights``)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM  # here: importing transformers imports torch (see the docstring)

    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as err:
        raise ConfigError(f"{key}={path}: cannot load the model ({_first_line(err)}); check the id or folder "
                          "(this machine may have no network to the model hub)") from err
    except SafetensorError as err:
        raise ConfigError(f"{key}={path}: its weights cannot be read ({_first_line(err)}), a file cut short or "
                          f"damaged: {remake_weights(path)}") from err


def remake_weights(path: str) -> str:
    """What to do about the unreadable weights of model ``path``: delete what rlt_mono made in its cache (it is made
    again on next use), re-run the stage that saved a run's model, or fetch a download or a copy again."""
    folder = Path(path).expanduser()
    if not folder.is_dir():  # a hub id: the file is in the Hugging Face download cache
        return f"delete {path}'s folder in the Hugging Face hub cache ($HF_HOME/hub) so that it downloads again"
    cache, where = default_cache_dir().expanduser().resolve(), folder.resolve()
    if where.is_relative_to(cache) and where != cache:
        return (f"delete {cache / where.relative_to(cache).parts[0]} (rlt_mono made it in its cache and makes it "
                "again on next use)")
    stage = saved_stage(folder)
    if stage is not None:
        return f"re-run the {stage} stage that saved it (its run folder is {folder.parent})"
    return f"copy or save the model into {folder} again"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def stop_token_ids(model, tokenizer) -> set[int]:
    """Ids that end a completion: the generation config's eos id(s), the tokenizer's eos and pad."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id, tokenizer.pad_token_id}
    return {i for i in ids if i is not None}


def dtype_name(name: str) -> str:
    if name not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {name!r}")
    return name


def model_kwargs(model_cfg: DictConfig) -> dict:
    kwargs = {"dtype": dtype_name(model_cfg.dtype)}
    if model_cfg.get("attn_implementation"):
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    return kwargs
