"""placement=async on the CPU: a real tiny RL trainer whose rollout server is a fake, one optimizer step ahead.

The fake stands where TRL's server-mode ``VLLMGeneration`` and its client stand on two GPUs: ``sync_weights`` takes a
copy of the trainer's weights (what the NCCL push would leave on the server), the client's ``generate`` samples each
prompt with that copy at the temperature it is sent and returns the sampled tokens' log-probs under it (vLLM's
processed log-probs), from the background worker of ``OneStepOff``. TRL's own ``generate`` (an evaluation's, on the
training thread) reaches the same client; it runs collectives, so the fake fails a call of it from any other
thread. It records which weights each generation used, which prompts it got, and fails the run if a push happens
while a generation runs.
"""

import copy
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlt_mono import build_trainer, compose, release_trainer
from rlt_mono.rl import trl_vllm
from rlt_mono.rl.one_step_off import OneStepOff
from rlt_mono.runs.outputs import EVAL_EVENT, METRICS_FILE, read_metrics


class FakeServerGeneration:
    """TRL's server-mode generation, with the weights of the trainer's last push (see the module doc)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.vllm_client = FakeClient(self)
        # the sampling settings TRL's VLLMGeneration keeps: the run's temperature and length (the fake samples with
        # them), the rest set apart from TRL's defaults, so that a rollout passing a default instead shows
        args = trainer.args
        self.temperature, self.max_completion_length = args.temperature, args.max_completion_length
        self.top_p, self.top_k, self.min_p, self.repetition_penalty = 0.9, 5, None, 1.1
        self.logprobs, self.structured_outputs_regex, self.generation_kwargs = 0, "[0-9]+", {"seed": 7}
        self.sampling: list[dict] = []  # per generation: the settings the client was sent
        self.snapshot, self.snapshot_step = None, None
        self.syncs: list[int] = []  # the trainer's global step at each push
        self.calls: list[dict] = []  # per generation: the pushed weights' step, its unique prompts, its tokens
        self.events: list[tuple[str, int]] = []  # ("sync", step), ("generate", call), ("done", call), in order
        self._lock = threading.Lock()
        self._generating = False

    def sync_weights(self) -> None:
        with self._lock:
            if self._generating:
                raise AssertionError(f"weights pushed at step {self.trainer.state.global_step} during a generation")
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            # a model of its own (a deepcopy would keep the forward TRL patched in, which calls the live model)
            self.snapshot = AutoModelForCausalLM.from_config(model.config).eval().requires_grad_(False)
            self.snapshot.load_state_dict({name: tensor.detach().clone() for name, tensor in
                                           model.state_dict().items()})
            self.snapshot_step = self.trainer.state.global_step
            self.syncs.append(self.snapshot_step)
            self.events.append(("sync", self.snapshot_step))

    def generate(self, prompts, images, num_generations, profiler=None):
        """TRL's VLLMGeneration.generate in one process: each prompt once to the client, the result per completion."""
        if threading.current_thread() is not threading.main_thread():
            raise AssertionError("TRL's generate (collectives) called off the training thread")
        output = self.vllm_client.generate(prompts=prompts[::num_generations], n=num_generations,
                                           temperature=self.temperature, max_tokens=self.max_completion_length)
        prompt_ids = [ids for ids in output["prompt_ids"] for _ in range(num_generations)]
        return prompt_ids, output["completion_ids"], output["logprobs"], None

    def sample(self, prompts, n, temperature, max_tokens, features=None, **sampling):
        """What the client's generate does: ``n`` completions of each prompt."""
        with self._lock:
            if self._generating:
                raise AssertionError("two generations at once")
            self._generating = True
            call = len(self.calls)
            unique = [list(ids) for ids in prompts]
            self.sampling.append({"n": n, "temperature": temperature, "max_tokens": max_tokens, **sampling})
            record = {"step": self.snapshot_step, "prompts": unique, "tokens": None}
            self.calls.append(record)
            self.events.append(("generate", call))
            model = self.snapshot
        try:
            generator = torch.Generator().manual_seed(1000 + call)
            completions, logprobs = [], []
            for ids in unique:
                sampled, sampled_logprobs = self._sample(model, ids, n, generator, temperature, max_tokens)
                completions += sampled
                logprobs += sampled_logprobs
            record["tokens"] = sum(len(ids) for ids in completions)
        finally:
            with self._lock:
                self._generating = False
                self.events.append(("done", call))
        return {"prompt_ids": unique, "completion_ids": completions,
                "logprobs": [[[lp] for lp in seq] for seq in logprobs], "logprob_token_ids": None}

    @torch.no_grad()
    def _sample(self, model, prompt: list[int], n: int, generator: torch.Generator, temperature: float,
                max_tokens: int):
        """``n`` completions of ``prompt`` (each up to and with its EOS) and their tokens' log-probs at
        ``temperature`` (log_softmax(logits / T), as TRL computes its own)."""
        eos = set(self.trainer.eos_token_ids)
        out = model(input_ids=torch.tensor([prompt] * n), use_cache=True)
        sequences, logprobs, done = [[] for _ in range(n)], [[] for _ in range(n)], [False] * n
        for _ in range(max_tokens):
            logp = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)
            tokens = torch.multinomial(logp.exp(), 1, generator=generator)
            for i in range(n):
                if not done[i]:
                    token = int(tokens[i])
                    sequences[i].append(token)
                    logprobs[i].append(float(logp[i, token]))
                    done[i] = token in eos
            if all(done):
                break
            out = model(input_ids=tokens, past_key_values=out.past_key_values, use_cache=True)
        return sequences, logprobs


