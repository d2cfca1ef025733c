"""A resumed SFT run reports what the uninterrupted run does: the tokens trained on (TRL's ``num_tokens``, kept in
memory only) and the final ``train_loss`` (transformers' sum over the steps, restarted at 0 by a new process) come
back from the checkpoint's ``rlt_mono_counters.json``, so a run killed after a save and resumed ends with the same
metrics.jsonl as one never stopped."""

import json
import shutil

import pytest

from rlt_mono.config import compose
from rlt_mono.runs.checkpoints import COUNTERS
from rlt_mono.runs.outputs import METRICS_FILE
from rlt_mono.stages.sft import SUMMARY_FILE, run_sft

FAST = ["size=tiny", "sft.per_device_train_batch_size=8", "sft.gradient_accumulation_steps=1", "+sft.disable_tqdm=true",
        "data.embedded_rows=48", "data.eval_rows=0", "sft.max_steps=4", "sft.save_steps=2", "sft.logging_steps=1"]
# Wall times and speeds differ between any two runs.
VOLATILE = ("runtime", "per_second", "time")

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(folder) -> list[dict]:
    rows = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not any(word in k for word in VOLATILE)} for row in rows]


def test_a_run_resumed_from_its_middle_checkpoint_ends_with_the_uninterrupted_metrics(tmp_path):
    whole = tmp_path / "whole"
    run_sft(compose("teacher_sft", [*FAST, f"output_dir={whole}"]))
    counters = json.loads((whole / "checkpoint-2" / COUNTERS).read_text())
    losses = [row["loss"] for row in _rows(whole) if "loss" in row]
    assert counters["num_tokens"] > 0 and counters["loss_sum"] == pytest.approx(sum(losses[:2]), rel=1e-6)
    # as if killed after the save of step 2: the later checkpoint and the outputs of the end are not there yet
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    for name in ("checkpoint-4", "final", SUMMARY_FILE):
        path = resumed / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_sft(compose("teacher_sft", [*FAST, f"output_dir={resumed}", "resume_from_checkpoint=true"]))
    expected, got = _rows(whole), _rows(resumed)
    assert [row.get("num_tokens") for row in got] == [row.get("num_tokens") for row in expected]
    assert [row for row in got if "train_loss" in row] == [row for row in expected if "train_loss" in row]
    assert got == expected
