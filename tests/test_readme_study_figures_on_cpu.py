"""The README's "Does it teach?" quotes the study's summary: its table and its bold differences must be the figures
results/study_gsm_symbolic_v2/study.json holds now (a summary rerun with more runs must not leave them stale)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDENT = "qwen2.5_coder_0.5b_instruct"
# The table's row labels and the arms they quote.
ROWS = {"nothing (a plain step-by-step prompt)": "untrained_plain",
        "the worked solutions, all 5,242 questions": "worked",
        "the worked solutions of the teachers' 3,000": "worked_common",
        "SFT teacher's explanations + worked solutions": "sft_teacher",
        "RL teacher's explanations + worked solutions": "rl_teacher",
        "answer-only mapping's RL teacher + worked solutions": "rl_teacher_answer_only"}


def _section() -> str:
    text = (ROOT / "README_MONO_GPU.md").read_text()
    start = text.index("## Does it teach?")
    return text[start:text.index("\n## ", start + 1)]


def _figure(accuracy: float, ci95: list[float], signed: bool = False) -> str:
    """A figure as the README writes it: three decimals, its interval in brackets, minus signs as "−"."""
    number = (lambda x: f"{x:+.3f}") if signed else (lambda x: f"{x:.3f}")
    return f"{number(accuracy)} [{number(ci95[0])}, {number(ci95[1])}]".replace("-", "−")


def test_the_table_quotes_every_arm_as_the_summary_holds_it():
    arms = json.loads((ROOT / "results/study_gsm_symbolic_v2/study.json").read_text())["students"][STUDENT]["arms"]
    quoted = {}
    for line in _section().splitlines():
        cells = [cell.strip().strip("*") for cell in line.strip().strip("|").split("|")]
        if cells[0] in ROWS:
            quoted[ROWS[cells[0]]] = cells
    assert sorted(quoted) == sorted(ROWS.values())
    for arm, cells in quoted.items():
        figures = arms[arm]
        assert cells[1].split()[0] == str(len(figures["seeds"])), arm
        for cell, held_out in ((cells[2], "held_out_instances"), (cells[3], "held_out_templates")):
            assert cell == _figure(figures[held_out]["accuracy"], figures[held_out]["ci95"]), (arm, held_out)


def test_the_control_and_the_endpoint_are_the_summary_s():
    student = json.loads((ROOT / "results/study_gsm_symbolic_v2/study.json").read_text())["students"][STUDENT]
    text = " ".join(_section().split())
    control = student["positive_control"]
    assert f"held-out instances: {_figure(control['difference'], control['ci95'], signed=True)}" in text
    endpoint = student["differences"]["rl_teacher - sft_teacher"]["held_out_instances"]
    quoted = _figure(endpoint["difference"], endpoint["ci95"], signed=True)
    assert re.search(rf"\*\*RL − SFT teacher: {re.escape(quoted)}\*\*", text), quoted
