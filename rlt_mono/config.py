"""Hydra composition and typed config groups, without importing torch or TRL (errors come back fast).

The Hydra tree in ``cfgs/`` has one group per concern (model, student, data, reward, trainer, placement,
logging, ...), whose options are deltas over the group's ``_base.yaml`` where it has one. The root
``cfgs/train.yaml`` picks one option per group and holds the run-level keys (stage, run_name, seed, output_dir,
run_dir, resume_from_checkpoint); a run config in ``cfgs/run_cfg/`` starts from it and states what its run changes.
``compose`` is the single entry used by ``launch_mono.sh`` (through ``rlt_mono.cli``) and by notebooks, so
both see the same configuration; ``instantiate`` turns one group into its dataclass with one-line errors.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlt_mono.errors import UserError

# The configs: inside the package when it is installed from a wheel (setup.py copies cfgs/ there), else the
# checkout's cfgs/ beside rlt_mono/ (an editable install, or running from the repository).
_PACKAGED = Path(__file__).resolve().parent / "cfgs"
CONFIG_DIR = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parent.parent / "cfgs"

if not OmegaConf.has_resolver("now"):  # Hydra registers it only inside @hydra.main
    OmegaConf.register_new_resolver("now", lambda pattern: datetime.datetime.now().strftime(pattern), use_cache=True)


# Folders of cfgs/ that are no config group: the run configs, and accelerate's configs for placement=dp.
NOT_GROUPS = ("run_cfg", "accelerate")


def default_cache_dir() -> Path:
    """Where built and downloaded artefacts live: ``$RLT_MONO_CACHE`` if set, else ``~/.cache/rlt_mono``."""
    return Path(os.environ.get("RLT_MONO_CACHE") or Path.home() / ".cache" / "rlt_mono")


class ConfigError(UserError, ValueError):
    """A configuration problem the user fixes on the command line or in a YAML file."""


def resolve_run_config(name_or_path: str) -> str:
    """Map ``demo_tiny``, ``run_cfg/demo_tiny`` or ``cfgs/run_cfg/demo_tiny.yaml`` to ``run_cfg/demo_tiny``."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        resolved = path.resolve()
        try:
            relative = resolved.relative_to(CONFIG_DIR)
        except ValueError:
            raise ConfigError(f"config file {name_or_path} is not inside {CONFIG_DIR}; run configs: "
                              f"{available_run_configs()}") from None
        if not resolved.is_file():
            raise ConfigError(f"config file {name_or_path} does not exist; run configs: {available_run_configs()}")
        return str(relative.with_suffix(""))
    name = name_or_path if "/" in name_or_path else f"run_cfg/{name_or_path}"
    if not (CONFIG_DIR / f"{name}.yaml").is_file():
        raise ConfigError(f"no run config named {name_or_path!r}; available: {available_run_configs()}")
    return name


def available_run_configs() -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / "run_cfg").glob("*.yaml"))


def config_groups() -> dict[str, list[str]]:
    """Every config group and its options, e.g. ``{"placement": ["auto", "mono", "split"], ...}``."""
    return {
        group.name: sorted(p.stem for p in group.glob("*.yaml") if not p.stem.startswith("_"))
        for group in sorted(CONFIG_DIR.iterdir())
        if group.is_dir() and group.name not in NOT_GROUPS
    }


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


def instantiate(cls, values, group: str):
    """Build dataclass ``cls`` from config group ``group``; unknown keys, unset (``???``) keys and values the
    dataclass rejects become one-line ``ConfigError`` naming the group."""
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(values, DictConfig):
        missing = [key for key in values if OmegaConf.is_missing(values, key)]
        if missing:
            raise ConfigError(f"{group}: {', '.join(f'{group}.{k}' for k in missing)} must be set "
                              f"(e.g. {group}.{missing[0]}=...)")
        try:
            values = OmegaConf.to_container(values, resolve=True)
        except MissingMandatoryValue as err:
            raise ConfigError(f"{group}: {err.full_key} must be set") from err
    else:
        values = dict(values)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:  # a few close names, never the whole list (TRL's configs have hundreds of fields)
        close = [f"{group}.{name}" for name in difflib.get_close_matches(unknown[0], sorted(known), n=3)]
        either = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
        hint = f"did you mean {either}?" if close else f"not a field of {cls.__name__}"
        raise ConfigError(f"unknown key {group}.{unknown[0]}: {hint}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{group}: {err}") from err
