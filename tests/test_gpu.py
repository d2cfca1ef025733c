"""On a CUDA GPU with vLLM: the tiny pair trains with vLLM colocated and asleep between generations, the
frozen models live on CPU outside their phase, the one-call weight sync is installed and visible in vLLM's
greedy output, and the reward reuses TRL's policy log-probs instead of running the teacher.

Marked ``gpu``: skipped without CUDA (run them on a GPU host before a change to GPU code counts as done).
"""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

# Set for this process's vLLM engine (rlt_mono.rl.build): a child process must pick its own.
DISTRIBUTED_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PROMPTS = ["Tom has 3 bags of 4 apples. How many apples?", "A train goes 60 km per hour for 2 hours. How far?"]


@pytest.fixture(scope="module")
def bf16_pair(tiny_pair, tmp_path_factory):
    """The embedded pair saved in bfloat16, the dtype vLLM's Hopper attention kernels take."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("bf16_pair")
    for role, path in (("teacher", tiny_pair.teacher_path), ("student", tiny_pair.student_path)):
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(root / role)
        AutoTokenizer.from_pretrained(path).save_pretrained(root / role)
    return root


def _vllm_pair(bf16_pair) -> list[str]:
    """The overrides every GPU run here starts from: the bf16 pair, trained on the GPU with vLLM colocated at 0.3
    and asleep between generations, for two steps."""
    return [f"model.model_name_or_path={bf16_pair / 'teacher'}", f"student.model_name_or_path={bf16_pair / 'student'}",
            "model.dtype=bfloat16", "student.dtype=bfloat16", "trainer.use_cpu=false", "trainer.bf16=true",
            "placement.rollout=vllm", "+trainer.vllm_mode=colocate", "trainer.vllm_gpu_memory_utilization=0.3",
            "trainer.vllm_enable_sleep_mode=true", "trainer.max_steps=2"]


def _why(done: subprocess.CompletedProcess) -> str:
    """What a failed child said: the first traceback of its stderr (several ranks' logs interleave there, and the
    first error is the cause), then the ends of its stderr and stdout."""
    first = done.stderr.find("Traceback")
    head = done.stderr[first:first + 6000] + "\n...\n" if first >= 0 else ""
    return head + done.stderr[-3000:] + "\n--- stdout ---\n" + done.stdout[-2000:]


def _launch_mono(*args: str) -> subprocess.CompletedProcess:
    """``launch_mono.sh <args>`` in a child process that picks its own distributed variables (this process set
    its own for its vLLM engine)."""
    from pathlib import Path

    launcher = Path(__file__).resolve().parent.parent / "launch_mono.sh"
    return subprocess.run([str(launcher), *args], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES})


@pytest.fixture(scope="module")
def gpu_run(bf16_pair, tmp_path_factory):
    from rlt_mono import build_trainer, compose

    out = tmp_path_factory.mktemp("gpu_run")
    cfg = compose("demo_tiny", [f"output_dir={out}", *_vllm_pair(bf16_pair), "trainer.learning_rate=5e-3",
                                "trainer.sync_ref_model=false"])
    import trl.trainer.grpo_trainer as grpo

    at_vllm_start = []  # bytes torch had allocated on the GPU since before the build, when vLLM's engine started
    engine, before = grpo.VLLMGeneration, torch.cuda.memory_allocated()

    class Starting(engine):
        def __init__(self, *args, **kwargs):
            at_vllm_start.append(torch.cuda.memory_allocated() - before)
            super().__init__(*args, **kwargs)

    grpo.VLLMGeneration = Starting
    try:
        trainer = build_trainer(cfg)
    finally:
        grpo.VLLMGeneration = engine
    seen = []  # (model id, device while resident, bytes added to the GPU while resident)

    def spying(context):
        @contextlib.contextmanager
        def spy(model, *args, **kwargs):
            before = torch.cuda.memory_allocated()
            with context(model, *args, **kwargs) as m:
                seen.append((id(model), next(model.parameters()).device.type, torch.cuda.memory_allocated() - before))
                yield m

        return spy

    # The reference's passes go through the swapper; the reward's through its model_context (the trainer's
    # counting wrapper around the swapper's resident).
    trainer.swapper.resident = spying(trainer.swapper.resident)
    trainer.teacher_reward.model_context = spying(trainer.teacher_reward.model_context)
    greedy_before = _greedy(trainer)
    trainer.train()
    yield trainer, out, seen, greedy_before, at_vllm_start


def _greedy(trainer):
    """Greedy vLLM completions of PROMPTS with the teacher's current weights pushed to vLLM."""
    from vllm import SamplingParams

    generation = trainer.vllm_generation
    generation.sync_weights()
    generation.llm.wake_up(tags=["kv_cache"])
    prompts = [trainer.processing_class.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                            add_generation_prompt=True) for p in PROMPTS]
    outputs = generation.llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    generation.llm.sleep(level=2)
    generation._llm_weights_sleeping = True
    return [o.outputs[0].token_ids for o in outputs]


