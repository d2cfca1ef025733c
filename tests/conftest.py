"""Shared fixtures: one embedded tiny pair per test session, built in a temporary cache."""

import os
import tempfile

import pytest
import torch


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


@pytest.fixture(scope="session")
def tiny_pair():
    from rlt_mono.embedded import build_tiny_pair

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
