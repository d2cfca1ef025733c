"""Every config mistake that can be seen in the composed config, found before torch, transformers or TRL load.

``rlt_mono.cli`` runs ``check_config`` right after composing, so a wrong key or value answers in about a second
with one line, instead of after the libraries load (tens of seconds on a busy machine). Two checks:

- **Keys.** A group read into a dataclass (``GROUP_CLASSES``) holds only that class's fields. The fields are read
  from the source files (``rlt_mono.read_source``), nothing imported: rlt_mono's own modules, and TRL's and
  transformers' files for the fields ``RLTConfig`` and ``SFTStageConfig`` inherit. A key added with
  ``+group.key=...`` to another group must be one of that group's keys. An unknown key is answered with at most
  three close names (``unknown_key``), never the whole list.
- **Values.** Every field annotated as a plain ``int``, ``float`` or ``bool`` (or that, or None) holds a value of
  that type, and the ranges the dataclasses' ``__post_init__`` check hold (``rules()``, ``CROSS_CHECKS``; their
  choices are read from the constants of the modules that own them). tests/test_first_hour_on_cpu.py keeps the
  table in step with the dataclasses: every rule is refused by its dataclass too.
- **Facts read without the libraries.** ``data.heldout_templates`` among the GSM-Symbolic templates rlt_mono
  generates (``gsm_templates``, no reasoning-gym), and the RL stage's ``model.lora_r`` within the teacher's hidden
  size where its config can be read without loading it (``check_lora_rank``).

The dataclasses check everything again when a stage builds them, with TRL's and transformers' own cross-field
checks, which only run there. A class whose fields cannot be read (a TRL or transformers release that moved them)
is logged as a warning: its unknown keys are then found only when the stage builds it.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlt_mono import runtime
from rlt_mono.config import GROUP_CLASSES, ConfigError, config_groups, dataclass_defaults, override_key
from rlt_mono.placement import MODES as PLACEMENT_MODES
from rlt_mono.placement import ROLLOUTS
from rlt_mono.read_source import dataclass_fields, module_constant
from rlt_mono.stages import STAGES

logger = logging.getLogger(__name__)

# How many close names an unknown key is answered with.
SUGGESTIONS = 3
# A plain annotation's type -> what the message says a value must be.
TYPE_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false"}


def plain_types(annotation: ast.expr) -> tuple[frozenset[str], bool] | None:
    """``({"int"}, True)`` for ``int | None`` (or ``Optional[int]``): the plain types of an annotation made only of
    int, float, bool and None, and whether None is allowed; None for any other annotation (not type-checked)."""
    names, nullable = set(), False

    def read(node: ast.expr) -> bool:
        nonlocal nullable
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return read(node.left) and read(node.right)
        if isinstance(node, ast.Constant) and node.value is None:
            nullable = True
            return True
        if isinstance(node, ast.Name) and node.id in TYPE_WORDS:
            names.add(node.id)
            return True
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id in ("Optional", "Union"):
            nullable = nullable or node.value.id == "Optional"
            members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return all(read(member) for member in members)
        return False

    return (frozenset(names), nullable) if read(annotation) and names else None


def _is_type(value: Any, name: str) -> bool:
    if name == "bool":
        return isinstance(value, bool)
    numbers = (int,) if name == "int" else (int, float)
    return isinstance(value, numbers) and not isinstance(value, bool)


# ---- the ranges the dataclasses check ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What one key's value must be: ``allows(value)`` is True for a good value (None is left to the type check);
    ``text`` ends the message ``<group>.<key> must be <text>, got <value>``."""

    allows: Callable[[Any], bool]
    text: str


def above(low: float, text: str = "") -> Rule:
    return Rule(lambda v: v > low, f"> {low}{text}")


def at_least(low: float, text: str = "") -> Rule:
    return Rule(lambda v: v >= low, f">= {low}{text}")


def one_of(choices: Iterable[str]) -> Rule:
    choices = tuple(choices)
    return Rule(lambda v: v in choices, f"one of {list(choices)}")


def one_of_constant(key: str, module: str, name: str) -> dict[str, Rule]:
    """``{key: one_of(<module>.<name>)}``, or nothing when that module has no such constant."""
    choices = module_constant(module, name)
    return {} if choices is None else {key: one_of(choices)}


def _reductions() -> tuple[str, ...]:
    return module_constant("rlt_mono.rewards.maths", "REDUCTIONS")


