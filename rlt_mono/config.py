"""Configuration: ``RLTConfig`` (TRL's ``GRPOConfig`` plus RLT's few fields) and Hydra composition.

The Hydra tree in ``cfgs/`` has one group per concern (model, student, data, reward, trainer, placement,
logging); a run config in ``cfgs/run_cfg/`` picks one option of each. ``compose`` is the single entry used by
``launch_mono.sh`` (through ``rlt_mono.train``) and by notebooks, so both see the same configuration.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path

import trl
from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "cfgs"

if not OmegaConf.has_resolver("now"):  # Hydra registers it only inside @hydra.main
    OmegaConf.register_new_resolver("now", lambda pattern: datetime.datetime.now().strftime(pattern), use_cache=True)


@dataclass
class RLTConfig(trl.GRPOConfig):
    """``trl.GRPOConfig`` with the fields RLT adds; every GRPO setting keeps TRL's name and meaning.

    The RLT run's GRPO settings map onto TRL as: ``loss_type="grpo"``, ``scale_rewards="group"``, ``beta=0.04``,
    ``temperature=0.7``, ``sync_ref_model=True`` with ``ref_model_mixup_alpha=0.9`` every
    ``ref_model_sync_steps``, and generate-once-train-many through ``steps_per_generation``.
    """

    explanation_samples_per_step: int = field(
        default=4,
        metadata={"help": "Teacher explanations (with their reward breakdown) appended to samples.jsonl per step."},
    )
    plot_metrics: bool = field(
        default=True,
        metadata={"help": "Write reward_components.png (reward components and phase timings over steps)."},
    )
    vllm_detokenize: bool = field(
        default=False,
        metadata={
            "help": "Let vLLM detokenize completions. TRL reads only their token ids, so rlt_mono turns it off "
            "(vLLM's SamplingParams.detokenize); stop strings in generation_kwargs need it on."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.explanation_samples_per_step < 0:
            raise ValueError(
                f"explanation_samples_per_step must be >= 0, got {self.explanation_samples_per_step}"
            )
        if self.use_vllm:
            self.generation_kwargs = {"detokenize": self.vllm_detokenize, **(self.generation_kwargs or {})}
            if self.generation_kwargs.get("stop") and not self.generation_kwargs["detokenize"]:
                raise ValueError(
                    "generation_kwargs.stop holds stop strings, which vLLM matches on detokenized text: set "
                    "trainer.vllm_detokenize=true (or stop on token ids with generation_kwargs.stop_token_ids)"
                )


class ConfigError(ValueError):
    """A configuration problem the user fixes on the command line or in a YAML file."""


def resolve_run_config(name_or_path: str) -> str:
    """Map ``demo_tiny``, ``run_cfg/demo_tiny`` or ``cfgs/run_cfg/demo_tiny.yaml`` to ``run_cfg/demo_tiny``."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        resolved = path.resolve()
        try:
            relative = resolved.relative_to(CONFIG_DIR)
        except ValueError:
            raise ConfigError(f"config file {name_or_path} is not inside {CONFIG_DIR}") from None
        if not resolved.is_file():
            raise ConfigError(f"config file {name_or_path} does not exist; run configs: {available_run_configs()}")
        return str(relative.with_suffix(""))
    name = name_or_path if "/" in name_or_path else f"run_cfg/{name_or_path}"
    if not (CONFIG_DIR / f"{name}.yaml").is_file():
        raise ConfigError(f"no run config named {name_or_path!r}; available: {available_run_configs()}")
    return name


def available_run_configs() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "run_cfg").glob("*.yaml"))


def compose(name_or_path: str = "demo_tiny", overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose a run config with Hydra overrides, e.g. ``compose("demo_tiny", ["trainer.max_steps=2"])``.

    Raises:
        ConfigError: unknown config, or an override Hydra rejects (the message says which and why).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_name = resolve_run_config(name_or_path)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        message = " ".join(line.strip() for line in str(err).strip().splitlines())
        if err.__cause__ is not None:
            message += f" ({str(err.__cause__).strip().splitlines()[0]})"
        raise ConfigError(message) from err
    return cfg
