"""A newcomer's first hour, the small things: a terminal shows one clean training bar with the log lines above it,
and a few mistakes answer in one line before anything heavy loads."""

import io
import json
import logging
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from terminal_run import run_in_terminal
from transformers import TrainerControl, TrainerState

from rlt_mono import cli, config_check
from rlt_mono.config import compose, default_cache_dir
from rlt_mono.data import gsm_symbolic
from rlt_mono.runs import console

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "trl", "datasets")
# A log line that starts right after a bar's last redraw, on the bar's own line: "... 3.63it/s]2026-11-27 ..." (a
# redraw shorter than the one before ends in spaces).
GLUED = re.compile(r"(?:it/s|s/it)\] *[^ \r\n]")


def _state(step: int, max_steps: int) -> TrainerState:
    state = TrainerState(max_steps=max_steps)
    state.global_step = step
    return state


def _fake_terminal(monkeypatch, request) -> io.StringIO:
    """stderr a terminal that keeps what is written, with the root logger's console handler on it (as
    ``logging.basicConfig`` leaves it in ``rlt_mono.cli``)."""
    stderr = io.StringIO()
    stderr.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", stderr)
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [*root.handlers, handler])
    # setLevel, not the bare attribute: each logger caches whether a level is on, and only setLevel clears that
    # cache (a logger that found INFO off earlier in this process would drop the INFO lines)
    level = root.level
    root.setLevel(logging.INFO)
    request.addfinalizer(lambda: root.setLevel(level))
    return stderr


# ---- 1. one clean bar in a terminal, the log lines above it ------------------------------------------------------
def test_a_line_logged_while_the_bar_is_open_is_written_above_it(monkeypatch, request):
    stderr = _fake_terminal(monkeypatch, request)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    args = SimpleNamespace(disable_tqdm=False, output_dir="/runs/a")
    state, control = _state(0, 2), TrainerControl()
    file_only = logging.getLogger("rlt_mono.tests.file_only")  # a logger that writes to a file alone stays so
    own_file = logging.StreamHandler(io.StringIO())
    monkeypatch.setattr(file_only, "handlers", [own_file])
    monkeypatch.setattr(file_only, "propagate", False)
    callback.on_train_begin(args, state, control)
    assert file_only.handlers == [own_file]
    file_only.warning("to its file only")
    state.global_step = 2
    callback.on_step_end(args, state, control)
    callback.on_log(args, state, control, logs={"train_runtime": 3.0})
    # what another callback logs at the end of training, before this one closes the bar (the reward plot)
    logging.getLogger("rlt_mono.runs.plots").info("wrote /runs/a/reward_components.png")
    callback.on_train_end(args, state, control)
    logging.getLogger("rlt_mono.stages.teacher_rlt").info("final teacher saved to /runs/a/final")
    text = stderr.getvalue()
    assert not GLUED.search(text), text
    assert "to its file only" not in text and own_file.stream.getvalue() == "to its file only\n"
    # each line starts on a cleared line (the bar wiped with \r), the bar drawn again under it
    assert re.search(r"\r *\rdone: step 2/2 in 3\.0 s \(1\.5 s/step\) \| outputs in /runs/a\n\r100%\|", text), text
    assert re.search(r"\r *\rINFO rlt_mono\.runs\.plots: wrote /runs/a/reward_components\.png\n\r100%\|", text), text
    assert re.search(r"\] *\nINFO rlt_mono\.stages\.teacher_rlt: final teacher saved to /runs/a/final\n$", text), text
    assert logging.getLogger().handlers == handlers and not list(console.OPEN_BARS)


def test_a_run_stopped_in_training_closes_its_bar_before_the_error_line(monkeypatch, request):
    stderr = _fake_terminal(monkeypatch, request)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    callback.on_train_begin(SimpleNamespace(disable_tqdm=False, output_dir="/runs/b"), _state(0, 4), TrainerControl())
    assert callback.bar is not None and list(console.OPEN_BARS) == [callback]
    from rlt_mono.cli import close_training_bar

    close_training_bar()  # what cli.main does before it writes the error line
    sys.stderr.write("error: interrupted at step 0\n")
    assert callback.bar is None and not list(console.OPEN_BARS)
    assert re.search(r"\| 0/4 \[00:00<\?, \?it/s\] *\nerror: interrupted at step 0\n$", stderr.getvalue())
    assert logging.getLogger().handlers == handlers


