"""A LoRA or QLoRA teacher for the RL stage (peft, bitsandbytes): fewer trained parameters, a smaller card.

``model.lora_r > 0`` trains rank-``r`` adapters on the teacher's linear layers (peft's ``LoraConfig``, handed to
TRL's ``GRPOTrainer`` as ``peft_config``) instead of every weight; ``model.load_in_4bit`` (QLoRA) also loads
those layers' base weights in 4-bit NF4 with double quantization (bitsandbytes, on the GPU). What changes:

- **Trained parameters.** A targeted linear layer ``y = W x`` becomes ``y = W x + (alpha / r) B A x`` with ``A``
  (``r x in``, random) and ``B`` (``out x r``, zero at the start, so the teacher starts as the base model).
  Gradients and optimizer state exist only for ``A`` and ``B``.
- **The reference.** TRL computes the KL reference with the adapters disabled: the base model, with no copy of
  the teacher to offload. TRL does not mix a reference into a PEFT model, so ``ref_model_sync_steps`` is off.
- **vLLM's weights.** vLLM generates from the merged weights ``W + (alpha / r) B A`` in the teacher's dtype,
  computed tensor by tensor at each weight sync (``merged_named_params``) without touching the trained model.
  TRL's own path merges the adapters into the base layers and unmerges them after the sync; on a 4-bit base
  that re-quantizes the base weights twice per sync (peft warns of the rounding), and TRL would also start vLLM
  in bitsandbytes 4-bit, whose packed weights its ``load_weights`` does not take from the trainer. rlt_mono
  keeps the 4-bit base as loaded and gives vLLM 16-bit weights (``trl_vllm.vllm_unquantized``).
- **The final teacher** (``final/``) is the merged model in the teacher's dtype, which distill and eval load
  like any other; the adapter alone is saved beside it in ``final/adapter``.

The planner's account of the memory is in ``rlt_mono.memory.model`` (``lora_params``, ``teacher_weight_bytes``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from rlt_mono.config import ConfigError

logger = logging.getLogger(__name__)

PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer"


def lora_rank(model_cfg) -> int:
    """``model.lora_r`` (0: every weight is trained), after checking every ``model.lora_*`` key and
    ``model.load_in_4bit``: a wrong value is a one-line ``ConfigError`` saying what to set. A group without LoRA keys
    (the student's: it is never trained with adapters) has rank 0; a model group has every key (cfgs/model/_base.yaml
    holds their defaults)."""
    if "lora_r" not in model_cfg:
        return 0
    rank = model_cfg["lora_r"]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ConfigError(f"model.lora_r={rank!r}: 0 (train every weight) or the adapters' rank, e.g. 16")
    four_bit = model_cfg["load_in_4bit"]
    if not isinstance(four_bit, bool):
        raise ConfigError(f"model.load_in_4bit={four_bit!r}: true or false")
    if four_bit and rank == 0:
        raise ConfigError("model.load_in_4bit=true freezes the 4-bit base weights, so only adapters can train: "
                          "set model.lora_r (e.g. model.lora_r=16)")
    alpha = model_cfg["lora_alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ConfigError(f"model.lora_alpha={alpha!r}: a positive number (the update is scaled by alpha / r)")
    dropout = model_cfg["lora_dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"model.lora_dropout={dropout!r}: a probability in [0, 1)")
    targets = model_cfg["lora_target_modules"]
    if not isinstance(targets, str) and not (_is_sequence(targets) and targets
                                             and all(isinstance(t, str) for t in targets)):
        raise ConfigError(f"model.lora_target_modules={targets!r}: all-linear or a list of module names, "
                          "e.g. [q_proj,v_proj]")
    if rank and not isinstance(targets, str) and "lm_head" in targets:  # TRL refuses it deep in the trainer
        raise ConfigError(f"model.lora_target_modules={list(targets)}: lm_head cannot carry an adapter (TRL reads "
                          "its weight directly for the log-probs): remove lm_head, e.g. [q_proj,v_proj]")
    return rank


def check_rank_fits(model_cfg, hidden_size: int) -> None:
    """``model.lora_r`` no larger than the teacher's hidden size (its config, before the weights load): a rank-``r``
    update of a ``hidden x hidden`` layer has rank at most ``hidden``, so a larger ``r`` only adds parameters."""
    rank = lora_rank(model_cfg)
    if rank > hidden_size:
        raise ConfigError(f"model.lora_r={rank}: above the teacher's hidden size ({hidden_size}), the most an "
                          f"adapter's rank can use: set model.lora_r from 1 to {hidden_size} (or 0: train every "
                          "weight)")


def check_target_modules(model_cfg, model: nn.Module) -> None:
    """Every name of a ``model.lora_target_modules`` list names a linear layer of ``model`` (the teacher, loaded),
    as peft matches it (the layer's full name, or its last parts): peft adapts the names it finds and drops the
    rest without a word. A ``ConfigError`` names the unknown ones and lists the teacher's linear layers."""
    targets = model_cfg["lora_target_modules"]
    if not lora_rank(model_cfg) or isinstance(targets, str):  # all-linear, or a regex peft matches itself
        return
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and name]
    unknown = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in linear)]
    if unknown:
        valid = sorted({name.rsplit(".", 1)[-1] for name in linear} - {"lm_head"})
        raise ConfigError(f"model.lora_target_modules={list(targets)}: {', '.join(unknown)} not among the teacher's "
                          f"linear layers; choose from {', '.join(valid)} (or all-linear)")