def _all_on_cpu_pinned(model):
    return all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())


def test_frozen_models_live_on_cpu_outside_their_phase(gpu_run):
    trainer, _, seen, _, _ = gpu_run
    student, reference = trainer.teacher_reward.student_model, trainer.ref_model
    assert _all_on_cpu_pinned(student) and _all_on_cpu_pinned(reference)
    assert next(trainer.model.parameters()).device.type == "cuda"
    for model in (student, reference):
        uses = [(device, added) for key, device, added in seen if key == id(model)]
        assert uses, "the model was never swapped in"
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for device, added in uses:
            assert device == "cuda"
            assert added >= weight_bytes * 0.9  # its weights really were on the GPU during the phase


def test_training_with_sleeping_colocated_vllm_writes_phase_metrics(gpu_run):
    from rlt_mono.runs.outputs import read_metrics

    trainer, out, _, _, _ = gpu_run
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["vllm/asleep"] == 1.0
        assert r["swap/gib"] > 0 and r["swap/seconds"] > 0
        for phase in ("generate", "score", "train"):
            assert r[f"phase/{phase}/seconds"] > 0
            assert r[f"phase/{phase}/peak_allocated_gib"] > 0
        assert r["perf/generation_tokens_per_s"] > 0 and r["perf/train_tokens_per_s"] > 0
        assert 0 < r["perf/mfu"] < 1
        # vLLM's prefix cache, read from its outputs: every prompt token counted, a share of them served from cache
        assert r["generate/prompt_tokens"] > 0 and 0 <= r["generate/prefix_cached_frac"] <= 1
    assert trainer.vllm_generation.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching


def test_colocated_vllm_gets_the_one_call_sync_and_the_reward_reuses_policy_log_probs(gpu_run):
    from rlt_mono.runs.outputs import read_metrics

    trainer, out, seen, _, _ = gpu_run
    # vLLM importance sampling (TRL's default) makes TRL compute its policy log-probs in every generation batch.
    assert trainer.trl_surface.one_call_sync and trainer.trl_surface.reuses_policy_log_probs
    assert trainer.trl_surface.expects_policy_log_probs
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    for r in rows:
        assert r["generate/weight_sync_seconds"] > 0  # the one-call sync ran, timed
        assert r["score/teacher_log_probs_reused"] == 1
        # The reward entered its model context for the teacher only for re-tokenized explanations.
        assert r.get("score/reward_teacher_passes", 0) <= (1 if r["alignment/retokenized_frac"] > 0 else 0)
    assert id(trainer.model) not in {key for key, _, _ in seen} or any(r["alignment/retokenized_frac"] > 0
                                                                        for r in rows)


def test_weight_sync_is_visible_in_vllm_greedy_output(gpu_run):
    trainer, _, _, greedy_before, _ = gpu_run
    assert _greedy(trainer) != greedy_before


def test_vllm_starts_beside_the_teacher_alone(gpu_run):
    """What memory.start_bytes counts beside vLLM's pool when its engine starts: the teacher's weights, not the
    reference (TRL loads it on the CPU in the one-rank distributed run rlt_mono sets up, and moves it after)."""
    trainer, _, _, _, at_vllm_start = gpu_run
    teacher = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert len(at_vllm_start) == 1 and teacher <= at_vllm_start[0] < 1.5 * teacher


