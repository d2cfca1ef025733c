"""Where a run lives and how it comes back: one output folder per run, verified checkpoints, resume checks.

A checkpoint is written into a hidden staging folder (``.partial-checkpoint-N``) and renamed to
``checkpoint-N`` only once every file, ``MANIFEST`` last, is on disk: a crash or a full disk during a save
leaves no ``checkpoint-N`` that could be picked for a resume. The manifest lists every file with its size, so
a truncated or missing optimizer, scheduler or RNG file is found before transformers tries to load it.
Nothing here imports torch: the checks run before any model loads.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlt_mono import runtime
from rlt_mono.config import ConfigError
from rlt_mono.errors import RunInterrupted, UserError
from rlt_mono.runs import atomic_write
from rlt_mono.runs.atomic_write import check_free_space, write_error

logger = logging.getLogger(__name__)

MANIFEST = "rlt_mono_checkpoint.json"
# The running totals a trainer keeps in memory only, saved beside each checkpoint so that a resumed run reports what
# the uninterrupted one would: the training loss summed over the steps so far (transformers' final train_loss is
# that sum over the steps, and restarts at 0 in a resumed process), and TRL's SFT token count (num_tokens).
COUNTERS = "rlt_mono_counters.json"
STAGING_PREFIX = ".partial-"
TRAINER_STATE = "trainer_state.json"
# What a resume needs beyond the weights: without them transformers continues silently with a fresh
# optimizer, a restarted schedule or unrestored RNG, and the run diverges from the uninterrupted one.
# transformers writes rng_state.pth in a one-process run, rng_state_<rank>.pth per rank in a data-parallel one.
TRAINING_STATE_FILES = ("optimizer.pt", "scheduler.pt", TRAINER_STATE)
# FSDP (placement.strategy=fsdp2) saves the optimizer through accelerate, as optimizer.bin, instead of optimizer.pt,
# and the whole model a second time, as pytorch_model_fsdp.bin: the copy a resume loads.
FSDP_OPTIMIZER = "optimizer.bin"
FSDP_MODEL = "pytorch_model_fsdp.bin"
RNG_FILE = "rng_state.pth"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "adapter_model.safetensors")
# Files of a run folder that mean a run already wrote there.
RUN_MARKERS = ("metrics.jsonl", "samples.jsonl", "config.yaml")
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(UserError):
    """A checkpoint that cannot be resumed from, or a run folder that cannot be used; says what to do."""


# ---- run folders -----------------------------------------------------------------------------------
# Run folders this process made (new_run_dir, ensure_output_dir), for remove_unused_run_dirs.
_made_run_dirs: list[Path] = []


def remove_unused_run_dirs() -> list[Path]:
    """Remove the run folders this process made that are still empty (a run that stopped before writing anything,
    e.g. on a wrong model path, leaves no folder behind); returns those removed. A folder with anything in it
    stays."""
    removed = []
    for folder in _made_run_dirs:
        with contextlib.suppress(OSError):  # not empty (the run wrote into it), or gone already
            folder.rmdir()
            removed.append(folder)
    _made_run_dirs.clear()
    return removed


def new_run_dir(run_dir: str | Path) -> Path:
    """Create and return the fresh folder ``run_dir`` (the config's ``run_dir``, e.g.
    ``outputs/<run_name>/<date_time>``), its parents included. When it exists already (two runs started in the
    same second) the run gets ``<run_dir>_2``, ``_3``, ...: ``mkdir`` without ``exist_ok`` is atomic, so no two
    processes share one."""
    run_dir = Path(run_dir)
    _make_dir(run_dir.parent, "the outputs folder")
    for attempt in range(1, 1000):
        folder = run_dir if attempt == 1 else run_dir.with_name(f"{run_dir.name}_{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as err:  # a read-only disk or a folder not ours: no variant of the name can be made either
            raise _cannot_create(folder, f"run_dir={run_dir}", err) from err
        _made_run_dirs.append(folder)
        return folder
    raise CheckpointError(f"{run_dir} and 998 variants of it exist: set output_dir=<a new folder>")


def previous_run_files(output_dir: str | Path) -> list[str]:
    """Names of the files and checkpoints a previous run left in ``output_dir`` (empty: the folder is free)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [name for name in RUN_MARKERS if (folder / name).exists()]
    return found + sorted(p.name for p in folder.iterdir() if _CHECKPOINT_NAME.match(p.name))


