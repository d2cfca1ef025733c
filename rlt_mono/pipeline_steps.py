"""The pipeline's steps and their folders: what ``rlt_mono.pipeline`` runs and ``rlt_mono.study`` reads.

A floor below both, so that neither imports the other's module for its names.
"""

ORDER = ("teacher_sft", "teacher_rlt", "distill", "student_sft", "eval")
# The eval config runs twice: the RL teacher scored by the frozen student the RL reward used (its reward, r_ss,
# r_kl, unmatched fraction, solution log-prob), then the distilled student alone (its held-out accuracy).
STEPS = (*ORDER[:-1], "eval_teacher", "eval_student")
# With ``study: true``, the controls (module docstring), after the main steps so their folders keep their numbers.
STUDY_STEPS = ("distill_sft_teacher", "student_sft_sft_teacher", "student_sft_raw_traces", "eval_sft_teacher",
               "eval_student_sft_teacher", "eval_student_raw_traces")
# Each step's folder inside a pipeline folder, numbered in the order of STEPS then STUDY_STEPS (a study's main
# folders are named as without it).
STEP_FOLDER_NAMES = {step: f"{i}_{step}" for i, step in enumerate((*STEPS, *STUDY_STEPS), start=1)}