@pytest.mark.gpu2
def test_student_gpu_placement_keeps_the_student_on_gpu1_and_overlaps(bf16_pair, tmp_path):
    if ran_in_own_process("test_student_gpu_placement_keeps_the_student_on_gpu1_and_overlaps"):
        return  # its sleeping vLLM engine cannot share this process with gpu_run's
    from rlt_mono import build_trainer, compose, release_trainer
    from rlt_mono.runs.outputs import read_metrics

    cfg = compose("demo_tiny", [f"output_dir={tmp_path}", "placement=student_gpu", *_vllm_pair(bf16_pair)])
    trainer = build_trainer(cfg)
    trainer.train()
    assert {p.device for p in trainer.teacher_reward.student_model.parameters()} == {torch.device("cuda", 1)}
    assert {p.device for p in trainer.model.parameters()} == {torch.device("cuda", 0)}
    assert {p.device for p in trainer.ref_model.parameters()} == {torch.device("cuda", 0)}  # resident in student_gpu
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["overlap/student_seconds"] > 0 and 0 <= r["overlap/fraction"] <= 1 for r in rows)
    release_trainer(trainer)


# SDPA's kernels that take no arbitrary mask, by the profiler op each runs under.
MASKLESS_ATTENTION = {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention"}


def test_left_aligned_padding_takes_a_maskless_attention_kernel(bf16_pair):
    """A left-padded bf16 batch through the teacher: with its mask, SDPA runs its memory-efficient kernel (the 7B
    profile's masked passes did); hooked by rlt_mono.rl.left_align it runs without a mask and takes a kernel the mask
    rules out: flash (the 7B profile, head dim 128) or cuDNN's (this pair, head dim 64, on the H200 with torch 2.11),
    with the same logits at the real positions, to bf16 rounding."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from rlt_mono.rl import left_align

    model = AutoModelForCausalLM.from_pretrained(bf16_pair / "teacher", dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size, (4, 96), generator=generator).cuda()
    mask = torch.ones_like(ids)
    mask[0, :40], mask[1, :7], mask[3, :1] = 0, 0, 0  # left padding of three lengths, one row without

    def forward() -> tuple[torch.Tensor, set[str]]:
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return logits, {event.key for event in prof.key_averages()}

    masked, masked_ops = forward()
    assert left_align.install(model.get_decoder())
    aligned, aligned_ops = forward()
    assert aligned_ops & MASKLESS_ATTENTION, sorted(aligned_ops)
    assert not masked_ops & MASKLESS_ATTENTION, sorted(masked_ops)
    assert "aten::_scaled_dot_product_efficient_attention" in masked_ops, sorted(masked_ops)
    # bf16 rounding (on the CPU, the same comparison: mean |difference| 0.007, max 0.17, on logits up to 10)
    real = mask.bool()
    assert (aligned[real].float() - masked[real].float()).abs().mean() < 0.03
    assert (aligned[real].argmax(-1) == masked[real].argmax(-1)).float().mean() > 0.98


def _runs_liger_layers(decoder) -> bool:
    """Whether every RMSNorm and MLP of ``decoder`` runs liger's kernels (liger swaps their forward in place)."""
    from liger_kernel.transformers import LigerRMSNorm

    return decoder.norm.forward.__func__ is LigerRMSNorm.forward and all(
        layer.mlp._get_name() == "LigerSwiGLUMLP" and layer.input_layernorm.forward.__func__ is LigerRMSNorm.forward
        for layer in decoder.layers)


def test_liger_layer_kernels_give_the_plain_layers_log_probs_and_gradients(bf16_pair, monkeypatch):
    """``trainer.use_liger_kernel``'s kernels (transformers' apply_liger_kernel, TRL's fused log-prob head kept): the
    RMSNorms and MLPs of the teacher run liger's Triton kernels, and a padded bf16 batch gets the plain layers'
    log-probs and gradients, to bf16 rounding."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.liger import apply_liger_kernel
    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):  # liger patches the module: undone after
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))

    def log_probs_and_gradient(model):
        ids = torch.randint(10, model.config.vocab_size, (4, 96), generator=torch.Generator().manual_seed(0)).cuda()
        mask = torch.ones_like(ids)
        mask[0, 60:], mask[2, 30:] = 0, 0  # right padding, as the reward's passes have
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        taken = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0] * mask[:, 1:]
        taken.sum().backward()
        return taken.detach(), model.model.layers[0].mlp.gate_proj.weight.grad.float().flatten()

    def load():
        return AutoModelForCausalLM.from_pretrained(bf16_pair / "teacher", dtype=torch.bfloat16).cuda().train()

    plain, plain_grad = log_probs_and_gradient(load())
    model = load()
    apply_liger_kernel(model, {"fused_linear_cross_entropy": False})
    assert _runs_liger_layers(model.get_decoder())
    fused, fused_grad = log_probs_and_gradient(model)
    assert (fused - plain).abs().mean() < 0.02, (fused - plain).abs().max()
    assert torch.nn.functional.cosine_similarity(fused_grad, plain_grad, dim=0) > 0.99


def test_actor_aside_frees_the_gpu_and_restores_weights_gradients_and_optimizer_state():
    from rlt_mono.rl.phases import PhaseTimer
    from rlt_mono.rl.swapper import ModelSwapper

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 2048, device="cuda")).sum().backward()
    optimizer.step()  # creates exp_avg / exp_avg_sq on the GPU
    model(torch.randn(8, 2048, device="cuda")).sum().backward()  # gradients held too
    weights = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    states = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()]  # "step": CPU
    timer = PhaseTimer("cuda:0")
    swapper = ModelSwapper("cuda:0", timer, pin_memory=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    aside = swapper.actor_aside(model, optimizer)
    # weights, gradients and both Adam states of 2 x (2048 x 2048 + 2048) float32 parameters left the GPU
    assert before - torch.cuda.memory_allocated() >= 4 * 2 * (2048 * 2048 + 2048) * 4
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    aside.restore()
    for p, w, g, st in zip(model.parameters(), weights, grads, states, strict=True):
        assert p.device.type == "cuda" and torch.equal(p.data, w) and torch.equal(p.grad, g)
        assert all(torch.equal(optimizer.state[p][k], v) and optimizer.state[p][k].device == v.device
                   for k, v in st.items())
    optimizer.step()  # the optimizer still steps the same parameters
    assert not torch.equal(next(model.parameters()).data, weights[0])
    assert timer.pop_metrics()["swap/gib"] > 0


def ran_in_own_process(test_name: str) -> bool:
    """Run ``test_name`` again in a pytest process of its own and assert it passed; True there (the caller
    returns), False inside that process (the caller runs the test). vLLM's sleep-mode allocator takes one engine per
    process, and this module's gpu_run holds one."""
    if os.environ.get("RLT_MONO_GPU_CHILD") == "1":
        return False
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{test_name}"],
                           env={**{k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES},
                                "RLT_MONO_GPU_CHILD": "1"}, capture_output=True, text=True)
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
    return True