def check_fresh_output_dir(output_dir: str | Path) -> None:
    """Refuse to start a new run in a folder another run wrote (its metrics would be mixed with ours)."""
    found = previous_run_files(output_dir)
    if found and last_complete_checkpoint(output_dir):
        raise CheckpointError(
            f"output_dir={output_dir} already holds a run ({', '.join(found[:4])}): continue it with "
            "resume_from_checkpoint=true, or start a new one in another output_dir (or leave output_dir unset)"
        )
    if found:
        raise CheckpointError(
            f"output_dir={output_dir} already holds a run ({', '.join(found[:4])}) that saved no complete checkpoint, "
            "so it cannot be resumed: start the new run in another output_dir (or leave output_dir unset)"
        )
    ensure_output_dir(output_dir)


def ensure_output_dir(output_dir: str | Path) -> Path:
    """Create ``output_dir`` if it is missing; one-line errors when it is a file or cannot be created. The folders
    it makes (``output_dir`` and its missing parents) are removed again while empty, as ``new_run_dir``'s are
    (``remove_unused_run_dirs``): a run refused before it writes anything leaves the disk as it was."""
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"output_dir={output_dir} is a file, not a folder: choose another output_dir")
    made = [path for path in (folder, *folder.parents) if not path.exists()]  # the deepest first
    _make_dir(folder, f"output_dir={output_dir}")
    _made_run_dirs.extend(made)
    return folder


def resolve_output_dir(output_dir: str | None, run_dir: str, *, resuming: bool, resume_from_checkpoint=None) -> Path:
    """The run's folder: ``output_dir``, or when it is unset a new folder ``run_dir`` (the config's
    ``outputs/<run_name>/<time>``, made unique: ``new_run_dir``); an existing folder only to resume. In a
    data-parallel rank ``output_dir`` as given: its launcher made or checked the folder (``rlt_mono.launch``)."""
    if runtime.in_rank():
        return Path(output_dir)
    if output_dir is None:
        if resume_from_checkpoint is True or resume_from_checkpoint == "true":
            raise ConfigError(
                "resume_from_checkpoint=true resumes from the newest checkpoint in output_dir, but output_dir is "
                "null (a new folder each run): set output_dir=<the run's folder>, or "
                "resume_from_checkpoint=<checkpoint path>"
            )
        return new_run_dir(run_dir)
    if not resuming:
        check_fresh_output_dir(output_dir)
    return Path(output_dir)


def _make_dir(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _cannot_create(folder, what, err) from err


def _cannot_create(folder: Path, what: str, err: OSError) -> CheckpointError:
    return CheckpointError(f"{what}: cannot create {folder} ({err.strerror or err}): choose a folder you can write "
                           "to (output_dir=...)")


# ---- checkpoints -----------------------------------------------------------------------------------
def checkpoint_step(folder: str | Path) -> int | None:
    match = _CHECKPOINT_NAME.match(Path(folder).name)
    return int(match.group(1)) if match else None


def rng_files(world_size: int) -> list[str]:
    """The RNG files a checkpoint of a run with ``world_size`` ranks holds."""
    return [RNG_FILE] if world_size == 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]


def saved_world_size(folder: str | Path) -> int | None:
    """How many ranks saved a checkpoint, read from its RNG files (None: no RNG file)."""
    folder = Path(folder)
    if (folder / RNG_FILE).is_file():
        return 1
    ranks = [p for p in folder.glob("rng_state_*.pth") if p.stem.split("_")[-1].isdigit()]
    return len(ranks) or None


def write_manifest(folder: str | Path, step: int, stage: str | None = None) -> None:
    """Record every file of a finished checkpoint with its size, and the stage that wrote it (``stage``), fsync
    them, then write the manifest."""
    folder = Path(folder)
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[str(path.relative_to(folder))] = path.stat().st_size
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"step": step, "stage": stage, "files": files}, indent=1))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(folder / MANIFEST)


