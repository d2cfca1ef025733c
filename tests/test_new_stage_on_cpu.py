"""A new stage is its module, its config group, its run config and its entry in the registry, and nothing else: in a
copy of rlt_mono/ and cfgs/ with a made-up stage ``dummy`` added that way, ``python -m rlt_mono.cli dummy`` runs it
with its group's option from the command line, ``--help`` lists it, and an unknown key of its group is one line."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STAGE_MODULE = '''"""A made-up stage: it writes its message into its run folder."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlt_mono.stages.base import Stage

MESSAGE_FILE = "message.txt"


def run(cfg: DictConfig) -> Path:
    """Write ``dummy.message`` to ``<output_dir>/message.txt``; returns the run folder."""
    folder = Path(cfg.output_dir)
    (folder / MESSAGE_FILE).write_text(str(cfg.dummy.message))
    return folder


STAGE = Stage(name="dummy", run=run, config_groups=("dummy",))
'''
GROUP_OPTION = "# The message the dummy stage writes.\nmessage: hello\n"
RUN_CONFIG = """# @package _global_
# The dummy stage: it reads its own group and no other.
defaults:
  - /train
  - /dummy: default
  - _self_

stage: dummy
run_name: dummy
"""


def _add_once(text: str, after: str, added: str) -> str:
    assert text.count(after) == 1, after
    return text.replace(after, after + added)


# The same stage with its options in a dataclass: the class declares its group, the group's option builds on the
# defaults read from it and sets nothing of its own.
STAGE_MODULE_WITH_OPTIONS = STAGE_MODULE.replace(
    "from pathlib import Path\n", "from dataclasses import dataclass\nfrom pathlib import Path\n").replace(
    "from rlt_mono.stages.base import Stage\n", """from rlt_mono.config import config_group
from rlt_mono.stages.base import Stage


@config_group("dummy")
@dataclass
class DummyConfig:
    # The message the dummy stage writes.
    message: str = "hello from the dataclass"
""")
GROUP_OPTION_OVER_THE_DATACLASS = "defaults:\n  - _dataclass\n  - _self_\n"


def _copy_with_a_new_stage(root: Path, module: str = STAGE_MODULE, option: str = GROUP_OPTION) -> None:
    for folder in ("rlt_mono", "cfgs"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "rlt_mono" / "stages" / "dummy.py").write_text(module)
    (root / "cfgs" / "dummy").mkdir()
    (root / "cfgs" / "dummy" / "default.yaml").write_text(option)
    (root / "cfgs" / "run_cfg" / "dummy.yaml").write_text(RUN_CONFIG)
    registry = root / "rlt_mono" / "stages" / "__init__.py"  # its entry: the module imported, its STAGE listed
    text = _add_once(registry.read_text(), "from rlt_mono.stages import eval as evaluate\n",
                     "from rlt_mono.stages import dummy\n")
    registry.write_text(_add_once(text, "    pipeline.STAGE,\n", "    dummy.STAGE,\n"))


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m rlt_mono.cli`` of the copy in ``root`` (its folder first on the path, the current folder too)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "rlt_mono.cli", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_stage_added_as_its_module_group_run_config_and_registry_entry_runs(tmp_path):
    root = tmp_path / "copy"
    _copy_with_a_new_stage(root)
    out = tmp_path / "run"

    ran = _cli(root, "dummy", "dummy.message=written by the dummy stage", f"output_dir={out}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (out / "message.txt").read_text() == "written by the dummy stage"

    shown = _cli(root, "--help")
    lines = shown.stdout.splitlines()
    stages = lines[next(i for i, line in enumerate(lines) if line.startswith("stages (")) + 1].split()
    assert stages == ["teacher_sft", "teacher_rlt", "distill", "student_sft", "eval", "pipeline", "dummy"]
    assert "dummy" in lines[next(i for i, line in enumerate(lines) if line.startswith("run configs (")) + 1].split()

    unknown = _cli(root, "dummy", "dummy.no_such=1", f"output_dir={tmp_path / 'unknown'}")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == "error: unknown key dummy.no_such: dummy has no key no_such and none close to it\n"
    assert not (tmp_path / "unknown").exists()


def test_a_new_stages_option_dataclass_declares_its_group_and_holds_its_defaults(tmp_path):
    """Its group's defaults come from the dataclass (nothing in the YAML but the line that builds on it), and a
    misspelt key is named against the class's fields."""
    root = tmp_path / "copy"
    _copy_with_a_new_stage(root, STAGE_MODULE_WITH_OPTIONS, GROUP_OPTION_OVER_THE_DATACLASS)
    ran = _cli(root, "dummy", f"output_dir={tmp_path / 'run'}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (tmp_path / "run" / "message.txt").read_text() == "hello from the dataclass"
    misspelt = _cli(root, "dummy", "dummy.mesage=x", f"output_dir={tmp_path / 'misspelt'}")
    assert (misspelt.returncode, misspelt.stdout) == (2, "")
    assert misspelt.stderr.startswith("error: unknown key dummy.mesage"), misspelt.stderr
    assert "dummy.message" in misspelt.stderr


def test_every_stage_has_its_row_in_the_readmes_stage_table():
    """The README's stage table is the docs row a new stage adds: one row per entry of STAGES, in its order."""
    from rlt_mono.stages import STAGES

    rows = [line.split("|")[1].strip().strip("`") for line in (ROOT / "README_MONO_GPU.md").read_text().splitlines()
            if line.startswith("| `") and line.split("|")[1].strip().strip("`") in STAGES]
    assert rows == list(STAGES)
