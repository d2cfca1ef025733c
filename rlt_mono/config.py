"""Hydra composition and typed config groups, without importing torch or TRL (errors come back fast).

The Hydra tree in ``cfgs/`` has one group per concern (model, student, data, reward, trainer, placement,
logging, ...), whose options are deltas over the group's ``_base.yaml`` where it has one. The root
``cfgs/train.yaml`` picks one option per group and holds the run-level keys (stage, run_name, seed, output_dir,
run_dir, resume_from_checkpoint); a run config in ``cfgs/run_cfg/`` starts from it and states what its run changes,
among it its stage's own group (trainer, sft, distill or eval; null in the root) as the option for the run's size
(``- override /trainer: size/${size}``, ``cfgs/trainer/size/<size>.yaml``); the groups its stage does not read are
left out as it is composed (``dropped_groups``), so no run config drops one.
``compose`` is the single entry used by ``launch_mono.sh`` (through ``rlt_mono.cli``) and by notebooks, so
both see the same configuration; ``instantiate`` turns one group into its dataclass with one-line errors.

A group built into a dataclass says so where the class is, ``@config_group("trainer")``; ``GROUP_CLASSES`` is what
those declarations say, read from rlt_mono's sources. The group has its defaults in that dataclass only: they are
read from its source and stored in Hydra's ConfigStore as ``<group>/_dataclass`` (``register_group_defaults``), the
node the group's YAML files start from (``defaults: [_dataclass, _self_]``), which then set only what differs.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import difflib
import functools
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlt_mono.errors import UserError
from rlt_mono.read_source import module_constant, module_file, tree_constant

# The configs: inside the package when it is installed from a wheel (setup.py copies cfgs/ there), else the
# checkout's cfgs/ beside rlt_mono/ (an editable install, or running from the repository).
_PACKAGED = Path(__file__).resolve().parent / "cfgs"
CONFIG_DIR = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parent.parent / "cfgs"

if not OmegaConf.has_resolver("now"):  # Hydra registers it only inside @hydra.main
    OmegaConf.register_new_resolver("now", lambda pattern: datetime.datetime.now().strftime(pattern), use_cache=True)


# Folders of cfgs/ that are no config group: the run configs, and accelerate's configs for placement=dp.
NOT_GROUPS = ("run_cfg", "accelerate")
PACKAGE_DIR = Path(__file__).resolve().parent


def config_group(group: str):
    """Declare the dataclass it decorates config group ``group``'s (``cfgs/<group>/``): its fields are the group's keys,
    their defaults the group's defaults. The declaration is read from the source (``declared_group_classes``), so
    composing a config never imports the class's module (most import torch or TRL); at run time the class carries
    its group as ``config_group``."""
    def declare(cls):
        cls.config_group = group
        return cls
    return declare


def declared_group_classes(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """Each group a class of the package's sources declares with ``@config_group("<group>")``, as
    ``{group: "module:Class"}``, read with ``ast`` (a file is parsed only if its text holds the decorator's name).

    Raises:
        ValueError: a group declared twice, or a declaration whose group is not written out as a string.
    """
    found: dict[str, str] = {}
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "config_group(" not in text:
            continue
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(text, filename=str(path)).body:
            for decorator in node.decorator_list if isinstance(node, ast.ClassDef) else ():
                if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("config_group")):
                    continue
                if len(decorator.args) != 1 or not isinstance(decorator.args[0], ast.Constant) \
                        or not isinstance(decorator.args[0].value, str) or decorator.keywords:
                    raise ValueError(f"{path}:{decorator.lineno}: write the group out, @config_group(\"<group>\"), so "
                                     "that it is read without importing the module")
                group = decorator.args[0].value
                if group in found:
                    raise ValueError(f"config group {group!r} declared twice: {found[group]} and {module}:{node.name}")
                found[group] = f"{module}:{node.name}"
    return found


# The config groups built into a dataclass, {group: "module:Class"}, as their classes declare them.
GROUP_CLASSES = declared_group_classes()
# The ConfigStore node of each of those groups that holds its dataclass's defaults.
DATACLASS_NODE = "_dataclass"
# Fields the config tree leaves unset (???) whatever their dataclass default: each option of the group names its own
# value, or leaves it to the command line (data=custom), which a default beneath it would fill (OmegaConf never
# merges ??? over a value).
LEFT_TO_OPTIONS = {"data": ("source",)}

def override_key(override) -> str:
    """The dotted key a command-line override sets: ``trainer.max_steps`` of ``+trainer.max_steps=3`` (Hydra's
    ``+`` append, ``++`` force and ``~`` delete prefixes dropped)."""
    return str(override).lstrip("+~").partition("=")[0]


def default_cache_dir() -> Path:
    """Where built and downloaded artefacts live: ``$RLT_MONO_CACHE`` if set, else ``~/.cache/rlt_mono``."""
    return Path(os.environ.get("RLT_MONO_CACHE") or Path.home() / ".cache" / "rlt_mono")


class ConfigError(UserError, ValueError):
    """A configuration problem the user fixes on the command line or in a YAML file."""


def resolve_run_config(name_or_path: str) -> str:
    """Map ``demo_tiny``, ``run_cfg/demo_tiny`` or ``cfgs/run_cfg/demo_tiny.yaml`` to ``run_cfg/demo_tiny``; a run
    config file of the user's own, outside the package's configs (``~/runs/mine.yaml``), to its absolute path without
    the suffix (``compose`` reads it with the package's groups on Hydra's search path)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        resolved = path.resolve()
        if not resolved.is_file():
            raise ConfigError(f"config file {name_or_path} does not exist; run configs: {available_run_configs()}")
        if not resolved.is_relative_to(CONFIG_DIR):
            if path.suffix != ".yaml":
                raise ConfigError(f"config file {name_or_path}: a run config of your own ends in .yaml (Hydra's "
                                  "suffix)")
            return str(resolved.with_suffix(""))
        return str(resolved.relative_to(CONFIG_DIR).with_suffix(""))
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


@functools.cache
def dataclass_defaults(reference: str) -> dict[str, Any]:
    """The fields rlt_mono declares in the dataclass ``"module:Class"`` and in its rlt_mono bases, each with its
    default (``"???"`` where it has none), read from the sources with ``ast``. A library base's fields
    (``trl.GRPOConfig``'s) are left out: they keep the library's defaults, and a group's YAML names those it sets.
    The dict is shared: read it, never change it."""
    module, _, name = reference.partition(":")
    path = module_file(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise ValueError(f"{path} defines no class {name}")
    values: dict[str, Any] = {}
    for base in reversed(node.bases):  # dataclasses collect fields over the MRO from its end
        home = _rlt_mono_module(base, tree, module)
        if home is not None:
            values.update(dataclass_defaults(f"{home}:{base.id}"))
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and not any(word in ast.unparse(statement.annotation) for word in ("ClassVar", "KW_ONLY")):
            try:
                values[statement.target.id] = _field_default(statement.value, tree, module)
            except ValueError as err:
                raise ValueError(f"{reference}.{statement.target.id}: its default is no literal ({err})") from err
    return values


def _rlt_mono_module(base: ast.expr, tree: ast.Module, module: str) -> str | None:
    """The rlt_mono module that defines the base class ``base`` of a class in ``module`` (source ``tree``); None for
    a library's class (``trl.GRPOConfig``)."""
    if not isinstance(base, ast.Name):
        return None
    if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
        return module
    for statement in ast.walk(tree):
        if isinstance(statement, ast.ImportFrom) and any(alias.name == base.id for alias in statement.names):
            return statement.module if (statement.module or "").startswith("rlt_mono") else None
    return None


def _field_default(value: ast.expr | None, tree: ast.Module, module: str) -> Any:
    """A field's default from its source (``tree``, of ``module``): ``= literal``, ``= NAME`` (a module-level literal
    constant of an rlt_mono module, imported by name: a default shared with library code keeps one home),
    ``field(default=literal)``, ``field(default_factory=list)`` or ``field(default_factory=lambda: literal)``;
    ``"???"`` (OmegaConf's unset) for none."""
    if isinstance(value, ast.Name):
        return _imported_constant(value.id, tree, module)
    if not (isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field")):
        return "???" if value is None else ast.literal_eval(value)
    given = {keyword.arg: keyword.value for keyword in value.keywords}
    factory = given.get("default_factory")
    if "default" in given:
        return ast.literal_eval(given["default"])
    if isinstance(factory, ast.Lambda):
        return ast.literal_eval(factory.body)
    if isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
        return [] if factory.id == "list" else {}
    if factory is None:
        return "???"
    raise ValueError(ast.unparse(factory))


def _imported_constant(name: str, tree: ast.Module, module: str) -> Any:
    """The literal value of ``name`` as ``module`` (source ``tree``) sees it: a constant it defines or imports by
    name (``from rlt_mono.x import NAME``) from another rlt_mono module."""
    local = tree_constant(tree, name)
    if local is not None:
        return local
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlt_mono":
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    value = module_constant(node.module, alias.name)
                    if value is None:
                        raise ValueError(f"{node.module} has no literal constant {alias.name}")
                    return value
    raise ValueError(f"{name} is neither a literal constant of {module} nor imported by name from rlt_mono")


@functools.cache
def register_group_defaults() -> None:
    """Store each ``GROUP_CLASSES`` group's dataclass defaults in Hydra's ConfigStore as ``<group>/_dataclass``.
    ``compose`` calls it; so must any other use of Hydra's compose on ``CONFIG_DIR``."""
    from hydra.core.config_store import ConfigStore

    for group, reference in GROUP_CLASSES.items():
        node = {**dataclass_defaults(reference), **dict.fromkeys(LEFT_TO_OPTIONS.get(group, ()), "???")}
        ConfigStore.instance().store(group=group, name=DATACLASS_NODE, node=node)


@functools.cache
def stage_groups(stage: str) -> tuple[str, ...] | None:
    """The config groups stage ``stage`` composes from the root's options, read from its declaration
    (``STAGE = Stage(...)`` in ``rlt_mono.stages.<stage>``, never imported here): those it declares
    (``config_groups``); none for a stage that launches other runs (``steps``: the pipeline), which reads no group
    itself and composes only those a run picks, to hand them on. None for a name that is no stage module."""
    path = module_file(f"rlt_mono.stages.{stage}") if stage.isidentifier() else None
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) if path is not None else ast.Module([], [])
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if [ast.unparse(t) for t in targets] != ["STAGE"]:
            continue
        call = node.value
        declared = {keyword.arg: keyword.value for keyword in call.keywords} \
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "Stage" and not call.args else None
        if declared is None or None in declared:
            raise ConfigError(f"{path}: STAGE must be declared as Stage(name=..., ...) with keywords, so that the "
                              "config groups it composes can be read without importing it")
        if "steps" in declared:
            return ()
        try:
            return tuple(ast.literal_eval(declared["config_groups"])) if "config_groups" in declared else ()
        except ValueError:
            raise ConfigError(f"{path}: STAGE's config_groups must be written out as a tuple of names (it is read "
                              f"without importing the module), not {ast.unparse(declared['config_groups'])}") from None
    return None


def dropped_groups(config_name: str, overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The groups of the root's defaults list that run config ``config_name`` composes with ``overrides`` drops:
    each one its stage does not compose (``stage_groups``) and neither the run config's defaults list nor an
    override picks (a group that sets other groups, ``size``, is no key of its own and stays); none for a config
    without a stage (the root)."""
    picked = {override_key(o) for o in overrides}
    stage = next((o.partition("=")[2] for o in map(str, overrides) if o.lstrip("+").startswith("stage=")), None)
    run_config = OmegaConf.load(CONFIG_DIR / f"{config_name}.yaml")
    picked |= {next(iter(entry)).removeprefix("override ").strip("/") for entry in run_config.get("defaults", [])
               if isinstance(entry, DictConfig)}
    composed = stage_groups(stage or str(run_config.get("stage", "???")))
    if composed is None:
        return []
    root = OmegaConf.load(CONFIG_DIR / "train.yaml")
    groups = [(group, option) for entry in root.defaults if isinstance(entry, DictConfig)
              for group, option in entry.items()]
    return [group for group, option in groups if option is not None and group not in composed
            and group not in picked and not _sets_other_groups(group, option)]


def _sets_other_groups(group: str, option: str) -> bool:
    """Option ``option`` of ``group`` is a global file (``# @package _global_``) that picks other groups' options."""
    return (CONFIG_DIR / group / f"{option}.yaml").read_text(encoding="utf-8").startswith("# @package _global_")


def compose(name_or_path: str = "demo_tiny", overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose a run config with Hydra overrides, e.g. ``compose("demo_tiny", ["trainer.max_steps=2"])``. The groups
    its stage does not read are left out (``dropped_groups``): a run config names only what its run changes.

    Raises:
        ConfigError: unknown config, or an override Hydra rejects (the message says which and why).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_name = resolve_run_config(name_or_path)
    register_group_defaults()
    # A run config of the user's own: read from its folder, the package's groups and root config found on Hydra's
    # search path. (dropped_groups reads CONFIG_DIR / <absolute path>, which is that path.)
    own = Path(config_name).is_absolute()
    config_dir, name = (str(Path(config_name).parent), Path(config_name).name) if own else (str(CONFIG_DIR),
                                                                                            config_name)
    search = [f"hydra.searchpath=[file://{CONFIG_DIR}]"] if own else []
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            dropped = [f"~{group}" for group in dropped_groups(config_name, overrides)]
            cfg = hydra_compose(config_name=name, overrides=[*search, *dropped, *overrides])
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
