"""bench/roofline.py: each phase's least time, against the 7B figures computed by hand."""

import importlib.util
import sys
from pathlib import Path

import pytest

from rlt_mono.memory.model import QWEN25_ARCHS, Arch

spec = importlib.util.spec_from_file_location("roofline", Path(__file__).parents[1] / "bench" / "roofline.py")
roofline = importlib.util.module_from_spec(spec)
sys.modules["roofline"] = roofline  # its dataclass looks its module up while it is defined
spec.loader.exec_module(roofline)

SEVEN_B = Arch.from_config(QWEN25_ARCHS["7b"])


def test_the_7b_4096_token_step_matches_the_roofline_by_hand():
    # By hand, on an H100 (800 TFLOP/s, 3 TB/s): decode 4,096 steps x ~19 GB (15.2 GB of weights + the KV cache
    # of 32 sequences at a mean context of 2,048) ~ 26 s; score 3 x 2 x 7.6e9 x 131K ~ 7.5 s; train 8 x 7.6e9 x
    # 131K ~ 10 s; about 43 s in all.
    work = roofline.Work(SEVEN_B, completions=32, completion_length=4096)
    bound = roofline.roofline(work, *roofline.DEVICES["H100"])
    params = SEVEN_B.params()
    assert params == pytest.approx(7.6e9, rel=0.01)
    kv = 32 * 2048 * 2 * 28 * 4 * 128 * 2  # sequences x mean context x (k, v) x layers x kv heads x head dim x bytes
    assert bound["generate"] == pytest.approx(4096 * (2 * params + kv) / 3e12)
    assert bound["generate"] == pytest.approx(26, abs=1.0)
    assert bound["score"] == pytest.approx(3 * 2 * params * 131072 / 800e12) == pytest.approx(7.5, abs=0.1)
    assert bound["train"] == pytest.approx(8 * params * 131072 / 800e12) == pytest.approx(10.0, abs=0.1)
    assert sum(bound.values()) == pytest.approx(43, abs=1.0)


def test_decode_is_compute_bound_when_many_sequences_share_a_small_model():
    small = Arch.from_config(QWEN25_ARCHS["0.5b"])
    flops, bandwidth = roofline.DEVICES["H200"]
    few, many = (roofline.Work(small, n, 1024, prompt_length=132) for n in (1, 4096))
    assert roofline.roofline(few, flops, bandwidth)["generate"] == pytest.approx(
        1024 * (2 * small.params() + (132 + 512) * small.kv_bytes_per_token(2)) / bandwidth)
    # 4,096 sequences: the KV cache read dominates the bytes, and still outlasts the FLOPs.
    step_bytes = 2 * small.params() + 4096 * 644 * small.kv_bytes_per_token(2)
    assert roofline.roofline(many, flops, bandwidth)["generate"] == pytest.approx(
        1024 * max(step_bytes / bandwidth, 2 * small.params() * 4096 / flops))


def test_training_without_recomputation_does_six_not_eight_times_params_per_token():
    work = roofline.Work(SEVEN_B, 32, 1024)
    on, off = (roofline.roofline(w, 800e12, 3e12)["train"] for w in (work, roofline.Work(SEVEN_B, 32, 1024,
                                                                                          recompute=False)))
    assert off / on == pytest.approx(6 / 8)


def test_the_table_sets_measured_times_and_ratios_beside_the_roofline():
    text = roofline.main(["--arch", "7b", "--completions", "32", "--completion-length", "4096", "--device",
                          "H100", "--measured", "generate=33.7,score=16.2,train=19.8"])
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()[2:]}
    assert float(rows["step"][2]) == pytest.approx(69.7)
    assert float(rows["score"][3].strip(" |")) == pytest.approx(16.2 / (3 * 2 * SEVEN_B.params() * 131072 / 800e12),
                                                                 abs=0.01)
    with pytest.raises(SystemExit):
        roofline.main(["--arch", "7b", "--completions", "1", "--completion-length", "8", "--device", "H100",
                       "--measured", "sample=1"])
