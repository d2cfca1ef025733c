"""Prompt formats of RLT ("stratos" style): the teacher chat and the student chat.

The teacher sees the question *and* its solution and continues a prefilled assistant turn with an
explanation. The student is scored on the solution after reading that explanation as its "thought".
Tags have the form ``<|begin_of_X|>`` / ``<|end_of_X|>`` (see ``RLT_REFERENCE.md``).
"""

from __future__ import annotations

from dataclasses import dataclass


def begin_tag(name: str) -> str:
    return f"<|begin_of_{name}|>"


def end_tag(name: str) -> str:
    return f"<|end_of_{name}|>"


TEACHER_SYSTEM_PROMPT = (
    "Your role as an assistant is to provide a detailed explanation of a given solution to a question. "
    "First write the Solution section, then an Explanation section that walks a student through the "
    "reasoning which leads to that solution, step by step. Put the solution in "
    f"{begin_tag('solution')} {end_tag('solution')} and the explanation in "
    f"{begin_tag('explanation')} {end_tag('explanation')}."
)

STUDENT_SYSTEM_PROMPT = (
    "Your role as an assistant involves thoroughly exploring questions through a systematic long thinking "
    "process before providing the final precise and accurate solution. Structure your response into two "
    f"sections: Thought, in {begin_tag('thought')} {end_tag('thought')}, and Solution, in "
    f"{begin_tag('solution')} {end_tag('solution')}."
)

# Every tag string the formats use; the embedded tokenizer registers them as single tokens.
ALL_TAGS: tuple[str, ...] = tuple(
    tag(name) for name in ("solution", "explanation", "thought") for tag in (begin_tag, end_tag)
)


@dataclass(frozen=True)
class PromptFormat:
    """The strings that make up the teacher and student chats.

    Defaults are the RLT run's; every field can be overridden from the ``data`` config group.
    """

    teacher_system_prompt: str = TEACHER_SYSTEM_PROMPT
    student_system_prompt: str = STUDENT_SYSTEM_PROMPT
    # Between the closing solution tag and the opening explanation / thought tag.
    section_delimiter: str = "\n\n"
    # Right after the opening explanation tag in the teacher's prefilled turn.
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
        """The student's assistant turn: the explanation as its thought, then the solution."""
        return (
            f"{begin_tag('thought')}{explanation}{end_tag('thought')}{self.section_delimiter}"
            f"{begin_tag('solution')}{solution}{end_tag('solution')}"
        )

    def student_messages(self, question: str, explanation: str, solution: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.student_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.student_completion(explanation, solution)},
        ]
