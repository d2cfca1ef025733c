"""Each default lives in one place: a group built into a dataclass (``rlt_mono.config.GROUP_CLASSES``) starts from
that dataclass's defaults (the ConfigStore node ``<group>/_dataclass``, read from its source), and its YAML files
set only what differs.

For the TRL subclasses (``RLTConfig``, ``SFTStageConfig``) the node holds only the fields rlt_mono declares: TRL's
own fields keep TRL's defaults, and the YAML names those it sets to the RLT run's values.
"""

import dataclasses
import importlib

import pytest
import trl
from omegaconf import OmegaConf

from rlt_mono.config import (
    CONFIG_DIR,
    DATACLASS_NODE,
    GROUP_CLASSES,
    LEFT_TO_OPTIONS,
    compose,
    config_groups,
    dataclass_defaults,
)

# The library class a group's dataclass extends: its fields are no rlt_mono default.
LIBRARY_BASES = {"trainer": trl.GRPOConfig, "sft": trl.SFTConfig}
# A run config that reads the group, and its overrides.
HOSTS = {"trainer": ["demo_tiny"], "sft": ["teacher_sft", "size=tiny"], "distill": ["distill"], "eval": ["eval"],
         "data": ["demo_tiny"], "reward": ["demo_tiny"]}


def _own_defaults(group: str) -> dict:
    """The defaults of the fields rlt_mono declares in the group's dataclass, from the imported class."""
    module, _, name = GROUP_CLASSES[group].partition(":")
    fields = dataclasses.fields(getattr(importlib.import_module(module), name))
    library = {f.name for f in dataclasses.fields(LIBRARY_BASES[group])} if group in LIBRARY_BASES else set()
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in fields if f.name not in library}


def _files(group: str) -> list[str]:
    """Every YAML file of the group that sets keys (its base and options), as config names."""
    return sorted(str(p.relative_to(CONFIG_DIR / group).with_suffix("")) for p in (CONFIG_DIR / group).rglob("*.yaml"))


def _own_values(group: str, name: str) -> dict:
    """The keys file ``<group>/<name>.yaml`` sets for the group itself (a global file: its ``<group>`` key)."""
    path = CONFIG_DIR / group / f"{name}.yaml"
    raw = OmegaConf.load(path)
    if path.read_text().startswith("# @package _global_"):
        raw = raw.get(group, OmegaConf.create())
    return {key: value for key, value in OmegaConf.to_container(raw).items() if key != "defaults"}


def _beneath(group: str, name: str) -> dict:
    """What the configs ``<group>/<name>.yaml`` starts from give the group: the dataclass's defaults for
    ``_dataclass``, then the values of each file of the group it lists (the same way down)."""
    values = {}
    for entry in OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml").get("defaults", []):
        path = str(entry).partition("@")[0].removeprefix(f"/{group}/")
        if path == DATACLASS_NODE:
            values.update({**_own_defaults(group), **dict.fromkeys(LEFT_TO_OPTIONS.get(group, ()), "???")})
        elif path != "_self_":
            values.update({**_beneath(group, path), **_own_values(group, path)})
    return values


def test_the_config_tree_reads_each_dataclass_default_from_its_source():
    for group in GROUP_CLASSES:
        assert dataclass_defaults(GROUP_CLASSES[group]) == _own_defaults(group), group


@pytest.mark.parametrize("group", sorted(GROUP_CLASSES))
def test_no_yaml_key_restates_the_value_beneath_it(group):
    """0 duplicated defaults: no base key equals the dataclass's default, no option key its base's value."""
    restated = {f"{name}.yaml: {key}": value for name in _files(group)
                for key, value in _own_values(group, name).items()
                if key in _beneath(group, name) and _beneath(group, name)[key] == value}
    assert restated == {}


@pytest.mark.parametrize("group", sorted(GROUP_CLASSES))
def test_each_option_composes_to_the_dataclass_defaults_updated_with_its_yaml(group):
    host, *overrides = HOSTS[group]
    names = [name for name in _files(group) if not name.startswith("size/")]  # size/<size>: aliases of options
    assert set(config_groups()[group]) <= set(names)
    for name in names:
        composed = OmegaConf.to_container(compose(host, [*overrides, f"{group}={name}"])[group])
        assert composed == {**_beneath(group, name), **_own_values(group, name)}, name
        assert set(_own_defaults(group)) <= set(composed), name  # every field rlt_mono declares can be set: key=value


def test_a_stage_group_base_sets_only_library_fields():
    """The trainer and sft bases hold the RLT run's values of TRL's fields; rlt_mono's own come from the dataclass."""
    for group in LIBRARY_BASES:
        assert not set(_own_values(group, "_base")) & set(_own_defaults(group)), group
