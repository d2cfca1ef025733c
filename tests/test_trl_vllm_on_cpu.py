"""The TRL/vLLM adapter: its start-up checks pass against the installed (pinned) TRL and fail or warn, naming
what changed, when a private name goes; the policy log-probs it captures reach the reward on a CPU step."""

import logging
from types import SimpleNamespace

import pytest
import torch
import trl
from accelerate.utils import DistributedType

from rlt_mono.rl import trl_vllm
from rlt_mono.rl.trl_vllm import TRLSurfaceError
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics


def test_the_installed_trl_has_every_name_rlt_mono_uses():
    assert trl.__version__ == trl_vllm.PINNED["trl"]
    trl_vllm.check_required()
    assert trl_vllm.call_order_problem() is None


def test_a_missing_or_changed_override_point_fails_with_the_pins(monkeypatch):
    monkeypatch.delattr(trl.GRPOTrainer, "_calculate_rewards")
    with pytest.raises(TRLSurfaceError, match=r"GRPOTrainer._calculate_rewards is gone\. rlt_mono is pinned to "
                                              r"trl==1\.16\.0"):
        trl_vllm.check_required()

    class Renamed(trl.GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts):
            return None

    with pytest.raises(TRLSurfaceError, match=r"Renamed._calculate_rewards takes \(self, inputs, prompts\), not "
                                              r"\(self, inputs, prompts, completions, completion_ids_list\)"):
        trl_vllm.check_required(Renamed)


def test_generate_must_return_completion_ids_second():
    class Reordered(trl.GRPOTrainer):
        def _generate(self, prompts):
            completion_ids, prompt_ids = [], []
            return completion_ids, prompt_ids

    with pytest.raises(TRLSurfaceError, match="Reordered._generate no longer returns the completion ids second"):
        trl_vllm.check_required(Reordered)
    assert trl_vllm.completion_ids(([[5]], [[1, 2], [3]], None)) == [[1, 2], [3]]
    with pytest.raises(TRLSurfaceError, match="returned Tensor second, not the completion ids"):
        trl_vllm.completion_ids(([[5]], torch.ones(2, 3)))
    with pytest.raises(TRLSurfaceError, match=r"no longer returns \(B, T\) log-probs first"):
        trl_vllm.log_probs_of((torch.ones(3), None, None))


def _rewards_first(self, inputs):
    prompt_ids, completion_ids = self._generate(inputs)
    rewards = self._calculate_rewards(inputs, [], [], completion_ids)
    old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(self.model, prompt_ids)
    return rewards, old_per_token_logps


def _fake_trainer(generation=None, accumulation=2, steps_per_generation=2, use_vllm=False):
    model = torch.nn.Linear(2, 2)
    args = SimpleNamespace(gradient_accumulation_steps=accumulation, steps_per_generation=steps_per_generation,
                           vllm_mode="colocate", sync_ref_model=True)
    return SimpleNamespace(args=args, num_iterations=1, use_vllm=use_vllm, vllm_importance_sampling_correction=True,
                           accelerator=SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO),
                           vllm_generation=generation, model=model)


def test_a_changed_call_order_turns_reuse_off_and_says_what_it_costs(monkeypatch, caplog):
    misaligned = _fake_trainer(accumulation=1)
    assert trl_vllm.inspect_surface(misaligned, True) == trl_vllm.Surface(True, True, False)
    assert trl_vllm.inspect_surface(_fake_trainer(), True) == trl_vllm.Surface(True, False, False)  # aligned
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions", _rewards_first)
    assert trl_vllm.call_order_problem() == "old_per_token_logps is no longer computed before _calculate_rewards"
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.trl_vllm"):
        surface = trl_vllm.inspect_surface(misaligned, True)
    assert surface == trl_vllm.Surface(False, False, False)
    assert ("the reward cannot reuse TRL's policy log-probs (TRL 1.16.0: old_per_token_logps is no longer computed "
            "before _calculate_rewards): it runs its own teacher forward over every generation batch") in caplog.text


def _generation(**missing):
    model = SimpleNamespace(load_weights=lambda weights: None)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(model_executor=SimpleNamespace(
        driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))))
    generation = SimpleNamespace(_iter_named_params=lambda: iter(()), enable_sleep_mode=True,
                                 _llm_weights_sleeping=True, llm=llm)
    for name in missing:
        delattr(generation, name)
    return generation


