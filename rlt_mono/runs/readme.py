"""The README of a run folder: what the run was (command, teacher, student, data, steps, mean reward at the
start and the end), what each file in the folder is, and how to resume it (``write_run_readme``).

``reward_trend`` and ``describe_trend`` (the mean reward of the first and the last steps) are shared with the
end-of-training line in the terminal.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from rlt_mono.runs.atomic_write import write_text
from rlt_mono.runs.outputs import (
    CONFIG_FILE,
    METRICS_FILE,
    PLOT_FILE,
    README_FILE,
    SAMPLES_FILE,
    STEP_EVENT,
    is_number,
    row_event,
)
from rlt_mono.runs.plots import smoothing_window

# The launcher script beside the rlt_mono package (the repository's root).
LAUNCHER = "launch_mono.sh"


class Block(NamedTuple):
    """Mean reward over consecutive steps ``first``..``last``."""

    first: int
    last: int
    mean: float


def reward_trend(steps: Sequence[int], rewards: Sequence[float]) -> tuple[Block, Block] | None:
    """Mean reward of the first and of the last block of steps, a block being the plot's smoothing window."""
    if not rewards:
        return None
    width = smoothing_window(len(rewards))
    head, tail = slice(0, width), slice(len(rewards) - width, len(rewards))
    return tuple(Block(steps[s][0], steps[s][-1], sum(rewards[s]) / width) for s in (head, tail))


def describe_trend(trend: tuple[Block, Block]) -> str:
    """``-3.020 (steps 1-7) -> -2.410 (steps 34-40)``; one block when both are the same steps."""
    first, last = trend
    return _describe_block(first) if first == last else f"{_describe_block(first)} -> {_describe_block(last)}"


def _describe_block(block: Block) -> str:
    steps = f"step {block.first}" if block.first == block.last else f"steps {block.first}-{block.last}"
    return f"{block.mean:.3f} ({steps})"


# What each file of a run folder is; checkpoints are described apart.
RUN_FILES = {
    CONFIG_FILE: "the resolved config of the run (every key, after overrides)",
    METRICS_FILE: 'one JSON row per optimizer step (`"event": "step"`: reward components, alignment, '
                  'completion lengths, phase seconds, memory) and one per finished training call '
                  '(`"event": "summary"`: runtime); `rlt_mono.runs.outputs.read_metrics` reads the step rows',
    SAMPLES_FILE: "a few teacher explanations per step with their question, solution and reward breakdown",
    PLOT_FILE: "reward components, unmatched explanations and phase seconds over steps",
    "final": "the trained teacher and its tokenizer (`AutoModelForCausalLM.from_pretrained` loads it)",
    README_FILE: "this file",
    "runs": "TensorBoard logs",
    "wandb": "Weights & Biases run files (`wandb sync` uploads an offline run)",
}
CHECKPOINT_DESCRIPTION = ("resumable checkpoint: teacher, optimizer, schedule, RNG, trainer state "
                          "(and `reference/model.safetensors` once a reference mixup has happened)")


def launch_command() -> str | None:
    """The ``launch_mono.sh`` command line of this process when it is the command-line entry
    (``python -m rlt_mono``, which ``launch_mono.sh`` runs, or ``python -m rlt_mono.cli``), else ``None`` (a notebook,
    a test), or ``rlt-mono ...`` when the console command of an installed package runs it. The launcher is named from
    the folder the process runs in: ``./launch_mono.sh`` in the repository's root, ``../../../launch_mono.sh`` for a
    pipeline's stage (run in the pipeline folder ``outputs/<run_name>/<time>``), ``rlt-mono`` outside it. A
    ``resume_from_checkpoint`` is left out: it says how this process started, not what the run is, so a resumed run
    records the command of the uninterrupted one (``resume_command`` adds it back)."""
    entry = Path(sys.argv[0])
    words = [w for w in sys.argv[1:] if not w.lstrip("+~").startswith("resume_from_checkpoint=")]
    if entry.name == "rlt-mono":  # the console command of an installed package: the same from any folder
        return shlex.join(["rlt-mono", *words])
    if entry.name not in ("cli.py", "__main__.py") or entry.parent.name != "rlt_mono":
        return None
    launcher, here = entry.resolve().parent.parent / LAUNCHER, Path.cwd().resolve()
    if not launcher.is_file() or not here.is_relative_to(launcher.parent):
        return shlex.join(["rlt-mono", *words])
    relative = os.path.relpath(launcher, here)
    return shlex.join([relative if "/" in relative else f"./{relative}", *words])


def resume_command(command: str | None, output_dir: str | Path) -> str:
    """``command`` with ``output_dir`` set to the run's folder and ``resume_from_checkpoint=true``, run from the
    folder the run was launched in (the current one, ``launch_folder``): the run's folder is written relative to it
    when it is inside it, as a pipeline records its steps, so the command still works once the tree is copied or
    moved; absolute otherwise."""
    folder = Path(output_dir).resolve()
    here = Path.cwd().resolve()
    target = [f"output_dir={folder.relative_to(here) if folder.is_relative_to(here) else folder}",
              "resume_from_checkpoint=true"]
    if command is None:
        return shlex.join([f"./{LAUNCHER}"]) + " <the run config and overrides of this run> " + shlex.join(target)
    words = [w for w in shlex.split(command)
             if not w.lstrip("+~").startswith(("output_dir=", "resume_from_checkpoint="))]
    return shlex.join([*words, *target])


