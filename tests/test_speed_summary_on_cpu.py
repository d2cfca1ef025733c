"""bench/speed_summary.py: pairs of alternating arms, their ratios, and a memory=speed run's whole-cycle step."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("speed_summary", Path(__file__).parents[1] / "bench" / "speed_summary.py")
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
