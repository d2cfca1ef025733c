"""Command-line entry of every stage: ``python -m rlt_mono.cli <run config> [hydra overrides ...]``.

``launch_mono.sh`` and the ``rlt-mono`` console command (pyproject.toml) call this; its help and hints name the
command as it was typed (``program_name``). It composes the config and checks every key and value it can without
torch, transformers or TRL (``rlt_mono.config_check``), so a mistake in a config name, a key or a value answers in
about a second; then it exposes the GPUs the placement uses and runs the config's ``stage``. An error the user can fix
(``rlt_mono.errors.UserError``) ends the process with one line on stderr saying what to do, the last line written,
and exit code 2; anything else is a bug: a one-line summary, then the traceback, exit code 1. Off a terminal (a log
file, a pipe) the libraries draw no progress bars (``rlt_mono.runtime.quiet_progress_bars``).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from rlt_mono import config_check, launch, runtime
from rlt_mono.config import (
    ConfigError,
    available_run_configs,
    compose,
    config_groups,
    default_cache_dir,
    override_key,
)
from rlt_mono.errors import UserError
from rlt_mono.memory.planner import MODES as MEMORY_MODES
from rlt_mono.placement import PlacementError, gpus_to_expose
from rlt_mono.runs import checkpoints
from rlt_mono.runs import lock as run_lock
from rlt_mono.stages import STAGES, adapter_stages
from rlt_mono.stages.pipeline_steps import pipeline_options

logger = logging.getLogger("rlt_mono")

# launch_mono.sh sets it to its own name as typed ($0), for the help and hints (program_name).
PROG_ENV = "RLT_MONO_PROG"


def main(argv: list[str] | None = None) -> int:
    code, message = _run(argv)
    if code != 0:  # a run that stopped before writing anything leaves no empty folder
        close_training_bar()
        for folder in checkpoints.remove_unused_run_dirs():
            logger.debug("removed the empty run folder %s", folder)  # the error line stays the last
    else:
        close_process_group()
    if message:  # last, so that the error line ends the output
        sys.stderr.write(message)
    return code


def close_training_bar() -> None:
    """Close the progress bar of a run stopped in the middle of training (an error, Ctrl-C), so that the lines
    written next start under it rather than glued to its last redraw, and logging goes back to its own handlers."""
    console = sys.modules.get("rlt_mono.runs.console")  # loaded with a stage's code; no stage loaded: no bar
    if console is not None:
        console.close_open_bars()


def close_process_group() -> None:
    """End the torch.distributed group a finished GPU run leaves (accelerate starts one for TRL's colocated vLLM
    engine, or for each data-parallel rank), so the process exits without torch's warning that
    destroy_process_group() was not called. Only after success: every rank has then passed the run's last
    collective, whereas after a rank's error the others may still wait in one."""
    if "torch" not in sys.modules:  # nothing imported torch (a config error, --show-config): no group
        return
    import torch.distributed as dist  # here: only a run that loaded torch has a group to close

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _run(argv: list[str] | None) -> tuple[int, str]:
    """Run the command; returns its exit code and what is left to write on stderr (a user error's line)."""
    prog = program_name()
    args = _parser(prog).parse_intermixed_args(argv)
    # A data-parallel run's ranks after the first log warnings only: rank 0 speaks for the run.
    logging.basicConfig(level=logging.INFO if runtime.rank() == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_run_config_name(args.config, prog)
        cfg = compose_naming_unknown_keys(args.config, args.overrides)
        if args.show_config:
            sys.stdout.write(OmegaConf.to_yaml(cfg))
            return 0, ""
        check_run_keys(cfg, args.overrides)
        config_check.check_config(cfg, args.overrides)
        check_steps(cfg)
        if args.check:
            logger.info("%s: the config and its overrides pass every check a run makes before it starts",
                        args.config)
            return 0, ""
        runtime.quiet_progress_bars()
        if auto_picks_split(cfg):
            args.overrides = [o for o in args.overrides if override_key(o) != "placement"]
            args.overrides.append("placement=split")
            logger.info("placement=auto: %d GPUs visible, placement=split (data parallel over two GPUs)",
                        runtime.gpus_present())
            cfg = compose(args.config, args.overrides)
        mode = cfg.placement.mode if "placement" in cfg else "mono"
        if mode == "dp" and not runtime.in_rank():
            return launch.launch(cfg, args.config, args.overrides, runtime.gpus_present()), ""
        if mode != "dp" and "placement" in cfg:
            launch.check_dp_keys_unused(cfg)
        hold_run_folder(cfg)
        if not runtime.in_rank():  # a rank sees the GPUs its launcher exposed
            expose_gpus(exposed_mode(cfg.stage, mode))
        STAGES[cfg.stage].run(cfg)  # its code, torch with it, loads now: after every check that needs none
    except UserError as err:
        # a rank's error is printed once, by its launcher
        return err.exit_code, "" if launch.record_rank_error(err) else f"error: {err}\n"
    except KeyboardInterrupt:
        return 130, "interrupted\n"
    except Exception as err:  # a bug: say so in one line, then give the traceback for the report
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return 1, (f"rlt_mono stopped on an unexpected error (a bug, please report it with the traceback below): "
                   f"{type(err).__name__}: {first}\n{traceback.format_exc()}")
    finally:
        run_lock.release_all()
    return 0, ""


def program_name() -> str:
    """The command as the user typed it, for the help and hints: ``launch_mono.sh``'s own name (``PROG_ENV``),
    ``rlt-mono`` (the console command), else ``python -m rlt_mono`` or ``python -m rlt_mono.cli``."""
    if os.environ.get(PROG_ENV):
        return os.environ[PROG_ENV]
    path = Path(sys.argv[0])
    if path.name == "__main__.py" and path.parent.name == "rlt_mono":
        return "python -m rlt_mono"
    return "python -m rlt_mono.cli" if path.name in ("cli.py", "__main__.py", "-c", "") else path.name


def check_run_config_name(config: str, prog: str) -> None:
    """A run config given as a path that is not there (a path is read from the current folder) or by a name that
    is not one: a ``ConfigError`` saying how to run it (or the closest one) by name, which works from any folder."""
    path = Path(config)
    names = available_run_configs()
    if path.suffix in (".yaml", ".yml"):
        if path.exists():
            return
        problem = f"run config {config} not found relative to the current folder {Path.cwd()}"
        if path.stem in names:
            raise ConfigError(f"{problem}: run it by name, from any folder: {prog} {path.stem}")
    elif "/" in config or path.stem in names:
        return
    else:
        problem = f"no run config named {config!r}"
    close = difflib.get_close_matches(path.stem, names, n=config_check.SUGGESTIONS)
    hint = f"did you mean {prog} {close[0]}?" if close else f"run configs: {' '.join(names)}"
    raise ConfigError(f"{problem}; {hint}")


def check_steps(cfg) -> None:
    """Each run a stage launches (``Stage.steps``: a pipeline's steps) composed and checked as its own command line
    would be (``compose_naming_unknown_keys``, ``check_run_keys``, ``config_check.check_config``), before the stage
    starts: a typo or a value out of range in the last step's overrides is one line naming the step, not an error
    after the steps before it have run. The warnings are left to each step, which logs them when it runs."""
    steps = STAGES[cfg.stage].steps
    if steps is None:
        return
    logging.disable(logging.WARNING)
    try:
        for step, config, overrides in steps(cfg):
            try:
                step_cfg = compose_naming_unknown_keys(config, overrides)
                check_run_keys(step_cfg, overrides)
                config_check.check_config(step_cfg, overrides)
                if "placement" in step_cfg and step_cfg.placement.mode != "dp":
                    launch.check_dp_keys_unused(step_cfg)
            except UserError as err:
                raise ConfigError(f"{cfg.stage} step {step}: {err}") from err
    finally:
        logging.disable(logging.NOTSET)


def compose_naming_unknown_keys(config: str, overrides: list[str]):
    """``compose``, with Hydra's refusal of an override of a key the config does not have ("Could not override
    'trainer.max_stepz' ... not in struct") answered as ``rlt_mono.config_check.unknown_key`` answers it: the
    close keys of that group."""
    try:
        return compose(config, overrides)
    except ConfigError as err:
        found = re.search(r"Could not override '([^']+)'", str(err))
        if found is None or "not in struct" not in str(err):
            raise
        key = found[1]
        rest = [o for o in overrides if override_key(o) != key]
        raise ConfigError(config_check.unknown_key(compose_naming_unknown_keys(config, rest), key,
                                                   _dataclass_fields(key))) from None


def _dataclass_fields(dotted: str) -> list[str]:
    """The fields of the dataclass of ``dotted``'s group (``config_check.GROUP_CLASSES``), none for another key."""
    group, _, rest = dotted.partition(".")
    if group not in config_check.GROUP_CLASSES or "." in rest:
        return []
    return list(config_check.dataclass_fields(config_check.GROUP_CLASSES[group]) or ())


def hold_run_folder(cfg) -> None:
    """Name the run's folder before its stage starts (``output_dir``, or a new ``run_dir`` when it is unset, which
    the stage then uses) and hold its lock (``rlt_mono.runs.lock``) until the stage ends, so no second run writes
    into it. Not in a data-parallel rank (its launcher holds the lock), nor on any but the first machine of a
    multi-machine run (the first holds the shared folder), nor for resume_from_checkpoint=true with output_dir unset
    (the stage says to set it)."""
    if runtime.in_rank() or ("placement" in cfg and cfg.placement.machine_rank != 0):
        return
    if cfg.output_dir is None:
        if cfg.get("resume_from_checkpoint") in (True, "true"):
            return
        cfg.output_dir = str(checkpoints.new_run_dir(cfg.run_dir))
    run_lock.acquire(checkpoints.ensure_output_dir(cfg.output_dir))


def check_run_keys(cfg, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """The run-level keys of cfgs/train.yaml: ``stage`` and ``run_name`` set by the run config, an integer
    ``seed``, ``memory`` one of ``rlt_mono.memory.planner.MODES``, ``resume_from_checkpoint`` only for the stages that
    resume from a checkpoint, no LoRA option for a stage that trains nothing (``rlt_mono.stages``; an adapter option
    given in ``overrides`` where no adapter is trained is a warning, ``warn_unused_lora_options``), and no root key
    that cfgs/train.yaml does not declare, the pipeline's settings typed (``rlt_mono.stages.pipeline_steps``)."""
    for key in ("stage", "run_name"):
        if OmegaConf.is_missing(cfg, key):
            raise UserError(f"{key} is not set: the run config sets it (or add {key}=... to the command)")
    if cfg.stage not in STAGES:
        raise UserError(f"stage={cfg.stage!r} is not a stage; stages: {sorted(STAGES)}")
    stage = STAGES[cfg.stage]
    pipeline_options(cfg, stage.config_groups)  # the pipeline's settings typed; another stage warns it ignores one
    if not isinstance(cfg.get("seed"), int) or isinstance(cfg.get("seed"), bool):
        raise UserError(f"seed must be an integer, got {cfg.get('seed')!r}")
    if cfg.memory not in MEMORY_MODES:
        raise UserError(f"memory={cfg.get('memory')!r}: choose one of {', '.join(MEMORY_MODES)}")
    # Without checkpoints, a stage run again with the same output_dir continues (distill, the pipeline) or redoes
    # its results (eval): resume_from_checkpoint means nothing to it.
    if not stage.keeps_checkpoints and cfg.get("resume_from_checkpoint") not in (None, False):
        raise UserError(f"stage {cfg.stage} keeps no checkpoints: drop resume_from_checkpoint (run it again with "
                        f"output_dir=<its folder> to continue it)")
    cache = default_cache_dir()
    if cache.exists() and not cache.is_dir():
        raise UserError(f"RLT_MONO_CACHE={cache} is a file, not a folder: point it at a folder (or unset it for "
                        "~/.cache/rlt_mono)")
    report_to = (cfg.logging.get("report_to") or []) if cfg.get("logging") is not None else []
    if "wandb" in report_to and importlib.util.find_spec("wandb") is None:
        raise UserError("logging=wandb needs the wandb package, which is not installed: pip install wandb (or "
                        "choose logging=local)")
    if stage.model_groups and stage.trains is None:  # it loads models and trains none: a LoRA option is ignored
        for group in stage.model_groups:
            if cfg.get(group) is not None and (cfg[group].get("lora_r") or 0) > 0:
                raise UserError(f"{group}.lora_r={cfg[group].lora_r}: {cfg.stage} trains nothing (LoRA adapters are "
                                f"{adapter_stages()}'s option): set {group}.lora_r=0")
    warn_unused_lora_options(cfg, stage, overrides)


# The options of a model group that shape LoRA adapters: read only where the stage trains that group with lora_r > 0.
LORA_ADAPTER_OPTIONS = ("lora_alpha", "lora_dropout", "lora_target_modules")


def warn_unused_lora_options(cfg, stage, overrides: list[str] | tuple[str, ...]) -> None:
    """A warning naming each adapter option (``LORA_ADAPTER_OPTIONS``) given on the command line for a model group
    that trains no adapters: the stage trains nothing, trains another group, or its ``lora_r`` is 0."""
    given = {override_key(o) for o in overrides}
    for group in stage.model_groups:
        if cfg.get(group) is None:
            continue
        rank = cfg[group].get("lora_r") or 0
        if stage.trains != group:
            why = f"{cfg.stage} trains nothing" if stage.trains is None else f"{cfg.stage} trains {stage.trains}"
        elif not stage.trains_adapters:
            why = f"{cfg.stage} trains every weight of {group} (LoRA adapters are {adapter_stages()}'s option)"
        elif not (isinstance(rank, int) and rank > 0):
            why = f"{group}.lora_r={rank} trains every weight, no adapters (set {group}.lora_r to train adapters)"
        else:
            continue
        for key in LORA_ADAPTER_OPTIONS:
            if f"{group}.{key}" in given:
                logger.warning("%s.%s=%s is ignored: %s", group, key, cfg[group].get(key), why)


def auto_picks_split(cfg) -> bool:
    """``placement=auto`` of a stage that may split (``Stage.may_split``: the RL stage) on a GPU launcher that sees two
    or more GPUs: ``placement=split`` (the fastest two-GPU placement measured, cfgs/placement/split.yaml); on one GPU
    (or the CPU) auto is ``mono``."""
    stage = STAGES[cfg.stage]
    return ("placement" in cfg and cfg.placement.mode == "auto" and stage.may_split and not runtime.in_rank()
            and not cfg[stage.trainer_group].get("use_cpu", False) and runtime.gpus_present() >= 2)


def exposed_mode(stage: str, mode: str) -> str:
    """The placement whose GPUs a stage's process sees: its own where the stage places models (its config groups
    hold ``placement``) or runs data parallel, else ``mono``: an SFT stage shown two GPUs would train on both through
    ``nn.DataParallel``, which its warning says ``placement=student_gpu`` does not do."""
    return mode if mode == "dp" or "placement" in STAGES[stage].config_groups else "mono"


def expose_gpus(placement_mode: str) -> None:
    """Set ``CUDA_VISIBLE_DEVICES`` to the GPUs the placement uses, before anything initialises CUDA.

    A value the user exported is kept. The count comes from ``nvidia-smi -L`` (no CUDA context needed).
    """
    if "CUDA_VISIBLE_DEVICES" in os.environ or shutil.which("nvidia-smi") is None:
        return
    present = runtime.gpus_present()
    try:
        wanted = gpus_to_expose(placement_mode, present)
    except PlacementError as err:
        raise UserError(str(err)) from err
    if wanted:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(wanted))
        logger.info("placement=%s: CUDA_VISIBLE_DEVICES=%s (%d GPUs present)", placement_mode,
                    os.environ["CUDA_VISIBLE_DEVICES"], present)


def _parser(prog: str) -> argparse.ArgumentParser:
    groups = "\n".join(f"  {group:<10} {' '.join(options)}" for group, options in config_groups().items())
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one stage of rlt_mono (the stage is named by the run config).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            f"run configs (cfgs/run_cfg/, each a delta over the root config cfgs/train.yaml):\n"
            f"  {' '.join(available_run_configs())}\n\n"
            f"stages (each run config names one with its stage key; each is declared in rlt_mono.stages.<stage>):\n"
            f"  {' '.join(STAGES)}\n\n"
            f"config groups and their options (pick one with group=option, e.g. placement=split):\n{groups}\n\n"
            "keys: set any key with group.key=value (e.g. trainer.max_steps=50 reward.clip_kl=5);\n"
            f"list every key and its value with:  {prog} <run config> --show-config [overrides]\n"
            f"several GPUs (RL and SFT stages):  {prog} <run config> placement=dp [placement.num_processes=N]\n"
            f"resume a run:  {prog} <run config> output_dir=<its folder> resume_from_checkpoint=true"
        ),
    )
    parser.add_argument("config", help="run config: cfgs/run_cfg/<name>.yaml or <name>")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.max_steps=3 placement=mono")
    parser.add_argument("--show-config", action="store_true", help="print the composed config and exit")
    parser.add_argument("--check", action="store_true",
                        help="compose the config and run every check a run makes before it starts, then exit "
                             "(nothing runs, no folder is made): a script's commands checked before a long job")
    return parser


if __name__ == "__main__":
    sys.exit(main())