def publish(staging: str | Path, final: str | Path) -> None:
    """Rename a finished staging folder to its checkpoint name (replacing an older folder of the same step)."""
    staging, final = Path(staging), Path(final)
    if final.exists():
        shutil.rmtree(final)
    atomic_write.publish(staging, final)


def remove_stale_staging(output_dir: str | Path) -> None:
    """Delete half-written staging folders a crashed save left behind."""
    folder = Path(output_dir)
    if folder.is_dir():
        for stale in folder.glob(f"{STAGING_PREFIX}*"):
            logger.warning("removing %s, a checkpoint whose save did not finish", stale)
            shutil.rmtree(stale, ignore_errors=True)


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why ``folder`` cannot be resumed from, or None when it is complete."""
    folder = Path(folder)
    if not folder.is_dir():
        return "no such folder"
    manifest = folder / MANIFEST
    if manifest.exists():
        try:
            files = json.loads(manifest.read_text())["files"]
        except (ValueError, KeyError):
            return f"its {MANIFEST} is unreadable"
        for name, size in files.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} were written (truncated or changed)"
    world_size = saved_world_size(folder)
    state_files = list(TRAINING_STATE_FILES)
    if (folder / FSDP_OPTIMIZER).is_file():  # an FSDP checkpoint: accelerate's optimizer file and its model copy
        state_files[state_files.index("optimizer.pt")] = FSDP_OPTIMIZER
        state_files.append(FSDP_MODEL)
    missing = [name for name in (*state_files, *rng_files(world_size or 1)) if not (folder / name).is_file()]
    if missing:
        return f"{', '.join(missing)} missing (a resume needs the optimizer, scheduler, RNG and trainer state)"
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return "no model weights"
    if not manifest.exists():
        logger.warning("%s has no %s (written before verified checkpoints): its file sizes cannot be checked",
                       folder, MANIFEST)
    return None


def saved_stage(folder: str | Path) -> str | None:
    """The stage that wrote a checkpoint: recorded in its manifest, or (a checkpoint saved before manifests
    recorded it) the ``stage`` of its run folder's ``config.yaml``; None when neither says."""
    folder = Path(folder)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no manifest, or not a JSON object
        stage = json.loads((folder / MANIFEST).read_text()).get("stage")
        if stage is not None:
            return stage
    import yaml  # here: only a resume of an older checkpoint reads its run's config

    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
        stage = yaml.safe_load((folder.parent / "config.yaml").read_text()).get("stage")
        return stage if isinstance(stage, str) else None
    return None


def saved_step(folder: str | Path) -> int:
    """The optimizer step a checkpoint was saved at (transformers' trainer_state.json)."""
    try:
        return int(json.loads((Path(folder) / TRAINER_STATE).read_text())["global_step"])
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{folder}: cannot read the step from {TRAINER_STATE} ({err})") from err


def _newest_first(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if checkpoint_step(p) is not None), key=checkpoint_step, reverse=True)


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest resumable ``checkpoint-N`` in ``output_dir``, or None (no such folder, or none complete yet)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    return next((candidate for candidate in _newest_first(folder) if checkpoint_problem(candidate) is None), None)


def newest_complete_checkpoint(output_dir: str | Path) -> Path:
    """The newest resumable ``checkpoint-N`` in ``output_dir``; each newer one skipped is logged with why."""
    folder = Path(output_dir)
    if not folder.is_dir():
        raise CheckpointError(f"resume_from_checkpoint=true: output_dir={output_dir} does not exist; "
                              "set output_dir=<the run's folder>")
    candidates = _newest_first(folder)
    for candidate in candidates:
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        logger.warning("skipping %s: %s", candidate, problem)
    raise CheckpointError(
        f"resume_from_checkpoint=true: no complete checkpoint in {output_dir}"
        + (f" ({len(candidates)} incomplete, see the warnings above)" if candidates else "")
        + ": start a new run (leave resume_from_checkpoint unset and use another output_dir)"
    )


