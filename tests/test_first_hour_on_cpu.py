"""A newcomer's first hour: a config mistake answers at once in one line, a redirected run holds no progress bars,
an SFT run logs one compact line per step, the command names itself as typed, ``compare`` needs no torch."""

import dataclasses
import importlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from terminal_run import run_in_terminal

from rlt_mono import config_check, runtime
from rlt_mono.config import ConfigError, compose, instantiate
from rlt_mono.stages.sft import heldout_loss_text

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "trl", "datasets")
# The run configs of the five stages, each also run with size=tiny.
STAGE_CONFIGS = ("teacher_sft", "teacher_rlt_mono", "distill", "student_sft", "eval")
RLT_MONO = Path(sys.executable).parent / "rlt-mono"  # the console command pip installs beside the interpreter


def _timed(command: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``command``: its result, its wall seconds and the CPU seconds it (and its children) used. The CPU time is
    what the command costs, whatever else the machine runs; the wall time also counts the waits for a busy core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# ---- 1. config mistakes: one line, exit code 2, before any heavy import ------------------------------------------
@pytest.mark.parametrize(("override", "line"), [
    ("trainer.max_steps=-1", "error: trainer.max_steps must be > 0, got -1"),
    ("reward.micro_batch_size=0", "error: reward.micro_batch_size must be >= 1, got 0"),
    ("+trainer.max_stepz=3", "error: unknown key trainer.max_stepz: did you mean trainer.max_steps, trainer.save_steps "
                             "or trainer.eval_steps?"),
])
def test_a_config_mistake_is_one_line_before_torch_loads(override, line):
    """The run stops in the command's process before torch, transformers, TRL or datasets are imported (what makes
    it quick on any machine), with the one line last on stderr."""
    script = ("import sys\nfrom rlt_mono import cli\ncode = cli.main(['demo_tiny', sys.argv[1]])\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(code)")
    result, wall, cpu = _timed([sys.executable, "-c", script, override])
    assert (result.returncode, result.stderr, result.stdout) == (2, line + "\n", "[]\n")
    # about 0.4 s on 2 idle cores; torch alone takes longer to import. Under load the wall time stretches, not the CPU.
    assert cpu < 2 and wall < 10, f"{cpu:.1f} s of CPU, {wall:.1f} s of wall time"


def test_the_launcher_answers_a_mistake_in_one_line_within_seconds():
    result, wall, cpu = _timed(["./launch_mono.sh", "cfgs/run_cfg/demo_tiny.yaml", "trainer.max_steps=-1"])
    assert (result.returncode, result.stderr, result.stdout) == (2, "error: trainer.max_steps must be > 0, got -1\n",
                                                                 "")
    assert cpu < 2 and wall < 10, f"{cpu:.1f} s of CPU, {wall:.1f} s of wall time"


def test_check_runs_every_check_then_stops_before_torch_and_makes_no_folder(tmp_path):
    """--check: what a script runs first to check its commands; a pipeline's later steps are checked too."""
    script = ("import sys\nfrom rlt_mono import cli\ncode = cli.main(sys.argv[1:])\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(code)")
    good, _, _ = _timed([sys.executable, "-c", script, "student_sft", "size=tiny", "data=embedded",
                         f"output_dir={tmp_path / 'run'}", "--check"])
    assert (good.returncode, good.stdout) == (0, "[]\n") and not (tmp_path / "run").exists()
    assert "student_sft: the config and its overrides pass every check a run makes before it starts" in good.stderr
    # a value out of range fails it, as it fails the run (--show-config only composes)
    bad, _, _ = _timed([sys.executable, "-c", script, "student_sft", "size=tiny", "data=embedded",
                        "sft.learning_rate=-1", "--check"])
    assert bad.returncode == 2 and bad.stderr.endswith("error: sft.learning_rate must be >= 0, got -1\n")


def _unknown(config: str, overrides: list[str]) -> str:
    from rlt_mono.cli import compose_naming_unknown_keys

    with pytest.raises(ConfigError) as caught:
        cfg = compose_naming_unknown_keys(config, overrides)
        config_check.check_config(cfg, overrides)
    return str(caught.value)


def test_unknown_keys_get_close_names_never_the_whole_list():
    assert _unknown("demo_tiny", ["trainer.max_stepz=3"]) == (
        "unknown key trainer.max_stepz: did you mean trainer.max_steps, trainer.save_steps or trainer.eval_steps?")
    assert _unknown("demo_tiny", ["trainr.max_steps=3"]) == (
        "unknown key trainr.max_steps: did you mean trainer.max_steps?")
    assert _unknown("demo_tiny", ["sed=3"]) == "unknown key sed: did you mean seed?"
    assert _unknown("demo_tiny", ["+model.attn_impl=sdpa"]) == (
        "unknown key model.attn_impl: did you mean model.attn_implementation?")
    assert _unknown("teacher_sft", ["size=tiny", "+sft.lerning_rate=1"]).startswith(
        "unknown key sft.lerning_rate: did you mean sft.learning_rate")
    assert _unknown("demo_tiny", ["sft.learning_rate=1"]) == (
        "unknown key sft.learning_rate: stage teacher_rlt has no sft group (its groups: model, student, data, reward, "
        "trainer, placement, logging)")
    # a library field the group's YAML does not set (trl.SFTConfig's tf32) is added with +; set with + it passes
    assert _unknown("teacher_sft", ["size=tiny", "sft.tf32=true"]) == (
        "unknown key sft.tf32: a field of the sft group's dataclass that its YAML does not set (it keeps the "
        "library's default): add it with +sft.tf32=...")
    from rlt_mono.cli import compose_naming_unknown_keys

    added = compose_naming_unknown_keys("teacher_sft", ["size=tiny", "+sft.tf32=true"])
    config_check.check_config(added, ["size=tiny", "+sft.tf32=true"])
    assert added.sft.tf32 is True
    assert _unknown("demo_tiny", ["+reward.zzzzzzz=1"]) == (
        "unknown key reward.zzzzzzz: reward has no key zzzzzzz and none close to it")
    # a notebook building the dataclass itself gets the same kind of line
    with pytest.raises(ConfigError, match=r"^unknown key trainer.max_stepz: did you mean trainer.max_steps, "):
        from rlt_mono.rl.grpo_config import RLTConfig

        instantiate(RLTConfig, {"max_stepz": 3}, "trainer")


def test_the_fields_read_from_the_sources_are_the_dataclasses_fields():
    for group, reference in config_check.GROUP_CLASSES.items():
        module, _, name = reference.partition(":")
        real = [field.name for field in dataclasses.fields(getattr(importlib.import_module(module), name))]
        assert sorted(config_check.dataclass_fields(reference)) == sorted(real), group


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "cfgs" / "run_cfg").glob("*.yaml")))
def test_every_run_config_passes_the_early_check(name, monkeypatch):
    """No false alarm on a shipped config (GPU configs with liger-kernel's layers: as on a GPU host with it)."""
    monkeypatch.setattr(config_check.runtime, "gpus_present", lambda: 1)
    monkeypatch.setattr(runtime.importlib.util, "find_spec", _with_liger(runtime.importlib.util.find_spec))
    extra = ["data.source=rows.jsonl"] if name == "student_sft" else []
    config_check.check_config(compose(name, extra), extra)
    if name in STAGE_CONFIGS:
        config_check.check_config(compose(name, ["size=tiny", *extra]), extra)


