"""rlt_mono.study.arithmetic (equations in an explanation, checked) and distill's selection=best_correct."""

import pytest

from rlt_mono.stages.distill_run import _distill_row, _select
from rlt_mono.study.arithmetic import check, evaluate


@pytest.mark.parametrize("text, counts", [
    ("She buys 73 + 35 + 20 = 128 apples.", (1, 0)),
    ("So 4 × 3 = $12 and 12 ÷ 4 = 3.", (2, 0)),
    ("1,200 - 200 = 1,000, then 1000 / 8 = 125.5.", (1, 1)),  # 1000 / 8 is 125
    ("He has 5 * 6 = 35 marbles.", (0, 1)),
    ("Half of it: 0.5 * 9 = 4.5", (1, 0)),
    ("The answer is 42. No equation here, 3 = 3 is not one (no operator).", (0, 0)),
    ("Divide: 7 / 0 = 0", (0, 0)),  # the left side cannot be evaluated: neither right nor wrong
])
def test_check_counts_right_and_wrong_equations(text, counts):
    assert check(text) == counts


def test_evaluate_reads_only_arithmetic():
    assert evaluate("2 + 3 × 4") == 14
    assert evaluate("1,000 ÷ 8") == 125
    for bad in ("__import__('os')", "2 ** 3", "(2 + 3"):
        with pytest.raises(ValueError):
            evaluate(bad)


def _sample(index, total, explanation):
    return {"sample_index": index, "total": total, "explanation": explanation, "r_ss": 0.0, "r_kl": 0.0,
            "match_penalty": 0.0, "unmatched": False}


def test_best_correct_keeps_the_best_sample_whose_equations_are_all_right():
    samples = [_sample(0, -1.0, "2 + 2 = 5"), _sample(1, -3.0, "2 + 2 = 4"), _sample(2, -2.0, "no equation")]
    assert [s["sample_index"] for s in _select(samples, "best")] == [0]
    assert [s["sample_index"] for s in _select(samples, "best_correct")] == [2]
    assert [s["sample_index"] for s in _select(samples, "all")] == [0, 1, 2]


def test_best_correct_falls_back_to_the_best_by_reward_and_the_row_counts_its_wrong_equations():
    samples = [_sample(0, -4.0, "2 + 2 = 5"), _sample(1, -2.0, "3 * 3 = 10, 1 + 1 = 3")]
    [kept] = _select(samples, "best_correct")
    assert kept["sample_index"] == 1
    row = _distill_row({"question": "q", "solution": "s"}, kept, "teacher")
    assert row["wrong_equations"] == 2 and row["sample_index"] == 1 and row["matched"]
