"""Every run config is a delta over the root cfgs/train.yaml, composes and instantiates; group options are deltas
over their _base; every YAML key is commented; no field shadows TRL's."""

import dataclasses
import re
from pathlib import Path

import pytest
import trl
from omegaconf import DictConfig, OmegaConf

from rlt_mono.cli import main as cli_main
from rlt_mono.config import CONFIG_DIR, ConfigError, available_run_configs, compose, config_groups, stage_groups
from rlt_mono.config import instantiate as _instantiate
from rlt_mono.data.rows import DataConfig
from rlt_mono.rewards import TeacherRewardConfig
from rlt_mono.rl.grpo_config import RLTConfig
from rlt_mono.stages import STAGES

ROOT_CONFIG = CONFIG_DIR / "train.yaml"
# A YAML key at any depth (list entries excluded).
_KEY = re.compile(r"^\s*[A-Za-z_][\w.]*:")


def _stage(name: str) -> str:
    return compose(name).get("stage")


def test_every_run_config_composes_and_names_a_known_stage():
    assert {name: _stage(name) in STAGES for name in available_run_configs()} == \
        {name: True for name in available_run_configs()}


@pytest.mark.parametrize("name", [n for n in available_run_configs() if _stage(n) == "teacher_rlt"])
def test_run_config_composes_and_instantiates(name, tmp_path):
    cfg = compose(name, [f"output_dir={tmp_path}"])
    assert set(cfg) >= {"model", "student", "data", "reward", "trainer", "placement", "logging", "seed"}
    _instantiate(TeacherRewardConfig, cfg.reward, "reward")
    _instantiate(DataConfig, cfg.data, "data")
    trainer = OmegaConf.to_container(cfg.trainer)
    # CPU-checkable: no bf16, 8-bit optimizer or liger-kernel (GPU only)
    trainer.update(output_dir=str(tmp_path), bf16=False, use_cpu=True, optim="adamw_torch", use_liger_kernel=False)
    args = _instantiate(RLTConfig, trainer, "trainer")
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps % args.num_generations == 0


def test_mono_run_has_the_reference_batch_sizes(tmp_path):
    cfg = compose("teacher_rlt_mono")
    t = cfg.trainer
    assert t.per_device_train_batch_size * t.gradient_accumulation_steps == 32  # completions per step
    assert (t.num_generations, t.max_completion_length, t.steps_per_generation) == (8, 4096, 8)
    assert (t.beta, t.temperature, t.loss_type, t.scale_rewards) == (0.04, 0.7, "grpo", "group")
    assert (t.ref_model_mixup_alpha, t.vllm_mode, t.vllm_gpu_memory_utilization) == (0.9, "colocate", 0.7)
    assert cfg.placement.offload_reference and cfg.placement.offload_student
    assert cfg.model.model_name_or_path.startswith("Qwen/Qwen2.5")
    assert cfg.student.model_name_or_path.startswith("Qwen/Qwen2.5")


def test_overrides_and_errors():
    cfg = compose("cfgs/run_cfg/demo_tiny.yaml", ["trainer.max_steps=3", "reward.clip_kl=5"])
    assert cfg.trainer.max_steps == 3 and cfg.reward.clip_kl == 5
    with pytest.raises(ConfigError, match="Could not override 'trainer.max_stepz'"):
        compose("demo_tiny", ["trainer.max_stepz=3"])
    with pytest.raises(ConfigError, match="Could not find 'placement/nowhere'"):
        compose("demo_tiny", ["placement=nowhere"])
    with pytest.raises(ConfigError, match="no run config named 'nope'"):
        compose("nope")
    with pytest.raises(ConfigError, match=r"reward: .*answer_log_prob_coeff has 1 entries"):
        _instantiate(TeacherRewardConfig, compose("demo_tiny", ["reward.answer_log_prob_coeff=[1.0]"]).reward,
                     "reward")


def test_rlt_fields_do_not_shadow_grpo_config():
    ours = {f.name for f in dataclasses.fields(RLTConfig)} - {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert ours == {"explanation_samples_per_step", "plot_metrics", "vllm_detokenize", "eval_questions",
                    "activation_offloading", "offload_actor_in_generation", "dynamic_sampling_rounds",
                    "sleep_leak_warn_gib", "left_align_padding", "max_minutes"}
    with pytest.raises(ValueError, match="explanation_samples_per_step must be >= 0"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, explanation_samples_per_step=-1, use_cpu=True)


def test_vllm_rollouts_skip_detokenization_unless_stop_strings_need_it():
    args = RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True, generation_kwargs={"min_tokens": 3})
    assert args.generation_kwargs == {"detokenize": False, "min_tokens": 3}
    args = RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True, vllm_detokenize=True)
    assert args.generation_kwargs == {"detokenize": True}
    # transformers rollouts: GenerationConfig has no such flag, nothing is added
    assert RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True).generation_kwargs is None
    with pytest.raises(ValueError, match="trainer.vllm_detokenize=true"):
        RLTConfig(output_dir="/tmp/x", max_steps=1, use_cpu=True, use_vllm=True,
                  generation_kwargs={"stop": ["</think>"]})


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_every_yaml_key_has_a_comment_above_it(path: Path):
    """Keys at every depth, and each entry of the root's defaults list (the group it picks)."""
    lines = path.read_text().splitlines()
    root = path == ROOT_CONFIG
    for i, line in enumerate(lines):
        if not (_KEY.match(line) or (root and line.startswith("  - "))):
            continue
        assert i > 0 and lines[i - 1].lstrip().startswith("#"), f"{path.name}:{i + 1} {line!r} has no comment"