def _with_liger(find_spec):
    return lambda name, *args: object() if name == "liger_kernel" else find_spec(name, *args)


# Each composed group a check is tried on: (run config, overrides).
HOSTS = {"trainer": ("demo_tiny", []), "sft": ("teacher_sft", ["size=tiny"]), "data": ("demo_tiny", []),
         "reward": ("demo_tiny", []), "distill": ("distill", ["size=tiny"]), "eval": ("eval", ["size=tiny"]),
         "placement": ("demo_tiny", [])}
# (group, key, a value the early check and the group's own check both refuse, a close one both accept)
CASES = [
    ("trainer", "max_steps", 0, 1), ("trainer", "per_device_train_batch_size", 0, 2),
    ("trainer", "gradient_accumulation_steps", 0, 1), ("trainer", "max_completion_length", 0, 1),
    ("trainer", "logging_steps", 0, 1), ("trainer", "save_steps", 0, 1), ("trainer", "ref_model_sync_steps", 0, 1),
    ("trainer", "sleep_leak_warn_gib", 0.0, 0.1), ("trainer", "temperature", 0.0, 0.1),
    ("trainer", "num_generations", 1, 2), ("trainer", "steps_per_generation", 0, 1), ("trainer", "beta", -0.1, 0.0),
    ("trainer", "learning_rate", -1e-5, 0.0), ("trainer", "explanation_samples_per_step", -1, 0),
    ("trainer", "eval_questions", -1, 0), ("trainer", "dynamic_sampling_rounds", -1, 0),
    ("trainer", "ref_model_mixup_alpha", 1.5, 1.0), ("trainer", "activation_offloading", True, False),
    ("trainer", "use_liger_kernel", True, False), ("trainer", "max_steps", "abc", 2),
    ("sft", "learning_rate", -1e-3, 0.0), ("sft", "per_device_train_batch_size", 0, 1),
    ("sft", "per_device_eval_batch_size", 0, 1), ("sft", "gradient_accumulation_steps", 0, 1),
    ("sft", "max_steps", 0, -1), ("sft", "early_stopping_patience", -1, 0), ("sft", "use_liger_kernel", True, False),
    ("data", "on_bad_row", "drop", "skip"), ("data", "on_long_row", "drop", "skip"),
    ("data", "row_format", "rows", "columns"), ("data", "max_rows", 0, 1), ("data", "eval_rows", -1, 0),
    ("data", "eval_fraction", 1.0, 0.0), ("data", "heldout_template_rows", 0, 1),
    ("data", "heldout_templates", [-1], []), ("data", "embedded_rows", 0, 1), ("data", "max_rows", 1.5, None),
    ("reward", "normalize_log_prob_fn", "log", "exp"), ("reward", "normalize_kl_fn", "log", "exp_norm"),
    ("reward", "reduction_log_prob_fn", ["mean", "mode"], ["mean", "max"]),
    ("reward", "reduction_kl_fn", ["mean"], ["mean", "min"]), ("reward", "clip_log_prob", 0.0, 0.1),
    ("reward", "clip_kl", -1.0, 0.1), ("reward", "answer_log_prob_coeff", [1.0, -0.01], [1.0, 0.0]),
    ("reward", "kl_penalty_reward_coeff", [-3.0, 0.03], [0.0, 0.03]), ("reward", "not_matched_penalty", 0.5, 0.0),
    ("reward", "unbias_student_log_probs_temp", 0.0, 0.1), ("reward", "micro_batch_size", 0, 1),
    *[(group, key, bad, good) for group in ("distill", "eval") for key, bad, good in (
        ("temperature", -0.1, 0.0), ("top_p", 0.0, 1.0), ("max_new_tokens", 0, 1), ("rows_per_batch", 0, 1),
        ("vllm_gpu_memory_utilization", 1.0, 0.9), ("vllm_kv_cache_gib", 0.0, 0.5),
        ("vllm_enforce_eager", "no", False))],
    ("distill", "samples_per_question", 0, 1), ("distill", "selection", "worst", "all"),
    ("eval", "split", "test", "train"), ("eval", "student_prompt", "socratic", "plain"),
    ("eval", "student_max_new_tokens", 0, 1), ("eval", "bootstrap_resamples", 0, 1), ("eval", "confidence", 1.0, 0.5),
    ("placement", "mode", "split", "mono"), ("placement", "rollout", "sglang", "transformers"),
]