def _sampling_rules() -> dict[str, Rule]:
    """``SamplingOptions`` (rlt_mono.stages.sampler), shared by the distill and eval groups."""
    return {
        "temperature": at_least(0, " (0: greedy)"),
        "top_p": Rule(lambda v: 0 < v <= 1, "in (0, 1]"),
        "max_new_tokens": at_least(1),
        "rows_per_batch": at_least(1),
        "vllm_gpu_memory_utilization": Rule(lambda v: 0 < v < 1, "in (0, 1)"),
        "vllm_kv_cache_gib": above(0, " GiB (null: vLLM sizes it by profiling)"),
    }


@functools.cache
def rules() -> dict[str, dict[str, Rule]]:
    """group -> key -> ``Rule``: the single-key checks of each group's dataclass (``RLTConfig._check_ranges``,
    ``SFTStageConfig``, ``DataConfig``, ``TeacherRewardConfig``, ``SamplingOptions``, ``DistillConfig``,
    ``EvalConfig``) and of the placement group (``rlt_mono.placement``). Choices come from their home modules."""
    normalizations = module_constant("rlt_mono.rewards.maths", "NORMALIZATIONS")
    return {
        "trainer": {
            **{key: above(0) for key in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                                         "max_completion_length", "logging_steps", "save_steps",
                                         "ref_model_sync_steps", "sleep_leak_warn_gib", "temperature")},
            "num_generations": at_least(2, " (GRPO compares completions of one prompt)"),
            "steps_per_generation": at_least(1, " or null"),
            **{key: at_least(0) for key in ("beta", "learning_rate", "explanation_samples_per_step",
                                            "eval_questions", "dynamic_sampling_rounds")},
            "ref_model_mixup_alpha": Rule(lambda v: 0 <= v <= 1, "in [0, 1]"),
        },
        "sft": {
            "learning_rate": at_least(0),
            **{key: at_least(1) for key in ("per_device_train_batch_size", "per_device_eval_batch_size",
                                            "gradient_accumulation_steps")},
            "max_steps": Rule(lambda v: v >= 1 or v == -1, ">= 1 (or -1: train sft.num_train_epochs)"),
            "early_stopping_patience": at_least(0),
        },
        "data": {
            "on_bad_row": one_of(("error", "skip")),
            "on_long_row": one_of(("error", "skip")),
            **one_of_constant("row_format", "rlt_mono.data.rows", "ROW_FORMATS"),
            "max_rows": at_least(1, " or null"),
            "eval_rows": at_least(0, " or null (data.eval_fraction then applies)"),
            "eval_fraction": Rule(lambda v: 0 <= v < 1, "in [0, 1)"),
            "heldout_template_rows": at_least(1, " or null (all their rows)"),
            "heldout_templates": Rule(lambda v: isinstance(v, list | tuple) and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v),
                "a list of template numbers (whole numbers >= 0)"),
        },
        "reward": {
            "normalize_log_prob_fn": one_of(normalizations),
            "normalize_kl_fn": one_of(normalizations),
            "reduction_log_prob_fn": Rule(lambda v: all(r in _reductions() for r in v),
                                          f"reductions out of {list(_reductions())}"),
            "reduction_kl_fn": Rule(lambda v: all(r in _reductions() for r in v),
                                    f"reductions out of {list(_reductions())}"),
            "clip_log_prob": above(0, " or null (a bound <= 0 flips the sign of its term)"),
            "clip_kl": above(0, " or null (a bound <= 0 flips the sign of its term)"),
            "answer_log_prob_coeff": Rule(lambda v: all(c >= 0 for c in v), "coefficients >= 0"),
            "kl_penalty_reward_coeff": Rule(lambda v: all(c >= 0 for c in v), "coefficients >= 0"),
            "not_matched_penalty": Rule(lambda v: v <= 0, "<= 0 (a penalty)"),
            "unbias_student_log_probs_temp": above(0),
            "micro_batch_size": at_least(1),
        },
        "distill": {
            **_sampling_rules(),
            "samples_per_question": at_least(1),
            **one_of_constant("selection", "rlt_mono.stages.distill", "SELECTIONS"),
        },
        "eval": {
            **_sampling_rules(),
            **one_of_constant("split", "rlt_mono.data.rows", "SPLITS"),
            **one_of_constant("student_prompt", "rlt_mono.stages.eval", "STUDENT_PROMPTS"),
            "student_max_new_tokens": at_least(1),
            "bootstrap_resamples": at_least(1),
            "confidence": Rule(lambda v: 0 < v < 1, "in (0, 1)"),
        },
        "placement": {
            "mode": one_of(PLACEMENT_MODES),
            "rollout": one_of(ROLLOUTS),
        },
    }