class FakeClient:
    """TRL's VLLMClient, as far as generation goes: the fake's weights sample."""

    def __init__(self, generation: FakeServerGeneration):
        self.generation = generation

    def generate(self, prompts, n=1, temperature=1.0, max_tokens=16, **sampling):
        return self.generation.sample(prompts, n, temperature, max_tokens, **sampling)


class FakeServer:
    def __init__(self):
        self.checks, self.stops = 0, 0

    def check_alive(self):
        self.checks += 1

    def stop(self):
        self.stops += 1


def async_trainer(out, *overrides):
    """The embedded demo's trainer (4 prompts x 4 completions per optimizer step, one generation per step), with
    the one-step-off rollout build gives it on two GPUs; the fake server, the fake generation and the dataloader's
    batches in the order the training loop read them."""
    cfg = compose("demo_tiny", [f"output_dir={out}", "trainer.save_steps=100", "trainer.steps_per_generation=2",
                                "trainer.gradient_accumulation_steps=2", *overrides])
    trainer = build_trainer(cfg)
    assert trainer.num_iterations == 1 and trainer.args.generation_batch_size == 16
    assert trainer.args.vllm_importance_sampling_correction  # TRL's default, which the run keeps
    trainer.use_vllm, trainer.vllm_mode, trainer.args.vllm_mode = True, "server", "server"
    trainer._last_loaded_step = -1  # as TRL's __init__ sets it with vLLM
    trainer.vllm_generation = FakeServerGeneration(trainer)
    trainer.rollout_server = FakeServer()
    trainer.one_step_off = OneStepOff(trainer._rollout, trainer._push_weights, timeout_s=300)
    # what the trainer reads from TRL once vLLM is on (the reward reuses TRL's policy log-probs)
    trainer.trl_surface = trl_vllm.inspect_surface(trainer, trainer.trl_surface.reuses_policy_log_probs)
    read: list[list[dict]] = []
    collate = trainer.data_collator

    def recording(features):
        read.append(copy.deepcopy(features))
        return collate(features)

    trainer.data_collator = recording
    return trainer, read


def unique_prompt_ids(trainer, batch: list[dict]) -> list[list[int]]:
    """A generation batch's prompts (each repeated once per completion), tokenized as TRL does, each once."""
    prompt_ids, _, _ = trainer._tokenize_prompts(copy.deepcopy([row["prompt"] for row in batch]))
    return [list(ids) for ids in prompt_ids[::trainer.num_generations]]


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("async") / "run"
    trainer, read = async_trainer(out, "trainer.max_steps=4")
    try:
        trainer.train()
        prompts = [unique_prompt_ids(trainer, batch) for batch in read]
        fake, server = trainer.vllm_generation, trainer.rollout_server
    finally:
        release_trainer(trainer)  # waits for the generation still in flight
    return read_metrics(out / METRICS_FILE), fake, server, prompts, read


def test_each_step_trains_on_completions_generated_one_step_earlier(four_steps):
    rows, fake, _, _, _ = four_steps
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    # step 1 generates synchronously; each later step takes what was generated while the step before trained
    assert [row["async/staleness"] for row in rows] == [0, 1, 1, 1]
    assert [row["async/overlapped"] for row in rows] == [0, 1, 1, 1]
    # one push per optimizer step, with the weights after 0, 1, 2, 3 updates
    assert [row["async/pushes"] for row in rows] == [1, 1, 1, 1]
    assert fake.syncs == [0, 1, 2, 3]
    # generation k (k >= 1) was submitted at global step k-1 with the weights pushed then: the batch trained at
    # global step n > 0 comes from the weights after n-1 updates; the fifth, read ahead for a step that never
    # came, was waited for when the trainer was released
    assert [call["step"] for call in fake.calls] == [0, 0, 1, 2, 3]
    # every push waits for the generation in flight; each background generation starts right after the push
    assert fake.events == [("sync", 0), ("generate", 0), ("done", 0), ("generate", 1), ("done", 1),
                           ("sync", 1), ("generate", 2), ("done", 2), ("sync", 2), ("generate", 3), ("done", 3),
                           ("sync", 3), ("generate", 4), ("done", 4)]
    # what step n trained is what generation n-1 returned (its completion tokens, counted by the trainer)
    assert [row["generate/tokens"] for row in rows] == [call["tokens"] for call in fake.calls[:4]]


