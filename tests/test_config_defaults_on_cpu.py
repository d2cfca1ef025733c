"""A dataclass's defaults are the values runs use: the root config's options and the group bases, key by key.

The root cfgs/train.yaml is composed with each stage group's base (or default option) in place of the option its
size picks, and each group is compared with the dataclass ``rlt_mono.config.instantiate`` builds from it. For the
TRL subclasses (``RLTConfig``, ``SFTStageConfig``) only the fields rlt_mono declares are compared: TRL's own
fields keep TRL's defaults on purpose (redeclaring them would shadow ``trl.GRPOConfig``), and the bases hold
the RLT run's values for them.
"""

import dataclasses

import pytest
import trl
from omegaconf import OmegaConf

from rlt_mono.config import CONFIG_DIR, compose
from rlt_mono.data.rows import DataConfig
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.stages.distill import DistillConfig
from rlt_mono.stages.eval import EvalConfig
from rlt_mono.stages.sft import SFTStageConfig

# group -> (its dataclass, the TRL class it extends or None)
GROUPS = {
    "reward": (TeacherRewardConfig, None),
    "data": (DataConfig, None),
    "distill": (DistillConfig, None),
    "eval": (EvalConfig, None),
    "trainer": (RLTConfig, trl.GRPOConfig),
    "sft": (SFTStageConfig, trl.SFTConfig),
}
# The stage groups' bases (or default option) in place of the options size=full picks.
STAGE_GROUPS = ["trainer=_base", "sft=_base", "distill=default", "eval=default"]


def _defaults(cls) -> dict:
    """Every field's default (a ``default_factory`` called)."""
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(cls)}


@pytest.fixture(scope="module")
def root():
    return compose(str(CONFIG_DIR / "train.yaml"), STAGE_GROUPS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_key_of_the_root_options_and_bases_is_the_dataclass_default(root, group):
    cls, trl_parent = GROUPS[group]
    values = {key: OmegaConf.to_container(root[group])[key] for key in root[group]
              if not OmegaConf.is_missing(root[group], key)}  # ???: each option sets it
    defaults = _defaults(cls)
    assert set(root[group]) <= set(defaults), f"{group}: keys that are no field of {cls.__name__}"
    if trl_parent is None:
        assert set(root[group]) == set(defaults), f"{group}: fields the YAML does not declare"
        compared = set(defaults)
    else:
        compared = set(defaults) - {f.name for f in dataclasses.fields(trl_parent)}
        assert compared & set(values), f"{group}: the base sets none of {sorted(compared)}"
    assert {k: values[k] for k in compared if k in values} == {k: defaults[k] for k in compared if k in values}