def resolve_resume(output_dir: str | Path, resume_from_checkpoint, max_steps: int, world_size: int = 1,
                   stage: str | None = None, trains: str | None = None) -> str | None:
    """The verified checkpoint folder a run of ``stage`` resumes from, or None for a fresh run; ``trains`` is the
    config group of the model ``stage`` trains (its ``Stage.trains``), named in the refusal of another stage's
    checkpoint.

    ``resume_from_checkpoint`` is null/false, true (the newest complete checkpoint in ``output_dir``) or a
    checkpoint folder. Raises ``CheckpointError`` for an incomplete checkpoint, one another stage wrote
    (``saved_stage``: its optimizer and step belong to another training) or one past ``max_steps``; one at
    ``max_steps`` is returned (the run stopped before saving ``final/``: nothing trains, ``final/`` is saved).
    A checkpoint saved by another number of ranks (``world_size``, placement=dp) is refused: each rank's data
    order and RNG state continue only with the same ranks.
    """
    if resume_from_checkpoint in (None, False, "", "false"):
        return None
    if resume_from_checkpoint is True or resume_from_checkpoint == "true":
        checkpoint = newest_complete_checkpoint(output_dir)
    else:
        checkpoint = Path(resume_from_checkpoint)
        problem = checkpoint_problem(checkpoint)
        if problem is not None:
            raise CheckpointError(
                f"resume_from_checkpoint={resume_from_checkpoint} cannot be resumed: {problem}; resume from "
                "an earlier checkpoint, or set resume_from_checkpoint=true for the newest complete one"
            )
    written_by = saved_stage(checkpoint)
    if stage is not None and written_by not in (None, stage):
        raise CheckpointError(
            f"{checkpoint} was saved by stage {written_by}, not {stage}: a checkpoint resumes only the stage that "
            f"saved it; to train {stage} from that run's model, leave resume_from_checkpoint unset and set "
            f"{trains}.model_name_or_path={checkpoint.parent / 'final'}"
        )
    saved_ranks = saved_world_size(checkpoint)
    if saved_ranks != world_size:
        raise CheckpointError(
            f"{checkpoint} was saved by {saved_ranks} rank{'s' * (saved_ranks > 1)} and this run has {world_size}: "
            + ("resume it with placement=dp and as many ranks (placement.num_processes x placement.num_machines = "
               f"{saved_ranks})" if saved_ranks > 1 else "resume it with placement=mono (one process)")
        )
    step = saved_step(checkpoint)
    if step > max_steps:
        raise CheckpointError(
            f"{checkpoint} is at step {step} and trainer.max_steps={max_steps}: nothing left to train; "
            f"raise trainer.max_steps above {step} to continue the run"
        )
    # step == max_steps: the run stopped after its last checkpoint, before final/; the stage saves final/ from it.
    logger.info("resuming from %s (step %d of %d)", checkpoint, step, max_steps)
    return str(checkpoint)