def test_qlora_teacher_trains_adapters_and_vllm_generates_from_the_merged_weights(bf16_pair, tmp_path):
    if ran_in_own_process("test_qlora_teacher_trains_adapters_and_vllm_generates_from_the_merged_weights"):
        return
    from safetensors.torch import load_file

    from rlt_mono import build_trainer, compose, release_trainer
    from rlt_mono.rl import lora
    from rlt_mono.runs.outputs import read_metrics
    from rlt_mono.stages.final_model import save_final

    cfg = compose("demo_tiny", [f"output_dir={tmp_path}", *_vllm_pair(bf16_pair), "trainer.learning_rate=5e-3",
                                "model.lora_r=8", "model.load_in_4bit=true"])
    trainer = build_trainer(cfg)
    assert trainer.model.is_loaded_in_4bit and trainer.ref_model is None and not trainer.args.sync_ref_model
    name = "model.layers.0.mlp.down_proj.weight"
    base = trainer.model.get_submodule("base_model.model." + name.removesuffix(".weight")).base_layer.weight
    packed_before = base.data.clone()
    trainer.train()
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["score/teacher_log_probs_reused"] == 1 and r["generate/weight_sync_seconds"] > 0 for r in rows)
    assert torch.equal(base.data, packed_before)  # the 4-bit base never changes: no merge into it
    assert any(p.abs().sum() > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)
    merged = dict(lora.merged_named_params(trainer.model))
    generation = trainer.vllm_generation
    generation.sync_weights()
    vllm_model = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
    in_vllm = dict(vllm_model.named_parameters())[name]
    assert in_vllm.dtype == torch.bfloat16 and torch.equal(in_vllm, merged[name])  # vLLM holds the merged layer
    generation.llm.sleep(level=2)
    generation._llm_weights_sleeping = True
    final = save_final(trainer, tmp_path)
    assert torch.equal(load_file(final / "model.safetensors")[name], merged[name].cpu())
    release_trainer(trainer)