def launch_folder(output_dir: str | Path) -> str:
    """Where ``resume_command`` runs, the folder the run was launched in (the current one), in words: as seen from
    the run's folder (```../../..` from this folder`` for ``outputs/<run_name>/<time>``, ```..` from this folder`` for
    a pipeline's step), or absolute when the run's folder is elsewhere."""
    folder, here = Path(output_dir).resolve(), Path.cwd().resolve()
    return f"`{os.path.relpath(here, folder)}` from this folder" if folder.is_relative_to(here) else f"`{here}`"


def write_run_readme(output_dir: str | Path, cfg_dict: Mapping, rows: Sequence[Mapping],
                     command: str | None = None) -> Path:
    """Write ``output_dir/README.md``: what the run was (command, teacher, student, data, steps, mean reward at
    the start and the end), what each file in the folder is, and how to resume.

    Args:
        cfg_dict: the resolved run config as plain containers (``OmegaConf.to_container(cfg, resolve=True)``).
        rows: the step rows of ``metrics.jsonl`` (``read_metrics``); summary rows are ignored.
        command: the command line that started the run (``launch_command()``), if known.
    """
    output_dir = Path(output_dir)
    rows = [row for row in rows if row_event(row) == STEP_EVENT]
    model, student = cfg_dict.get("model") or {}, cfg_dict.get("student") or {}
    data, trainer = cfg_dict.get("data") or {}, cfg_dict.get("trainer") or {}
    max_steps = trainer.get("max_steps")
    steps_done = max((row["step"] for row in rows), default=0)
    of_max = f" of {max_steps}" if max_steps else ""
    if (output_dir / "final").is_dir() and max_steps and steps_done < max_steps and trainer.get("max_minutes"):
        status = f"stopped by trainer.max_minutes={trainer['max_minutes']:g}; the trained teacher is in `final/`"
    elif (output_dir / "final").is_dir():
        status = "finished; the trained teacher is in `final/`"
    elif max_steps and steps_done >= max_steps:
        status = "all steps done; no `final/` (the newest checkpoint holds the teacher)"
    else:
        status = "stopped, or still running"
    rewarded = [row for row in rows if is_number(row.get("reward"))]
    trend = reward_trend([row["step"] for row in rewarded], [float(row["reward"]) for row in rewarded])
    data_source = data.get("source")
    if data_source and data.get("max_rows"):
        data_source += f" (a seeded sample of {data['max_rows']} rows)"
    facts = [
        ("command", f"`{command}`" if command else
         "not recorded (built in Python, e.g. `rlt_mono.compose(...)`); the resolved config is `config.yaml`"),
        ("run name", f"`{cfg_dict['run_name']}`" if "run_name" in cfg_dict else None),
        ("seed", cfg_dict.get("seed")),
        ("teacher (trained)", f"`{model['model_name_or_path']}`" if "model_name_or_path" in model else None),
        ("student (frozen, scores the explanations)",
         f"`{student['model_name_or_path']}`" if "model_name_or_path" in student else None),
        ("data", f"`{data_source}`" if data_source else None),
        ("steps done", f"{steps_done}{of_max}: {status}"),
    ]
    if trend is not None:
        facts.append(("mean reward", describe_trend(trend)))
    lines = [
        f"# rlt_mono run `{cfg_dict.get('run_name', output_dir.name)}`: {output_dir.name}",
        "",
        "An RLT teacher trained with GRPO: it sees a question and its solution and writes an explanation; the "
        "reward is the frozen student's log-probability of the solution after the explanation (`r_ss`) minus the "
        "teacher-student KL on the explanation (`r_kl`), with a penalty when the explanation is never closed.",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {name} | {value} |" for name, value in facts if value is not None],
        "",
        "## Files",
        "",
    ]
    entries = sorted(p for p in output_dir.iterdir() if not p.name.startswith((".", "~"))) \
        if output_dir.is_dir() else []
    names = {p.name for p in entries} | {README_FILE}
    for name in sorted(names, key=_file_order):
        path = output_dir / name
        slash = "/" if path.is_dir() else ""
        if name.startswith("checkpoint-"):
            lines.append(f"- `{name}/`: {CHECKPOINT_DESCRIPTION}")
        else:
            lines.append(f"- `{name}{slash}`" + (f": {RUN_FILES[name]}" if name in RUN_FILES else ""))
    lines += [
        "",
        "## Resume",
        "",
        f"From the newest checkpoint (rows of `metrics.jsonl` / `samples.jsonl` after it are dropped and run again), "
        f"in the folder the run was launched in ({launch_folder(output_dir)}):",
        "",
        "```bash",
        resume_command(command, output_dir),
        "```",
        "",
    ]
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / README_FILE
    write_text(path, "\n".join(lines))
    return path


def _file_order(name: str) -> tuple:
    known = list(RUN_FILES)
    if name.startswith("checkpoint-") and name.removeprefix("checkpoint-").isdigit():
        return (len(known), int(name.removeprefix("checkpoint-")), name)
    return (known.index(name) if name in known else len(known) + 1, 0, name)
