"""bench/study_gsm.sh on the embedded tiny pair: one seed's RL chain with a second distill selection beside it.

What it checks is the orchestration: which folder each pipeline writes, which teacher each distill read and with
which selection, the links that put every step where ``rlt_mono.study.aggregate`` reads it, and both aggregates.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tests.test_pipeline_on_cpu import SMALL

ROOT = Path(__file__).resolve().parent.parent


def _rows(path: Path) -> dict[str, dict]:
    return {row["question"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_a_seed_chain_runs_a_second_selection_and_links_every_step_where_the_study_reads_it(tmp_path):
    root = tmp_path / "study"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "STUDY_CONFIG": "cfgs/run_cfg/pipeline_tiny.yaml", "STUDY_OVERRIDES": " ".join(["study=true", *SMALL]),
           "STUDY_CONTROLS": "", "STUDY_ALSO_SELECTION": "best_correct",
           "RLT_MONO_ENGINE_LOCK": str(tmp_path / "engine.lock")}
    result = subprocess.run(["bash", "bench/study_gsm.sh", str(root), "0", "1"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=1500)
    logs = "".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((root / "logs").glob("*.log")))
    assert result.returncode == 0, result.stdout + logs
    assert (root / "DONE").read_text().split()[:4] == ["teacher_sft=0", "seed0=0", "control0=0", "aggregate=0"]

    main, also, also_ctl, teacher = (root / "seed0", root / "seed0-best_correct", root / "seed0-best_correctctl",
                                     root / "seed0ev")
    # the RL teacher is evaluated in its own folder and linked into both seed folders
    assert (teacher / "5_eval_teacher" / "eval.json").is_file() and not (teacher / "5_eval_teacher").is_symlink()
    for folder in (main, also):
        assert (folder / "5_eval_teacher").resolve() == (teacher / "5_eval_teacher").resolve()
    # each distill read its teacher under its selection: the RL teacher twice, the SFT teacher once (no controls)
    for folder, step, teacher_step, selection in ((main, "3_distill", "2_teacher_rlt", "best"),
                                                  (also, "3_distill", "2_teacher_rlt", "best_correct"),
                                                  (also_ctl, "7_distill_sft_teacher", "1_teacher_sft",
                                                   "best_correct")):
        config = OmegaConf.load(folder / step / "config.yaml")
        assert config.distill.selection == selection, (folder, step)
        assert (folder / config.model.model_name_or_path).resolve() == (main / teacher_step / "final").resolve()
    assert not (main / "7_distill_sft_teacher").exists()  # STUDY_CONTROLS="" ran none of the usual controls
    # the same samples (seeded by seed and question) kept two ways: best_correct keeps a sample with every equation
    # right, or the reward's best when there is none
    best, best_correct = _rows(main / "3_distill" / "distill.jsonl"), _rows(also / "3_distill" / "distill.jsonl")
    assert best.keys() == best_correct.keys() and len(best) == 4
    for question, row in best_correct.items():
        assert row["wrong_equations"] == 0 or row["sample_index"] == best[question]["sample_index"]
        assert row["total"] <= best[question]["total"]
    # the second selection's students trained on their own rows, the SFT teacher's linked in from its control folder
    sft = json.loads((also / "4_student_sft" / "sft_summary.json").read_text())
    assert (also / OmegaConf.load(also / "4_student_sft" / "config.yaml").data.source).resolve() == (
        also / "3_distill" / "distill.jsonl").resolve() and sft["steps"] == 2
    for step in ("7_distill_sft_teacher", "8_student_sft_sft_teacher", "11_eval_student_sft_teacher"):
        assert (also / step).resolve() == (also_ctl / step).resolve(), step
    # one aggregate per selection, each with the RL teacher's student and (for best_correct) the SFT teacher's
    study = json.loads((root / "aggregate" / "study.json").read_text())
    also_study = json.loads((root / "aggregate-best_correct" / "study.json").read_text())
    assert study["seeds"] == also_study["seeds"] == [0]
    # every arm whose steps ran is found through the links (the embedded data has no held-out split, so the figures
    # themselves are None here; tests/test_study_aggregate_on_cpu.py checks them)
    present = {name: {arm["name"] for arm in s["arms"] if not arm["missing"]} for name, s in (("best", study),
                                                                                           ("also", also_study))}
    assert present == {"best": {"base", "rl_teacher"}, "also": {"base", "rl_teacher", "sft_teacher"}}
    assert [t["name"] for t in also_study["teachers"] if not t["missing"]] == ["rl_teacher"]
