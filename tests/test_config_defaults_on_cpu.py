"""Each default lives in one place: a YAML file sets only what differs from the file(s) it builds on (its
``defaults``). A group built into a dataclass (``rlt_mono.config.GROUP_CLASSES``) starts from that dataclass's
defaults (the ConfigStore node ``<group>/_dataclass``, read from its source); another group starts from its
``_base.yaml`` (which may itself build on another group's file: the model's on the student's); an option may build on
another option of its group (``trainer/size/tiny.yaml`` on ``trainer/demo_cpu.yaml``).

For the TRL subclasses (``RLTConfig``, ``SFTStageConfig``) the node holds only the fields rlt_mono declares: TRL's
own fields keep TRL's defaults, and the YAML names those it sets to the RLT run's values.
"""

import dataclasses
import functools
import importlib
import json

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
    declared_group_classes,
)

# The library class a group's dataclass extends: its fields are no rlt_mono default.
LIBRARY_BASES = {"trainer": trl.GRPOConfig, "sft": trl.SFTConfig}
# A run config that reads the group, and its overrides (demo_tiny where none is named).
HOSTS = {"trainer": ["demo_tiny"], "sft": ["teacher_sft", "size=tiny"], "distill": ["distill"], "eval": ["eval"],
         "data": ["demo_tiny"], "reward": ["demo_tiny"]}


def _own_defaults(group: str) -> dict:
    """The defaults of the fields rlt_mono declares in the group's dataclass, from the imported class."""
    module, _, name = GROUP_CLASSES[group].partition(":")
    fields = dataclasses.fields(getattr(importlib.import_module(module), name))
    library = {f.name for f in dataclasses.fields(LIBRARY_BASES[group])} if group in LIBRARY_BASES else set()
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in fields if f.name not in library}


def _target(group: str, entry) -> tuple[str, str] | None:
    """The config a ``defaults`` entry of a file of ``group`` names, as (its group, its name in that group):
    ``_base`` -> (group, "_base"), ``/student/_base@_here_`` -> ("student", "_base"), ``default@distill`` ->
    (group, "default"); None for ``_self_``, an override (``override /size: tiny``) or the root config (``/train``)."""
    if not isinstance(entry, str) or entry == "_self_":
        return None
    path = entry.partition("@")[0]
    if not path.startswith("/"):
        return group, path
    other, _, name = path[1:].partition("/")
    return (other, name) if name else None


def _layered_groups() -> list[str]:
    """Every config group with a file that builds on another config: its dataclass node, a _base.yaml, another
    option (not accelerate, run_cfg or size, whose files set keys outright or only pick other groups' options)."""
    return sorted(group.name for group in CONFIG_DIR.iterdir() if group.is_dir() and any(
        _target(group.name, entry) for path in group.rglob("*.yaml")
        for entry in OmegaConf.load(path).get("defaults", [])))


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


@functools.cache
def _beneath(group: str, name: str) -> dict[str, tuple[object, str]]:
    """What the configs ``<group>/<name>.yaml`` starts from give it, each key with the file that gives its value:
    the dataclass's defaults for ``_dataclass``, then the values of each file it lists (the same way down), in the
    order of its ``defaults``. Shared: read it, never change it."""
    values = {}
    for entry in OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml").get("defaults", []):
        target = _target(group, entry)
        if target is None:
            continue
        other, path = target
        if path == DATACLASS_NODE:
            source = GROUP_CLASSES[other].partition(":")[2]
            own = {**_own_defaults(other), **dict.fromkeys(LEFT_TO_OPTIONS.get(other, ()), "???")}
            values.update({key: (value, f"the dataclass {source}") for key, value in own.items()})
        else:
            own = {key: (value, f"{other}/{path}.yaml") for key, value in _own_values(other, path).items()}
            values.update({**_beneath(other, path), **own})
    return values


def _values_beneath(group: str, name: str) -> dict:
    return {key: value for key, (value, _) in _beneath(group, name).items()}


def _same(value, other) -> bool:
    """Equal, and both a bool or neither (``True == 1`` in Python, not in a config)."""
    return value == other and isinstance(value, bool) == isinstance(other, bool)


def test_the_config_tree_reads_each_dataclass_default_from_its_source():
    for group in GROUP_CLASSES:
        assert dataclass_defaults(GROUP_CLASSES[group]) == _own_defaults(group), group


def test_every_group_that_builds_on_a_base_is_checked():
    groups = _layered_groups()
    assert set(GROUP_CLASSES) | {p.parent.name for p in CONFIG_DIR.glob("*/_base.yaml")} <= set(groups)
    assert {"accelerate", "run_cfg", "size"}.isdisjoint(groups)
    assert _beneath("model", "qwen2.5_1.5b_instruct")["gguf_file"] == (None, "student/_base.yaml")
    assert _beneath("trainer", "size/tiny")["use_cpu"] == (True, "trainer/demo_cpu.yaml")