def test_generations_follow_the_dataloader_none_skipped_or_repeated(four_steps):
    _, fake, server, prompts, read = four_steps
    # TRL's sampler yields each generation batch once per micro-step (steps_per_generation=2)
    assert len(read) >= 10 and all(read[2 * k] == read[2 * k + 1] for k in range(5))
    # generation k has the prompts of the k-th generation batch the dataloader yielded, as a plain run trains them
    assert [call["prompts"] for call in fake.calls] == [prompts[2 * k] for k in range(5)]
    assert len({tuple(map(tuple, call["prompts"])) for call in fake.calls}) == 5
    assert all(len(call["prompts"]) == 4 for call in fake.calls)
    assert server.checks == 5 and server.stops == 1
    # each prompt went once, for 4 completions, with the sampling settings TRL's generation keeps
    sent = {"n": 4, "temperature": fake.temperature, "max_tokens": fake.max_completion_length, "top_p": 0.9,
            "top_k": 5, "min_p": 0.0, "repetition_penalty": 1.1, "logprobs": 0,
            "structured_outputs_regex": "[0-9]+", "generation_kwargs": {"seed": 7}}
    assert fake.sampling == [sent] * 5


def test_importance_sampling_sees_the_one_step_lag(four_steps):
    rows, _, _, _, _ = four_steps
    difference = [row["sampling/sampling_logp_difference/mean"] for row in rows]
    ratio = [row["sampling/importance_sampling_ratio/mean"] for row in rows]
    # step 1 samples and trains with the same weights: only float noise between the two forwards
    assert difference[0] < 1e-4 and ratio[0] == pytest.approx(1.0, abs=1e-3)
    # later steps sample with the weights one update behind the ones that train
    assert all(d > 10 * difference[0] + 1e-5 for d in difference[1:]), difference
    assert all(r != 1.0 for r in ratio[1:]), ratio
    assert all(row["score/teacher_log_probs_reused"] == 1 for row in rows)


def test_an_evaluation_drains_the_generation_in_flight(tmp_path, one_thread):
    out = tmp_path / "run"
    trainer, read = async_trainer(out, "trainer.max_steps=3", "trainer.eval_strategy=steps",
                                  "trainer.eval_steps=2", "trainer.eval_questions=4",
                                  "trainer.per_device_eval_batch_size=4", "trainer.max_completion_length=24")
    try:
        trainer.train()
        fake = trainer.vllm_generation
        train_prompts = [unique_prompt_ids(trainer, batch) for batch in read if len(batch) == 16]
    finally:
        release_trainer(trainer)
    rows = read_metrics(out / METRICS_FILE)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["step"] for row in read_metrics(out / METRICS_FILE, EVAL_EVENT)] == [2, 3]  # and the last step
    # after the evaluation at step 2 the next step generates synchronously with the current weights
    assert [row["async/staleness"] for row in rows] == [0, 1, 0]
    assert [row["async/overlapped"] for row in rows] == [0, 1, 0]
    # calls: B0, B1 (ahead), B2 (ahead, dropped by the evaluation's drain), the evaluation, B2 again with the
    # current weights, B3 (ahead, dropped by the last evaluation's drain), the last evaluation
    assert [call["step"] for call in fake.calls] == [0, 0, 1, 2, 2, 2, 3]
    assert [call["prompts"] for call in fake.calls[:3]] == [train_prompts[0], train_prompts[2], train_prompts[4]]
    assert fake.calls[4]["prompts"] == train_prompts[4] and fake.calls[5]["prompts"] == train_prompts[6]
    assert fake.calls[3]["prompts"] not in train_prompts and fake.calls[6]["prompts"] not in train_prompts
    # each evaluation waits for the generation in flight, then pushes; step 3 trains on the weights the evaluation
    # pushed, with no second push of them
    assert fake.events == [("sync", 0), ("generate", 0), ("done", 0), ("generate", 1), ("done", 1),
                           ("sync", 1), ("generate", 2), ("done", 2), ("sync", 2), ("generate", 3), ("done", 3),
                           ("generate", 4), ("done", 4), ("generate", 5), ("done", 5), ("sync", 3),
                           ("generate", 6), ("done", 6)]
    assert fake.syncs == [0, 1, 2, 3]
    assert "async/push_seconds" in rows[1] and "async/push_seconds" not in rows[2]
