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


def _copy_with_a_new_stage(root: Path) -> None:
    for folder in ("rlt_mono", "cfgs"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "rlt_mono" / "stages" / "dummy.py").write_text(STAGE_MODULE)
    (root / "cfgs" / "dummy").mkdir()
    (root / "cfgs" / "dummy" / "default.yaml").write_text(GROUP_OPTION)
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
