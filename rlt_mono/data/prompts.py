r"""Prompt formats of RLT ("stratos" style): the teacher chat and the student chat.

The teacher sees the question *and* its solution and continues a prefilled assistant turn with an
explanation. The student is scored on the solution after reading that explanation as its "thought".
Tags have the form ``<|begin_of_X|>`` / ``<|end_of_X|>``; docs/METHOD.md gives both chats character by character
and lists where rlt_mono's formats differ from the original RLT code.

The student chat is the Bespoke-Stratos format the RLT student (Bespoke-Stratos-7B) was trained on: its system
prompt, then ``<|begin_of_thought|>`` + ``explanation_prefix`` + explanation + ``<|end_of_thought|>`` + ``\n\n`` +
``<|begin_of_solution|>`` + solution + ``<|end_of_solution|>``. The explanation is the text the teacher generated
after its own prefilled ``<|begin_of_explanation|>`` + ``explanation_prefix``, so the student reads the thought
exactly as RLT handed it over, prefix included. Nothing is stripped or padded: whitespace inside the solution
tags is the data's own (a Bespoke-Stratos solution keeps its ``\n\n`` padding).
"""

from __future__ import annotations

from dataclasses import dataclass


def begin_tag(name: str) -> str:
    return f"<|begin_of_{name}|>"


def end_tag(name: str) -> str:
    return f"<|end_of_{name}|>"


# rlt_mono's own teacher prompt, deliberately not RLT's: rlt_mono's teacher is warmed up on this format by its own
# SFT stage, so SFT, RL and distillation agree. A teacher warmed up by the RLT code needs RLT's text instead
# (PromptFormat(teacher_system_prompt=...)); docs/METHOD.md lists this with the other differences.
TEACHER_SYSTEM_PROMPT = (
    "Your role as an assistant is to provide a detailed explanation of a given solution to a question. "
    "First write the Solution section, then an Explanation section that walks a student through the "
    "reasoning which leads to that solution, step by step. Put the solution in "
    f"{begin_tag('solution')} {end_tag('solution')} and the explanation in "
    f"{begin_tag('explanation')} {end_tag('explanation')}."
)

# The system prompt of the Bespoke-Stratos-17k data (its "system" field), which the RLT student was fine-tuned on
# and RLT scores with: kept verbatim, spelling included, since the student's log-probs depend on every character.
STUDENT_SYSTEM_PROMPT = (
    "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking process "
    "before providing the final precise and accurate solutions. This requires engaging in a comprehensive cycle of "
    "analysis, summarizing, exploration, reassessment, reflection, backtracing, and iteration to develop "
    "well-considered thinking process. Please structure your response into two main sections: Thought and "
    "Solution. In the Thought section, detail your reasoning process using the specified format: "
    f"{begin_tag('thought')} {{thought with steps separated with '\\n\\n'}} {end_tag('thought')} Each step should "
    "include detailed considerations such as analisying questions, summarizing relevant findings, brainstorming "
    "new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. "
    "In the Solution section, based on various attempts, explorations, and reflections from the Thought section, "
    "systematically present the final solution that you deem correct. The solution should remain a logical, "
    "accurate, concise expression style and detail necessary step needed to reach the conclusion, formatted as "
    f"follows: {begin_tag('solution')} {{final formatted, precise, and clear solution}} {end_tag('solution')} Now, "
    "try to solve the following question through the above guidelines:"
)

# Every tag string the formats use; the embedded tokenizer registers them as single tokens.
ALL_TAGS: tuple[str, ...] = tuple(
    tag(name) for name in ("solution", "explanation", "thought") for tag in (begin_tag, end_tag)
)


@dataclass(frozen=True)
class PromptFormat:
    """The strings that make up the teacher and student chats.

    Defaults are the RLT run's ("stratos" style, docs/METHOD.md); the teacher's system prompt is rlt_mono's own.
    """

    teacher_system_prompt: str = TEACHER_SYSTEM_PROMPT
    student_system_prompt: str = STUDENT_SYSTEM_PROMPT
    # Between the closing solution tag and the opening explanation tag (teacher), and between the closing thought
    # tag and the opening solution tag (student).
    section_delimiter: str = "\n\n"
    # Right after the opening explanation tag in the teacher's prefilled turn, and after the opening thought tag in
    # the student's turn: part of the prompt for the teacher, part of the thought the student reads.
    explanation_prefix: str = "\n\n"

    @property
    def explanation_end(self) -> str:
        return end_tag("explanation")

    def teacher_prefill(self, solution: str) -> str:
        """The assistant text the teacher continues: the solution, then an opened explanation."""
        return (
            f"{begin_tag('solution')}{solution}{end_tag('solution')}"
            f"{self.section_delimiter}{begin_tag('explanation')}{self.explanation_prefix}"
        )

    def teacher_messages(self, question: str, solution: str) -> list[dict[str, str]]:
        """Conversational teacher prompt; the last (assistant) message is continued by generation."""
        return [
            {"role": "system", "content": self.teacher_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.teacher_prefill(solution)},
        ]

    def student_completion(self, explanation: str, solution: str) -> str:
        """The student's assistant turn: the explanation (after the prefix) as its thought, then the solution.

        ``explanation`` is what the teacher wrote after its prefilled prefix; a Bespoke-Stratos turn is rebuilt
        exactly from ``split_student_completion``'s parts.
        """
        return (
            f"{begin_tag('thought')}{self.explanation_prefix}{explanation}{end_tag('thought')}"
            f"{self.section_delimiter}{begin_tag('solution')}{solution}{end_tag('solution')}"
        )

    def student_messages(self, question: str, explanation: str, solution: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.student_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.student_completion(explanation, solution)},
        ]

    def split_student_completion(self, text: str) -> tuple[str | None, str | None]:
        """The inverse of ``student_completion``: ``(explanation, solution)`` of a student-format turn.

        The explanation is the thought without one leading ``explanation_prefix`` (the part a teacher prompt
        already holds), the solution everything between the solution tags, whitespace kept; so a Bespoke-Stratos
        assistant turn maps to the columns that rebuild it character for character. A part whose tags are missing
        is None.
        """
        thought, solution = between(text, "thought"), between(text, "solution")
        explanation = thought.removeprefix(self.explanation_prefix) if thought is not None else None
        return explanation, solution


def between(text: str, name: str) -> str | None:
    """The text between the first ``begin_tag(name)`` and the next ``end_tag(name)``; None if either is missing (a
    part cut at a token cap has no end tag)."""
    begin = text.find(begin_tag(name))
    if begin < 0:
        return None
    begin += len(begin_tag(name))
    stop = text.find(end_tag(name), begin)
    return text[begin:stop] if stop >= 0 else None
