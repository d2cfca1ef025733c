"""Resuming a checkpoint saved without the CUDA RNG state on a GPU: the other RNGs come back, and one warning line
says the CUDA RNG does not."""

import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlt_mono.runs.checkpoints import VerifiedCheckpoints


class TransformersTrainer:
    """Stands in for transformers' ``Trainer``: records the checkpoints its own RNG restore was asked for."""

    def __init__(self):
        self.args = SimpleNamespace(world_size=1, process_index=0)
        self.restored_by_transformers = []

    def _load_rng_state(self, checkpoint):
        self.restored_by_transformers.append(checkpoint)


class Trainer(VerifiedCheckpoints, TransformersTrainer):
    pass


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint folder whose RNG file has the Python, NumPy and CPU states only; the draws that follow them."""
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               folder / "rng_state.pth")
    return folder, _draws()


def test_a_checkpoint_without_the_cuda_rng_resumed_on_a_gpu_warns_once_and_restores_the_rest(checkpoint,
                                                                                             monkeypatch, caplog):
    folder, after_save = checkpoint
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = Trainer()
    _draws()  # the run went on after the save
    with caplog.at_level(logging.INFO):
        trainer._load_rng_state(str(folder))
    assert _draws() == after_save
    assert trainer.restored_by_transformers == []  # its restore would log an error naming only the key 'cuda'
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"{folder / 'rng_state.pth'} holds no CUDA RNG state (saved without CUDA): the CUDA RNG is not "
                    "restored, so sampling after this resume differs from the uninterrupted run's")]


def test_transformers_restores_a_checkpoint_with_the_cuda_rng_or_on_a_machine_without_cuda(checkpoint, monkeypatch,
                                                                                           caplog):
    folder, _ = checkpoint
    trainer = Trainer()
    trainer._load_rng_state(str(folder))  # no CUDA here: nothing to miss
    state = torch.load(folder / "rng_state.pth", weights_only=False)
    torch.save({**state, "cuda": torch.zeros(16, dtype=torch.uint8)}, folder / "rng_state.pth")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer._load_rng_state(str(folder))
    trainer._load_rng_state(None)  # a fresh run
    assert trainer.restored_by_transformers == [str(folder), str(folder), None]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
