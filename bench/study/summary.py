"""The fair study's summary (bench/study_fair.py ``summarize``, docs/STUDY.md): per student every arm's held-out
accuracy with intervals over seeds, templates and questions, the paired differences the study exists for, the
positive control, the teacher-reward <-> student-accuracy correlation, and what the finished study must hold
(``requirements``)."""

from __future__ import annotations

import numpy as np

from study.layout import _STEP_ARM, SETS, _arm_distill, _kept_teacher, arm_rank
from study.stats import (
    _interval,
    _point_replicates,
    _question_weights,
    _seed_means,
    _uncut_difference,
    correlation_figures,
    seed_t_interval,
    stream,
)

# The positive control: students trained on the dataset's own worked solutions against the better untrained prompt,
# on held-out instances of the training templates, must gain at least this much with the interval above zero.
CONTROL_ARM, UNTRAINED_ARMS, CONTROL_MARGIN = "worked", ("untrained", "untrained_plain"), 0.05
# An answer cut at the token cap is graded on its text like any other, and is mostly wrong (it seldom reaches its
# final line). Where an arm's answers are cut more often than this on a held-out set, a difference with it is also
# given on the questions no seed of either arm cut (``uncut``), and the table says so: the cap may be part of what
# the difference measures. That subset is picked by the arms' own outputs (how long they write): a conditional
# comparison that locates a difference, not a cause.
CAP_BAR = 0.05
# The comparisons the study exists for, each as (arm, minus arm), per student, wherever both arms were run.
# worked_common: the worked solutions alone on the teachers' questions (the teacher arms' like-for-like control).
DIFFERENCES = (("worked", "untrained"), ("worked", "untrained_plain"), ("worked_common", "untrained_plain"),
               ("rl_teacher", "sft_teacher"),
               ("rl_teacher", "worked"), ("sft_teacher", "worked"), ("rl_teacher", "worked_common"),
               ("sft_teacher", "worked_common"),
               ("rl_teacher", "traces"), ("rl_teacher", "rl_teacher_answer_only"),
               ("rl_teacher_full", "rl_teacher"), ("rl_teacher_full", "sft_teacher"))

# The arms whose students of seed s read RL teacher s: a correlation point a seed.
RL_SEED_ARMS = ("rl_teacher", "rl_teacher_full")
# What the finished study must hold (docs/STUDY.md, "Why a second study"): both students; per student every arm,
# three seeds of each trained one, a passing positive control, held-out sets of at least 1,000 questions (the
# held-out templates at least 15 of them) and at least four RL teachers in the correlation; every run at one commit.
REQUIRED_STUDENTS = ("qwen2.5_coder_0.5b_instruct", "qwen2.5_coder_1.5b_instruct")
REQUIRED_ARMS = ("untrained", "untrained_plain", "worked", "traces", "sft_teacher", "rl_teacher",
                 "rl_teacher_answer_only")
MIN_SEEDS, MIN_QUESTIONS, MIN_TEMPLATES, MIN_RL_TEACHERS = 3, 1000, 15, 4
# The arms that need MIN_SEEDS seeds: the trained ones of REQUIRED_ARMS, and worked_common, the teachers' arms'
# like-for-like control. A checkpoint's arm (rl_teacher_step<N>) is a correlation point: one student of its own
# suffices there.
SEEDED_ARMS = tuple(arm for arm in REQUIRED_ARMS if arm not in UNTRAINED_ARMS) + ("worked_common",)
# RL at least three times the first study's completions a seed (16,000): 188 steps of 256 make 48,128.
MIN_RL_COMPLETIONS = 48_000
# The untrained students' answers are cut at the eval's token cap on at most this share of each held-out set.
MAX_UNTRAINED_CAPPED = 0.05
# The taught arms the primary endpoint compares, whose seeds must read as many distinct teachers (or teacher
# samples) as the seeds rule asks: three students of one teacher hold no teacher-to-teacher spread. (The
# answer-only ablation reads one teacher, rl_answer_s0, at every seed: said where it is reported.)
TAUGHT_ARMS = ("sft_teacher", "rl_teacher")