def test_one_call_sync_is_installed_only_where_vllm_has_what_it_needs(caplog):
    assert trl_vllm.one_call_sync_problem(_generation()) is None
    assert trl_vllm.one_call_sync_problem(_generation(_iter_named_params=1)) == "VLLMGeneration has no " \
                                                                                "_iter_named_params"
    assert trl_vllm.one_call_sync_problem(_generation(_llm_weights_sleeping=1)) == "VLLMGeneration has no " \
                                                                                   "_llm_weights_sleeping"
    broken = _generation()
    del broken.llm.llm_engine.model_executor.driver_worker
    assert trl_vllm.one_call_sync_problem(broken).endswith("(stops at driver_worker)")

    assert trl_vllm.inspect_surface(_fake_trainer(_generation(), use_vllm=True), True).one_call_sync
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.trl_vllm"):
        surface = trl_vllm.inspect_surface(_fake_trainer(_generation(_iter_named_params=1), use_vllm=True), True)
    assert not surface.one_call_sync
    assert surface.expects_policy_log_probs  # vLLM importance sampling: TRL computes them every batch
    assert ("one-call weight sync unavailable (VLLMGeneration has no _iter_named_params): TRL's per-tensor sync "
            "is used, 2 vLLM load_weights calls per sync instead of 1") in caplog.text  # Linear: weight and bias


def test_the_one_call_sync_hands_every_tensor_to_vllm_at_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls, seconds, emptied = [], [], []
    generation = _generation()
    params = [("a", torch.ones(1)), ("b", torch.zeros(2))]
    generation._iter_named_params = lambda: iter(params)
    generation.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights = \
        lambda weights: calls.append(("load", list(weights)))
    generation.llm.wake_up = lambda tags: calls.append(("wake", tags))
    generation.llm.reset_prefix_cache = lambda: calls.append(("reset",))
    trl_vllm.install_one_call_sync(generation, lambda: emptied.append(1), seconds.append)
    generation.sync_weights()
    assert calls == [("wake", ["weights"]), ("load", params), ("reset",)]
    assert generation._llm_weights_sleeping is False
    assert emptied == [1] and len(seconds) == 1 and seconds[0] >= 0
    assert trl_vllm.weights_asleep(generation) is False
    assert trl_vllm.weights_asleep(SimpleNamespace()) is None


def test_a_sharded_teacher_keeps_trls_sync_timed_even_on_one_rank(monkeypatch):
    def accelerator(kind, processes):
        return SimpleNamespace(distributed_type=kind, num_processes=processes)

    assert trl_vllm.holds_whole_model(accelerator(DistributedType.NO, 1))
    assert trl_vllm.holds_whole_model(accelerator(DistributedType.MULTI_GPU, 4))
    assert not trl_vllm.holds_whole_model(accelerator(DistributedType.FSDP, 1))  # the path N ranks take
    assert not trl_vllm.holds_whole_model(accelerator(DistributedType.DEEPSPEED, 2))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    synced, seconds = [], []
    generation = SimpleNamespace(sync_weights=lambda: synced.append(1))
    trl_vllm.time_weight_sync(generation, seconds.append)
    generation.sync_weights()
    assert synced == [1] and len(seconds) == 1 and seconds[0] >= 0


def test_a_reference_mixup_that_trl_no_longer_adds_is_an_error():
    trainer = _fake_trainer()
    trainer.callback_handler = SimpleNamespace(callbacks=[])
    with pytest.raises(TRLSurfaceError, match="sync_ref_model is on but TRL 1.16.0 added no SyncRefModelCallback"):
        trl_vllm.wrap_reference_sync(trainer, swapper=None)


def _steps(out):
    return [r for r in read_metrics(out / METRICS_FILE) if "teacher_reward/total" in r]


