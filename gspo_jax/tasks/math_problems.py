r"""MATH: competition mathematics (Hendrycks et al.), and MATH-500, from the released files.

Rows (JSONL or Hugging Face parquet, data/files.py) carry ``problem`` and ``solution`` (a worked
solution in LaTeX whose final answer is boxed), and ``answer`` in MATH-500's release; when there is
no ``answer`` field it is the last ``\boxed{}`` of the solution (math_answers.last_boxed). A row
with neither is an error naming it. Records carry problem, solution and answer (text), all three
in batches (``record_fields``), so ``task.record_from_batch`` gives them back, and the release's
difficulty as "level N" when it has one (MATH's and MATH-500's ``level``; ``task.difficulty``).

Prompts, tokenizers and scoring: word_problems.py. Character mode's prompt is
"Problem: <problem>\nSolution:" and its demonstration the solution itself; chat mode asks for the
answer in ``\boxed{}`` (Qwen's instruction) and demonstrates the solution, ending in a boxed final
answer. The reference is ``answer``, compared by math-verify (so ``\frac{1}{2}``, ``0.5`` and
``\dfrac12`` match); only a ``\boxed{}`` answer counts as well formed, and only a boxed answer
can be correct.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gspo_jax.tasks import math_answers
from gspo_jax.tasks.task import as_str
from gspo_jax.tasks.word_problems import WordProblemTask


def record_from_example(example: Mapping[str, Any]) -> dict[str, str]:
    """A MATH / MATH-500 row as a record {problem, solution, answer}."""
    problem, solution = as_str(example["problem"]), as_str(example["solution"])
    answer = example.get("answer")
    if answer is None or not as_str(answer).strip():
        answer = math_answers.last_boxed(solution)
        if answer is None:
            raise ValueError(
                f"MATH solution without \\boxed{{}} and no 'answer': {solution[-80:]!r}"
            )
    record = dict(problem=problem, solution=solution, answer=as_str(answer).strip())
    if str(example.get("level") or "").strip():  # MATH's "Level 3", MATH-500's 3
        record["level"] = level_name(example["level"])
    return record


def level_name(level: Any) -> str:
    """A MATH difficulty as "level N" (from "Level N" or N); other text (MATH's few "Level ?")
    as it is."""
    text = as_str(level).strip()
    digits = text.removeprefix("Level").strip()
    return f"level {digits}" if digits.isdigit() else text


class MathTask(WordProblemTask):
    """Competition math problems (MATH, MATH-500) from their released files."""

    name = "math"
    record_fields = ("problem", "solution", "answer")
    question_field = "problem"
    answer_markers = ("boxed",)
    # Only a boxed answer can be correct: a MATH answer is an expression, and the number after
    # "####" or the last number of an unboxed response is one number read out of one (the last
    # number of "z = 6 - 5i" is 5), which would pay a wrong answer whose digits end right.
    answer_sources = ("boxed",)

    def record_from_example(self, example: Mapping[str, Any]) -> dict[str, str]:
        return record_from_example(example)

    def difficulty(self, record: Mapping[str, Any]) -> str:
        """MATH's level (1-5) when the release has one ("" otherwise)."""
        return as_str(record.get("level", ""))

    def reference(self, record: Mapping[str, Any]) -> str:
        return as_str(record["answer"])

    def plain_prompt(self, question: str) -> str:
        return f"Problem: {question}\nSolution:"

    def worked_solution(self, record: Mapping[str, Any]) -> str:
        return as_str(record["solution"])

    def plain_demonstration(self, record: Mapping[str, Any]) -> str:
        return " " + as_str(record["solution"]).strip()

    def demonstration(self, record: Mapping[str, Any], rng) -> str:
        """The solution as released when it boxes its answer (MATH's do); else with the boxed
        final-answer line appended."""
        solution = as_str(record["solution"]).strip()
        if self.chat and math_answers.last_boxed(solution) is None:
            return super().demonstration(record, rng)
        return solution if self.chat else " " + solution
