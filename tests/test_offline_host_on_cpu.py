"""The scripts of offline_host/ on a stand-in host (its GPUs a stand-in nvidia-smi, its GPU stack a stand-in
install_gpu_stack.sh): a wrong command or a missing stack is one line on stderr, background jobs run and come back,
and every folder they keep lies under OFFLINE_HOST_ROOT."""

import json
import lzma
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USAGE = ("usage: bash offline_host/speed.sh start 05b [pairs] [steps] [speed arms] [score micro-batch] | start 7b "
         "[steps] [arms] [profiled step] | start '05b ...' '7b ...' | wait <seconds>")


def _stand_in_host(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of offline_host/ in <tmp_path>/repo, and a folder for PATH whose nvidia-smi lists two GPUs; made once
    (a second command of the same test may start while the first still reads these files)."""
    repo, fake = tmp_path / "repo", tmp_path / "bin"
    if not (repo / "offline_host").exists():
        shutil.copytree(ROOT / "offline_host", repo / "offline_host")
    if not (fake / "nvidia-smi").exists():
        _executable(fake / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: stand-in'\necho 'GPU 1: stand-in'\n")
    return repo, fake


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.mark.parametrize("args", [(), ("start",), ("start", "9b"), ("wait",), ("wait", "soon"), ("stop",)],
                         ids=["nothing", "start-no-spec", "start-unknown-target", "wait-no-seconds",
                              "wait-not-a-number", "unknown-command"])
def test_speed_sh_without_a_known_command_prints_its_usage_and_exits_2(args, tmp_path):
    done = subprocess.run(["bash", "offline_host/speed.sh", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert (done.returncode, done.stderr, done.stdout) == (2, USAGE + "\n", "")


def test_speed_sh_start_without_the_gpu_stack_says_where_it_looked_and_writes_nothing(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPU_STACK_PARTS": str(tmp_path / "parts"),
           "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", "offline_host/speed.sh", "start", "05b"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/speed.sh: no {tmp_path / 'parts'}/install_gpu_stack.sh: stash the GPU "
                           "stack's parts there first (offline_host/gpu_pipeline.sh stash), or set GPU_STACK_PARTS\n")


def _gpu_pipeline(tmp_path, parts, *args):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPU_STACK_PARTS": str(parts), "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", "offline_host/gpu_pipeline.sh", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env=env)


def test_gpu_pipeline_without_the_gpu_stack_says_where_it_looked(tmp_path):
    done = _gpu_pipeline(tmp_path, tmp_path / "parts", "run", "demo_tiny", "10")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/gpu_pipeline.sh: no {tmp_path / 'parts'}/install_gpu_stack.sh: stash the "
                           "GPU stack's parts there first (offline_host/gpu_pipeline.sh stash), or set "
                           "GPU_STACK_PARTS\n")


def test_gpu_pipeline_whose_stack_does_not_install_shows_the_end_of_its_log(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "install_gpu_stack.sh").write_text('echo unpacking; echo "xz: file is corrupt" >&2; exit 1\n')
    done = _gpu_pipeline(tmp_path, parts, "fair", "students", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"offline_host/gpu_pipeline.sh: the GPU stack did not install; "
                           f"{tmp_path / 'out'}/install.log ends:\nunpacking\nxz: file is corrupt\n")


def _multi_gpu(tmp_path, *args, install='echo unpacked; echo "export STACK=ready"', env=None, popen=False):
    """offline_host/multi_gpu.sh on a stand-in host (_stand_in_host) with a stand-in GPU stack; ``env`` adds to its
    environment, ``popen`` starts it and returns the process."""
    repo, fake = _stand_in_host(tmp_path)
    parts = tmp_path / "parts"
    parts.mkdir(exist_ok=True)
    script = parts / "install_gpu_stack.sh"
    if not script.exists() or script.read_text() != install + "\n":  # never rewritten under a running command
        script.write_text(install + "\n")
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "GPU_STACK_PARTS": str(parts),
           "MULTI_GPU_ROOT": str(tmp_path / "root"), "OUT": str(tmp_path / "out"), **(env or {})}
    if popen:
        return subprocess.Popen(["bash", "offline_host/multi_gpu.sh", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=repo, env=env)
    return subprocess.run(["bash", "offline_host/multi_gpu.sh", *args], capture_output=True, text=True, cwd=repo,
                          timeout=60, env=env)


def test_multi_gpu_runs_its_commands_in_the_background_one_after_another(tmp_path):
    started = _multi_gpu(tmp_path, "start", "none", "none|")
    assert started.returncode == 0 and "2 command(s) started" in started.stdout, started.stderr
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert waited.returncode == 0 and "DONE, exit codes: 0 0" in waited.stdout, waited.stdout + waited.stderr
    log = (tmp_path / "root" / "chain.log").read_text()
    assert log.count("bash offline_host/multi_gpu.sh none") == 2  # one after the other, each logged
    assert (tmp_path / "out" / "install.log").read_text() == "unpacked\nexport STACK=ready\n"  # copied back


def test_multi_gpu_background_records_a_command_that_failed(tmp_path):
    assert _multi_gpu(tmp_path, "start", "none", install="echo corrupt >&2; exit 1").returncode == 0
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert "DONE, exit codes: 2" in waited.stdout, waited.stdout + waited.stderr
    assert "the GPU stack did not install" in (tmp_path / "root" / "chain.log").read_text()


def test_multi_gpu_tests_count_the_gpus_the_command_was_given(tmp_path):
    """Given some of the host's GPUs (CUDA_VISIBLE_DEVICES), the tests' log is named by those, not the host's two."""
    _multi_gpu(tmp_path, "none", "all", env={"CUDA_VISIBLE_DEVICES": "1"})
    _multi_gpu(tmp_path, "none", "all", env={"OUT": str(tmp_path / "all_gpus")})
    assert [p.name for p in (tmp_path / "out").glob("gpu_tests_*.log")] == ["gpu_tests_1.log"]
    assert [p.name for p in (tmp_path / "all_gpus").glob("gpu_tests_*.log")] == ["gpu_tests_2.log"]


def test_multi_gpu_hands_its_rounds_and_commit_to_the_scale_bench(tmp_path):
    """SCALE_ROUNDS, SCALE_MINUTES and SCALE_COMMIT reach bench_mono.py scale (a stand-in that prints its arguments
    into the arms' log); more than one round names the files, the default of one leaves their names as they were."""
    _executable(tmp_path / "repo" / "bench" / "bench_mono.py", "import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    out = tmp_path / "out"
    done = _multi_gpu(tmp_path, "mono:1,async:2", env={"SCALE_ARCH": "0.5b", "SCALE_ROUNDS": "3",
                                                       "SCALE_COMMIT": "abc1234", "SCALE_MINUTES": "20"})
    assert done.returncode == 0, done.stderr
    assert _multi_gpu(tmp_path, "mono:1,async:2").returncode == 0
    assert sorted(p.name for p in out.glob("scale_*.log")) == ["scale_0.5b_mono_1_async_2_r3.log",
                                                               "scale_1.5b_mono_1_async_2.log"]
    rounds = json.loads((out / "scale_0.5b_mono_1_async_2_r3.log").read_text())
    assert rounds == ["scale", "--arch", "0.5b", "--completion-length", "1024", "--steps", "4", "--arms",
                      "mono:1,async:2", "--rounds", "3", "--max-minutes", "20", "--commit", "abc1234", "--out",
                      str(out / "scale_0.5b_mono_1_async_2_r3.json")]
    once = json.loads((out / "scale_1.5b_mono_1_async_2.log").read_text())
    assert once[once.index("--rounds"):] == ["--rounds", "1", "--out", str(out / "scale_1.5b_mono_1_async_2.json")]


def test_multi_gpu_archives_the_log_of_each_run_beside_the_scale_json(tmp_path):
    """The runs' own logs, named in the scale JSON, come back as one archive of their file names."""
    logs = tmp_path / "bench_logs"
    logs.mkdir()
    for name in ("rlt-1.log", "rlt-2.log"):
        (logs / name).write_text(f"{name}: vLLM engine started\n")
    results = [{"placement": "mono", "log": str(logs / "rlt-1.log")},
               {"placement": "async", "log": str(logs / "rlt-2.log")}, {"placement": "dp", "status": "error"}]
    _executable(tmp_path / "repo" / "bench" / "bench_mono.py",
                "import json, sys\nargs = sys.argv[1:]\n"
                f"open(args[args.index('--out') + 1], 'w').write(json.dumps({{'results': {results!r}}}))\n")
    done = _multi_gpu(tmp_path, "mono:1,async:2,dp:2", env={"SCALE_ARCH": "0.5b"})
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "out" / "scale_0.5b_mono_1_async_2_dp_2_logs.tgz") as archive:
        assert sorted(archive.getnames()) == ["rlt-1.log", "rlt-2.log"]
        assert archive.extractfile("rlt-2.log").read() == b"rlt-2.log: vLLM engine started\n"


def test_multi_gpu_runs_the_commands_of_an_entry_side_by_side_each_on_its_gpus(tmp_path):
    """'0@...+1@...' runs both at once, each seeing its GPU and writing into its lane; the next entry starts once both
    ended; wait brings every lane's files back named by the lane, and DONE joins side-by-side codes with '+'."""
    trace = tmp_path / "trace"
    _executable(tmp_path / "repo" / "bench" / "bench_mono.py",
                "import json, os, sys, time\nargs = sys.argv[1:]\ngpus = os.environ['CUDA_VISIBLE_DEVICES']\n"
                f"log = open({str(trace)!r}, 'a')\n"
                "print('start', gpus, file=log, flush=True)\ntime.sleep(1.5)\n"
                "print('end', gpus, file=log, flush=True)\n"
                "open(args[args.index('--out') + 1], 'w').write(json.dumps({'results': [], 'gpus': gpus}))\n"
                "sys.exit(3 if gpus == '1' else 0)\n")
    started = _multi_gpu(tmp_path, "start", "0@mono:1+1@mono:1", "0,1@mono:1,async:2")
    assert started.returncode == 0 and "2 command(s) started" in started.stdout, started.stderr
    waited = _multi_gpu(tmp_path, "wait", "40")
    assert "DONE, exit codes: 0+0 0" in waited.stdout, waited.stdout + waited.stderr  # the arms' failure is logged
    lines = trace.read_text().split("\n")
    assert sorted(lines[:2]) == ["start 0", "start 1"] and sorted(lines[2:4]) == ["end 0", "end 1"]
    assert lines[4:6] == ["start 0,1", "end 0,1"]
    out = tmp_path / "out"
    for lane, gpus in (("lane-0", "0"), ("lane-1", "1"), ("lane-0_1", "0,1")):
        arms = "mono_1_async_2" if gpus == "0,1" else "mono_1"
        assert json.loads((out / f"{lane}_scale_1.5b_{arms}.json").read_text())["gpus"] == gpus
    chain = (tmp_path / "root" / "chain.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=1 bash offline_host/multi_gpu.sh mono:1" in chain


def test_multi_gpu_commands_side_by_side_unpack_the_stack_in_turn(tmp_path):
    """Two commands started together on one host (each on its own GPUs) never unpack the stack at the same time."""
    trace = tmp_path / "trace"
    install = f'echo start >> {trace}; sleep 1; echo end >> {trace}; echo "export STACK=ready"'
    runs = [_multi_gpu(tmp_path, "none", install=install, popen=True,
                       env={"CUDA_VISIBLE_DEVICES": gpu, "OUT": str(tmp_path / f"out{gpu}")}) for gpu in "01"]
    assert [run.wait(timeout=60) for run in runs] == [0, 0], [run.stderr.read() for run in runs]
    assert trace.read_text().split() == ["start", "end", "start", "end"]


def test_multi_gpu_wait_with_nothing_started_says_so(tmp_path):
    waited = _multi_gpu(tmp_path, "wait", "30")
    assert waited.returncode == 1
    assert "nothing runs and none has ended here" in waited.stderr
    assert _multi_gpu(tmp_path, "start").returncode == 2  # no command to start


def test_one_root_holds_every_folder_the_scripts_keep_on_the_host(tmp_path):
    """With OFFLINE_HOST_ROOT set and no folder's own setting, each script's folders land under it, none under
    HOME (where the root's default lies)."""
    repo, fake = _stand_in_host(tmp_path)
    host, home, out = tmp_path / "host", tmp_path / "home", tmp_path / "out"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(home), "OFFLINE_HOST_ROOT": str(host), "OUT": str(out)}
    # The pipeline and the time-to-reward study stand-ins record where they were pointed; the study's log ends in a
    # progress bar, and speed.sh's runs print no result line: wait still copies everything back.
    _executable(repo / "launch_mono.sh", '#!/bin/bash\nfor arg; do [[ $arg != output_dir=* ]] || '
                'folder=${arg#output_dir=}; done\nmkdir -p "$folder" && echo "$RLT_MONO_CACHE" > "$folder/cache"\n'
                'echo launched\n')
    _executable(repo / "bench" / "time_to_reward.sh", 'mkdir -p "$1/logs" && echo " 5%| | 1/20 [00:01, 1.00it/s]" '
                '> "$1/logs/auto_s0.log"\necho "root=$1" > "$1/DONE"\n')
    carried = tmp_path / "carried"
    _executable(carried / "install_gpu_stack.sh", 'echo "export STACK=ready"\n')

    def run(*command: str) -> str:
        done = subprocess.run(["bash", *command], capture_output=True, text=True, cwd=repo, timeout=90, env=env)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout

    run("offline_host/gpu_pipeline.sh", "stash", str(carried))
    run("offline_host/gpu_pipeline.sh", "run", "demo_tiny", "30")
    run("offline_host/gpu_pipeline.sh", "ttr", "0", "auto")
    assert f"root={host / 'study'}" in run("offline_host/gpu_pipeline.sh", "wait", "30")
    run("offline_host/speed.sh", "start", "05b 0 5 none")  # no pairs and no speed arm: the background script alone
    run("offline_host/speed.sh", "wait", "30")
    run("offline_host/multi_gpu.sh", "start", "none")
    assert "DONE, exit codes: 0" in run("offline_host/multi_gpu.sh", "wait", "30")

    kept = {"code-<time>" if path.name.startswith("code-") else path.name for path in host.iterdir()}
    assert kept == {"parts", "cache", "pipeline", "study", "code-<time>", "speed", "multi_gpu"}
    assert (host / "parts" / "install_gpu_stack.sh").is_file()
    assert (host / "pipeline" / "cache").read_text() == f"{host / 'cache'}\n"  # the pipeline's RLT_MONO_CACHE
    assert (host / "speed" / "DONE").is_file() and (host / "multi_gpu" / "DONE").read_text() == "0\n"
    assert {path.name for path in out.iterdir()} >= {"pipeline_results.tgz", "study.tgz", "speed_results.tgz"}
    assert not home.exists()


def test_the_root_defaults_to_a_folder_in_home(tmp_path):
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / "stack.part00").write_text("piece")
    done = subprocess.run(["bash", "offline_host/gpu_pipeline.sh", "stash", str(carried)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out")})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "rlt_mono_host" / "parts" / "stack.part00").read_text() == "piece"


def test_a_study_keeps_its_settings_as_words_a_shell_reads_back_to_the_same_values(tmp_path):
    settings = {"STUDY_RL": "trainer.save_steps=100000 trainer.eval_steps=25", "STUDY_ARMS": "rl_teacher,worked",
                "STUDY_QUOTE": "it's", "STUDY_EMPTY": "", "STUDY_ANSWERS": "/host/answers",
                "STUDY_EXPLANATIONS": str(ROOT / "study_data" / "kept"), "STUDY_OUTSIDE": "/elsewhere/kept"}
    env = {"PATH": "/usr/bin:/bin", **settings}
    words = subprocess.run(["bash", "-c", "source offline_host/gpu_host.sh; study_settings"], capture_output=True,
                           text=True, cwd=ROOT, timeout=60, env=env, check=True).stdout
    # sorted, the host's own STUDY_ANSWERS left out, quoted only where a word needs it, a path in the working
    # tree as $PWD/<path> (the record names no folder of the host), one outside it as it is
    assert words == ("STUDY_ARMS=rl_teacher,worked STUDY_EMPTY='' STUDY_EXPLANATIONS=$PWD/study_data/kept "
                     "STUDY_OUTSIDE=/elsewhere/kept STUDY_QUOTE='it'\\''s' "
                     "STUDY_RL='trainer.save_steps=100000 trainer.eval_steps=25' ")
    # read back by a shell in another checkout: the same values, the path in that checkout
    elsewhere = tmp_path / "checkout"
    elsewhere.mkdir()
    echoed = subprocess.run(["bash", "-c", f"{words} bash -c 'printf \"%s|\" \"$STUDY_RL\" \"$STUDY_QUOTE\" "
                                           f"\"$STUDY_ARMS\" \"${{STUDY_EMPTY-unset}}\" \"$STUDY_EXPLANATIONS\"'"],
                            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, check=True,
                            cwd=elsewhere)
    assert echoed.stdout == ("trainer.save_steps=100000 trainer.eval_steps=25|it's|rl_teacher,worked||"
                             f"{elsewhere}/study_data/kept|")


def test_two_fair_parts_run_side_by_side_each_from_its_code_and_each_wait_brings_back_its_own(tmp_path):
    """OFFLINE_HOST_STUDY puts a second part in a folder of its own and OFFLINE_HOST_SNAP runs it from another
    carried commit; a wait with the same setting waits for that part alone (not for one still running beside it)
    and copies that folder back."""
    repo, fake = _stand_in_host(tmp_path)
    host = tmp_path / "host"
    # bench/study_fair.sh as each commit has it: it says which commit it is, and the second part's ends at once
    # while the first's runs on
    for folder, commit, seconds in ((".snap", "aaaa111", 60), (".snap-students", "bbbb222", 0)):
        code = tmp_path / f"code-{commit}"
        _executable(code / "bench" / "study_fair.sh",
                    f'mkdir -p "$2/logs" && echo "{commit} $1 $3 gpus=$STUDY_GPUS" > "$2/ran"\n'
                    f'sleep {seconds}\necho "$1=0" > "$2/DONE"\n')
        (repo / folder).mkdir(parents=True)
        subprocess.run(["tar", "cf", str(repo / folder / "code.tar"), "-C", str(code), "."], check=True)
        (repo / folder / "commit").write_text(commit + "\n")
    carried = tmp_path / "carried"
    _executable(carried / "install_gpu_stack.sh", 'echo "export STACK=ready"\n')
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "OFFLINE_HOST_ROOT": str(host)}

    def run(*command: str, **more: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "offline_host/gpu_pipeline.sh", *command], capture_output=True, text=True,
                              cwd=repo, timeout=90, env={**env, "OUT": str(tmp_path / more.pop("out")), **more})

    assert run("stash", str(carried), out="o0").returncode == 0
    first = run("fair", "teachers", "0", out="o1", STUDY_GPUS="0")
    second = run("fair", "students", "0,1", out="o2", STUDY_GPUS="1", OFFLINE_HOST_STUDY="study-students",
                 OFFLINE_HOST_SNAP=".snap-students")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    try:
        waited = run("wait", "30", out="o3", OFFLINE_HOST_STUDY="study-students")
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout.rstrip().endswith("students=0")  # its own DONE, while the teachers part still runs
        with tarfile.open(tmp_path / "o3" / "study.tgz") as archive:
            assert archive.extractfile("./ran").read() == b"bbbb222 students 0,1 gpus=1\n"
            assert archive.extractfile("./commit").read() == b"bbbb222\n"
        assert not (tmp_path / "o3" / "teacher_sft.tgz").exists()  # the first study's folder: none in a fair part
        assert (host / "study" / "ran").read_text() == "aaaa111 teachers 0 gpus=0\n"
        assert not (host / "study" / "DONE").exists()
        # each part's command says how to run it again, the second's folder, code and settings with it
        assert (host / "study-students" / "command").read_text() == (
            "OFFLINE_HOST_STUDY=study-students OFFLINE_HOST_SNAP=.snap-students STUDY_GPUS=1 bash "
            "offline_host/gpu_pipeline.sh fair students 0,1\n")
        assert (host / "study" / "command").read_text() == (
            "STUDY_GPUS=0 bash offline_host/gpu_pipeline.sh fair teachers 0\n")
    finally:
        subprocess.run(["pkill", "-f", f"study_fair.sh teachers {host}/study "], check=False)


