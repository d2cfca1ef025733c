"""requirements.txt (the GPU install) holds exactly pyproject.toml's dependencies and its gpu extra."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_requirements_txt_is_pyprojects_dependencies_and_gpu_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert pins == project["dependencies"] + project["optional-dependencies"]["gpu"]
    assert "torch==2.11.0" in pins and "vllm==0.25.1" in pins  # the pair vLLM is built against