@pytest.mark.parametrize("name", available_run_configs())
def test_every_run_config_is_a_delta_over_the_root(name):
    """It starts from /train, names its stage and run, and leaves the other run-level keys to the root."""
    text = (CONFIG_DIR / "run_cfg" / f"{name}.yaml").read_text()
    assert f"# Launch: ./launch_mono.sh cfgs/run_cfg/{name}.yaml" in text.split("\ndefaults:")[0]  # the header
    raw = OmegaConf.create(text)
    assert raw.defaults[0] == "/train" and raw.defaults[-1] == "_self_"
    assert all(next(iter(entry)).startswith("override /") for entry in raw.defaults[1:-1])
    assert raw.run_name == name and raw.stage in STAGES
    assert not {"seed", "output_dir", "run_dir", "resume_from_checkpoint"} & set(raw)


@pytest.mark.parametrize("name", available_run_configs())
def test_each_run_composes_the_groups_its_stage_reads(name):
    cfg = compose(name)
    groups = {key for key in cfg if isinstance(cfg[key], DictConfig) and key != "pipeline"}
    # the groups its stage declares (rlt_mono.stages); a pipeline's data group may be left out (it reads none itself)
    assert groups == set(STAGES[cfg.stage].config_groups) or (cfg.stage == "pipeline" and not groups)


def test_the_root_leaves_stage_and_run_name_to_the_run_configs():
    root = compose(str(ROOT_CONFIG))
    assert OmegaConf.is_missing(root, "stage") and OmegaConf.is_missing(root, "run_name")
    assert set(root) == {"model", "student", "data", "reward", "placement", "logging",  # no stage's own group
                         "stage", "run_name", "seed", "output_dir", "run_dir", "resume_from_checkpoint", "memory",
                         "study", "steps", "rerun_changed", "keep_checkpoints"}  # the pipeline's settings


# Each stage's own group: null in the root; the stage's run config picks its option for the size.
STAGE_GROUPS = ("trainer", "sft", "distill", "eval")