def test_training_with_liger_kernels_patches_the_teacher_the_reference_and_the_student(bf16_pair, tmp_path):
    """trainer.use_liger_kernel through build_trainer, vLLM colocated: two steps train, and the teacher (transformers,
    at train()), the reference and the student (rlt_mono's trainer) all run liger's RMSNorm and SwiGLU. In a process
    of its own: liger patches transformers' Qwen2 module for every model after it."""
    if ran_in_own_process("test_training_with_liger_kernels_patches_the_teacher_the_reference_and_the_student"):
        return
    import math

    from rlt_mono import build_trainer, compose, release_trainer
    from rlt_mono.runs.outputs import read_metrics

    trainer = build_trainer(compose("demo_tiny", [f"output_dir={tmp_path}", *_vllm_pair(bf16_pair),
                                                  "trainer.use_liger_kernel=true"]))
    trainer.train()
    for model in (trainer.model, trainer.ref_model, trainer.teacher_reward.student_model):
        assert _runs_liger_layers(model.get_decoder())
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward" in r]
    assert len(rows) == 2 and all(math.isfinite(r["reward"]) for r in rows)
    release_trainer(trainer)


def test_sleep_wake_cycles_keep_device_memory_flat(bf16_pair, tmp_path):
    """22 RL steps of the tiny pair, each one cycle of generate -> sleep (level 2, TRL's) -> score and train ->
    wake: the device memory this process holds right after each wake-up grows by at most 256 MiB over the cycles
    after the warm-up, and the trainer's leak tracker (rlt_mono.rl.sleep_leak) logs no warning. With
    RLT_MONO_SLEEP_LEAK_READINGS=<file> set, the readings of every cycle are written there (JSON) for a report."""
    if ran_in_own_process("test_sleep_wake_cycles_keep_device_memory_flat"):
        return
    import dataclasses
    import json
    from pathlib import Path

    from rlt_mono import build_trainer, compose, release_trainer
    from rlt_mono.runs.outputs import read_metrics

    steps, bound = 22, 256 * 1024**2
    overrides = [o for o in _vllm_pair(bf16_pair) if not o.startswith("trainer.max_steps=")]
    cfg = compose("demo_tiny", [f"output_dir={tmp_path}", *overrides, f"trainer.max_steps={steps}",
                                "trainer.save_steps=1000"])
    trainer = build_trainer(cfg)
    trainer.train()
    tracker = trainer.sleep_cycles
    # demo_cpu generates once per optimizer step (steps_per_generation = gradient_accumulation_steps = 2).
    assert len(tracker.cycles) == steps
    baseline = tracker.baseline()
    if report := os.environ.get("RLT_MONO_SLEEP_LEAK_READINGS"):
        Path(report).write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "card_bytes": torch.cuda.mem_get_info()[1],
            "warmup_cycles": tracker.warmup_cycles, "baseline_cycles": tracker.baseline_cycles,
            "baseline": dataclasses.asdict(baseline), "cycles": [dataclasses.asdict(c) for c in tracker.cycles]},
            indent=1))
    wake_growth = [cycle.after_wake - baseline.after_wake for cycle in tracker.cycles[tracker.warmup_cycles:]]
    assert max(wake_growth) <= bound, [f"{g / 1024**2:.0f} MiB" for g in wake_growth]
    assert tracker.warned_at is None
    # The readings see vLLM's pool (0.3 of the card): it leaves the device when vLLM sleeps.
    total = torch.cuda.mem_get_info()[1]
    assert all(cycle.after_wake - cycle.after_sleep > 0.5 * 0.3 * total for cycle in tracker.cycles)
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "reward" in r]
    assert len(rows) == steps
    assert all(r["memory/after_wake_gib"] > r["memory/after_sleep_gib"] > 0 for r in rows)
    assert all(r["memory/after_wake_growth_gib"] * 1024**3 <= bound
               for r in rows[tracker.warmup_cycles + tracker.baseline_cycles:])
    release_trainer(trainer)