def _gpu_kernels(group: str) -> Callable[[Mapping], str | None]:
    """The training group's ``use_liger_kernel`` needs a GPU and the liger-kernel package
    (``runtime.gpu_kernels_problem``, which the stage checks again when it starts)."""
    def check(values: Mapping) -> str | None:
        on_gpu = not values.get("use_cpu") and runtime.gpus_present() > 0
        return runtime.gpu_kernels_problem(group, values.get("use_liger_kernel"), on_gpu)

    return check


def _trainer_cross(values: Mapping) -> str | None:
    """``RLTConfig``'s checks of one key against another."""
    if values.get("use_liger_kernel") and (values.get("liger_kernel_config") or {}).get("fused_linear_cross_entropy"):
        return ("trainer.liger_kernel_config.fused_linear_cross_entropy=true replaces the model's forward, which TRL's "
                "fused log-prob head needs: leave it out (TRL turns it off)")
    if values.get("activation_offloading") and values.get("use_cpu"):
        return "trainer.activation_offloading moves activations from a GPU to the CPU: it needs a GPU run"
    return None


def _data_cross(values: Mapping) -> str | None:
    """``DataConfig``'s checks that depend on ``data.source``."""
    source = values.get("source")
    builtin = module_constant("rlt_mono.data.rows", "BUILTIN_SOURCES")
    if values["row_format"] != "columns" and source in builtin:
        return (f"data.row_format={values['row_format']} applies to files and hub datasets, not to the built-in "
                f"data.source={source}: set data.row_format=columns")
    if source == "embedded" and values["embedded_rows"] < 1:
        return f"data.embedded_rows must be >= 1 with data.source=embedded, got {values['embedded_rows']}"
    most = module_constant("rlt_mono.data.rows", "MAX_GSM_ITEMS_PER_TEMPLATE") or float("inf")
    if source == "gsm_symbolic" and not 1 <= values["gsm_items_per_template"] <= most:
        return (f"data.gsm_items_per_template must be in 1..{most} (each item is a generator call), got "
                f"{values['gsm_items_per_template']}")
    if values.get("heldout_templates") and source != "gsm_symbolic":
        return (f"data.heldout_templates holds out whole templates of data.source=gsm_symbolic; data.source={source} "
                "has none: set data.heldout_templates=[]")
    unknown = sorted(set(values.get("heldout_templates") or ()) - set(gsm_templates())) \
        if source == "gsm_symbolic" else []
    if unknown:  # the words of rlt_mono.data.rows, which finds it again from the rows
        return (f"data.heldout_templates: {unknown} not among the templates of data.source=gsm_symbolic (they are "
                f"{_spans(gsm_templates())}): hold out templates of that list")
    return None


# reasoning-gym's GSM-Symbolic templates are numbered 0-99 (its generate_0 ... generate_99, rlt_mono.data.gsm_symbolic).
GSM_TEMPLATE_NUMBERS = range(100)


def gsm_templates() -> list[int]:
    """The templates ``data=gsm_symbolic`` generates rows of, known without reasoning-gym: every number but those
    ``rlt_mono.data.gsm_symbolic`` leaves out (``NEEDS_FIX``, ``FLAWED_TEMPLATES``)."""
    left_out = {t for name in ("NEEDS_FIX", "FLAWED_TEMPLATES")
                for t in module_constant("rlt_mono.data.gsm_symbolic", name) or ()}
    return [t for t in GSM_TEMPLATE_NUMBERS if t not in left_out]