@pytest.mark.parametrize("name", available_run_configs())
def test_a_run_config_picks_its_stage_group_for_the_size_and_drops_no_group(name):
    """Compose leaves out the groups a stage does not read (rlt_mono.config.dropped_groups): no run config drops one."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "run_cfg" / f"{name}.yaml").defaults)
    entries = [next(iter(entry.items())) for entry in defaults if isinstance(entry, dict)]
    assert not [key for key, value in entries if value is None]
    assert not re.search(r"override /\w+: null", (CONFIG_DIR / "run_cfg" / f"{name}.yaml").read_text())
    picked = {key.removeprefix("override /") for key, value in entries if value == "size/${size}"}
    assert picked == set(STAGE_GROUPS) & set(STAGES[compose(name).stage].config_groups)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_compose_reads_each_stages_groups_from_its_declaration(stage):
    """``compose`` reads the groups from the stage module's source (rlt_mono.config imports no stage); a stage that
    launches runs (Stage.steps) composes none of its own."""
    declared = STAGES[stage]
    assert stage_groups(stage) == (() if declared.steps is not None else declared.config_groups)


@pytest.mark.parametrize("declaration, groups", [
    ('STAGE: Stage = Stage(name="mine", run=run, config_groups=("data", "mine"))', ("data", "mine")),
    ('STAGE = Stage(name="mine", run=run, config_groups=GROUPS)', "config_groups must be written out as a tuple"),
    ('STAGE = Stage("mine", run)', "STAGE must be declared as Stage(name=..., ...) with keywords"),
    ('STAGE = make_stage("mine")', "STAGE must be declared as Stage(name=..., ...) with keywords"),
])
def test_a_stage_declaration_is_read_annotated_or_refused_in_one_line(declaration, groups, tmp_path, monkeypatch):
    module = tmp_path / "mine.py"
    module.write_text(f"from rlt_mono.stages.stage import Stage\n\n{declaration}\n")
    monkeypatch.setattr("rlt_mono.config.module_file", lambda name: module if name == "rlt_mono.stages.mine" else None)
    stage_groups.cache_clear()  # read once per process: this test's module, not another's
    if isinstance(groups, tuple):
        assert stage_groups("mine") == groups
    else:
        with pytest.raises(ConfigError, match=re.escape(groups)):
            stage_groups("mine")
    stage_groups.cache_clear()


def test_a_group_picked_on_the_command_line_is_composed_and_a_key_of_a_dropped_group_is_refused():
    assert "student" not in compose("teacher_sft") and compose("teacher_sft", ["student=tiny"]).student.dtype
    assert compose("pipeline_tiny", ["data=gsm_symbolic"]).data.source == "gsm_symbolic"
    assert set(compose("demo_tiny", ["stage=teacher_sft"])) & {"student", "reward", "placement"} == set()
    with pytest.raises(ConfigError, match=r"Could not override 'reward.micro_batch_size'"):
        compose("teacher_sft", ["reward.micro_batch_size=16"])


# The run config of each stage; the size group sizes it (cfgs/size/).
STAGE_CONFIGS = ["teacher_sft", "teacher_rlt_mono", "distill", "student_sft", "eval"]


def test_no_run_config_is_a_size_twin_of_another():
    """A stage on other hardware is its run config with size=<option>, not a copy named <config>_<option>."""
    names = set(available_run_configs())
    twins = [name for name in names for size in config_groups()["size"]
             if name.endswith(f"_{size}") and name.removesuffix(f"_{size}") in names]
    assert not twins


@pytest.mark.parametrize("name", STAGE_CONFIGS)
def test_size_tiny_runs_each_stage_on_the_tiny_pair_on_cpu(name):
    full, tiny = compose(name), compose(name, ["size=tiny"])
    assert compose(name, ["size=full"]) == full  # full: the default
    assert set(tiny) == set(full) and tiny.stage == full.stage  # the same groups: a run config's drops stay dropped
    models = [group for group in ("model", "student") if group in tiny]
    assert models and all(tiny[group].model_name_or_path.startswith("embedded:") for group in models)
    assert all(not full[group].model_name_or_path.startswith("embedded:") for group in models)
    assert tiny.logging.report_to == []  # no tracker on CPU
    for group in ("trainer", "sft"):
        if group in tiny:
            assert tiny[group].use_cpu and not tiny[group].bf16
    for group in ("distill", "eval"):
        if group in tiny:
            assert tiny[group].max_new_tokens == 64 and tiny.data.max_rows is not None  # a few short rows


def test_each_model_is_described_once():
    """A model that is both a model (teacher) and a student option is described by its student option; the model
    option of the same name defers to it and adds only the teacher's keys (cfgs/model/_base.yaml, which defers to
    cfgs/student/_base.yaml for the keys both roles share)."""
    assert OmegaConf.load(CONFIG_DIR / "model" / "_base.yaml").defaults == ["/student/_base@_here_", "_self_"]
    shared = set(config_groups()["model"]) & set(config_groups()["student"]) - {"tiny"}  # tiny: two models
    assert shared
    for name in shared:
        raw = OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml")
        assert set(raw) == {"defaults"} and raw.defaults == ["_base", f"/student/{name}@_here_", "_self_"], name
        cfg = compose("teacher_rlt_mono", [f"model={name}", f"student={name}"])
        assert {k: cfg.model[k] for k in cfg.student} == OmegaConf.to_container(cfg.student), name
    described = [OmegaConf.load(path).get("model_name_or_path") for group in ("model", "student")
                 for path in sorted((CONFIG_DIR / group).glob("[!_]*.yaml"))]
    described = [model for model in described if model is not None]
    assert len(described) == len(set(described)), "a model described in two files"


@pytest.mark.parametrize("group", sorted(p.parent.name for p in CONFIG_DIR.glob("*/_base.yaml")))
def test_group_options_are_deltas_over_their_base(group):
    """Every option starts from _base.yaml (hidden from the options) and sets every key the base leaves ??? (but
    data=custom's data.source, which the command line sets)."""
    host = {"sft": ["teacher_sft", "size=tiny"]}.get(group, ["demo_tiny"])
    base = compose(host[0], [*host[1:], f"{group}=_base"])[group]  # with what it defers to (model: student/_base)
    required = {key for key in base if OmegaConf.is_missing(base, key)}
    assert "_base" not in config_groups()[group]
    for option in config_groups()[group]:
        defaults = OmegaConf.load(CONFIG_DIR / group / f"{option}.yaml").defaults
        assert defaults in (["_base", "_self_"], ["_base", f"/student/{option}@_here_", "_self_"]), option
        composed = compose(host[0], [*host[1:], f"{group}={option}"])[group]
        assert list(composed)[:len(base)] == list(base), option  # the base's keys, in its order
        left = [key for key in required if OmegaConf.is_missing(composed, key)]
        assert left == (["source"] if (group, option) == ("data", "custom") else []), option  # custom: the command's


def test_run_dir_is_a_new_folder_per_run_name_and_start_time():
    cfg = compose("demo_tiny", ["run_name=mine"])
    assert re.fullmatch(r"outputs/mine/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", cfg.run_dir)
    assert cfg.output_dir is None and cfg.resume_from_checkpoint is None


@pytest.mark.parametrize(("argv", "error"), [
    (["distill", "size=tiny", "resume_from_checkpoint=true"],
     "error: stage distill keeps no checkpoints: drop resume_from_checkpoint (run it again with "
     "output_dir=<its folder> to continue it)"),
    (["eval", "size=tiny", "stage=???"],
     "error: stage is not set: the run config sets it (or add stage=... to the command)"),
    (["demo_tiny", "run_name=???"],
     "error: run_name is not set: the run config sets it (or add run_name=... to the command)"),
    (["demo_tiny", "seed=x"], "error: seed must be an integer, got 'x'"),
    (["teacher_rlt_mono", "memory=fast"], "error: memory='fast': choose one of auto, speed, manual"),
    (["demo_tiny", "trainer.offload_actor_in_generation=maybe"],
     "error: trainer.offload_actor_in_generation must be true or false, got 'maybe'"),
    (["demo_tiny", "trainer.left_align_padding=maybe"],
     "error: trainer.left_align_padding must be true or false, got 'maybe'"),
    (["demo_tiny", "trainer.use_liger_kernel=maybe"],
     "error: trainer.use_liger_kernel must be true or false, got 'maybe'"),
    (["demo_tiny", "trainer.use_liger_kernel=true"],
     "error: trainer.use_liger_kernel=true runs liger-kernel's Triton kernels on a GPU, and this run has none (no "
     "CUDA device, or trainer.use_cpu=true): set trainer.use_liger_kernel=false"),
    (["demo_tiny", "trainer.activation_offloading=true"],
     "error: trainer.activation_offloading moves activations from a GPU to the CPU: it needs a GPU run"),
])
def test_run_level_key_mistakes_are_one_line_before_any_stage_starts(argv, error, capsys):
    assert cli_main(argv) == 2
    assert capsys.readouterr().err == error + "\n"


def test_no_key_is_declared_twice_across_groups():
    cfg = compose("teacher_rlt_mono")
    groups = ["model", "student", "data", "reward", "trainer", "placement", "logging"]
    seen = {}
    for group in groups:
        for key in cfg[group]:
            if group in ("model", "student") and key in ("model_name_or_path", "dtype", "gguf_file"):
                continue  # the same field of two different models
            assert key not in seen, f"{group}.{key} also declared in {seen.get(key)}"
            seen[key] = group


def test_a_run_config_of_ones_own_outside_the_package_composes_with_the_packages_groups(tmp_path):
    """An installed user's own run config (not inside the package's cfgs/) builds on the package's root and groups
    as a shipped one does, its stage's unread groups left out the same way."""
    for name in ("demo_tiny", "teacher_sft"):
        own = tmp_path / f"my_{name}.yaml"
        own.write_text((CONFIG_DIR / "run_cfg" / f"{name}.yaml").read_text())
        assert compose(str(own), ["trainer.max_steps=2"] if name == "demo_tiny" else []) == \
            compose(name, ["trainer.max_steps=2"] if name == "demo_tiny" else [])
    assert "student" not in compose(str(tmp_path / "my_teacher_sft.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        compose(str(tmp_path / "nowhere.yaml"))
    (tmp_path / "mine.yml").write_text("stage: eval\n")
    with pytest.raises(ConfigError, match="a run config of your own ends in .yaml"):
        compose(str(tmp_path / "mine.yml"))


# The trained stages of a pipeline and the group whose weights each trains.
TRAINED_GROUP = {"teacher_sft": "model", "teacher_rlt": "model", "student_sft": "student"}


@pytest.mark.parametrize("name", [n for n in available_run_configs() if _stage(n) == "pipeline"])
def test_every_shipped_pipeline_trains_float32_weights_or_adapters(name):
    """A pipeline's SFT and RL stages train float32 weights (under bfloat16 autocast) or LoRA adapters: in bfloat16
    a step of their learning rates (1e-6 to 3e-5) changes a tenth to a third of a model's weights and the rest
    rounds away (rlt_mono/runs/precision.py)."""
    stages = compose(name).pipeline
    trained = {}
    for stage, group in TRAINED_GROUP.items():
        if stage in stages:
            cfg = compose(stages[stage].config, list(stages[stage].overrides))
            trained[stage] = "adapters" if cfg[group].get("lora_r") else cfg[group].dtype
    assert trained and set(trained.values()) <= {"float32", "adapters"}, trained
