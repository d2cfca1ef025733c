"""bench/explanation_value.py on the tiny embedded student: the readings, their pairing and its errors."""

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "explanation_value.py"
sys.path[:0] = [str(ROOT / "bench")]

from explanation_value import plain_text  # noqa: E402

# Three templates of two questions each; "copy" explains by restating the worked solution, "blank" writes nothing.
QUESTIONS = [(f"q{i:02d}", f"How many apples are {i} and {i + 1}?", f"{i} + {i + 1} = {2 * i + 1}.\n"
              f"The answer is {2 * i + 1}.", i % 3) for i in range(6)]


def _keep(folder: Path, teachers: dict[str, list[str]], r_ss: float = 5.0, solutions: dict | None = None) -> None:
    """A kept-explanations folder as study_fair.py keep writes it: <name>.jsonl.xz and manifest.json (with the
    distill's ``data.gsm_solution`` for the teachers in ``solutions``)."""
    folder.mkdir(parents=True)
    manifest = {"teachers": {}}
    for name, explanations in teachers.items():
        rows = [{"question_id": qid, "question": question, "solution": solution, "explanation": explanation,
                 "template": template, "r_ss": r_ss, "answer": solution.rsplit(" ", 1)[1].rstrip(".")}
                for (qid, question, solution, template), explanation in zip(QUESTIONS, explanations)]
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        (folder / f"{name}.jsonl.xz").write_bytes(lzma.compress(data))
        manifest["teachers"][name] = {"file": f"{name}.jsonl.xz", "rows": len(rows),
                                      "sha256": hashlib.sha256(data).hexdigest()}
        if name in (solutions or {}):
            manifest["teachers"][name]["config"] = {"distill": {"data": {"gsm_solution": solutions[name]}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "size=tiny"], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    root = tmp_path_factory.mktemp("value")
    _keep(root / "kept", {"blank": [""] * 6, "other": ["two numbers"] * 6,
                          "copy": [solution for _, _, solution, _ in QUESTIONS]})
    done = _run(root / "kept", "--teachers", "blank,other,copy", "--questions", 3, "--out", root / "value.json")
    assert done.returncode == 0, done.stderr
    # the same rows, "copy" kept from a distill that scored the answer line (the answer-only teacher's)
    _keep(root / "kept_answer", {"blank": [""] * 6, "other": ["two numbers"] * 6,
                                 "copy": [solution for _, _, solution, _ in QUESTIONS]}, solutions={"copy": "answer"})
    answer = _run(root / "kept_answer", "--teachers", "blank,other,copy", "--questions", 3, "--solution", "answer",
                  "--out", root / "answer.json")
    assert answer.returncode == 0, answer.stderr
    return (json.loads((root / "value.json").read_text()), done.stdout + done.stderr,
            json.loads((root / "answer.json").read_text()))


def test_each_reading_is_scored_on_the_same_stratified_questions(scored):
    result, stdout, _ = scored
    # 3 of 6 questions, one of each template (the sample is stratified)
    assert (result["questions"], result["templates"]) == (3, 3)
    assert sorted(q["template"] for q in result["per_question"]) == [0, 1, 2]
    assert list(result["readings"]) == ["none", "blank", "other", "copy", "worked_solution"]
    per_question = result["per_question"]
    # the same text in the student's thought gives the same score: a blank explanation is no explanation, and one
    # that restates the worked solution is the worked solution
    assert all(q["blank"] == q["none"] and q["copy"] == q["worked_solution"] for q in per_question)
    assert any(q["other"] != q["none"] for q in per_question)
    for name, figures in result["readings"].items():
        assert figures["r_ss"] == pytest.approx(sum(q[name] for q in per_question) / 3, abs=1e-4)
        # the solution's opening tokens and the rest, apart (every solution here has more than 5 tokens)
        assert {"mean_log_prob_first_5", "mean_log_prob_after_5"} <= set(figures)
        assert figures["mean_log_prob_first_5"] != figures["mean_log_prob_after_5"]
    assert result["readings"]["blank"] == result["readings"]["none"]
    assert "worked_solution: r_SS" in stdout


def test_differences_are_paired_means_with_an_interval_around_them(scored):
    result, _, _ = scored
    differences = result["differences"]
    assert set(differences) == {"blank - none", "other - none", "copy - none", "worked_solution - none",
                                "worked_solution - blank", "worked_solution - other", "worked_solution - copy",
                                "other - blank", "copy - blank", "copy - other"}
    assert differences["blank - none"] == {"r_ss": 0.0, "ci95": [0.0, 0.0]}
    assert differences["worked_solution - copy"] == {"r_ss": 0.0, "ci95": [0.0, 0.0]}
    other = [q["other"] - q["none"] for q in result["per_question"]]
    low, high = differences["other - none"]["ci95"]
    assert differences["other - none"]["r_ss"] == pytest.approx(sum(other) / 3, abs=1e-3)
    assert min(other) - 1e-3 <= low <= differences["other - none"]["r_ss"] <= high <= max(other) + 1e-3
    # each teacher's kept r_ss (+5.0 in every row) against its score here
    assert list(result["reproduces"]) == ["blank", "other", "copy"]
    for name, figures in result["reproduces"].items():
        scores = [q[name] for q in result["per_question"]]
        assert figures["mean_difference"] == pytest.approx(sum(scores) / 3 - 5.0, abs=1e-3)
        assert figures["max_abs_difference"] == pytest.approx(max(abs(v - 5.0) for v in scores), abs=1e-3)
    assert result["commit"] and result["device"].startswith("CPU") and result["command"].startswith("python bench/")


def test_unknown_teachers_and_too_many_questions_are_one_line_and_exit_2(tmp_path):
    _keep(tmp_path / "kept", {"sft": [""] * 6, "rl_s0": ["x"] * 6})
    done = _run(tmp_path / "kept", "--teachers", "sft,rl_s9", "--out", tmp_path / "v.json")
    assert (done.returncode, done.stderr) == (2, f"error: {tmp_path / 'kept'}: no kept explanations of rl_s9 "
                                                 "(kept: sft, rl_s0)\n")
    done = _run(tmp_path / "kept", "--teachers", "sft,rl_s0", "--questions", 7, "--out", tmp_path / "v.json")
    assert (done.returncode, done.stderr) == (2, "error: --questions 7: the teachers share only 6 questions\n")
    done = _run(tmp_path / "kept", "--teachers", "sft,none", "--out", tmp_path / "v.json")
    assert done.returncode == 2 and "not none or worked_solution" in done.stderr
    # a kept file whose rows are not the ones its manifest recorded is refused (study.kept.read_kept)
    (tmp_path / "kept" / "sft.jsonl.xz").write_bytes(lzma.compress(b'{"question_id": "q00"}\n'))
    done = _run(tmp_path / "kept", "--teachers", "sft,rl_s0", "--out", tmp_path / "v.json")
    assert done.returncode == 2 and "sft.jsonl.xz: its rows are not the ones kept" in done.stderr
    assert not (tmp_path / "v.json").exists()


def test_the_answer_line_alone_is_scored_after_the_same_thoughts(scored):
    worked, _, answer = scored
    assert (answer["solution"], worked["solution"]) == ("answer", "worked")
    assert [q["question_id"] for q in answer["per_question"]] == [q["question_id"] for q in worked["per_question"]]
    # another text scored after the same thoughts: other figures; the kept r_ss is reproduced only for the teacher
    # whose distill scored the answer line too, and in the worked reading for none of it
    assert all(a["none"] != w["none"] for a, w in zip(answer["per_question"], worked["per_question"]))
    assert list(answer["reproduces"]) == ["copy"]
    copy = [q["copy"] for q in answer["per_question"]]
    assert answer["reproduces"]["copy"]["mean_difference"] == pytest.approx(sum(copy) / 3 - 5.0, abs=1e-3)
    assert all(q["copy"] == q["worked_solution"] for q in answer["per_question"])


@pytest.mark.parametrize("tex, plain", [
    (r"\( 3 \times 4 = 12 \)", "3 * 4 = 12"),
    # nested fractions: a part that is more than one number or word is put in parentheses
    (r"\frac{\frac{1}{2}}{3} and \frac{1}{\frac{2}{3}}", "(1/2)/3 and 1/(2/3)"),
    (r"\[ \dfrac{20 + 30}{100} = \frac12 \]", "(20 + 30)/100 = 1/2"),
    # \boxed with braces inside it: a fraction, a \text, escaped braces
    (r"is \(\boxed{\frac{7}{\text{2 days}}}\).", "is 7/(2 days)."),
    (r"\boxed{\{3, 4\}} and \boxed{{26}}", "{3, 4} and 26"),
    (r"\left( \frac{78}{195} \right) \times 100\% = 40\%", "(78/195) * 100% = 40%"),
    (r"12 \div 4 \cdot 2 \approx 6 \mathrm{kg}", "12 / 4 * 2 ~ 6 kg"),
    # thin spaces: between a number and its unit a space, inside a number nothing; an unknown command dropped
    (r"1\,000 \, \text{kg} \quad \left\lfloor 2.5 \right\rfloor", "1000 kg 2.5"),
    # a currency $ stays (as the worked solutions write it), \$ is $, $...$ math is unwrapped
    (r"It costs \$5, then $7 and $8; $x + 1$ is more.", "It costs $5, then $7 and $8; x + 1 is more."),
    ("### Step 1\n**Isabella's slices:** 3 *each*, __all__ of them", "Step 1\nIsabella's slices: 3 each, all of them"),
    # a display block: its delimiter lines go, the equation keeps its line; one blank line between paragraphs
    ("is:\n   \\[\n   \\text{Total} = 3 + 10 = 13\n   \\]\n\n\n**Step 2:** next",
     "is:\nTotal = 3 + 10 = 13\n\nStep 2: next"),
    # multiplication is not italics; a code block is kept as written (its # a comment, its ** a power)
    ("2 * 3 = 6 and 4*5*6\n# Code\n```python\n# total\nx = 2 ** 3\n```\n**done**",
     "2 * 3 = 6 and 4*5*6\nCode\n```python\n# total\nx = 2 ** 3\n```\ndone"),
])
def test_plain_text_rewrites_tex_and_markdown_into_plain_text(tex, plain):
    assert plain_text(tex) == plain
    if "{" not in plain:  # (a brace is read as TeX's, a group: "{3, 4}" again is "3, 4")
        assert plain_text(plain) == plain  # plain text is left as it is


def test_plain_text_keeps_every_number_and_word_of_a_teachers_explanation():
    kept = ("To find the total, we add.\n\n1. **Isabella's slices:**\n   \\[\n   \\text{Isabella's slices} = 3\n"
            "   \\]\n2. **Total:**\n   \\[\n"
            "   30 \\text{ minutes/riddle} \\times 10 \\text{ riddles} = 300 \\text{ minutes}\n"
            "   \\]\n\nTherefore, the answer is \\(\\boxed{26}\\).")
    assert plain_text(kept) == ("To find the total, we add.\n\n1. Isabella's slices:\nIsabella's slices = 3\n"
                                "2. Total:\n30 minutes/riddle * 10 riddles = 300 minutes\n\n"
                                "Therefore, the answer is 26.")
    for solution in (solution for _, _, solution, _ in QUESTIONS):  # the worked solutions are plain text already
        assert plain_text(solution) == solution


# The worked solution, written in TeX and markdown: rewritten into plain text, it is the worked solution again.
TEX = [f"**{i} + {i + 1} = {2 * i + 1}.**\n\\[\n\\text{{The answer is }} \\boxed{{{2 * i + 1}}}.\n\\]"
       for i in range(6)]


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    _keep(root / "kept", {"tex": TEX, "copy": [solution for _, _, solution, _ in QUESTIONS]})
    done = _run(root / "kept", "--teachers", "tex,copy", "--questions", 3, "--rewrite", "plain",
                "--out", root / "plain.json")
    assert done.returncode == 0, done.stderr
    return json.loads((root / "plain.json").read_text()), done.stdout + done.stderr


def test_rewrite_plain_scores_the_rewritten_text_beside_the_explanations_as_kept(rewritten, scored):
    result, stdout = rewritten
    assert [plain_text(text) for text in TEX] == [solution for _, _, solution, _ in QUESTIONS]
    assert list(result["readings"]) == ["none", "tex", "copy", "tex_plain", "copy_plain", "worked_solution"]
    per_question = result["per_question"]
    # the student read the rewritten text: the TeX teacher's rewritten explanation is the worked solution, and
    # scores as it does, where its explanation as kept does not; plain text rewritten is the same text
    assert all(q["tex_plain"] == q["worked_solution"] and q["tex"] != q["worked_solution"] for q in per_question)
    assert all(q["copy_plain"] == q["copy"] == q["worked_solution"] for q in per_question)
    # the same questions as a run without --rewrite, scored the same
    assert [q["question_id"] for q in per_question] == [q["question_id"] for q in scored[0]["per_question"]]
    assert [q["none"] for q in per_question] == [q["none"] for q in scored[0]["per_question"]]
    differences = result["differences"]
    assert {"tex_plain - tex", "copy_plain - copy", "tex_plain - none", "copy_plain - tex_plain",
            "worked_solution - tex_plain"} <= set(differences)
    assert differences["copy_plain - copy"] == {"r_ss": 0.0, "ci95": [0.0, 0.0]}
    gain = [q["tex_plain"] - q["tex"] for q in per_question]
    assert differences["tex_plain - tex"]["r_ss"] == pytest.approx(sum(gain) / 3, abs=1e-3) != 0
    assert differences["tex_plain - none"] == differences["worked_solution - none"]
    assert "tex_plain - tex:" in stdout


def test_rewrite_plain_is_recorded_and_its_readings_are_not_checked_against_the_distill(rewritten, scored):
    result, _ = rewritten
    assert result["rewrite"] == "plain" and scored[0]["rewrite"] is None and "rewritten" not in scored[0]
    # only the explanations as kept are compared with the distill's own r_ss, which scored them
    assert list(result["reproduces"]) == ["tex", "copy"]
    summary = result["rewritten"]
    assert summary["readings"] == {"tex_plain": "tex", "copy_plain": "copy"}
    assert "not checked for the rewritten readings" in summary["reproduces"]
    assert summary["changed"] == {"tex": 3, "copy": 0}
    assert summary["mean_chars"]["tex"]["kept"] > summary["mean_chars"]["tex"]["plain"]
    example = summary["example"]
    assert example["teacher"] == "tex" and "\\boxed" in example["kept"]
    assert example["plain"] == plain_text(example["kept"]) and "\\" not in example["plain"]
    assert result["commit"] and result["device"].startswith("CPU") and "--rewrite plain" in result["command"]


def test_rewrite_refuses_kept_and_a_teacher_named_as_a_rewritten_reading(tmp_path):
    _keep(tmp_path / "kept", {"sft": [""] * 6, "sft_plain": ["x"] * 6})
    done = _run(tmp_path / "kept", "--teachers", "sft,sft_plain", "--rewrite", "plain", "--out", tmp_path / "v.json")
    assert done.returncode == 2 and "a teacher named as another's --rewrite plain reading" in done.stderr
    done = _kept_run(tmp_path / "kept", tmp_path / "v.json", "--teachers", "sft,sft_plain", "--rewrite", "plain")
    assert done.returncode == 2 and "no --rewrite" in done.stderr
    assert not (tmp_path / "v.json").exists()


def _keep_scored(folder: Path, scores: dict[str, list[tuple[float, float]]], shuffled: tuple[str, ...] = (),
                 extra: tuple[str, ...] = (), fields: dict[str, list[dict]] | None = None) -> None:
    """A kept folder whose rows carry the distill's own r_ss and r_kl (total = r_ss - r_kl, no match penalty); the
    teachers in ``shuffled`` have their rows in reverse order, those in ``extra`` one more question (q99);
    ``fields[name]``: more fields of each of that teacher's rows, in question order."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"teachers": {}}
    for name, pairs in scores.items():
        more = (fields or {}).get(name) or [{}] * len(pairs)
        rows = [{"question_id": qid, "question": question, "solution": solution, "explanation": "",
                 "template": template, "answer": "1", "r_ss": r_ss, "r_kl": r_kl, "total": r_ss - r_kl, **added}
                for (qid, question, solution, template), (r_ss, r_kl), added in zip(QUESTIONS, pairs, more)]
        if name in extra:
            rows.append({**rows[0], "question_id": "q99", "question": "another", "r_ss": 50.0, "total": 50.0})
        if name in shuffled:
            rows.reverse()
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        (folder / f"{name}.jsonl.xz").write_bytes(lzma.compress(data))
        manifest["teachers"][name] = {"file": f"{name}.jsonl.xz", "rows": len(rows),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _kept_run(folder: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), folder, "--kept", "--out", out, *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


SFT = [(-2.0, 1.0), (-1.0, 0.5), (-3.0, 1.5), (-2.0, 1.0), (-1.0, 0.5), (-3.0, 1.5)]
RL = [(r_ss + bump, r_kl - 0.25) for (r_ss, r_kl), bump in zip(SFT, [0.1, 0.3, 0.2, 0.1, 0.3, 0.2])]


def test_kept_compares_the_distills_own_scores_on_every_common_question_without_a_model(tmp_path):
    # rl_s0's rows in another order and with a question sft lacks: pairs are matched by question id
    _keep_scored(tmp_path / "kept", {"sft": SFT, "rl_s0": RL}, shuffled=("rl_s0",), extra=("rl_s0",))
    out = tmp_path / "kept.json"
    done = _kept_run(tmp_path / "kept", out, "--teachers", "sft,rl_s0", "--questions", "0")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert (result["questions"], result["templates"], result["scores"]) == (6, 3, "kept")
    assert result["teachers"]["sft"] == {"r_ss": -2.0, "r_kl": 1.0, "total": -3.0}
    assert result["teachers"]["rl_s0"] == {"r_ss": -1.8, "r_kl": 0.75, "total": -2.55}
    pair = result["differences"]["rl_s0 - sft"]
    assert (pair["r_ss"]["mean"], pair["r_kl"]["mean"], pair["total"]["mean"]) == (0.2, -0.25, 0.45)
    # every question moved by the same r_kl: no interval width; r_ss moved 0.1..0.3: the interval lies within that
    assert pair["r_kl"]["ci95"] == [-0.25, -0.25]
    assert 0.1 <= pair["r_ss"]["ci95"][0] < 0.2 < pair["r_ss"]["ci95"][1] <= 0.3
    assert "rl_s0 - sft: r_ss +0.200" in done.stderr
    # the other order: the later named minus the earlier
    done = _kept_run(tmp_path / "kept", out, "--teachers", "rl_s0,sft", "--questions", "0")
    assert json.loads(out.read_text())["differences"]["sft - rl_s0"]["r_ss"]["mean"] == -0.2


def test_kept_compares_the_shares_of_wrong_equations_and_of_explanations_that_close(tmp_path):
    """Rows carrying the distill's ``wrong_equations`` (a count) and ``matched``: each teacher's share of rows with a
    wrong equation and that close, and their paired differences; a count that is not one is refused."""
    sft = [{"wrong_equations": w, "matched": m} for w, m in zip([2, 0, 1, 0, 0, 3], [True] * 5 + [False])]
    rl = [{"wrong_equations": w, "matched": True} for w in [0] * 5 + [1]]
    _keep_scored(tmp_path / "kept", {"sft": SFT, "rl_s0": RL}, fields={"sft": sft, "rl_s0": rl})
    out = tmp_path / "kept.json"
    done = _kept_run(tmp_path / "kept", out, "--teachers", "sft,rl_s0", "--questions", "0")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["teachers"]["sft"] == {"r_ss": -2.0, "r_kl": 1.0, "total": -3.0, "wrong_equation": 0.5,
                                         "closes": 0.8333}
    assert (result["teachers"]["rl_s0"]["wrong_equation"], result["teachers"]["rl_s0"]["closes"]) == (0.1667, 1.0)
    pair = result["differences"]["rl_s0 - sft"]
    assert (pair["wrong_equation"]["mean"], pair["closes"]["mean"]) == (-0.3333, 0.1667)
    # a count written as a flag is refused
    _keep_scored(tmp_path / "flag", {"sft": SFT, "rl_s0": RL},
                 fields={"sft": sft, "rl_s0": [{**rl[0], "wrong_equations": True}, *rl[1:]]})
    done = _kept_run(tmp_path / "flag", out, "--teachers", "sft,rl_s0", "--questions", "0")
    assert done.returncode == 2 and "rl_s0: question q00: wrong_equations is True, not a count" in done.stderr


def test_kept_refuses_what_it_cannot_compare_in_one_line(tmp_path):
    nan = [(float("nan"), 1.0), *SFT[1:]]
    _keep_scored(tmp_path / "kept", {"sft": SFT, "rl_s0": RL, "rl_s1": nan})
    out = tmp_path / "kept.json"
    for extra, said in ((["--teachers", "sft"], "--kept compares two or more kept teachers"),
                        (["--teachers", "sft,rl_s0", "size=tiny"], "--kept compares two or more kept teachers"),
                        (["--teachers", "sft,sft"], "--teachers sft,sft: a teacher named twice"),
                        (["--teachers", "sft,rl_s1", "--questions", "0"],
                         "rl_s1: question q00: r_ss is nan, not a finite number")):
        done = _kept_run(tmp_path / "kept", out, *extra)
        assert done.returncode == 2 and said in done.stderr, (extra, done.stderr)
    # a teacher whose distill scored the answer line alone beside ones that scored the worked solution
    manifest = json.loads((tmp_path / "kept" / "manifest.json").read_text())
    manifest["teachers"]["rl_s0"]["config"] = {"distill": {"data": {"gsm_solution": "answer"}}}
    (tmp_path / "kept" / "manifest.json").write_text(json.dumps(manifest))
    done = _kept_run(tmp_path / "kept", out, "--teachers", "sft,rl_s0", "--questions", "0")
    assert done.returncode == 2 and ("error: --kept: sft's distill scored the worked solution, rl_s0's distill "
                                     "scored the answer solution: their r_ss are not one quantity") in done.stderr
    # teachers that share fewer than two questions
    _keep_scored(tmp_path / "apart", {"sft": SFT[:1], "rl_s0": RL[:1]})
    done = _kept_run(tmp_path / "apart", out, "--teachers", "sft,rl_s0", "--questions", "0")
    assert (done.returncode, done.stderr) == (2, "error: sft, rl_s0 share 1 questions: nothing to pair (at least 2)\n")
    assert not out.exists()