def _group_check(group: str, values: dict, tmp_path: Path) -> None:
    """What the stage itself checks when it builds the group (raises on a refused value)."""
    if group == "placement":
        from tests.test_placement_on_cpu import placed

        placed(values["mode"], 0, rollout=values["rollout"])
        return
    if group == "trainer" and values.get("use_liger_kernel"):  # rlt_mono.rl.build checks this before the dataclass
        from rlt_mono.rl.build import check_gpu_kernels

        check_gpu_kernels(OmegaConf.create({"stage": "teacher_rlt", "trainer": values}), on_gpu=False)
    if group == "sft" and values.get("use_liger_kernel"):
        from rlt_mono.rl.build import check_gpu_kernels

        check_gpu_kernels(OmegaConf.create({"stage": "teacher_sft", "sft": values}), on_gpu=False, group="sft")
    module, _, name = config_check.GROUP_CLASSES[group].partition(":")
    if group in ("trainer", "sft"):
        values = {**values, "output_dir": str(tmp_path)}
    if group == "sft" and values.get("early_stopping_patience"):
        from rlt_mono.stages.sft import check_early_stopping

        check_early_stopping(values)
    instantiate(getattr(importlib.import_module(module), name), values, group)


def _early_check(group: str, values: dict) -> None:
    reference = config_check.GROUP_CLASSES.get(group)
    fields = config_check.dataclass_fields(reference) if reference else {}
    config_check.check_values(group, OmegaConf.create(values), fields)