def test_data_parallel_ranks_each_colocate_vllm_and_write_one_run(bf16_pair, tmp_path):
    """placement=dp through launch_mono.sh and accelerate: one rank per GPU (two where there are two, else one),
    each with its own sleeping vLLM engine and the one-call weight sync; one metrics row per step, one RNG file
    per rank, one final teacher."""
    import json

    ranks = min(2, torch.cuda.device_count())
    out = tmp_path / "dp"
    done = _launch_mono("demo_tiny", "placement=dp", f"placement.num_processes={ranks}", f"output_dir={out}",
                        *_vllm_pair(bf16_pair), "trainer.save_steps=2")
    assert done.returncode == 0, _why(done)
    assert f"all {ranks} ranks finished" in done.stderr
    assert "destroy_process_group() was not called" not in done.stderr  # each rank closed its NCCL group
    # each rank pins its reference and student (the bf16 pair: 2 x 283,136 bytes): the launcher logged the sum
    pinned = f"CPU memory: {ranks} rank{'s' * (ranks > 1)} x 0.00 GiB (reference 0.00, student 0.00)"
    assert pinned in done.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["generate/weight_sync_seconds"] > 0 and r["vllm/asleep"] == 1 for r in steps)
    rng = sorted(p.name for p in (out / "checkpoint-2").glob("rng_state*.pth"))
    assert rng == (["rng_state.pth"] if ranks == 1 else ["rng_state_0.pth", "rng_state_1.pth"])
    assert (out / "final" / "model.safetensors").is_file()


def test_auto_placement_runs_split_on_two_gpus_and_mono_on_one(bf16_pair, tmp_path):
    """placement=auto through launch_mono.sh: with two or more GPUs visible the RL stage relaunches as
    placement=split (data parallel, two ranks, one per GPU); with one it runs mono in the launcher's process."""
    from rlt_mono.runs.outputs import read_metrics

    gpus = torch.cuda.device_count()
    out = tmp_path / "auto"
    done = _launch_mono("demo_tiny", "placement=auto", f"output_dir={out}", *_vllm_pair(bf16_pair))
    assert done.returncode == 0, _why(done)
    assert "destroy_process_group() was not called" not in done.stderr  # the run closed its NCCL group
    relaunched = f"placement=auto: {gpus} GPUs visible, placement=split"
    if gpus >= 2:
        assert relaunched in done.stderr and "all 2 ranks finished" in done.stderr
    else:
        assert "placement=split" not in done.stderr and "ranks finished" not in done.stderr
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert (out / "final" / "model.safetensors").is_file()


def _fsdp2_launcher(config: str, out, *fixed: str):
    """``(ranks, launch)``: ``launch(*overrides)`` runs ``launch_mono.sh <config> placement=dp
    placement.strategy=fsdp2`` on one rank per GPU (up to two) into ``out``, with ``fixed`` then ``overrides``."""
    ranks = min(2, torch.cuda.device_count())

    def launch(*overrides):
        return _launch_mono(config, "placement=dp", "placement.strategy=fsdp2", f"placement.num_processes={ranks}",
                            f"output_dir={out}", *fixed, *overrides)

    return ranks, launch


def _assert_fsdp_checkpoint(checkpoint) -> None:
    assert (checkpoint / "optimizer.bin").is_file() and not (checkpoint / "optimizer.pt").exists()
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file()  # the model copy an FSDP resume loads


