r"""What the real math datasets (GSM8K, MATH) share: a question, a worked solution, a final answer
judged by math_answers, and two ways to tokenize them.

Two tokenizers, chosen by the ``tokenizer_path`` knob:

* "" (default): a character tokenizer over ASCII printables, a plain-text prompt (the task's
  ``plain_prompt``) and the dataset's own solution as the demonstration. Prompts are long; this
  mode exercises the real-data path, not something to train on a CPU.
* a checkpoint folder (tokenizer.json, tokenizer_config.json; see hf_tokenizer.py): the question
  is a user message rendered by the model's chat template with the generation prompt (and
  ``enable_thinking``, Qwen3's switch; off by default, so responses stay short), followed by the
  instruction Qwen's math evaluations use (CHAT_INSTRUCTION: the final answer in ``\boxed{}``);
  demonstrations end in ``\boxed{}``.

Data (``data_path``): a folder with the released split files (tasks/released.py), converted
once into the cache; each row becomes a record by the task's ``record_from_example``.

Scoring (math_answers.py): the response's final answer is its last ``\boxed{}``, else the number
after its last "####", else its last number; it is correct when it was found by one of the task's
``answer_sources`` and math-verify finds it equal to the reference (``reference(record)``).
"format" is 1 for a terminated response that marks its answer with one of the task's
``answer_markers``; reward = correct + format_weight * format. ``score`` compares the B answers
of a batch in worker processes (scoring.py: in parallel, same verdicts as one by one) and
returns per row "verify_timeouts": 1 where the comparison ran past scoring.LIMIT_S (logged,
retried, scored 0 if the retry also ran past it; 0 in practice), so the trainer logs the share
of such rows beside the reward.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

import abc
import os
import string
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks import math_answers, released, scoring
from gspo_jax.tasks.hf_tokenizer import HFTokenizer
from gspo_jax.tasks.task import Task, Verdict, as_str
from gspo_jax.tasks.tokenizer import CharTokenizer

# The instruction Qwen's math evaluations append to a question; asks for the \boxed{} answer.
CHAT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class WordProblemTask(Task):
    """Base of the real math datasets; subclasses say where the question, the solution and the
    reference answer are in a record, and how a row of the released files becomes a record."""

    question_field: str
    # Which math_answers sources count as a marked answer for the format score.
    answer_markers: tuple[str, ...] = ("boxed", "####")
    # Which math_answers sources may be correct (an answer found otherwise scores 0).
    answer_sources: tuple[str, ...] = ("boxed", "####", "last_number")
    score_keys = ("reward", "correct", "format", "verify_timeouts")

    def __init__(
        self,
        *,
        max_prompt_len: int = 768,
        max_response_len: int = 512,
        format_weight: float = 0.1,
        tokenizer_path: str = "",
        enable_thinking: bool = False,
        data_path: str = "",
    ):
        if max_prompt_len < 2 or max_response_len < 2:
            raise ValueError(
                f"max_prompt_len and max_response_len must be >= 2 (bos or eos plus "
                f"one character), got {max_prompt_len}, {max_response_len}."
            )
        if data_path:
            data_path = os.path.abspath(os.fspath(data_path))
            released.find_folder(data_path, self.splits)  # a bad folder fails here, not later
        elif not self.catalogue_name:
            raise ValueError(
                f"the {self.name} task reads its data from files: pass data_path=<a folder with "
                "train.jsonl/test.jsonl or Hugging Face parquet shards> (docs/data.md)."
            )
        self.config = dict(
            max_prompt_len=max_prompt_len,
            max_response_len=max_response_len,
            format_weight=format_weight,
            tokenizer_path=tokenizer_path,
            enable_thinking=enable_thinking,
        )
        if (
            data_path
        ):  # only when set: the catalogue task's config (and cache keys) stay as they were
            self.config["data_path"] = data_path
        self.data_path = data_path
        self.max_prompt_len, self.max_response_len = max_prompt_len, max_response_len
        self.format_weight = format_weight
        self.enable_thinking = enable_thinking
        self.tokenizer: CharTokenizer | HFTokenizer
        if tokenizer_path:
            self.tokenizer = HFTokenizer(tokenizer_path)
            if self.tokenizer.chat_template is None:
                raise ValueError(
                    f"tokenizer_path={tokenizer_path!r} has no chat template; the {self.name} "
                    "task renders its prompts with the model's template."
                )
        else:
            self.tokenizer = CharTokenizer(string.printable)

    # ---- what subclasses define -----------------------------------------------------------
    @abc.abstractmethod
    def record_from_example(self, example: Mapping[str, Any]) -> dict[str, str]:
        """A row of the released files as a record; ValueError / KeyError for a row without
        what the task needs."""

    @abc.abstractmethod
    def reference(self, record: Mapping[str, Any]) -> str:
        """The reference final answer of a record."""

    @abc.abstractmethod
    def plain_prompt(self, question: str) -> str:
        """Character mode's prompt text."""

    @abc.abstractmethod
    def worked_solution(self, record: Mapping[str, Any]) -> str:
        """The dataset's solution text without its final-answer line (chat demonstrations
        append ``\\boxed{reference}``)."""

    @abc.abstractmethod
    def plain_demonstration(self, record: Mapping[str, Any]) -> str:
        """Character mode's demonstration (the dataset's own solution format)."""

    # ---- shared ---------------------------------------------------------------------------
    @property
    def chat(self) -> bool:
        """Whether prompts go through a checkpoint's chat template (tokenizer_path set)."""
        return isinstance(self.tokenizer, HFTokenizer)

    def tfds_features(self) -> dict[str, Any]:
        raise ValueError(f"{self.name} is read from its files or catalogue; it is not generated.")

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        raise ValueError(f"{self.name} is read from its files or catalogue; it is not generated.")

    def data_fingerprint(self) -> str:
        """The content key of the task's files ("" for catalogue data): caches of anything
        trained on the data (the warm start) key on it, so an edited file is a new dataset."""
        if not self.data_path:
            return ""
        return released.fingerprint(self)

    def messages(self, record: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat of one problem: a single user turn, the question and the instruction."""
        question = as_str(record[self.question_field]).strip()
        return [{"role": "user", "content": f"{question}\n{CHAT_INSTRUCTION}"}]

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        if self.chat:
            return self.tokenizer.apply_chat_template(
                self.messages(record),
                add_generation_prompt=True,
                enable_thinking=self.enable_thinking,
            )
        return self.plain_prompt(as_str(record[self.question_field]).strip())

    def prompt_ids(self, record: Mapping[str, Any]) -> list[int]:
        """Character mode: Task's (bos + prompt). Chat mode: the rendered template's ids without
        an added bos (the template writes the bos its model expects); longer prompts keep their
        end (the generation prompt) either way."""
        if not self.chat:
            return super().prompt_ids(record)
        ids = self.tokenizer.encode(self.prompt_text(record))
        return ids if len(ids) <= self.max_prompt_len else ids[-self.max_prompt_len :]

    def demonstration(self, record: Mapping[str, Any], rng) -> str:
        del rng
        if self.chat:
            worked = self.worked_solution(record).strip()
            return f"{worked}\nThe final answer is $\\boxed{{{self.reference(record).strip()}}}$."
        return self.plain_demonstration(record)

    def _verdict(
        self, found: math_answers.Extracted | None, correct: float, terminated: bool, timeouts: int
    ) -> Verdict:
        well_formed = float(
            terminated and found is not None and found.source in self.answer_markers
        )
        return Verdict(
            reward=correct + self.format_weight * well_formed,
            correct=correct,
            format=well_formed,
            extras={"verify_timeouts": float(timeouts > 0)},
        )

    def _to_compare(self, text: str) -> tuple[Any, str | None]:
        """(the response's extracted answer, the answer text to compare or None when it cannot
        be correct: none found, or found by a source the task does not accept)."""
        found = math_answers.extract_answer(text)
        if found is None or found.source not in self.answer_sources:
            return found, None
        return found, found.text

    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        found, answer = self._to_compare(text)
        reference = as_str(self.reference(record))
        correct = float(answer is not None and math_answers.is_equivalent(reference, answer))
        return self._verdict(found, correct, terminated, 0)

    def score(
        self,
        batch: Mapping[str, np.ndarray],
        responses: np.ndarray,  # [B, T] int
        response_mask: np.ndarray,  # [B, T]
        group_size: int,
    ) -> dict[str, np.ndarray]:
        """Task.score with the B comparisons in scoring.score_batch (worker processes when B is
        large enough): the verdicts equal ``verify``'s row by row; "verify_timeouts" [B] is 1 where
        the row's comparison ran past scoring.LIMIT_S (its sum counts them)."""
        responses, response_mask = self._check_score_args(
            batch, responses, response_mask, group_size
        )
        records = [self.record_from_batch(batch, p) for p in range(len(batch["prompt"]))]
        rows, pairs, where = [], [], []
        for b in range(responses.shape[0]):
            text, terminated = self.split_response(responses[b], response_mask[b])
            record = records[b // group_size]
            found, answer = self._to_compare(text)
            rows.append((found, terminated))
            if answer is not None:
                where.append(b)
                pairs.append((as_str(self.reference(record)), answer))
        results: list[scoring.Result | None] = [None] * len(rows)
        for b, result in zip(where, scoring.score_batch(pairs), strict=True):
            results[b] = result
        out = {k: np.zeros(len(rows), np.float32) for k in self.score_keys}
        for b, ((found, terminated), result) in enumerate(zip(rows, results, strict=True)):
            correct, timeouts = (0.0, 0) if result is None else (result.correct, result.timeouts)
            verdict = self._verdict(found, correct, terminated, timeouts)
            parts = {"reward": verdict.reward, "correct": verdict.correct, "format": verdict.format}
            parts.update(verdict.extras)
            for k in self.score_keys:
                out[k][b] = parts[k]
        return out
