"""bench/speed_summary.py: pairs of alternating arms, their ratios, and a memory=speed run's whole-cycle step."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # as when run as a script: it imports bench/roofline.py
spec = importlib.util.spec_from_file_location("speed_summary", BENCH / "speed_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def _arm(mode, median):
    return {"mode": mode, "median_step_seconds": median}


def test_pairs_are_taken_in_run_order_whichever_arm_ran_first():
    pairs = summary.pair_ratios([_arm("rlt", 6.0), _arm("trl", 5.0), _arm("trl", 4.0), _arm("rlt", 5.0)])
    assert [(p["order"], p["ratio"]) for p in pairs] == [("rlt,trl", pytest.approx(1.2)),
                                                          ("trl,rlt", pytest.approx(1.25))]


@pytest.mark.parametrize("arms, message", [
    ([_arm("rlt", 1.0)], "even number"),
    ([_arm("rlt", 1.0), _arm("rlt", 1.0)], "one rlt and one trl"),
])
def test_arms_that_do_not_pair_are_refused(arms, message):
    with pytest.raises(ValueError, match=message):
        summary.pair_ratios(arms)


def test_the_speed_step_is_the_mean_of_the_second_whole_generation_cycle():
    # 4 steps per generation: the first cycle (warm-up) is left out, the second is (10 + 1 + 1 + 2) / 4 = 3.5.
    assert summary.cycle_mean([30.0, 1.0, 1.0, 1.0, 10.0, 1.0, 1.0, 2.0, 12.0], 4) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="no second cycle"):
        summary.cycle_mean([30.0, 1.0, 1.0, 1.0, 10.0], 4)


def test_a_7b_run_is_set_beside_its_roofline():
    run = {"arch": "7b", "completions_per_step": 32, "completion_length": 4096, "prompt_length": 0, "memory": "manual",
           "status": "ok", "median_step_seconds": 73.4, "step_seconds": [90.0, 73.0, 73.4, 74.0],
           "phase/generate/seconds": 33.7, "phase/score/seconds": 16.2, "phase/train/seconds": 19.8,
           "grpo_config": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 16,
                           "steps_per_generation": 16, "gradient_checkpointing": True, "optim": "adamw_bnb_8bit",
                           "vllm_gpu_memory_utilization": 0.3}}
    [entry] = summary.seven_b([run], "H100")
    # This step's roofline, by hand (bench/roofline.py's docstring): about 26 + 7.5 + 10 = 43 s, so 73.4 s is 1.71x.
    assert entry["roofline_step_s"] == pytest.approx(43, abs=1.0)
    assert entry["step_ratio"] == pytest.approx(73.4 / entry["roofline_step_s"]) == pytest.approx(1.71, abs=0.04)
    assert entry["phase_ratio"]["score"] == pytest.approx(16.2 / entry["roofline_s"]["score"])
    assert entry["settings"]["optim"] == "adamw_bnb_8bit"
    # The arm says the attention path where the run predates bench_mono.py's left_align_padding field.
    assert entry["left_align_padding"] is True and entry["arm"] is None
    noalign, recorded = summary.seven_b([{**run, "arm": "noalign"}, {**run, "arm": "manual",
                                                                       "left_align_padding": False}], "H100")
    assert (noalign["arm"], noalign["left_align_padding"]) == ("noalign", False)
    assert recorded["left_align_padding"] is False
    failed = summary.seven_b([{**run, "status": "out_of_memory", "median_step_seconds": None,
                               "phase/train/seconds": None}], "H100")[0]
    assert failed["step_ratio"] is None and failed["phase_ratio"]["train"] is None


def test_each_speed_run_is_set_against_the_pairs_rlt_median(tmp_path, monkeypatch):
    import json

    config = {"steps_per_generation": 8, "gradient_accumulation_steps": 2}  # 4 optimizer steps per generation
    pairs = [{**_arm(mode, median), "status": "ok", "grpo_config": {}}
             for mode, median in (("rlt", 6.0), ("trl", 5.0), ("trl", 5.0), ("rlt", 4.0))]
    (tmp_path / "pairs_raw.json").write_text(json.dumps(pairs))

    def speed(second_cycle, liger):
        return [{"memory": "speed", "grpo_config": config, "completions_per_step": 32, "completion_length": 1024,
                 "step_seconds": [30.0, 1.0, 1.0, 1.0, *second_cycle, 9.0], "predicted_table": "plan",
                 "use_liger_kernel": liger, "phase/score/seconds": 2.0}]

    (tmp_path / "speed_raw.json").write_text(json.dumps(speed([7.0, 1.0, 1.0, 1.0], False)))  # mean 2.5 s
    (tmp_path / "speed_liger_raw.json").write_text(json.dumps(speed([5.0, 0.5, 0.5, 0.0], True)))  # mean 1.5 s
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["speed_summary.py", str(tmp_path), "--out", str(out), "--commit", "abc",
                                      "--device", "H200", "--command", "bash offline_host/speed.sh start 05b"])
    summary.main()
    # the pairs' rlt median is (6 + 4) / 2 = 5 s: speedups 5 / 2.5 and 5 / 1.5
    plain, liger = (json.loads((out / f"{name}.json").read_text()) for name in ("speed", "speed_liger"))
    assert (plain["speedup"], plain["use_liger_kernel"]) == (pytest.approx(2.0), False)
    assert (liger["speedup"], liger["use_liger_kernel"]) == (pytest.approx(10 / 3), True)
    assert liger["completion_tokens_per_s"] == pytest.approx(32 * 1024 / 1.5)
    table = (out / "table.md").read_text().splitlines()
    assert table[-2].startswith("memory=speed: 4 optimizer steps per generation, 2.50 s per step")
    assert table[-1].startswith("memory=speed with liger-kernel: 4 optimizer steps per generation, 1.50 s per step")
    assert table[-1].endswith("3.33x")
    assert json.loads((out / "pairs.json").read_text())["median_ratio"] == pytest.approx((1.2 + 0.8) / 2)


@pytest.mark.parametrize("raw_files, message", [
    # memory=speed runs are set against the same run's pairs
    ({"speed_raw.json": []}, "has no pairs_raw.json: the memory=speed runs are set against the pairs' rlt arms"),
    # the run stopped inside the first pair
    ({"pairs_raw.json": [{**_arm("rlt", 7.8), "status": "ok", "grpo_config": {}}]},
     "pairs_raw.json holds no whole pair (1 arm(s) ran): nothing to compare"),
])
def test_raw_results_with_no_whole_pair_are_refused_and_nothing_is_written(raw_files, message, tmp_path, monkeypatch,
                                                                          capsys):
    import json

    for name, content in raw_files.items():
        (tmp_path / name).write_text(json.dumps(content))
    monkeypatch.setattr(sys, "argv", ["speed_summary.py", str(tmp_path), "--out", str(tmp_path / "out"), "--commit",
                                      "abc", "--device", "H200", "--command", "c"])
    with pytest.raises(SystemExit) as stop:
        summary.main()
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_arm_whose_pair_never_finished_is_listed_apart_and_in_no_ratio(tmp_path, monkeypatch):
    import json

    arms = [{**_arm(mode, median), "status": "ok", "grpo_config": {}}
            for mode, median in (("rlt", 7.8), ("trl", 6.0), ("trl", 5.9))]
    arms[0]["chosen"] = {"reward_micro_batch_size": 16}  # only the rlt arms have a score pass
    (tmp_path / "pairs_raw.json").write_text(json.dumps(arms))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["speed_summary.py", str(tmp_path), "--out", str(out), "--commit", "abc",
                                      "--device", "H200", "--command", "c"])
    summary.main()
    pairs = json.loads((out / "pairs.json").read_text())
    assert [p["ratio"] for p in pairs["pairs"]] == [pytest.approx(1.3)]
    assert pairs["median_ratio"] == pytest.approx(1.3)
    assert pairs["unpaired_arms"] == [{"mode": "trl", "median_step_s": 5.9}]
    assert pairs["rlt_reward_micro_batch_size"] == 16
    assert (out / "table.md").read_text().endswith(
        "Unpaired (the run stopped before its pair's other arm): trl 5.90 s/step\n\n")