def test_fsdp2_shards_the_teacher_saves_whole_weights_and_resumes(bf16_pair, tmp_path):
    """placement=dp placement.strategy=fsdp2 (one rank per GPU, up to two): TRL syncs the sharded teacher into each
    rank's vLLM (no one-call sync), the mixed reference is gathered into each checkpoint beside accelerate's
    optimizer.bin, a resume restores it, and final/ holds whole weights."""
    import json
    import shutil

    from safetensors import safe_open

    from rlt_mono.rl.trainer import REFERENCE_FILE

    out = tmp_path / "fsdp2"
    ranks, launch = _fsdp2_launcher("demo_tiny", out, *_vllm_pair(bf16_pair), "trainer.save_steps=1",
                                    "trainer.ref_model_sync_steps=1")

    done = launch()
    assert done.returncode == 0, _why(done)
    assert "strategy fsdp2" in done.stderr and f"all {ranks} ranks finished" in done.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["generate/weight_sync_seconds"] > 0 for r in steps)
    checkpoint = out / "checkpoint-1"
    _assert_fsdp_checkpoint(checkpoint)
    name = "model.layers.0.mlp.down_proj.weight"
    with safe_open(bf16_pair / "teacher" / "model.safetensors", "pt") as initial:
        names, shape = set(initial.keys()), initial.get_tensor(name).shape
    with safe_open(checkpoint / REFERENCE_FILE, "pt") as saved:
        assert names <= set(saved.keys()) and saved.get_tensor(name).shape == shape  # whole weights, not a shard
    with safe_open(out / "final" / "model.safetensors", "pt") as final:
        assert final.get_tensor(name).shape == shape
    for name in ("checkpoint-2", "final"):
        shutil.rmtree(out / name)
    # Without vLLM importance sampling TRL computes no policy log-probs: the reward runs the sharded teacher itself.
    resumed = launch("resume_from_checkpoint=true", "+trainer.vllm_importance_sampling_correction=false")
    assert resumed.returncode == 0, _why(resumed)
    assert "reference model restored from" in resumed.stderr
    last = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "step"][-1]
    assert last["step"] == 2 and last["score/reward_teacher_passes"] >= 1
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["event"] == "step"] == [1, 2]
    assert (out / "final" / "model.safetensors").is_file()


def test_fsdp2_sft_of_the_teacher_checkpoints_sharded_state_and_resumes(bf16_pair, tmp_path):
    """teacher_sft with placement=dp placement.strategy=fsdp2 (one rank per GPU, up to two): transformers' own FSDP2
    path trains, each checkpoint holds accelerate's optimizer.bin and model copy, a resume from the first
    checkpoint finishes the run, and final/ holds whole weights that moved."""
    import json
    import shutil

    from safetensors import safe_open

    out = tmp_path / "sft_fsdp2"
    ranks, launch = _fsdp2_launcher(
        "teacher_sft", out, "size=tiny", f"model.model_name_or_path={bf16_pair / 'teacher'}", "model.dtype=bfloat16",
        "sft.use_cpu=false", "sft.bf16=true", "sft.max_steps=4", "sft.save_steps=2")

    done = launch()
    assert done.returncode == 0, _why(done)
    assert "strategy fsdp2" in done.stderr and f"all {ranks} ranks finished" in done.stderr
    for step in (2, 4):
        _assert_fsdp_checkpoint(out / f"checkpoint-{step}")
    name = "model.layers.0.mlp.down_proj.weight"
    with safe_open(bf16_pair / "teacher" / "model.safetensors", "pt") as initial:
        before = initial.get_tensor(name)
    with safe_open(out / "final" / "model.safetensors", "pt") as final:
        after = final.get_tensor(name)
    assert after.shape == before.shape and not torch.equal(after.to(before.dtype), before)  # whole, and trained
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 4 and summary["heldout_loss_after"] > 0  # the held-out pass ran on every rank
    for name in ("checkpoint-4", "final", "sft_summary.json"):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    resumed = launch("resume_from_checkpoint=true")
    assert resumed.returncode == 0, _why(resumed)
    resumed_summary = json.loads((out / "sft_summary.json").read_text())
    assert resumed_summary["steps"] == 4
    assert resumed_summary["heldout_loss_before"] == summary["heldout_loss_before"]  # read back, not measured again
    assert (out / "checkpoint-4" / "optimizer.bin").is_file() and (out / "final" / "model.safetensors").is_file()


