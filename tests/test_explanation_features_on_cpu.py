"""bench/explanation_features.py: the features read from an explanation, and their relation to the r_SS gap."""

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench")]

from explanation_features import analyse, features  # noqa: E402

SOLUTION = "Her sister ate 3 + 7 = 10 slices.\nThey ate 3 + 10 + 13 = 26 slices.\nThe answer is 26."


def test_features_count_the_solutions_results_the_explanation_states_and_its_style():
    plain = features(SOLUTION, "First 3 + 7 gives 10, so she ate 10.")
    assert plain == {"results_share": 0.5, "chars": 36.0, "latex": 0.0, "markdown": 0.0}
    tex = features(SOLUTION, "**Step 1**\n\\[ 3 + 7 = 10 \\]\n# Total\n26 slices, 1,0 apart")
    assert (tex["results_share"], tex["latex"], tex["markdown"]) == (1.0, 1.0, 1.0)
    # a solution with no "=" has no results to state
    assert np.isnan(features("The answer is 4.", "4")["results_share"])


def test_analyse_gives_the_rank_correlation_and_the_yes_no_difference_with_intervals():
    gap = np.array([-0.4, -0.3, -0.2, -0.1, 0.0, 0.1])
    table = {"chars": np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), "latex": np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])}
    out = analyse(gap, table, np.array([0, 1, 2, 0, 1, 2]), seed=0, resamples=200)
    assert out["chars"]["spearman_rho"] == 1.0 and out["chars"]["median"] == 3.5
    assert out["chars"]["ci95"] == [1.0, 1.0]  # every resample keeps the order
    assert (out["latex"]["share"], out["latex"]["mean_gap_with"], out["latex"]["mean_gap_without"],
            out["latex"]["difference"]) == (0.5, -0.3, 0.0, -0.3)
    assert out["latex"]["ci95"][0] <= -0.3 <= out["latex"]["ci95"][1]


def test_rows_other_than_the_scored_ones_are_refused(tmp_path):
    value = tmp_path / "value.json"
    value.write_text(json.dumps({"per_question": [{"question_id": "q0", "template": 0, "none": -1.0, "rl_s0": -1.2},
                                                  {"question_id": "q9", "template": 1, "none": -1.0, "rl_s0": -1.1}]}))
    kept = tmp_path / "kept"
    kept.mkdir()
    data = (json.dumps({"question_id": "q0", "solution": SOLUTION, "explanation": "10"}) + "\n").encode()
    (kept / "rl_s0.jsonl.xz").write_bytes(lzma.compress(data))
    (kept / "manifest.json").write_text(json.dumps({"teachers": {"rl_s0": {
        "file": "rl_s0.jsonl.xz", "rows": 1, "sha256": hashlib.sha256(data).hexdigest()}}}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "explanation_features.py"), value, kept, "--teacher",
                           "rl_s0", "--out", tmp_path / "out.json"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, f"error: {kept}: 1 of the scored questions have no kept row of rl_s0 "
                                                 "(first: q9): not the rows that were scored\n")
    assert not (tmp_path / "out.json").exists()