def test_every_rule_of_the_early_check_is_the_stages_own(tmp_path):
    """Each value the early check refuses is refused when the stage builds the group too, and a close value both
    accept: the table says what the dataclasses say, no more. Every rule of ``config_check.rules()`` is tried."""
    bases = {group: OmegaConf.to_container(compose(config, overrides)[group], resolve=True)
             for group, (config, overrides) in HOSTS.items()}
    for group, key, bad, good in CASES:
        values = {**bases[group], key: bad}
        with pytest.raises(ConfigError, match=re.escape(f"{group}.{key}")):
            _early_check(group, values)
        with pytest.raises(ValueError):  # ConfigError, PlacementError, DataConfigError are ValueErrors
            _group_check(group, values, tmp_path)
        values[key] = good
        _early_check(group, values)
        _group_check(group, values, tmp_path)
    assert {(group, key) for group, rules in config_check.rules().items() for key in rules} <= {
        (group, key) for group, key, _, _ in CASES}


# ---- 2 and 3. no bars off a terminal, one bar in it, one line per SFT step ---------------------------------------
SFT_RUN = ["teacher_sft", "size=tiny", "sft.max_steps=2", "sft.logging_steps=1", "sft.diversity_prompts=0",
           "sft.per_device_train_batch_size=8", "sft.gradient_accumulation_steps=1", "data.eval_rows=8"]
LIBRARY_BARS = ("Loading weights", "Writing model shards", "Building labels", "Truncating", "Map", "it/s]", "s/it]")