# ---- placement=async: the rollout on a vLLM server on GPU 1, one step ahead --------------------------------
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="placement=async needs two GPUs")


def _async_pair(bf16_pair) -> list[str]:
    """The bf16 pair under placement=async: the teacher trains on GPU 0, the vLLM server generates on GPU 1."""
    colocated = ("+trainer.vllm_mode=", "trainer.vllm_enable_sleep_mode=", "trainer.max_steps=")
    return [o for o in _vllm_pair(bf16_pair) if not o.startswith(colocated)] + [
        "placement=async", "trainer.vllm_enable_sleep_mode=false", "trainer.max_steps=4"]


def _server_greedy(trainer) -> list[list[int]]:
    """Greedy completions of PROMPTS from the rollout server after the teacher's current weights are pushed."""
    trainer.one_step_off.drain()
    trainer.vllm_generation.sync_weights()
    # (transformers 5 tokenizes a chat into a BatchEncoding: its input_ids are the prompt)
    prompts = [trainer.processing_class.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                                            add_generation_prompt=True, return_dict=True)["input_ids"]
               for p in PROMPTS]
    output = trainer.vllm_generation.vllm_client.generate(prompts=[list(ids) for ids in prompts], n=1,
                                                          temperature=0.0, max_tokens=24)
    return output["completion_ids"]


@two_gpus
def test_async_trains_one_step_off_with_the_weights_pushed_each_step(bf16_pair, tmp_path):
    from rlt_mono import build_trainer, compose
    from rlt_mono.runs.outputs import read_metrics

    out = tmp_path / "async"
    trainer = build_trainer(compose("demo_tiny", [f"output_dir={out}", *_async_pair(bf16_pair),
                                                  "trainer.learning_rate=5e-3", "trainer.sync_ref_model=false"]))
    try:
        assert trainer.rollout_server.healthy() and trainer.args.vllm_mode == "server"
        before = _server_greedy(trainer)
        trainer.train()
        after = _server_greedy(trainer)
        server = trainer.rollout_server.process.pid
    finally:
        trainer.release()
    assert after != before  # the trained weights reached the server
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1]  # exactly one step behind after the first
    assert [r["async/overlapped"] for r in rows] == [0, 1, 1, 1]
    assert [r["async/pushes"] for r in rows] == [1, 1, 1, 1] and all(r["async/push_seconds"] > 0 for r in rows)
    assert all("sampling/importance_sampling_ratio/mean" in r for r in rows)  # TRL's correction is on
    assert (out / "rollout_server.log").is_file()  # (final/ is the stage's: the killed-and-resumed test's)
    status = Path(f"/proc/{server}/status")
    assert not status.exists(), status.read_text()[:200]  # released with the trainer: its pid is gone


@two_gpus
def test_async_killed_after_a_checkpoint_resumes_and_leaves_no_server(bf16_pair, tmp_path):
    import signal
    import time

    from rlt_mono.runs.outputs import read_metrics

    out = tmp_path / "killed"
    launcher = Path(__file__).resolve().parent.parent / "launch_mono.sh"
    args = ["demo_tiny", f"output_dir={out}", *_async_pair(bf16_pair), "trainer.save_steps=2"]
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    with open(tmp_path / "killed.log", "w") as log:
        run = subprocess.Popen([str(launcher), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 600
        while not (out / "checkpoint-2").is_dir():
            assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "killed.log").read_text()[-3000:]
            time.sleep(0.1)
        run.send_signal(signal.SIGKILL)
        run.wait()
    time.sleep(10)  # the server ends on its parent's death (SIGTERM), freeing GPU 1
    done = _launch_mono(*args, "resume_from_checkpoint=true")
    assert done.returncode == 0, _why(done)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in rows][-2:] == [3, 4]
    assert rows[-2]["async/staleness"] == 0 and rows[-1]["async/staleness"] == 1  # a resume starts on-policy
    assert (out / "final" / "model.safetensors").is_file()