def _spans(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _reward_cross(values: Mapping) -> str | None:
    """``TeacherRewardConfig``: one coefficient per reduction."""
    for coeffs, reductions in (("answer_log_prob_coeff", "reduction_log_prob_fn"),
                               ("kl_penalty_reward_coeff", "reduction_kl_fn")):
        if len(values.get(coeffs, ())) != len(values.get(reductions, ())):
            return (f"reward.{coeffs} has {len(values[coeffs])} entries but reward.{reductions} has "
                    f"{len(values[reductions])}: give one coefficient per reduction")
    return None


# group -> checks of several keys at once, each returning the message of what is wrong (None: nothing).
CROSS_CHECKS: dict[str, tuple[Callable[[Mapping], str | None], ...]] = {
    "trainer": (_gpu_kernels("trainer"), _trainer_cross),
    "sft": (_gpu_kernels("sft"),),
    "data": (_data_cross,),
    "reward": (_reward_cross,),
}


# ---- the checks -----------------------------------------------------------------------------------------------
def check_config(cfg: DictConfig, overrides: Iterable[str] = ()) -> None:
    """Raise ``ConfigError`` (one line) at the first unknown key or bad value of a composed run config;
    ``overrides`` are the command's, whose ``+group.key=...`` additions are checked against the group's keys."""
    added = [o.lstrip("+").partition("=")[0] for o in overrides if o.startswith("+") and "@" not in o]
    for key in added:
        group, _, name = key.partition(".")
        if name and "." not in name and group not in GROUP_CLASSES and isinstance(cfg.get(group), DictConfig):
            known = set(cfg[group]) - {k.partition(".")[2] for k in added if k.startswith(f"{group}.")}
            if name not in known:
                raise ConfigError(unknown_key(cfg, key, known))
    stage = STAGES.get(cfg.get("stage"))
    # The group of the stage's training arguments first: a refused kernel or batch size is the first thing to fix,
    # before a data source a standalone run has to be given.
    first = stage.trainer_group if stage is not None else None
    for group in sorted(GROUP_CLASSES, key=lambda name: name != first):
        reference = GROUP_CLASSES[group]
        if not isinstance(cfg.get(group), DictConfig):
            continue
        fields = dataclass_fields(reference)
        if fields is None:
            logger.warning("the fields of %s (the %s group) could not be read from its source: an unknown %s key is "
                           "found only when the stage builds it", reference.replace(":", "."), group, group)
        else:
            for key in cfg[group]:
                if key not in fields:
                    raise ConfigError(unknown_key(cfg, f"{group}.{key}", fields))
        check_values(group, cfg[group], fields or {})
    if isinstance(cfg.get("placement"), DictConfig):
        check_values("placement", cfg.placement, {})
    if stage is not None and stage.trains_adapters and isinstance(cfg.get("model"), DictConfig):
        check_lora_rank(cfg.model)
    if isinstance(cfg.get("data"), DictConfig):
        warn_unread_data_keys(cfg.data, overrides)


# data keys that one built-in data.source alone reads -> that source.
SOURCE_KEYS = {"gsm_items_per_template": "gsm_symbolic", "gsm_solution": "gsm_symbolic"}


def warn_unread_data_keys(data: DictConfig, overrides: Iterable[str] = ()) -> None:
    """A warning naming each ``SOURCE_KEYS`` key set for a run whose ``data.source`` does not read it: given on the
    command line (``overrides``), or away from its default (``DataConfig``'s)."""
    given = {override_key(o) for o in overrides}
    defaults = dataclass_defaults(GROUP_CLASSES["data"])
    for key, source in SOURCE_KEYS.items():
        if key in data and data.source != source and (f"data.{key}" in given or data[key] != defaults[key]):
            logger.warning("data.%s=%s is ignored: only data.source=%s reads it, and this run's data.source is %s",
                           key, data[key], source, data.source)


def check_lora_rank(model: DictConfig) -> None:
    """``model.lora_r`` no larger than the teacher's hidden size when this process can read it
    (``teacher_hidden_size``), in the words of ``rlt_mono.rl.lora.check_rank_fits``, which checks it again from the
    teacher's config before its weights load. LoRA is the RL stage's option: ``rlt_mono.cli`` refuses it for a stage
    that trains nothing, ``rlt_mono.stages.sft`` for the SFT stages."""
    rank = model.get("lora_r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return  # no adapters, or a value rlt_mono.rl.lora.lora_rank refuses in its own words
    hidden = teacher_hidden_size(model)
    if hidden is not None and rank > hidden:
        raise ConfigError(f"model.lora_r={rank}: above the teacher's hidden size ({hidden}), the most an adapter's "
                          f"rank can use: set model.lora_r from 1 to {hidden} (or 0: train every weight)")


def teacher_hidden_size(model: Mapping) -> int | None:
    """The hidden size of the teacher ``model.model_name_or_path`` names, read without loading it: the
    embedded pair's (``rlt_mono.data.embedded.tiny_models.MODEL_SIZES``, built or not), or the ``config.json`` of a
    local folder or of a hub id already in the Hugging Face cache. None where it cannot be read here: a GGUF file (its
    config comes with the conversion), a hub id not downloaded yet, a path that is not a model folder (the stage says
    so)."""
    name = model.get("model_name_or_path")
    if not isinstance(name, str) or model.get("gguf_file") is not None:
        return None
    prefix = module_constant("rlt_mono.data.embedded.model_paths", "EMBEDDED_PREFIX")
    if name.startswith(prefix):
        if name.removeprefix(prefix) not in module_constant("rlt_mono.data.embedded.model_paths", "EMBEDDED_ROLES"):
            return None
        return module_constant("rlt_mono.data.embedded.tiny_models", "MODEL_SIZES")["hidden_size"]
    folder = Path(name).expanduser()
    if folder.exists():
        config = folder / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache  # here: only a hub id needs it

        try:
            found = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a hub id either (HFValidationError): the stage says what it is
            return None
        if not isinstance(found, str):  # not downloaded, or known to be missing
            return None
        config = Path(found)
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    hidden = values.get("hidden_size", (values.get("text_config") or {}).get("hidden_size"))
    return hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None


def check_values(group: str, node: DictConfig, fields: Mapping[str, ast.expr]) -> None:
    """The values of one group: unset keys, plain types from the ``fields``' annotations, ``rules()`` and
    ``CROSS_CHECKS``."""
    unset = [key for key in node if OmegaConf.is_missing(node, key)]
    if unset:
        raise ConfigError(f"{group}.{unset[0]} must be set (e.g. {group}.{unset[0]}=...)")
    try:
        values = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{group}: {str(err).strip().splitlines()[0]}") from err
    group_rules = rules().get(group, {})
    for key, value in values.items():
        if value is None:
            continue
        types = plain_types(fields[key]) if key in fields else None
        if types is not None and not any(_is_type(value, name) for name in types[0]):
            wanted = " or ".join(TYPE_WORDS[name] for name in sorted(types[0]))
            raise ConfigError(f"{group}.{key} must be {wanted}{' or null' if types[1] else ''}, got {value!r}")
        rule = group_rules.get(key)
        if rule is not None and not _allows(rule, value):
            raise ConfigError(f"{group}.{key} must be {rule.text}, got {value!r}")
    for check in CROSS_CHECKS.get(group, ()):
        problem = check(values)
        if problem is not None:
            raise ConfigError(problem)


def _allows(rule: Rule, value: Any) -> bool:
    try:
        return bool(rule.allows(value))
    except TypeError:  # a string where a number is due, a number where a list is: not allowed
        return False


def unknown_key(cfg: DictConfig, dotted: str, known: Iterable[str] | None = None) -> str:
    """The one line for ``dotted``, a key ``cfg`` does not have: up to ``SUGGESTIONS`` close names of the level
    where it goes astray (``known``: that level's names, when they are more than the config holds, e.g. the
    fields of the group's dataclass), or what that level is; a field of the dataclass that the YAML leaves out
    is added with ``+``."""
    parts = dotted.split(".")
    node, depth = cfg, 0
    while depth < len(parts) - 1 and isinstance(node, DictConfig) and isinstance(node.get(parts[depth]), DictConfig):
        node, depth = node[parts[depth]], depth + 1
    if depth == len(parts) - 1 and parts[depth] in set(known or ()) - (set(node) if isinstance(node, DictConfig)
                                                                        else set()):
        return (f"unknown key {dotted}: a field of the {parts[0]} group's dataclass that its YAML does not set "
                f"(it keeps the library's default): add it with +{dotted}=...")
    names = set(known or ()) | (set(node) if isinstance(node, DictConfig) else set())
    names.discard(parts[depth])  # a key added with +group.key=... is in the config, and no answer to itself
    close = difflib.get_close_matches(parts[depth], sorted(names), n=SUGGESTIONS)
    if close:
        heads = [".".join([*parts[:depth], name, *parts[depth + 1:]]) for name in close]
        return f"unknown key {dotted}: did you mean {_either(heads)}?"
    if depth == 0 and parts[0] in config_groups():
        stage = cfg.get("stage")
        groups = [g for g in (STAGES[stage].config_groups if stage in STAGES else ()) if g in cfg]
        return (f"unknown key {dotted}: stage {stage} has no {parts[0]} group (its groups: "
                f"{', '.join(groups) or 'none'})")
    where = ".".join(parts[:depth]) or "the run config"
    return f"unknown key {dotted}: {where} has no key {parts[depth]} and none close to it"


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
