"""The debugging notebook executes top to bottom on CPU from a folder that is not the repository root, and
prints what the runs recorded."""

import os
import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from rlt_mono.runs.console import format_step_line
from rlt_mono.runs.outputs import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "debug_rlt_mono.ipynb"


def test_notebook_executes_from_any_folder(tmp_path, monkeypatch):
    # The kernel inherits this environment. PYTHONPATH stands in for `pip install -e .` where the package is not
    # installed; the kernel starts in an empty folder, so nothing may depend on the working directory.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(elsewhere)}}
                   ).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    lines = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout"
                    ).splitlines()
    out = Path(next(line for line in lines if line.startswith("runs in ")).removeprefix("runs in "))
    try:
        rows = read_metrics(out / "first" / METRICS_FILE)
        assert "steps recorded: [1, 2]" in lines
        for row in rows:  # the notebook's progress lines are those of the rows on disk
            assert format_step_line(row, row["step"], 2) in lines
        assert "second run steps: [1]" in lines
        assert any(line.startswith("mean reward ") and "; unmatched " in line for line in lines)
        reward_panel = next(line for line in lines if line.startswith("reward: "))
        assert reward_panel.startswith("reward: reward (= r_ss - r_kl + match_penalty), r_ss")
        assert "total" not in reward_panel  # equal to TRL's reward, so not drawn twice
        assert any(line.startswith("seconds: generate, score, train") for line in lines)
        assert any("image/png" in o.get("data", {}) for o in outputs)
        assert list(elsewhere.iterdir()) == []  # nothing written where the kernel started
    finally:
        shutil.rmtree(out, ignore_errors=True)