def _is_sequence(value) -> bool:
    from omegaconf import ListConfig

    return isinstance(value, (list, tuple, ListConfig))


def no_target_error(model_cfg, err: Exception) -> ConfigError:
    """The ``ConfigError`` for peft finding none of ``model.lora_target_modules`` in the teacher."""
    targets = model_cfg["lora_target_modules"]
    return ConfigError(f"model.lora_target_modules={targets}: {err} Use all-linear, or names of the teacher's "
                       "linear layers, e.g. [q_proj,k_proj,v_proj,o_proj]")


def peft_config(model_cfg):
    """The ``peft.LoraConfig`` of ``model.lora_*`` (None when ``model.lora_r`` is 0)."""
    rank = lora_rank(model_cfg)
    if rank == 0:
        return None
    from peft import LoraConfig

    targets = model_cfg["lora_target_modules"]
    return LoraConfig(r=rank, lora_alpha=model_cfg["lora_alpha"], lora_dropout=model_cfg["lora_dropout"],
                      target_modules=targets if isinstance(targets, str) else list(targets), task_type="CAUSAL_LM")


def quantization_kwargs(model_cfg, device: torch.device | str) -> dict:
    """``from_pretrained`` keyword arguments of ``model.load_in_4bit`` (empty when off): NF4 with double
    quantization, computing in the model's dtype, loaded straight onto ``device``. A CPU run or a missing
    bitsandbytes is a ``ConfigError`` saying what to change."""
    lora_rank(model_cfg)
    if not model_cfg["load_in_4bit"]:
        return {}
    if torch.device(device).type != "cuda":
        raise ConfigError("model.load_in_4bit=true needs a CUDA GPU (bitsandbytes 4-bit layers): set "
                          "model.load_in_4bit=false, keeping model.lora_r for a LoRA teacher")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise ConfigError("model.load_in_4bit=true needs bitsandbytes: pip install -e '.[gpu]'") from err
    from transformers import BitsAndBytesConfig

    dtype = getattr(torch, model_cfg["dtype"])
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=dtype)
    return {"quantization_config": config, "device_map": {"": str(torch.device(device))}}


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def adapters_enabled(model: nn.Module) -> bool:
    """False inside peft's ``disable_adapter()`` (TRL's reference pass on a PEFT policy); True for other models."""
    if not is_peft(model):
        return True
    return not any(layer.disable_adapters for layer in _lora_layers(model).values())


def _is_4bit(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "Params4bit"


def _dequantized(module: nn.Module) -> torch.Tensor:
    from peft.utils.integrations import dequantize_module_weight

    return dequantize_module_weight(module)


def merged_named_params(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The teacher's weights under the base model's names, one tensor at a time, in ``dtype`` (default: the
    input embedding's): each adapted layer's weight is ``W + sum over active adapters of (alpha / r) B A`` (peft's
    ``get_delta_weight``), computed in float32 from the (dequantized) base weight; 4-bit weights of layers with no
    adapter are dequantized; adapter tensors are left out. The model is not changed. A model without adapters
    yields its parameters as they are."""
    dtype = dtype or model.get_input_embeddings().weight.dtype
    layers = _lora_layers(model)
    for name, param in model.named_parameters():
        if ".lora_" in name:
            continue
        clean = name.removeprefix(PEFT_PREFIX).replace(BASE_LAYER, "")
        owner_name, _, leaf = name.rpartition(".")
        layer_name = owner_name.removesuffix(BASE_LAYER)
        layer = layers.get(layer_name) if owner_name.endswith(BASE_LAYER) else None
        if layer is not None and leaf == "weight":
            weight = _dequantized(layer.get_base_layer()).float()
            if not layer.disable_adapters and not layer.merged:
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        weight = weight + layer.get_delta_weight(adapter).float()
            yield clean, weight.to(dtype)
        elif _is_4bit(param):
            yield clean, _dequantized(model.get_submodule(owner_name)).to(dtype)
        else:
            yield clean, param.data


def save_merged(model: nn.Module, tokenizer, folder: Path) -> None:
    """Write the merged teacher (``merged_named_params``) as a plain transformers model in ``folder``:
    ``config.json`` without the quantization settings, ``model.safetensors`` and the tokenizer."""
    import safetensors.torch

    base = model.get_base_model()
    dtype = model.get_input_embeddings().weight.dtype
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous()
               for name, tensor in merged_named_params(model, dtype)}
    safetensors.torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = copy.deepcopy(base.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    config.save_pretrained(folder)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    logger.info("merged LoRA teacher (%d tensors, %s) saved to %s", len(tensors), dtype, folder)