def test_the_carried_wheels_install_again_only_when_they_changed(tmp_path):
    """A second part started beside a running one must not rewrite the files the first imports: the same wheels
    install once; a changed wheel installs again."""
    calls, fake, repo = tmp_path / "calls", tmp_path / "bin", tmp_path / "repo"
    _executable(fake / "python3", f'#!/bin/sh\necho "$@" >> {calls}\n')
    (repo / ".whl").mkdir(parents=True)
    (repo / ".whl" / "gguf-0.19.0-py3-none-any.whl").write_bytes(b"one")
    site = tmp_path / "site"
    script = (f"source {ROOT / 'offline_host' / 'gpu_host.sh'}; CARRIED_SITE={site}; install_carried_wheels; "
              'echo "$PYTHONPATH"')

    def install() -> str:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=repo, timeout=60,
                              env={"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert install().startswith(f"{site}")
    install()
    assert calls.read_text().count("pip install") == 1
    (repo / ".whl" / "gguf-0.19.0-py3-none-any.whl").write_bytes(b"two")
    install()
    assert calls.read_text().count("pip install") == 2


def test_wait_brings_back_the_finished_students_answers_and_their_texts(tmp_path):
    """A fair part's finished eval runs come back twice: their flags (answers.tgz, bench/study_fair.py export) and
    their texts (outputs.tar, bench/study_fair.py outputs), each under the student's folder, ready to unpack into
    study_data/gsm_symbolic_v2."""
    repo, fake = _stand_in_host(tmp_path)
    for folder in ("bench", "rlt_mono"):
        if not (repo / folder).exists():
            (repo / folder).symlink_to(ROOT / folder)
    study, out = tmp_path / "host" / "study", tmp_path / "out"
    eval_folder = study / "s" / "rl_teacher_s0" / "eval"
    eval_folder.mkdir(parents=True)
    rows = [{"question": f"question {i}", "answer": "7", "heldout": "instances", "template": i, "correct": i == 0,
             "capped": False, "student_output": f"<|begin_of_thought|>t{i}<|end_of_thought|>The answer is {7 + i}."}
            for i in range(2)]
    (eval_folder / "eval_rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (eval_folder / "eval.json").write_text("{}\n")
    (study / "commit").write_text("abc1234\n")
    (study / "command").write_text("bash offline_host/gpu_pipeline.sh fair students 0\n")
    (study / "DONE").write_text("s/rl_teacher_s0=0\n")
    python = Path(shutil.which("python3") or "python3").parent
    env = {"PATH": f"{fake}:{python}:/usr/bin:/bin", "HOME": str(tmp_path), "OFFLINE_HOST_ROOT": str(tmp_path / "host"),
           "OUT": str(out)}
    done = subprocess.run(["bash", "offline_host/gpu_pipeline.sh", "wait", "30"], capture_output=True, text=True,
                          cwd=repo, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(out / "answers.tgz") as archive:
        answers = json.loads(archive.extractfile("./s/rl_teacher_s0.json").read())
    assert answers["correct"] == "10" and answers["commit"] == "abc1234" and answers["device"].startswith("2× ")
    with tarfile.open(out / "outputs.tar") as archive:
        texts = archive.extractfile("./s/rl_teacher_s0.jsonl.xz").read()
    lines = [json.loads(line) for line in lzma.decompress(texts).decode().splitlines()]
    assert [line["output"] for line in lines] == [row["student_output"] for row in rows]
    assert [line["question"] for line in lines] == answers["question"]