@pytest.mark.parametrize("group", _layered_groups())
def test_no_yaml_key_restates_the_value_beneath_it(group):
    """0 duplicated defaults: no base key equals the dataclass's default, no option key the value of the file(s)
    it builds on (its base, another option, another group's file)."""
    restated = [f"{group}/{name}.yaml: {key}: {json.dumps(value)} restates {beneath[key][1]} (drop the key)"
                for name in _files(group) for beneath in [_beneath(group, name)]
                for key, value in _own_values(group, name).items()
                if key in beneath and _same(beneath[key][0], value)]
    assert not restated, "\n".join(restated)


@pytest.mark.parametrize("group", _layered_groups())
def test_each_option_composes_to_the_values_beneath_it_updated_with_its_yaml(group):
    host, *overrides = HOSTS.get(group, ["demo_tiny"])
    names = [name for name in _files(group) if not name.startswith("size/")]  # size/<size>: aliases of options
    assert set(config_groups()[group]) <= set(names)
    for name in names:
        composed = OmegaConf.to_container(compose(host, [*overrides, f"{group}={name}"])[group])
        assert composed == {**_values_beneath(group, name), **_own_values(group, name)}, name
        if group in GROUP_CLASSES:  # every field rlt_mono declares can be set: key=value
            assert set(_own_defaults(group)) <= set(composed), name


@pytest.mark.parametrize("group", sorted(GROUP_CLASSES))
def test_a_file_built_on_the_dataclass_sets_none_of_its_fields(group):
    """A field rlt_mono declares has its default in the dataclass alone: the file that builds on the dataclass (a
    base, or the group's default option) sets none of them, to a different value no more than to the same one (the
    trainer and sft bases hold the RLT run's values of TRL's fields, which are no rlt_mono default)."""
    bases = [name for name in _files(group)
             if DATACLASS_NODE in OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml").get("defaults", [])]
    assert bases, group
    for name in bases:
        assert not set(_own_values(group, name)) & set(_own_defaults(group)), f"{group}/{name}.yaml"


def test_the_pipelines_settings_have_their_defaults_in_train_yaml_alone():
    from rlt_mono.stages.pipeline_steps import PipelineOptions, pipeline_options

    settings = dataclasses.fields(PipelineOptions)
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in settings)
    root = OmegaConf.load(CONFIG_DIR / "train.yaml")
    options = pipeline_options(compose("pipeline_tiny"))
    assert {f.name: getattr(options, f.name) for f in settings} == {f.name: root[f.name] for f in settings}


def test_each_group_class_declares_its_group_where_it_is_defined():
    """GROUP_CLASSES is what the classes declare (@config_group), read without importing them; imported, each class
    carries the same group."""
    assert set(GROUP_CLASSES) == {"trainer", "sft", "data", "reward", "distill", "eval"}
    for group, reference in GROUP_CLASSES.items():
        module, _, name = reference.partition(":")
        assert getattr(importlib.import_module(module), name).config_group == group


def _package(tmp_path, sources: dict[str, str]):
    package = tmp_path / "pkg"
    for name, source in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    return package


def test_group_declarations_are_found_by_module_and_class(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "@config_group('alpha')\n@dataclass\nclass Alpha:\n    x: int = 1\n",
        "sub/__init__.py": "@config.config_group('beta')\nclass Beta:\n    pass\n",
        "c.py": "@dataclass\nclass NoGroup:\n    pass\n",  # never parsed: no declaration in its text
    })
    assert declared_group_classes(package) == {"alpha": "pkg.a:Alpha", "beta": "pkg.sub:Beta"}


@pytest.mark.parametrize("sources, message", [
    ({"a.py": "@config_group('alpha')\nclass A:\n    pass\n", "b.py": "@config_group('alpha')\nclass B:\n    pass\n"},
     "config group 'alpha' declared twice: pkg.a:A and pkg.b:B"),
    ({"a.py": "NAME = 'alpha'\n@config_group(NAME)\nclass A:\n    pass\n"},
     'a.py:2: write the group out, @config_group("<group>"), so that it is read without importing the module'),
])
def test_a_group_declared_twice_or_not_written_out_is_refused(tmp_path, sources, message):
    with pytest.raises(ValueError) as caught:
        declared_group_classes(_package(tmp_path, sources))
    assert str(caught.value).endswith(message)


def test_a_default_named_by_an_imported_constant_is_read_from_its_module():
    import ast

    from rlt_mono.config import _imported_constant, compose
    from rlt_mono.study import eval_stats

    cfg = compose("eval", ["size=tiny"])
    assert (cfg.eval.confidence, cfg.eval.bootstrap_resamples) == (eval_stats.CONFIDENCE, eval_stats.RESAMPLES)
    tree = ast.parse("from rlt_mono.study.eval_stats import RESAMPLES as R\nLOCAL = 7\n")
    assert _imported_constant("R", tree, "x") == eval_stats.RESAMPLES and _imported_constant("LOCAL", tree, "x") == 7
    with pytest.raises(ValueError, match="MISSING is neither a literal constant of x nor imported"):
        _imported_constant("MISSING", tree, "x")
    with pytest.raises(ValueError, match="rlt_mono.study.eval_stats has no literal constant NOPE"):
        _imported_constant("NOPE", ast.parse("from rlt_mono.study.eval_stats import NOPE\n"), "x")
