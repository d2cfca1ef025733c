"""A question's samples depend on the run's seed and the question only (``rlt_mono.stages.sampler.prompt_seed``): a
distill run that crashed and is run again writes what an uninterrupted run writes, whatever the batches."""

import json
import re
import shutil
import sys
import types

import pytest

from rlt_mono.config import compose
from rlt_mono.errors import UserError
from rlt_mono.runs import lock as run_lock
from rlt_mono.stages.distill import DISTILL_FILE, run_distill
from rlt_mono.stages.sampler import VLLMGenerator, prompt_seed

# Every sample written (selection=all), so every sample of every question is compared.
OVERRIDES = ["data.max_rows=6", "distill.selection=all", "distill.samples_per_question=2", "distill.max_new_tokens=24"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, one_thread):
    """An uninterrupted run in batches of two questions: its folder and its lines."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    run_distill(compose("distill", ["size=tiny", f"output_dir={folder}", *OVERRIDES, "distill.rows_per_batch=2"]))
    lines = (folder / DISTILL_FILE).read_text().splitlines(keepends=True)
    assert len(lines) == 12 and len(set(lines)) == 12  # 6 questions x 2 distinct samples
    return folder, lines


def _crash_and_resume(uninterrupted, folder, kept_text, *overrides) -> list[str]:
    """The uninterrupted run's folder with ``distill.jsonl`` cut to ``kept_text``, run again; its lines."""
    shutil.copytree(uninterrupted, folder)
    (folder / DISTILL_FILE).write_text(kept_text)
    run_distill(compose("distill", ["size=tiny", f"output_dir={folder}", *OVERRIDES, *overrides]))
    return (folder / DISTILL_FILE).read_text().splitlines(keepends=True)


def test_a_distill_killed_while_writing_and_run_again_writes_the_uninterrupted_lines(uninterrupted, tmp_path):
    folder, lines = uninterrupted
    # Killed while appending the second batch: two questions complete, the third's first line cut short.
    kept = "".join(lines[:4]) + lines[4][:30]
    assert _crash_and_resume(folder, tmp_path / "resumed", kept, "distill.rows_per_batch=2") == lines


def test_a_questions_samples_do_not_depend_on_the_questions_batched_with_it(uninterrupted, tmp_path):
    folder, lines = uninterrupted
    # Resumed after three questions with batches of three: questions 4-6 are generated in one batch, not in
    # [3, 4] and [5, 6]. The explanations are the same ids; the scores are the same up to rounding, since the
    # reward's micro-batches (sorted by length across the batch) pad each sequence to other widths.
    resumed = [json.loads(line) for line in _crash_and_resume(folder, tmp_path / "resumed", "".join(lines[:6]),
                                                              "distill.rows_per_batch=3")]
    scores = ("r_ss", "r_kl", "match_penalty", "total")
    for before, after in zip([json.loads(line) for line in lines], resumed, strict=True):
        assert {k: v for k, v in after.items() if k not in scores} == {k: v for k, v in before.items()
                                                                       if k not in scores}
        assert [after[k] for k in scores] == pytest.approx([before[k] for k in scores], abs=1e-5)


def test_vllm_seeds_each_prompt_by_the_prompt_not_its_place(monkeypatch, tmp_path):
    """Each prompt is one vLLM request whose seed is the prompt's (vLLM seeds its i-th sample with seed + i)."""
    requests = []

    class LLM:
        def __init__(self, **kwargs):
            pass

        def generate(self, prompts, params, use_tqdm):
            requests.extend((p["prompt_token_ids"], q["seed"], q["n"]) for p, q in zip(prompts, params, strict=True))
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7])] * q["n"]) for q in params]

        def sleep(self, level):
            pass

        def wake_up(self):
            pass

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=dict))
    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(tmp_path / "engine.lock"))
    generator = VLLMGenerator("teacher", dtype="float32", max_new_tokens=8, max_prompt_tokens=8, top_p=1.0,
                              gpu_memory_utilization=0.3, seed=5, enforce_eager=True, kv_cache_gib=None)
    assert generator.generate([[1, 2], [3]], 2, 0.7) == [[[7], [7]], [[7], [7]]]
    generator.generate([[3]], 2, 0.7)  # the second prompt alone, as a resumed run would send it
    assert requests == [([1, 2], prompt_seed(5, [1, 2]), 2), ([3], prompt_seed(5, [3]), 2),
                        ([3], prompt_seed(5, [3]), 2)]
    assert prompt_seed(5, [3]) != prompt_seed(6, [3]) and prompt_seed(5, [3]) != prompt_seed(5, [1, 2])
    assert prompt_seed(5, [3]) == 0x186FEE0EBEB420  # a hash of its inputs alone, the same in every process


def test_a_set_kv_cache_size_reaches_vllm_and_none_leaves_it_to_profiling(monkeypatch, tmp_path):
    """vllm_kv_cache_gib becomes kv_cache_memory_bytes (vLLM then skips its memory profiling); null passes nothing."""
    engines = []

    class LLM:
        def __init__(self, **kwargs):
            engines.append(kwargs)

        def sleep(self, level):
            pass

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=dict))
    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(tmp_path / "engine.lock"))
    for gib in (None, 1.5):
        VLLMGenerator("teacher", dtype="float32", max_new_tokens=8, max_prompt_tokens=8, top_p=1.0,
                      gpu_memory_utilization=0.3, seed=5, enforce_eager=True, kv_cache_gib=gib)
    assert "kv_cache_memory_bytes" not in engines[0]
    assert engines[1]["kv_cache_memory_bytes"] == 1610612736  # 1.5 x 1024**3


def test_a_model_folder_vllm_would_read_as_two_models_stops_before_an_engine_starts(monkeypatch, tmp_path):
    """vLLM loads every top-level *.safetensors of a folder without a shard index: a second model's weights there
    (an older checkpoint's mixed reference) would replace the model's own. The engine is not started."""
    engines = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(
        LLM=lambda **kwargs: engines.append(kwargs) or types.SimpleNamespace(sleep=lambda level: None),
        SamplingParams=dict))
    monkeypatch.setenv(run_lock.ENGINE_LOCK_ENV, str(tmp_path / "engine.lock"))
    checkpoint = tmp_path / "checkpoint-60"
    checkpoint.mkdir()
    for name in ("model.safetensors", "reference_model.safetensors"):
        (checkpoint / name).write_bytes(b"x")

    def start():
        VLLMGenerator(str(checkpoint), dtype="float32", max_new_tokens=8, max_prompt_tokens=8, top_p=1.0,
                      gpu_memory_utilization=0.3, seed=5, enforce_eager=True, kv_cache_gib=None)

    with pytest.raises(UserError, match=re.escape(
            f"{checkpoint}: 2 weight files (model.safetensors, reference_model.safetensors) and no "
            "model.safetensors.index.json: vLLM would load them all as one model")):
        start()
    assert engines == []
    # the reference where checkpoints now keep it, in a folder of its own: one model at the top
    (checkpoint / "reference").mkdir()
    (checkpoint / "reference_model.safetensors").rename(checkpoint / "reference" / "model.safetensors")
    start()
    # shards named by an index: vLLM reads the index's files only
    (checkpoint / "model-00002.safetensors").write_bytes(b"x")
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    start()
    assert [engine["model"] for engine in engines] == [str(checkpoint)] * 2
