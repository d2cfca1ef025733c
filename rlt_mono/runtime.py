"""Facts about the running process, read from its environment: which rank of a launch it is, which GPUs it sees.

A data-parallel run (``placement=dp``) is started by ``rlt_mono.launch``, which sets ``LAUNCHED_ENV`` in every
rank's environment beside torch.distributed's ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; outside a launch a
process is rank 0 of 1. The GPU count comes from ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``, without creating a
CUDA context (which would fix the visible GPUs before the placement exposes its own). Nothing here imports torch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

from omegaconf import DictConfig

# Environment switches of the libraries' progress bars (huggingface_hub's downloads, and transformers' loading and
# saving bars, which follow it; datasets' map; every tqdm bar), set off a terminal for this process and its children.
PROGRESS_BAR_SWITCHES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                         "TQDM_DISABLE": "1"}
# Set in every rank's environment: the process runs its stage instead of launching ranks.
LAUNCHED_ENV = "RLT_MONO_LAUNCHED"


def in_rank() -> bool:
    """Whether this process is a rank that ``rlt_mono.launch`` started (it runs its stage instead of launching)."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def rank() -> int:
    """This process's global rank (0 outside a launch)."""
    return int(os.environ.get("RANK", "0")) if in_rank() else 0


def local_rank() -> int:
    """This process's rank on its machine: its GPU is ``cuda:<local rank>`` (0 outside a launch)."""
    return int(os.environ.get("LOCAL_RANK", "0")) if in_rank() else 0


def world_size() -> int:
    """Ranks in the run (1 outside a launch)."""
    return int(os.environ.get("WORLD_SIZE", "1")) if in_rank() else 1


def gpus_present() -> int:
    """GPUs this process may use, without creating a CUDA context: those ``CUDA_VISIBLE_DEVICES`` names when it
    is set, else those ``nvidia-smi -L`` lists (0 without it)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return len([gpu for gpu in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if gpu.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def usable_gpus(training: DictConfig, gpus_present: int) -> int:
    """The GPUs a ``placement=dp`` run's ranks use on this machine: none with ``use_cpu`` in ``training``, the group of
    the stage's training arguments (``trainer`` or ``sft``; ``rlt_mono.stages.base.Stage.trainer_group``: CPU ranks),
    else every one present."""
    return 0 if training.get("use_cpu", False) else gpus_present


def quiet_progress_bars() -> None:
    """Off a terminal (stderr a file or a pipe) switch off the libraries' progress bars, for the processes this one
    starts (a pipeline's stages, data-parallel ranks) and, when called before tqdm loads (``python -m rlt_mono``,
    ``rlt-mono``), for this one: tqdm reads its ``TQDM_*`` switches once, as it loads. Each redraw of a bar is
    ``\\r`` plus the whole bar, glued to the log lines written under it. A value the user exported is kept."""
    if not sys.stderr.isatty():
        for name, value in PROGRESS_BAR_SWITCHES.items():
            os.environ.setdefault(name, value)


def gpu_kernels_problem(group: str, use_liger_kernel, on_gpu: bool) -> str | None:
    """Why ``<group>.use_liger_kernel`` cannot run here (None: it can, or it is off): liger-kernel's Triton kernels
    need the run on a GPU (``on_gpu``: a CUDA device here and not ``<group>.use_cpu``) and the liger-kernel package
    (transformers would stop in the trainer's constructor, with a traceback)."""
    if use_liger_kernel is not True:
        return None
    if not on_gpu:
        return (f"{group}.use_liger_kernel=true runs liger-kernel's Triton kernels on a GPU, and this run has none "
                f"(no CUDA device, or {group}.use_cpu=true): set {group}.use_liger_kernel=false")
    if importlib.util.find_spec("liger_kernel") is None:
        return (f"{group}.use_liger_kernel=true needs the liger-kernel package, which is not installed: pip install "
                f"liger-kernel (or pip install -e '.[gpu]'), or set {group}.use_liger_kernel=false")
    return None


def set_wandb_env(logging_cfg: DictConfig, report_to: list[str]) -> None:
    """W&B reads its project and mode from the environment; the ``logging`` group sets them (a value the user
    exported wins)."""
    if "wandb" in report_to:
        os.environ.setdefault("WANDB_PROJECT", logging_cfg.wandb_project)
        os.environ.setdefault("WANDB_MODE", logging_cfg.wandb_mode)