# ---- trainers --------------------------------------------------------------------------------------
class VerifiedCheckpoints:
    """Mixin for a transformers ``Trainer`` (``class T(VerifiedCheckpoints, trl.GRPOTrainer)``): every checkpoint
    is written into a staging folder, gets a manifest, and is renamed to ``checkpoint-N`` once complete, so a
    crash or a full disk mid-save leaves no ``checkpoint-N`` behind. TRL's generic model card is not written
    (the run folder's README says what the run was)."""

    _staging_root: str | None = None
    # The stage recorded in each checkpoint's manifest (``saved_stage``); set by the stage that builds the trainer.
    checkpoint_stage: str | None = None

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.args.world_size > 1 and self.args.device.type == "cpu":
            allow_indexed_cpu_restore()
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint):
        """transformers' RNG restore, except for a checkpoint without the CUDA RNG state (saved where CUDA was not
        available) resumed on a GPU: transformers would log an error naming only the missing key ``'cuda'``; the
        Python, NumPy and CPU states are restored here instead, and one warning says the CUDA RNG is not."""
        # here: this module imports no torch (module docstring)
        import numpy as np
        import torch
        from transformers.trainer_pt_utils import safe_globals

        if checkpoint is not None:  # transformers calls this once a resumed run has set its totals to 0
            self._restore_counters(Path(checkpoint))
        if checkpoint is None or not torch.cuda.is_available():
            return super()._load_rng_state(checkpoint)
        path = Path(checkpoint) / rng_files(self.args.world_size)[self.args.process_index]
        if not path.is_file():  # transformers says so in its own line
            return super()._load_rng_state(checkpoint)
        with safe_globals():  # the NumPy state's types
            state = torch.load(path, weights_only=True)
        if "cuda" in state:
            return super()._load_rng_state(checkpoint)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.random.set_rng_state(state["cpu"])
        logger.warning("%s holds no CUDA RNG state (saved without CUDA): the CUDA RNG is not restored, so sampling "
                       "after this resume differs from the uninterrupted run's", path)

    def _save_counters(self, folder: Path) -> None:
        """Write ``COUNTERS`` into a checkpoint being saved: the loss summed so far (what transformers has folded
        into its total at the logged steps, and what it has gathered since) and, for TRL's SFT trainer, the tokens
        trained on."""
        counters = {"loss_sum": self._total_loss_scalar + self._tr_loss.item()}
        if hasattr(self, "_total_train_tokens"):
            counters["num_tokens"] = self._total_train_tokens
        atomic_write.write_text(folder / COUNTERS, json.dumps(counters) + "\n")

    def _restore_counters(self, checkpoint: Path) -> None:
        """Set the running totals from a resumed checkpoint's ``COUNTERS`` (a checkpoint saved without them keeps
        transformers' restart at 0)."""
        path = checkpoint / COUNTERS
        if not path.is_file():
            return
        counters = json.loads(path.read_text())
        self._total_loss_scalar = counters["loss_sum"]
        if "num_tokens" in counters and hasattr(self, "_total_train_tokens"):
            self._total_train_tokens = counters["num_tokens"]

    def _evaluate(self, trial, ignore_keys_for_eval, skip_scheduler=False):
        """transformers' evaluation, except the start evaluation (``eval_on_start``, the one call with
        ``skip_scheduler``) of a resumed run: its step-0 evaluation is in the history the checkpoint restored. The
        arguments stay as configured, so a resumed run's checkpoints hold the uninterrupted run's
        ``training_args.bin``."""
        if skip_scheduler and self.state.global_step > 0:
            return {}
        return super()._evaluate(trial, ignore_keys_for_eval, skip_scheduler=skip_scheduler)

    def save_extra_checkpoint_files(self, folder: Path) -> None:
        """Files a subclass adds to each checkpoint (written first, into the staging folder). Called on every
        rank (gathering a sharded model is collective); only the main process (``args.should_save``) writes."""

    def _save_checkpoint(self, model, trial):
        # here: this module imports no torch (module docstring), and transformers would import it
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        run_dir = Path(super()._get_output_dir(trial=trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = run_dir / f"{STAGING_PREFIX}{name}"
        staging = staging_root / name
        # Data parallel: rank 0 writes the model, optimizer and extra files, every rank its RNG file; the folder
        # is made before any rank writes and published after every rank wrote.
        previous = _newest_checkpoint_size(run_dir)
        if previous:  # every rank checks (the same disk), so none waits below for one that stopped
            check_free_space(run_dir, previous, f"{name} (as large as the last checkpoint)",
                             then=how_to_continue(run_dir))
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)
            staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            self._save_counters(staging)
        self.save_extra_checkpoint_files(staging)
        self._staging_root = str(staging_root)
        try:
            super()._save_checkpoint(model, trial)  # writes into staging (see _get_output_dir)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            # transformers recorded the best checkpoint (load_best_model_at_end) where it wrote it, the staging path:
            # the state, in memory and in the checkpoint (a resume reads it), names the published folder instead.
            if self.state.best_model_checkpoint == str(staging):
                self.state.best_model_checkpoint = str(run_dir / name)
                self.state.save_to_json(str(staging / "trainer_state.json"))
            write_manifest(staging, self.state.global_step, self.checkpoint_stage)
            publish(staging, run_dir / name)
            shutil.rmtree(staging_root)
            # transformers rotated inside the staging folder (one checkpoint there); rotate the real ones now.
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()

    def _get_output_dir(self, trial):
        if self._staging_root is not None:
            return self._staging_root
        return super()._get_output_dir(trial=trial)

    def create_model_card(self, *args, **kwargs) -> None:
        """Not written: TRL's card is generic (it links to "None"); the run folder has its own README."""


@functools.cache  # registered once per process
def allow_indexed_cpu_restore() -> None:
    """Let ``torch.load(map_location="cpu:N")`` load onto the CPU. transformers maps a data-parallel run's
    optimizer state to ``args.device``, which is ``cpu:0`` on CPU ranks, a location torch's own CPU restore does not
    accept (it knows ``"cpu"`` only). Registered with torch's public ``register_package``; it saves nothing
    differently."""
    import torch  # here: this module imports no torch (module docstring)

    def restore(storage, location: str):
        return storage if location.startswith("cpu:") else None

    torch.serialization.register_package(30, lambda _storage: None, restore)


@contextlib.contextmanager
def training_failures(trainer, output_dir: Path, memory_hint: str) -> Iterator[None]:
    """Turn what a user can act on during training into one-line ``UserError``s that say how to resume:
    a full disk, a card out of memory (``memory_hint``: the settings to lower), Ctrl-C."""
    try:
        yield
    except KeyboardInterrupt as err:
        raise RunInterrupted(f"interrupted at step {trainer.state.global_step}; "
                             f"{how_to_continue(output_dir)}") from err
    except Exception as err:
        if isinstance(err, OSError) or is_disk_full(err):  # full, read-only or not ours: one line (write_error)
            as_os_error = err if isinstance(err, OSError) else OSError(errno.ENOSPC, str(err))
            error = write_error(getattr(err, "filename", None) or output_dir, as_os_error,
                                then=how_to_continue(output_dir))
            if error is not None:
                raise error from err
        if type(err).__name__ != "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch here
            raise
        raise UserError(f"out of GPU memory at step {trainer.state.global_step + 1}: lower {memory_hint}; "
                        f"{how_to_continue(output_dir)}") from err


# What libraries say when a write runs out of disk: safetensors' writer (Rust) "No space left on device (os error
# 28)"; torch.save's zip writer (caffe2 inline_container.cc) "file write failed" or "unexpected pos" (the bytes it
# wrote are fewer than it meant to).
DISK_FULL_TEXTS = ("No space left on device", "file write failed", "unexpected pos")


def is_disk_full(err: BaseException) -> bool:
    """An ``OSError`` with ``ENOSPC`` / ``EDQUOT``, or a library error carrying one of ``DISK_FULL_TEXTS``."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(text in str(err) for text in DISK_FULL_TEXTS)


def _newest_checkpoint_size(run_dir: Path) -> int:
    """Bytes of the newest ``checkpoint-N`` in ``run_dir`` (0: none yet): what the next one will about need."""
    if not run_dir.is_dir():
        return 0
    steps = sorted((p for p in run_dir.iterdir() if checkpoint_step(p) is not None), key=checkpoint_step)
    return sum(f.stat().st_size for f in steps[-1].rglob("*") if f.is_file()) if steps else 0


def how_to_continue(output_dir: str | Path) -> str:
    """What to do after a run in ``output_dir`` stopped: the overrides that resume it from its last complete
    checkpoint, or, before its first checkpoint (a resume would be refused), to start it again. Evaluated when the
    failure happens, so it names the checkpoint that exists then."""
    saved = last_complete_checkpoint(output_dir)
    if saved is not None:
        return f"resume with output_dir={output_dir} resume_from_checkpoint=true (last complete checkpoint: {saved})"
    return ("start the run again in a new output_dir (or with output_dir unset): it saved no checkpoint yet, so "
            "there is nothing to resume")