# The correlation's teacher reward without a common block in the teachers file.
HELD_OUT_X = "the teacher's held-out reward (eval_reward)"
# The worked-solution reward the RL teachers are trained and measured with (data.gsm_solution).
WORKED_REWARD = "worked"
CORRELATION_LEFT_OUT = {
    "rl_teacher_answer_only": "its teacher's held-out reward scores the student's likelihood of the answer line "
                              "alone (data.gsm_solution=answer), a different quantity from the worked-solution "
                              "reward of the other teachers"}


def _matrix(per_seed: dict[int, list[dict]], held_out: str) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Correctness (seeds x questions, questions in one sorted order), the questions, each one's template, and
    whether each answer was cut at the cap (seeds x questions)."""
    by_seed = {seed: {row["question"]: row for row in rows if row.get("heldout") == held_out
                      and row.get("correct") is not None} for seed, rows in per_seed.items()}
    questions = sorted(set.intersection(*(set(rows) for rows in by_seed.values())))
    first = next(iter(by_seed.values()))
    templates = np.array([first[q].get("template", -1) for q in questions])
    correct = np.array([[float(by_seed[s][q]["correct"]) for q in questions] for s in sorted(by_seed)])
    capped = np.array([[bool(by_seed[s][q].get("capped")) for q in questions] for s in sorted(by_seed)])
    return correct, questions, templates, capped


def summarize(arms: dict, resamples: int, seed: int, teachers: dict | None = None) -> dict:
    """Per student: every arm's accuracy per held-out set (arms in ``arm_rank`` order), the differences of
    ``DIFFERENCES``, the positive control and the ``correlation`` with the teachers of ``teachers`` (the teachers
    file)."""
    students = {}
    for student, per_arm in sorted(arms.items()):
        entry = {"arms": {}, "differences": {}}
        answers = {}  # per held-out set: the resamples' question weights and each arm's answers (the correlation's)
        for held_out, name in SETS.items():
            matrices = {arm: _matrix(per_seed, held_out) for arm, per_seed in per_arm.items()}
            matrices = {arm: m for arm, m in matrices.items() if m[1]}
            if not matrices:
                continue
            shared = sorted(set.intersection(*(set(m[1]) for m in matrices.values())))
            keep = {arm: np.isin(m[1], shared) for arm, m in matrices.items()}
            templates = next(iter(matrices.values()))[2][keep[next(iter(matrices))]]
            weights = _question_weights(templates, resamples, stream(seed, student, held_out))
            answers[name] = {"weights": weights, "correct": {arm: m[0][:, keep[arm]] for arm, m in matrices.items()}}
            boot, seed_means, cut = {}, {}, {}
            for arm, (correct, _, _, capped_matrix) in matrices.items():
                correct = correct[:, keep[arm]]
                cut[arm] = capped_matrix[:, keep[arm]].any(axis=0)  # a question some seed's answer was cut on
                seed_means[arm] = _seed_means(correct, resamples, stream(seed, student, held_out, arm))
                boot[arm] = (weights * seed_means[arm]).sum(1) / weights.sum(1)
                capped = [row.get("capped") for rows in per_arm[arm].values() for row in rows
                          if row.get("heldout") == held_out]
                entry["arms"].setdefault(arm, {"seeds": sorted(per_arm[arm])})[name] = {
                    "accuracy": round(float(correct.mean()), 4), "ci95": _interval(boot[arm]),
                    "questions": int(correct.shape[1]), "templates": int(len(np.unique(templates))),
                    "per_seed": [round(float(x), 4) for x in correct.mean(axis=1)],
                    "capped_frac": round(float(np.mean([bool(c) for c in capped])), 4) if capped else None,
                    "looped_frac": _looped_frac(per_arm[arm], held_out)}
            for arm, minus in DIFFERENCES:
                if arm in boot and minus in boot:
                    point = entry["arms"][arm][name]["accuracy"] - entry["arms"][minus][name]["accuracy"]
                    figures = {"difference": round(point, 4), "ci95": _interval(boot[arm] - boot[minus])}
                    seeds_alone = seed_t_interval(entry["arms"][arm][name]["per_seed"],
                                                  entry["arms"][minus][name]["per_seed"])
                    if seeds_alone is not None:
                        figures["seed_t"] = seeds_alone
                    over = {a: entry["arms"][a][name]["capped_frac"] for a in (arm, minus)
                            if (entry["arms"][a][name]["capped_frac"] or 0) > CAP_BAR}
                    if over:  # the difference is also given where neither arm cut (CAP_BAR)
                        figures["cut_above_bar"] = over
                        figures["uncut"] = _uncut_difference(
                            [matrices[a][0][:, keep[a]] for a in (arm, minus)], [seed_means[a] for a in (arm, minus)],
                            ~(cut[arm] | cut[minus]), weights)
                    entry["differences"].setdefault(f"{arm} - {minus}", {})[name] = figures
        entry["arms"] = {arm: entry["arms"][arm] for arm in sorted(entry["arms"], key=arm_rank)}
        entry["positive_control"] = positive_control(entry)
        entry["correlation"] = correlation(entry["arms"], teachers, resamples, seed, answers, student)
        students[student] = entry
    return students


def _looped_frac(per_seed: dict[int, list[dict]], held_out: str) -> float | None:
    """The share of an arm's answers on ``held_out`` that loop (``looped``); None where a run's export kept no loop
    bit."""
    loops = [row.get("looped") for rows in per_seed.values() for row in rows if row.get("heldout") == held_out]
    if not loops or any(loop is None for loop in loops):
        return None
    return round(float(np.mean(loops)), 4)


def positive_control(entry: dict) -> dict | None:
    """The worked-solution students against the better untrained prompt, on held-out instances."""
    name = SETS["instances"]
    untrained = [arm for arm in UNTRAINED_ARMS if name in entry["arms"].get(arm, {})]
    if CONTROL_ARM not in entry["arms"] or not untrained:
        return None
    baseline = max(untrained, key=lambda arm: entry["arms"][arm][name]["accuracy"])
    difference = entry["differences"][f"{CONTROL_ARM} - {baseline}"][name]
    passes = difference["difference"] >= CONTROL_MARGIN and difference["ci95"][0] > 0
    return {"arm": CONTROL_ARM, "baseline": baseline, "set": name, **difference, "passes": bool(passes),
            "rule": f"difference >= {CONTROL_MARGIN} and the interval above 0"}


def requirements(students: dict, commits: list[str], rows_checked: bool = True, traces_checked: bool = True,
                 teachers: dict | None = None) -> dict:
    """Each rule of the finished study (``REQUIRED_*``, ``MIN_*``): ``met``, and ``short`` naming what falls short
    of it (empty where met), so that an interim summary says plainly how far the study is from done.
    ``rows_checked``: the taught runs' rows were checked against the kept explanations (``--explanations``), the one
    check that an SFT-teacher student of seed s read the SFT teacher's sample s, and every taught student its own
    teacher's kept rows; ``traces_checked``: the traces runs' rows against the committed traces (``--traces``).
    ``teachers`` (the teachers file): each RL teacher's ``completions`` (``rl_completions``: at least
    ``MIN_RL_COMPLETIONS``) and the distills there are (``distinct_teachers``: the SFT teacher's seeded samples)."""
    taught = sorted(f"{student}/{arm}" for student, entry in students.items() for arm in entry["arms"]
                    if (_kept_teacher(arm, 0) is not None and not rows_checked)
                    or (arm == "traces" and not traces_checked))
    short = {"students": [s for s in REQUIRED_STUDENTS if s not in students],
             "arms": [], "seeds": [], "positive_control": [], "held_out_sets": [], "correlation": [],
             "one_commit": [] if len(commits) == 1 else [f"{len(commits)} commits: {', '.join(commits)}"],
             "rows_checked": [] if not taught else
             [f"the rows of {', '.join(taught)} were not checked against the kept ones (--explanations, --traces)"],
             "distinct_teachers": [], "untrained_cap": [],
             "rl_completions": ["no teachers file"] if teachers is None else
             [f"{name}: {teacher.get('completions', 0):,}" for name, teacher in sorted(teachers["teachers"].items())
              if teacher.get("reward_setting") and teacher.get("completions", 0) < MIN_RL_COMPLETIONS]}
    distills = set((teachers or {}).get("common", {}).get("distills", ()))
    for student, entry in students.items():
        arms = entry["arms"]
        short["arms"] += [f"{student}/{arm}" for arm in REQUIRED_ARMS if arm not in arms]
        short["seeds"] += [f"{student}/{arm}: {len(figures['seeds'])}" for arm, figures in arms.items()
                           if arm in SEEDED_ARMS and len(figures["seeds"]) < MIN_SEEDS]
        for arm in TAUGHT_ARMS:
            if arm in arms and not distills:
                short["distinct_teachers"].append(f"{student}/{arm}: not known (no common block of the teachers' "
                                                  "distills: --explanations)")
            elif arm in arms:
                read = {_kept_teacher(arm, seed, distills) for seed in arms[arm]["seeds"]}
                if len(read) < MIN_SEEDS:
                    short["distinct_teachers"].append(f"{student}/{arm}: {len(read)} ({', '.join(sorted(read))})")
        for arm in UNTRAINED_ARMS:
            for name, figures in arms.get(arm, {}).items():
                if name in SETS.values() and (figures["capped_frac"] or 0) > MAX_UNTRAINED_CAPPED:
                    short["untrained_cap"].append(f"{student}/{arm} {name}: {figures['capped_frac']:.1%} cut")
        control = entry.get("positive_control")
        if not control or not control["passes"]:
            short["positive_control"].append(f"{student}: {'fails' if control else 'not run'}")
        for arm, figures in arms.items():
            for name in SETS.values():
                f = figures.get(name)
                if f is None or f["questions"] < MIN_QUESTIONS \
                        or (name == SETS["templates"] and f["templates"] < MIN_TEMPLATES):
                    short["held_out_sets"].append(
                        f"{student}/{arm} {name}: " + ("none" if f is None else
                                                       f"{f['questions']} questions, {f['templates']} templates"))
        rl_teachers = entry.get("correlation", {}).get("rl_teachers", 0)
        if rl_teachers < MIN_RL_TEACHERS:
            short["correlation"].append(f"{student}: {rl_teachers} RL teachers")
    return {rule: {"met": not falls, "short": falls} for rule, falls in short.items()}


def _reward_at(curve: list[list[float]], step: int) -> list[float]:
    """``[step, eval_reward]`` of the evaluation at ``step``, else of the one nearest it (the earlier on a tie)."""
    return min(curve, key=lambda point: (abs(point[0] - step), point[0]))


def correlation_x(teachers: dict | None) -> str:
    """What a correlation's teacher reward is: the common block's mean explanation reward when the teachers file
    has one, else the held-out reward."""
    if teachers is not None and teachers.get("common"):
        source = (f"the kept explanations in {teachers['common']['from']}" if teachers["common"].get("from")
                  else "the teachers file's common block")
        return (f"the mean RLT reward of the teacher's kept explanations of the {teachers['common']['questions']} "
                f"questions every teacher explained ({source})")
    return HELD_OUT_X


def correlation_points(arms: dict, teachers: dict) -> tuple[list[dict], list[str]]:
    """Each taught arm's students against the reward of the teacher that taught them, as points
    ``{arm, teacher, teacher_reward, reward_step | reward_from, seeds, <held-out set>: accuracy}``.

    When the teachers file has a ``common`` block, a teacher's reward is the block's ``mean_total`` of its distill
    (``_arm_distill``; the point says which as ``distill``): the mean RLT reward of its kept explanations of the
    questions every teacher explained; ``sft_teacher`` and ``rl_teacher_step<N>`` against the arm's accuracy over
    its seeds, ``rl_teacher`` seed s against seed s's students. Without one, the held-out reward:

    - ``sft_teacher``: the SFT teacher, whose held-out reward is the step-0 evaluation of the worked-reward RL runs
      that start from it (their mean), against the arm's accuracy over its seeds;
    - ``rl_teacher``: for each seed s, ``rl_s<s>``'s last held-out reward against seed s's students;
    - ``rl_teacher_step<N>``: ``rl_s0``'s held-out reward at step N (or the evaluation nearest N: ``reward_step``
      says which) against the arm's accuracy over its seeds.

    Also returns what is missing for a point, one sentence each. ``CORRELATION_LEFT_OUT`` arms give no point."""
    rl = {name: teacher for name, teacher in teachers.get("teachers", {}).items() if teacher.get("eval_reward_curve")}
    points, missing = [], []
    common = teachers.get("common")

    def point(arm: str, seeds: list[int], teacher: str, reward: float, where: dict) -> None:
        figures = arms[arm]
        accuracy = {name: float(np.mean([figures[name]["per_seed"][figures["seeds"].index(s)] for s in seeds]))
                    for name in SETS.values() if name in figures}
        points.append({"arm": arm, "teacher": teacher, "teacher_reward": round(reward, 4), **where, "seeds": seeds,
                       **{name: round(value, 4) for name, value in accuracy.items()}})

    for arm in sorted(arms, key=arm_rank):
        seeds = arms[arm]["seeds"]
        if common and _arm_distill(arm, 0) is not None:
            distills = set(common["distills"])
            # a point per seed where each seed's students read their own distill (the RL teachers; the SFT
            # teacher's seeded samples)
            own = len({_arm_distill(arm, seed, distills) for seed in seeds}) > 1 or arm in RL_SEED_ARMS
            groups = [[seed] for seed in seeds] if own else [seeds]
            for group in groups:
                teacher, distill = _arm_distill(arm, group[0], distills)
                reward = common["distills"].get(distill, {}).get("mean_total")
                who = f"{arm} seed {group[0]}" if own else arm
                if reward is None:
                    missing.append(f"{who}: no mean reward of distill {distill} in the teachers file's common block")
                    continue
                point(arm, group, teacher, reward, {
                    "distill": distill, "reward_from": f"the mean RLT reward of its kept explanations of the "
                                                       f"{common['questions']} questions every teacher explained"})
        elif arm == "sft_teacher":
            starts = {name: teacher["eval_reward_curve"][0][1] for name, teacher in sorted(rl.items())
                      if teacher.get("reward_setting") == WORKED_REWARD and teacher["eval_reward_curve"][0][0] == 0}
            if starts:
                point(arm, seeds, "sft", float(np.mean(list(starts.values()))),
                      {"reward_from": f"step 0 of {', '.join(starts)} (mean)"})
            else:
                missing.append("sft_teacher: no worked-reward RL teacher has a held-out reward at step 0 "
                               "(trainer.eval_on_start)")
        elif arm in RL_SEED_ARMS:
            for seed in seeds:
                teacher = _arm_distill(arm, seed)[0]
                if teacher in rl:
                    step, reward = rl[teacher]["eval_reward_curve"][-1]
                    point(arm, [seed], teacher, reward, {"reward_step": step})
                else:
                    missing.append(f"{arm} seed {seed}: no held-out reward of {teacher} in the teachers file")
        elif match := _STEP_ARM.match(arm):
            if "rl_s0" in rl:
                step, reward = _reward_at(rl["rl_s0"]["eval_reward_curve"], int(match["step"]))
                point(arm, seeds, "rl_s0", reward, {"reward_step": step})
            else:
                missing.append(f"{arm}: no held-out reward of rl_s0 in the teachers file")
    return points, missing


def correlation(arms: dict, teachers: dict | None, resamples: int, seed: int, answers: dict | None = None,
                student: str = "") -> dict:
    """A student's teacher-reward <-> student-accuracy correlation: its ``points`` (``correlation_points``), how
    many distinct RL teachers they hold (``rl_teachers``: checkpoints and seeds; the SFT teacher is not one), per
    held-out set ``correlation_figures`` (with ``ci95_answers`` where ``answers``, summarize's per held-out set
    question weights and answers, has the set), what is ``missing`` and the arms ``left_out`` with why. Without a
    teachers file, no points."""
    points, missing = correlation_points(arms, teachers) if teachers is not None else ([], ["no teachers file"])
    def figures(chosen: list[dict], rng: np.random.Generator) -> dict:
        by_set = {}
        for name in ("held_out_templates", "held_out_instances"):
            on_set = [p for p in chosen if name in p]
            replicates = (_point_replicates(on_set, arms, answers[name], rng)
                          if answers and name in answers and on_set else None)
            by_set[name] = correlation_figures([p["teacher_reward"] for p in on_set], [p[name] for p in on_set],
                                               resamples, rng, replicates)
        return by_set

    rl_points = [p for p in points if p["teacher"] != "sft"]
    rl_teachers = {(p["teacher"], p.get("distill"), p.get("reward_step")) for p in rl_points}
    # The declared reading (docs/STUDY.md, "The claim, declared…"): within the RL teachers, where RL moves the
    # reward continuously; over all points the SFT samples and the RL teachers form two clusters.
    return {"x": correlation_x(teachers), "y": "the taught students' accuracy", "points": points,
            "rl_teachers": len(rl_teachers), **figures(points, stream(seed, student, "correlation")),
            "within_rl": figures(rl_points, stream(seed, student, "correlation", "within_rl")),
            "missing": missing, "left_out": CORRELATION_LEFT_OUT}
