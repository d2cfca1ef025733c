"""The fair study's table and figures (bench/study_fair.py): study_table.md's rows and lines from the summary,
study.png (each arm's accuracy with its interval) and teachers.png (the RL teachers' held-out curves)."""

from __future__ import annotations

import io
from pathlib import Path

from rlt_mono.runs.atomic_write import write_bytes
from study.layout import _SFT_SAMPLE, SETS, StudyError
from study.summary import CAP_BAR, CONTROL_ARM, HELD_OUT_X, RL_SEED_ARMS, UNTRAINED_ARMS

TEACHER_CURVES = (("reward", "held-out reward (r_SS - r_KL + match penalty)"),
                  ("r_ss", "r_SS: the student's log-prob of the solution"), ("r_kl", "r_KL: the penalty subtracted"))


def accuracy_cell(figures: dict) -> str:
    """An arm's accuracy on a held-out set as the tables write it: ``0.753 [0.677, 0.826] (n=1000)``."""
    low, high = figures["ci95"]
    return f"{figures['accuracy']:.3f} [{low:.3f}, {high:.3f}] (n={figures['questions']})"


def signed_interval(value: float, ci95: list[float]) -> str:
    """A difference with its interval as the tables write it: ``-0.008 [-0.040, +0.025]``."""
    return f"{value:+.3f} [{ci95[0]:+.3f}, {ci95[1]:+.3f}]"


def table(students: dict) -> str:
    """study_table.md: one row per student and arm."""
    lines = ["| student | arm | seeds | held-out templates | held-out instances | answers cut at the cap "
             "| answers that loop |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for student, entry in students.items():
        for arm, figures in entry["arms"].items():
            cells = []
            for name in ("held_out_templates", "held_out_instances"):
                f = figures.get(name)
                cells.append("—" if f is None else accuracy_cell(f))
            capped = [figures[n]["capped_frac"] for n in SETS.values() if figures.get(n, {}).get("capped_frac")
                      is not None]
            cut = f"{max(capped):.1%}" if capped else "—"
            loops = [figures[n]["looped_frac"] for n in SETS.values() if figures.get(n, {}).get("looped_frac")
                     is not None]
            loop = f"{max(loops):.1%}" if loops else "—"
            lines.append(f"| {student} | {arm} | {', '.join(map(str, figures['seeds']))} | {cells[0]} | {cells[1]} | "
                         f"{cut} | {loop} |")
        control = entry.get("positive_control")
        if not control and any(arm not in (CONTROL_ARM, *UNTRAINED_ARMS) for arm in entry["arms"]):
            lines.append("")
            lines.append(f"Positive control ({student}): not run (it needs the {CONTROL_ARM} students and an untrained "
                         f"one): no comparison of this student's arms rests on it.")
        if control:
            lines.append("")
            difference = signed_interval(control["difference"], control["ci95"])
            lines.append(f"Positive control ({student}): {control['arm']} - {control['baseline']} on "
                         f"{control['set'].replace('_', ' ')}: {difference}: "
                         f"{'passes' if control['passes'] else 'FAILS'} ({control['rule']}).")
        for pair, sets in entry["differences"].items():
            for name, d in sets.items():
                line = f"- {student}, {pair}, {name.replace('_', ' ')}: {signed_interval(d['difference'], d['ci95'])}"
                if "seed_t" in d:
                    t = d["seed_t"]
                    line += (f" (the seeds alone, Welch t, df {t['df']:g}: [{t['ci95'][0]:+.3f}, "
                             f"{t['ci95'][1]:+.3f}])")
                if "cut_above_bar" in d:
                    over = ", ".join(f"{arm} {frac:.1%}" for arm, frac in d["cut_above_bar"].items())
                    uncut = d["uncut"]
                    line += f"; answers cut at the cap above {CAP_BAR:.0%}: {over}; on the {uncut['questions']} " \
                            "questions neither arm cut: " + ("none" if not uncut["questions"] else
                                                              f"{uncut['difference']:+.3f} [{uncut['ci95'][0]:+.3f}, "
                                                              f"{uncut['ci95'][1]:+.3f}]")
                lines.append(line)
        if "correlation" in entry:
            lines += ["", correlation_line(student, entry["correlation"])]
        lines.append("")
    return "\n".join(lines)


def correlation_line(student: str, entry: dict) -> str:
    """The table's line for a student's correlation: r and rho per held-out set, or why there is none, over all
    points and over the RL teachers' alone (``within_rl``, the declared reading)."""
    cells = _correlation_cells(entry)
    within = entry.get("within_rl")
    teachers = ", ".join(f"{p['arm']}" + (f" s{p['seeds'][0]}" if p["arm"] in RL_SEED_ARMS
                                          or _SFT_SAMPLE.match(p.get("distill", "")) else "")
                         for p in entry["points"])
    reward = "held-out reward" if entry["x"] == HELD_OUT_X else "reward on the common questions"
    return (f"Teacher {reward} vs student accuracy ({student}; points: {teachers or 'none'}; "
            f"{entry.get('rl_teachers', 0)} RL teachers): "
            f"{'; '.join(cells)}" + (f". Within the RL teachers: {'; '.join(_correlation_cells(within))}" if within
                                     else "") + ".")


def _correlation_cells(entry: dict) -> list[str]:
    """Per held-out set: r and rho with their intervals over points and over answers, or why there are none."""
    cells = []
    for name in ("held_out_templates", "held_out_instances"):
        figures, label = entry[name], name.replace("_", " ")
        if "result" in figures:
            cells.append(f"{label}: {figures['result']} (n={figures['points']})")
            continue
        interval = figures["ci95"] if isinstance(figures["ci95"], dict) else {}
        answers = figures.get("ci95_answers", {})
        values = []
        for key, symbol in (("pearson_r", "r"), ("spearman_rho", "rho")):
            value, ci, by_answers = figures[key], interval.get(key), answers.get(key)
            values.append(f"{symbol} " + ("undefined (a side is constant)" if value is None else f"{value:+.3f}")
                          + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}] over points" if ci else "")
                          + (f", [{by_answers[0]:+.3f}, {by_answers[1]:+.3f}] over answers" if by_answers else ""))
        cells.append(f"{label}: {', '.join(values)} (n={figures['points']})")
    return cells