def test_an_sft_run_into_a_file_has_no_bar_and_one_line_per_step(tmp_path):
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        result = subprocess.run([sys.executable, "-m", "rlt_mono.cli", *SFT_RUN, f"output_dir={tmp_path / 'run'}"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600)
    text = log.read_text()
    assert result.returncode == 0, text[-3000:]
    assert "\r" not in text and "\x1b[" not in text
    assert not [bar for bar in LIBRARY_BARS if bar in text]
    assert "{'" not in text  # no metrics dict
    steps = re.findall(r"rlt_mono\.runs\.console: step (\d)/2 \| loss \d\.\d+ \| lr \d\.\de[-+]\d\d \| [\d.]+ s/step\n",
                       text)
    assert steps == ["1", "2"]
    assert re.search(r"rlt_mono\.runs\.console: step 0/2 \| held-out loss \d\.\d+\n", text)
    assert re.search(r"rlt_mono\.runs\.console: done: step 2/2 in [\d.]+ s \([\d.]+ s/step\) \| mean loss .* "
                     r"\| outputs in ",
                     text)
    assert re.search(r"teacher_sft done: 2 steps, held-out loss \d\.\d{1,4} -> \d\.\d{1,4}; model in ", text)


def test_an_sft_run_in_a_terminal_draws_one_bar(tmp_path):
    # as from a shell: without the switches an in-process cli.main of an earlier test left off a terminal
    code, text = run_in_terminal([sys.executable, "-m", "rlt_mono.cli", *SFT_RUN, f"output_dir={tmp_path / 'run'}"],
                                 ROOT)
    assert code == 0, text[-3000:]
    bars = re.findall(r"\d+%\|[^|]*\| *(\d+)/(\d+) \[", text)
    assert bars and {total for _, total in bars} == {"2"}  # the training bar only
    assert not [bar for bar in LIBRARY_BARS[:5] if bar in text] and "\x1b[A" not in text
    assert re.search(r"step 2/2 \| loss \d\.\d+ \| lr ", text)


def test_the_held_out_line_says_what_was_not_measured():
    assert heldout_loss_text(None, None) == "held-out loss: not measured (no held-out rows)"
    assert heldout_loss_text(1.0319271087646484, 0.9775885939598083) == "held-out loss 1.032 -> 0.9776"
    assert heldout_loss_text(None, 0.5) == "held-out loss not measured -> 0.5"


# ---- 4. the command names itself as typed ------------------------------------------------------------------------
def test_help_names_the_command_as_it_was_typed():
    launcher = subprocess.run(["./launch_mono.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert launcher.stdout.startswith("usage: ./launch_mono.sh ")
    assert "list every key and its value with:  ./launch_mono.sh <run config> --show-config" in launcher.stdout
    console = subprocess.run([str(RLT_MONO), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert console.stdout.startswith("usage: rlt-mono ") and "launch_mono" not in console.stdout


def test_a_run_config_path_from_another_folder_is_answered_with_its_name(tmp_path):
    result = subprocess.run([str(RLT_MONO), "cfgs/run_cfg/demo_tiny.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: run config cfgs/run_cfg/demo_tiny.yaml not found relative to the current folder "
                             f"{os.path.realpath(tmp_path)}: run it by name, from any folder: rlt-mono demo_tiny\n")
    typo = subprocess.run([str(RLT_MONO), "demo_tny"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert typo.stderr == "error: no run config named 'demo_tny'; did you mean rlt-mono demo_tiny?\n"


# ---- 5. compare without torch ------------------------------------------------------------------------------------
def test_compare_imports_nothing_heavy(tmp_path):
    for name, mean in (("a", 0.25), ("b", 0.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval.json").write_text(json.dumps({
            "teacher": name, "student": "s", "questions": 4, "questions_sha256": "same",
            "metrics": {"student/accuracy": {"mean": mean, "low": 0.0, "high": 1.0, "n": 4, "too_few": True}}}))
    script = ("import runpy, sys\nsys.argv = ['rlt_mono.stages.eval', 'compare', *sys.argv[1:]]\n"
              "try:\n    runpy.run_module('rlt_mono.stages.eval', run_name='__main__')\n"
              f"finally:\n    print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), str(tmp_path / "b" / "eval.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, "[]\n")
    assert ("| student/accuracy | 0.250 [0.000, 1.000] (too few rows) (n=4) | 0.500 [0.000, 1.000] (too few rows) "
            "(n=4) |") in result.stdout
    assert result.stdout.startswith(f"| | {tmp_path / 'a'} | {tmp_path / 'b'} |")
    plain = subprocess.run([sys.executable, "-m", "rlt_mono.stages.eval", "compare", str(tmp_path / "a"),
                            str(tmp_path / "nope.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and plain.stderr.startswith(f"error: {tmp_path / 'nope.json'}: no such file")
