"""Shared fixtures: one embedded tiny pair per test session, built in a temporary cache."""

import json
import os
import tempfile

import pytest
import torch

from rlt_mono.stages import pipeline


def pytest_configure(config):
    # Subprocesses (CLI, notebook) inherit this, so the whole session builds the tiny pair once.
    if "RLT_MONO_CACHE" not in os.environ:
        os.environ["RLT_MONO_CACHE"] = tempfile.mkdtemp(prefix="rlt_mono_cache_")


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count()
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gpu2" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))


def pytest_runtest_logreport(report):
    """With RLT_MONO_TEST_FAILURES set, each failed test's report is appended to that file when the test ends, not
    only at the session's end: a GPU test run cut by its time limit still says why the finished ones failed."""
    path = os.environ.get("RLT_MONO_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as failures:
            failures.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")


@pytest.fixture(scope="session")
def tiny_pair():
    from rlt_mono.data.embedded import build_tiny_pair

    return build_tiny_pair()


@pytest.fixture(scope="session")
def tokenizer(tiny_pair):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_pair.teacher_path)


@pytest.fixture(scope="session")
def student(tiny_pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair.student_path).eval()


@pytest.fixture(scope="session")
def teacher(tiny_pair):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair.teacher_path).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors run faster on one thread than with OpenMP synchronisation on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def launched(monkeypatch) -> list[str]:
    """Stages run as fakes that leave the output a real stage leaves (a training stage its checkpoint and final/);
    the list names the folders launched."""
    names = []

    def fake_stage(command, folder):
        out = folder / next(a for a in command if a.startswith("output_dir=")).split("=", 1)[1]
        names.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        if "eval" in out.name:
            (out / "eval.json").write_text(json.dumps({"teacher": None, "student": "s", "questions": 1,
                                                       "metrics": {}}))
        elif "distill" in out.name:
            (out / "distill.jsonl").write_text('{"question": "q", "solution": "s"}\n')
        else:
            (out / "checkpoint-2").mkdir(exist_ok=True)
            (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"x" * 1024)
            (out / "final").mkdir(exist_ok=True)
            (out / "final" / "config.json").write_text("{}")
        return 0

    monkeypatch.setattr(pipeline, "run_stage", fake_stage)
    return names