def requirements_line(rules: dict) -> str:
    """study_table.md's last line: the rules the study meets and, for each it does not, what falls short."""
    unmet = [f"{rule} ({'; '.join(r['short'][:4])}{'; ...' if len(r['short']) > 4 else ''})"
             for rule, r in rules.items() if not r["met"]]
    met = [rule for rule, r in rules.items() if r["met"]]
    return (f"\nThe finished study's requirements: met: {', '.join(met) or 'none'}; not met: "
            f"{', '.join(unmet) or 'none'}.\n")


def plot(students: dict, path: Path) -> None:
    """study.png: per student, a panel per held-out set with each arm's accuracy and its 95% interval, arms in
    study order (top down); an arm whose answers were cut at the cap above ``CAP_BAR`` on that set is drawn hollow
    and says how many were cut."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = ("held_out_instances", "held_out_templates")
    rows = max(len(entry["arms"]) for entry in students.values())
    figure = Figure(figsize=(11, 0.45 * rows * len(students) + 1.2 * len(students)), layout="constrained")
    axes = figure.subplots(len(students), len(names), squeeze=False, sharex=True)
    for row, (student, entry) in enumerate(students.items()):
        arms = list(entry["arms"])
        for column, name in enumerate(names):
            ax = axes[row][column]
            for y, arm in enumerate(arms):
                figures = entry["arms"][arm].get(name)
                if figures is None:
                    continue
                accuracy, (low, high), cut = figures["accuracy"], figures["ci95"], figures["capped_frac"] or 0
                over = cut > CAP_BAR
                ax.barh(y, accuracy, color="white" if over else "tab:blue", edgecolor="tab:blue", hatch="//" if over
                        else None)
                ax.errorbar(accuracy, y, xerr=[[accuracy - low], [high - accuracy]], color="black", capsize=3)
                label = f"{accuracy:.3f}" + (f"  ({cut:.0%} cut)" if over else "")
                ax.text(high + 0.01, y, label, va="center", fontsize=8)
            ax.set_yticks(range(len(arms)), [f"{arm} (s{','.join(map(str, entry['arms'][arm]['seeds']))})"
                                             for arm in arms] if column == 0 else [""] * len(arms))
            ax.invert_yaxis()
            ax.set_xlim(0, 1.2)
            ax.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
            ax.set_title(f"{student}: {name.replace('_', ' ')}", fontsize=10)
            ax.grid(axis="x", alpha=0.3)
        for ax in axes[row]:
            ax.set_xlabel("accuracy (95% bootstrap: seeds, templates, questions)")
    FigureCanvasAgg(figure).print_png(str(path))


def plot_teachers(teachers: dict, path: Path) -> list[str]:
    """teachers.png from merged teachers files (``read_teachers_files``): each RL teacher's held-out reward, r_SS
    and r_KL against its optimizer step, a panel each, a line per teacher (its step count and reward setting in the
    legend). Returns the teachers drawn; refuses a set with no held-out curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    drawn = {name: entry for name, entry in sorted(teachers["teachers"].items())
             if len(entry.get("eval_reward_curve") or []) >= 2}
    if not drawn:
        raise StudyError("no RL teacher with a held-out curve of two or more evaluations in these teachers files")
    figure = Figure(figsize=(15, 4.2), layout="constrained")
    axes = figure.subplots(1, len(TEACHER_CURVES))
    for ax, (key, title) in zip(axes, TEACHER_CURVES, strict=True):
        for name, entry in drawn.items():
            curve = entry["eval_reward_curve"] if key == "reward" else (entry.get("eval_reward_parts") or {}).get(key)
            if not curve:
                continue
            steps, values = zip(*curve, strict=True)
            label = f"{name} ({entry.get('steps', steps[-1])} steps, {entry.get('reward_setting', '?')} reward)"
            ax.plot(steps, values, marker="o", markersize=3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    # 64 colours (line plots need no more): a quarter of the full-colour file's size, for results/'s budget
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba()).convert("RGB")
    data = io.BytesIO()
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(data, format="PNG", optimize=True)
    write_bytes(path, data.getvalue())
    return list(drawn)