@pytest.fixture(scope="module")
def misaligned_run(tmp_path_factory, one_thread):
    """One generation batch trained over two optimizer steps: TRL computes its policy log-probs on the CPU."""
    import rlt_mono.rewards.teacher_kl as teacher_kl
    from rlt_mono import build_trainer, compose

    out = tmp_path_factory.mktemp("misaligned")
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.max_steps=2", "trainer.gradient_accumulation_steps=1",
                                "trainer.plot_metrics=false"])
    trainer = build_trainer(cfg)
    teacher = trainer.model
    given, teacher_forwards = [], []
    real_teacher_log_probs, real_range_log_probs = teacher_kl.TeacherKLReward._teacher_log_probs, \
        teacher_kl.range_log_probs

    def spy_teacher_log_probs(self, prompts, samples, precomputed):
        given.append((precomputed, [s.retokenized for s in samples]))
        return real_teacher_log_probs(self, prompts, samples, precomputed)

    def spy_range_log_probs(model, *args, **kwargs):
        if model is teacher:
            teacher_forwards.append(len(args[0]))
        return real_range_log_probs(model, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(teacher_kl.TeacherKLReward, "_teacher_log_probs", spy_teacher_log_probs)
        patch.setattr(teacher_kl, "range_log_probs", spy_range_log_probs)
        trainer.train()
    yield trainer, out, given, teacher_forwards
    trainer.release()


def test_the_reward_gets_trls_policy_log_probs_and_runs_no_teacher(misaligned_run):
    trainer, out, given, teacher_forwards = misaligned_run
    assert trainer.trl_surface == trl_vllm.Surface(True, True, False)
    assert len(given) == 1  # one generation batch of 16 completions for the two steps
    precomputed, retokenized = given[0]
    assert precomputed is not None and len(precomputed) == 16
    assert all(lp.dim() == 1 and lp.dtype == torch.float32 for lp in precomputed)
    # The teacher runs only for completions whose explanation was re-tokenized (their ids differ from TRL's).
    assert sum(teacher_forwards) == sum(retokenized)
    rows = _steps(out)
    assert [r["step"] for r in rows] == [1]  # step 2 trains on the same batch: no reward computed
    assert rows[0]["score/teacher_log_probs_reused"] == 1
    assert rows[0].get("score/reward_teacher_passes", 0) == (1 if any(retokenized) else 0)


def test_a_missing_capture_where_trl_computes_it_warns_once(tmp_path, monkeypatch, caplog, one_thread):
    """If TRL's first policy pass stopped being the one captured, the reward runs the teacher: warned and counted."""
    from rlt_mono import build_trainer, compose

    cfg = compose("demo_tiny", [f"output_dir={tmp_path}", "trainer.max_steps=4",
                                "trainer.gradient_accumulation_steps=1", "trainer.max_completion_length=24",
                                "trainer.plot_metrics=false"])
    trainer = build_trainer(cfg)
    monkeypatch.setattr(trl_vllm, "is_policy_no_grad_pass", lambda trainer, model: False)
    with caplog.at_level(logging.WARNING, logger="rlt_mono.rl.trainer"):
        trainer.train()
    trainer.release()
    assert caplog.text.count("computed no policy log-probs before the reward in this batch, where TRL 1.16.0 "
                             "does: the reward runs a second teacher forward per batch") == 1
    rows = _steps(tmp_path)
    assert [r["step"] for r in rows] == [1, 3]  # two generation batches, each scored with a teacher pass
    assert all(r["score/reward_teacher_passes"] == 1 and "score/teacher_log_probs_reused" not in r for r in rows)


def test_prefix_cache_watch_sums_prompt_and_cached_tokens_per_generate_call():
    outputs = [SimpleNamespace(prompt_token_ids=[1] * 100, num_cached_tokens=0),  # the group's first request
               *[SimpleNamespace(prompt_token_ids=[1] * 100, num_cached_tokens=96) for _ in range(7)],  # 6 blocks
               SimpleNamespace(prompt_token_ids=[2] * 10, num_cached_tokens=None)]  # no count: left out
    llm = SimpleNamespace(generate=lambda prompts, sampling_params=None, use_tqdm=True: outputs)
    calls = []
    trl_vllm.watch_prefix_cache(llm, lambda prompt, cached: calls.append((prompt, cached)))
    assert llm.generate(["p"], sampling_params=None, use_tqdm=False) is outputs  # the outputs pass through
    assert calls == [(800, 7 * 96)]
    llm_without_counts = SimpleNamespace(generate=lambda *a, **k: [SimpleNamespace(prompt_token_ids=[1])])
    trl_vllm.watch_prefix_cache(llm_without_counts, lambda *a: calls.append(a))
    llm_without_counts.generate([])
    assert calls == [(800, 7 * 96)]