def test_off_a_terminal_there_is_no_bar_and_the_handlers_stay(monkeypatch, caplog):
    stderr = io.StringIO()
    stderr.isatty = lambda: False
    monkeypatch.setattr(sys, "stderr", stderr)
    handlers = list(logging.getLogger().handlers)
    callback = console.CompactProgressCallback()
    args, state, control = SimpleNamespace(disable_tqdm=False, output_dir="/runs/c"), _state(0, 1), TrainerControl()
    with caplog.at_level(logging.INFO, logger="rlt_mono.runs.console"):
        callback.on_train_begin(args, state, control)
        assert logging.getLogger().handlers == handlers  # nothing redirected
        state.global_step = 1
        callback.on_log(args, state, control, logs={"loss": 0.5, "step_time": 0.25})
        callback.on_train_end(args, state, control)
    assert stderr.getvalue() == "" and [r.getMessage() for r in caplog.records] == ["step 1/1 | loss 0.5 | 0.25 s/step"]


@pytest.mark.parametrize("entry, bar", [("rlt_mono.__main__", False), ("rlt_mono.cli", True)])
def test_off_a_terminal_the_entry_switches_tqdm_off_before_it_loads(entry, bar):
    """A bar drawn in the command's own process (transformers' GGUF conversion, a download) stays out of a log:
    ``python -m rlt_mono`` and ``rlt-mono`` (rlt_mono/__main__.py) set the switches before tqdm loads, which reads
    them once, as it loads. Importing rlt_mono.cli first loads tqdm before its main can set them: the bar is drawn."""
    from rlt_mono.runtime import PROGRESS_BAR_SWITCHES

    env = {name: value for name, value in os.environ.items() if name not in PROGRESS_BAR_SWITCHES}
    probe = (f"import {entry}, sys\nassert 'tqdm' in sys.modules\n"
             "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='Converting GGUF'): pass\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("Converting GGUF" in done.stderr) == bar, done.stderr


def test_the_launcher_and_the_console_command_go_through_the_entry_that_switches_bars_off():
    assert 'exec "${PYTHON:-python3}" -m rlt_mono "$@"' in (ROOT / "launch_mono.sh").read_text()
    assert 'rlt-mono = "rlt_mono.__main__:main"' in (ROOT / "pyproject.toml").read_text()


def test_the_demo_in_a_terminal_shows_one_clean_bar(tmp_path):
    """The RL demo in a pseudo-terminal: the reward plot's line, logged at the end of training while the bar is
    still open, is written above the bar, not glued to its last redraw."""
    code, text = run_in_terminal(["./launch_mono.sh", "cfgs/run_cfg/demo_tiny.yaml", "trainer.max_steps=2",
                                  f"output_dir={tmp_path / 'run'}"], ROOT)
    assert code == 0, text[-3000:]
    assert {total for _, total in re.findall(r"\d+%\|[^|]*\| *(\d+)/(\d+) \[", text)} == {"2"}, text
    assert not GLUED.search(text), text[-3000:]
    assert re.search(r"\r *\r[\d-]+ [\d:,]+ INFO rlt_mono\.runs\.plots: wrote .*reward_components\.png\r\n\r100%\|",
                     text)
    assert re.search(r"\] *\r\n[\d-]+ [\d:,]+ INFO rlt_mono\.stages\.teacher_rlt: final teacher saved to ", text)


# ---- 2. mistakes that answer in under 2 s, one line, before torch loads ------------------------------------------
def _cli(overrides: list[str], env: dict | None = None, config: str = "demo_tiny") -> tuple[int, str, str, float]:
    """``cli.main([config, *overrides])`` in a fresh process: (exit code, stderr, the heavy modules it imported, the
    CPU seconds it used: what the command costs whatever else the machine runs, where a busy machine stretches the
    wall time)."""
    script = ("import sys\nfrom rlt_mono import cli\ncode = cli.main(sys.argv[1:])\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\nsys.exit(code)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-c", script, config, *overrides], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result.returncode, result.stderr, result.stdout, cpu


GSM_TEMPLATES = ("0-1, 5-23, 25-26, 28-31, 33-34, 36, 38-60, 62, 64, 66-73, 78, 80-85, 88-89, 91-96")


def test_a_held_out_template_the_source_lacks_is_one_line_before_torch_loads(tmp_path):
    code, stderr, heavy, seconds = _cli(["data=gsm_symbolic", "data.heldout_templates=[999,0,32]",
                                         f"output_dir={tmp_path / 'run'}"])
    assert (code, stderr, heavy) == (2, f"error: data.heldout_templates: [32, 999] not among the templates of "
                                        f"data.source=gsm_symbolic (they are {GSM_TEMPLATES}): hold out templates "
                                        "of that list\n", "[]\n")
    assert seconds < 2, f"{seconds:.1f} s"
    assert not (tmp_path / "run").exists()


def test_the_early_template_list_is_the_generators(monkeypatch):
    """The templates known without reasoning-gym are those its generators give once rlt_mono leaves its own out."""
    assert config_check.gsm_templates() == sorted(gsm_symbolic.generators(default_cache_dir()))
    assert config_check._spans(config_check.gsm_templates()) == GSM_TEMPLATES


def _hub_cache(root: Path, repo: str, config: dict) -> Path:
    """A Hugging Face cache holding ``repo``'s config.json only, laid out as huggingface_hub downloads it."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    (folder / "snapshots" / "abc123").mkdir(parents=True)
    (folder / "snapshots" / "abc123" / "config.json").write_text(json.dumps(config))
    return root


def test_a_lora_rank_above_the_hidden_size_is_one_line_before_torch_loads(tmp_path):
    code, stderr, heavy, seconds = _cli(["model.lora_r=4096", f"output_dir={tmp_path / 'run'}"])
    assert (code, stderr, heavy) == (2, "error: model.lora_r=4096: above the teacher's hidden size (64), the most an "
                                        "adapter's rank can use: set model.lora_r from 1 to 64 (or 0: train every "
                                        "weight)\n", "[]\n")
    assert seconds < 2, f"{seconds:.1f} s"
    # a hub id already downloaded: its cached config.json (a multimodal config keeps it under text_config)
    env = {**os.environ, "HF_HUB_CACHE": str(_hub_cache(tmp_path / "hub", "org/wide", {"text_config": {
        "hidden_size": 896}})), "HF_HUB_OFFLINE": "1"}
    code, stderr, heavy, seconds = _cli(["model.model_name_or_path=org/wide", "model.lora_r=1024"], env=env)
    assert (code, stderr.splitlines()[-1], heavy) == (2, "error: model.lora_r=1024: above the teacher's hidden size "
                                                         "(896), the most an adapter's rank can use: set model.lora_r "
                                                         "from 1 to 896 (or 0: train every weight)", "[]\n")
    assert seconds < 2, f"{seconds:.1f} s"


def test_the_teachers_hidden_size_is_read_where_it_can_be_without_loading_it(tmp_path, monkeypatch):
    import huggingface_hub.constants

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32}))
    (tmp_path / "no-config").mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    cases = [("embedded:teacher", None, 64), (str(folder), None, 32),
             ("org/not-downloaded", None, None), (str(folder), "model.gguf", None),  # GGUF: its config comes later
             ("embedded:nobody", None, None), ("not a hub id", None, None), (str(tmp_path / "no-config"), None, None)]
    assert [config_check.teacher_hidden_size({"model_name_or_path": name, "gguf_file": gguf})
            for name, gguf, _ in cases] == [size for _, _, size in cases]


# ---- 3. a misspelt pipeline step ---------------------------------------------------------------------------------
def test_a_misspelt_pipeline_step_is_answered_with_the_close_name(tmp_path):
    code, stderr, heavy, seconds = _cli(["steps=[distill,distil]", f"output_dir={tmp_path / 'p'}"],
                                        config="pipeline_tiny")
    assert (code, stderr, heavy) == (2, "error: steps: unknown step 'distil': did you mean distill?\n", "[]\n")
    assert seconds < 2, f"{seconds:.1f} s"
    assert not (tmp_path / "p").exists()


def test_a_study_step_without_study_and_a_name_far_from_any_are_one_line_each():
    from rlt_mono.stages.pipeline_steps import PipelineOptions

    for steps, line in ((["eval_sft_teacher"], "steps: eval_sft_teacher is a step of study=true: add study=true, or "
                                               "leave it out of steps"),
                        (["zzz"], "steps: unknown step 'zzz': this pipeline's steps are teacher_sft, teacher_rlt, "
                                  "distill, student_sft, eval_teacher, eval_student")):
        try:
            PipelineOptions(study=False, steps=steps, rerun_changed=False, keep_checkpoints=True)
        except ValueError as err:
            assert str(err) == line
        else:
            raise AssertionError(f"steps={steps} accepted")
    assert PipelineOptions(study=True, steps=["eval_sft_teacher"], rerun_changed=False,
                           keep_checkpoints=True).steps == ["eval_sft_teacher"]


# ---- 4. a data option the data source does not read --------------------------------------------------------------
def test_a_gsm_option_given_to_another_data_source_is_a_warning_naming_it(caplog):
    from rlt_mono.config import compose

    def warnings(overrides: list[str]) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlt_mono.config_check"):
            config_check.check_config(compose("demo_tiny", overrides), overrides)
        return [r.getMessage() for r in caplog.records if r.name == "rlt_mono.config_check"]

    assert warnings(["data.gsm_items_per_template=5"]) == [
        "data.gsm_items_per_template=5 is ignored: only data.source=gsm_symbolic reads it, and this run's data.source "
        "is embedded"]
    # given on the command line at its default value, and the other gsm option
    assert warnings(["data=custom", "data.source=rows.jsonl", "data.gsm_items_per_template=60",
                     "data.gsm_solution=answer"]) == [
        "data.gsm_items_per_template=60 is ignored: only data.source=gsm_symbolic reads it, and this run's "
        "data.source is rows.jsonl",
        "data.gsm_solution=answer is ignored: only data.source=gsm_symbolic reads it, and this run's data.source is "
        "rows.jsonl"]
    assert warnings([]) == []
    assert warnings(["data=gsm_symbolic", "data.gsm_items_per_template=5", "data.gsm_solution=answer"]) == []


# ---- 5. a README's resume command that survives a copy -----------------------------------------------------------
def test_the_resume_command_names_the_run_folder_from_where_it_was_launched(tmp_path, monkeypatch):
    """A run folder inside the launch folder is written relative to it (as a pipeline records its steps), with where
    to run the command from as seen from the run folder: a copy of the tree resumes with the same command."""
    import shutil

    from rlt_mono.runs.readme import write_run_readme

    command = "./launch_mono.sh demo_tiny trainer.max_steps=3"
    resume = f"{command} output_dir=outputs/demo_tiny/t1 resume_from_checkpoint=true"
    where = "in the folder the run was launched in (`../../..` from this folder):"
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    readme = write_run_readme("outputs/demo_tiny/t1", {"run_name": "demo_tiny"}, [], command=command)
    text = readme.read_text()
    assert resume in text.splitlines() and text.count(where) == 1 and str(tmp_path) not in text
    shutil.copytree(tmp_path / "here", tmp_path / "copy")
    monkeypatch.chdir(tmp_path / "copy")  # the copy's own README, written again there, says the same
    assert write_run_readme("outputs/demo_tiny/t1", {"run_name": "demo_tiny"}, [], command=command).read_text() == text
    # a pipeline's step runs in the pipeline folder: its folder is one down
    monkeypatch.chdir(tmp_path / "copy" / "outputs" / "demo_tiny")
    text = write_run_readme("1_teacher_sft", {"run_name": "teacher_sft"}, [], command=command).read_text()
    assert f"{command} output_dir=1_teacher_sft resume_from_checkpoint=true" in text.splitlines()
    assert "in the folder the run was launched in (`..` from this folder):" in text
    # a folder outside the launch folder stays absolute, and so does where to run it from
    text = write_run_readme(tmp_path / "elsewhere", {"run_name": "r"}, [], command=command).read_text()
    assert f"{command} output_dir={tmp_path / 'elsewhere'} resume_from_checkpoint=true" in text.splitlines()
    assert f"in the folder the run was launched in (`{tmp_path / 'copy' / 'outputs' / 'demo_tiny'}`):" in text


# ---- 6. a refused run leaves the disk as it was ------------------------------------------------------------------
def test_a_refused_distill_or_eval_with_an_explicit_output_dir_leaves_nothing(tmp_path, capsys):
    from rlt_mono import cli

    (tmp_path / "there").mkdir()  # a folder that was there before stays, empty as it was
    for stage, folder in (("distill", tmp_path / "new" / "nested"), ("eval", tmp_path / "there")):
        assert cli.main([stage, "size=tiny", f"output_dir={folder}", "model.model_name_or_path=/nowhere/model"]) == 2
        assert capsys.readouterr().err == ("error: model.model_name_or_path=/nowhere/model: no such folder (a local "
                                           "model is a folder with config.json; a hub id looks like org/name)\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["there"]


# ---- 7. the pipeline's wiring is the pipeline's ------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "line"), [
    ("+pipeline.distill.extra_overrides=['output_dir=mine']",
     "pipeline.distill.extra_overrides: output_dir is the pipeline's to set for step distill (output_dir=3_distill): "
     "leave it out"),
    ("+pipeline.eval.extra_overrides=['eval.max_new_tokens=8','model.model_name_or_path=other/teacher']",
     "pipeline.eval.extra_overrides: model.model_name_or_path is the pipeline's to set for step eval_teacher "
     "(model.model_name_or_path=2_teacher_rlt/final): leave it out"),
    ("+pipeline.student_sft.extra_overrides=['data.source=rows.jsonl']",
     "pipeline.student_sft.extra_overrides: data.source is the pipeline's to set for step student_sft "
     "(data.source=3_distill/distill.jsonl): leave it out"),
    ("pipeline.student_sft.overrides=['size=tiny','data=embedded']",
     "pipeline.student_sft.overrides: data is the pipeline's to set for step student_sft (data=custom): leave it out"),
    ("+pipeline.teacher_sft.extra_overrides=['+seed=7']",
     "pipeline.teacher_sft.extra_overrides: seed is the pipeline's to set for step teacher_sft (seed=0): set it on "
     "the pipeline (seed=...)"),
])
def test_a_stage_override_of_the_pipelines_wiring_is_one_line_and_exit_2(extra, line, tmp_path, capsys, launched):
    from rlt_mono import cli

    assert cli.main(["pipeline_tiny", f"output_dir={tmp_path / 'p'}", extra]) == 2
    assert capsys.readouterr().err == f"error: {line}\n"
    assert launched == [] and not (tmp_path / "p").exists()


@pytest.mark.parametrize("group, stage", [("trainer", "demo_tiny"), ("sft", "teacher_sft"), ("sft", "student_sft")])
def test_the_liger_refusal_advises_a_key_the_stage_declares(group, stage, capsys, tmp_path):
    """``<group>.use_liger_kernel=true`` on the CPU is refused with "set <group>.use_liger_kernel=false", and that
    advice, typed as given (no ``+``), composes: both training groups declare the key."""
    overrides = ([] if stage == "demo_tiny" else ["size=tiny"]) + [f"output_dir={tmp_path / 'run'}"]
    assert cli.main([stage, *overrides, f"{group}.use_liger_kernel=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {group}.use_liger_kernel=true ") and err.endswith(
        f"set {group}.use_liger_kernel=false\n"), err
    assert compose(stage, [*overrides, f"{group}.use_liger_kernel=false"])[group].use_liger_kernel is False
