"""bench/study_stage.sh's stage: a study run skipped when finished, tried again while another run holds the GPU's
memory, once more after any other failure, never after its weights went non-finite."""

import subprocess
from pathlib import Path

STAGE = Path(__file__).resolve().parents[1] / "bench" / "study_stage.sh"
CHECKPOINT_MANIFEST = next(line.split("=")[1].split()[0] for line in STAGE.read_text().splitlines()
                           if line.startswith("CHECKPOINT_MANIFEST="))

# A stand-in for launch_mono.sh: each call counts itself in <root>/calls, prints the message of its call number
# (FAILS[n], or nothing), and fails while one is given; the last call writes the finished run's eval.json.
FAKE_RUN = r"""#!/usr/bin/env bash
root=$(dirname "$0")
n=$(( $(cat "$root/calls" 2>/dev/null || echo 0) + 1 )); echo $n > "$root/calls"
echo "start $n: $*"
mapfile -t fails < "$root/fails"
if [ "$n" -le "${#fails[@]}" ]; then echo "${fails[$((n - 1))]}"; exit 1; fi
out=${@: -1}; [ "$out" = resume_from_checkpoint=true ] && out=${@: -2:1}; out=${out#output_dir=}
mkdir -p "$out" && echo '{}' > "$out/eval.json"
"""


def _stage(tmp_path, fails, memory_tries=10, folder_setup=None, prelude="STUDY_RETRY_SECONDS=0"):
    (tmp_path / "logs").mkdir(exist_ok=True)
    (tmp_path / "fails").write_text("".join(f + "\n" for f in fails))
    run = tmp_path / "run.sh"
    run.write_text(FAKE_RUN)
    run.chmod(0o755)
    folder = tmp_path / "arm" / "eval"
    if folder_setup:
        folder_setup(folder)
    script = (f"root={tmp_path} check=0 {prelude} STUDY_MEMORY_TRIES={memory_tries}; "
              f"source {STAGE}; stage {folder} arm_eval {run} eval seed=0")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    calls = int((tmp_path / "calls").read_text()) if (tmp_path / "calls").exists() else 0
    log = tmp_path / "logs" / "arm_eval.log"
    return result.returncode, calls, log.read_text() if log.exists() else "", folder


VLLM_SHORT = ("ValueError: Free memory on device cuda:0 (10.1/139.8 GiB) on startup is less than desired GPU memory "
              "utilization (0.08, 11.18 GiB).")
TRAIN_OOM = "error: out of GPU memory at step 4: lower sft.max_length"


def test_a_run_short_of_gpu_memory_is_tried_until_it_gets_it(tmp_path):
    status, calls, log, folder = _stage(tmp_path, [VLLM_SHORT, TRAIN_OOM, VLLM_SHORT])
    assert status == 0 and calls == 4 and (folder / "eval.json").is_file()
    assert log.count("stopped for want of GPU memory") == 3 and "(3 of 10)" in log


def _waits(tmp_path, random_seed):
    """The seconds each memory retry of a run waits, with bash's random numbers seeded and ``sleep`` recorded, not
    slept."""
    prelude = (f"STUDY_RETRY_SECONDS=60 RANDOM={random_seed}; sleep() {{ echo \"$1\" >> {tmp_path}/slept; }};")
    status, calls, log, _ = _stage(tmp_path, [TRAIN_OOM] * 3, prelude=prelude)
    waits = [int(line) for line in (tmp_path / "slept").read_text().split()]
    assert status == 0 and calls == 4 and len(waits) == 3
    assert [f"trying again in {w} s" in log for w in waits] == [True] * 3
    return waits


def test_memory_retries_wait_the_pause_plus_a_random_part_that_sets_apart_runs_that_failed_together(tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    one.mkdir(), other.mkdir()
    first, second = _waits(one, 1), _waits(other, 2)
    assert all(60 <= wait <= 120 for wait in first + second)
    # two runs that ran out of memory at the same moment do not try again at the same moment, each time
    assert all(a != b for a, b in zip(first, second))


def test_memory_tries_run_out(tmp_path):
    status, calls, log, _ = _stage(tmp_path, [VLLM_SHORT] * 5, memory_tries=2)
    assert status == 1 and calls == 3 and "(2 of 2)" in log


def test_any_other_failure_is_tried_once_more_and_only_its_own_output_counts(tmp_path):
    # the first failure is for memory; the second and third are not, though the memory line is still in the log
    status, calls, log, _ = _stage(tmp_path, [VLLM_SHORT, "KeyError: 'x'", "KeyError: 'x'", "KeyError: 'x'"])
    assert status == 1 and calls == 3
    assert log.count("failed; trying again") == 1


def test_a_diverged_run_is_not_tried_again(tmp_path):
    status, calls, _, _ = _stage(tmp_path, ["the step made the weights non-finite"])
    assert status == 1 and calls == 1


def test_a_finished_run_is_skipped(tmp_path):
    status, calls, _, _ = _stage(tmp_path, [], folder_setup=lambda f: (f.mkdir(parents=True),
                                                                     (f / "eval.json").write_text("{}")))
    assert status == 0 and calls == 0


def _whole_checkpoint(folder):
    (folder / "checkpoint-10").mkdir(parents=True)
    (folder / "checkpoint-10" / CHECKPOINT_MANIFEST).write_text("{}")


def test_a_run_with_a_whole_checkpoint_resumes_from_the_first_try(tmp_path):
    status, calls, log, folder = _stage(tmp_path, [], folder_setup=_whole_checkpoint)
    assert status == 0 and calls == 1 and "start 1: eval seed=0 output_dir=" in log
    assert log.rstrip().endswith("resume_from_checkpoint=true") and (folder / "checkpoint-10").is_dir()


def test_a_failed_run_does_not_resume_from_a_half_written_checkpoint(tmp_path):
    status, calls, log, folder = _stage(tmp_path, [TRAIN_OOM], folder_setup=lambda f: (
        (f / "checkpoint-10").mkdir(parents=True), (f / "checkpoint-20").mkdir()))  # no manifest: not whole
    assert status == 0 and calls == 2 and "resume_from_checkpoint" not in log
    assert not (folder / "checkpoint-10").exists()  # tried again in an empty folder


def test_a_distill_tried_again_keeps_the_explanations_it_wrote(tmp_path):
    def half_distill(folder):
        folder.mkdir(parents=True)
        (folder / "distill.jsonl").write_text('{"question": "q"}\n')

    status, calls, _, folder = _stage(tmp_path, ["KeyError: 'x'"], folder_setup=half_distill)
    assert status == 0 and calls == 2 and (folder / "distill.jsonl").read_text() == '{"question": "q"}\n'


def test_an_earlier_runs_last_log_line_does_not_count_as_this_runs_failure(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "arm_eval.log").write_text("torch.OutOfMemoryError: CUDA out of memory")  # no newline
    status, calls, log, _ = _stage(tmp_path, ["KeyError: 'x'", "KeyError: 'x'"])
    assert status == 1 and calls == 2 and "want of GPU memory" not in log


def test_the_manifest_name_is_the_checkpoints_own():
    from rlt_mono.runs.checkpoints import MANIFEST

    assert CHECKPOINT_MANIFEST == MANIFEST
