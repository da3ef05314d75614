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
after its last "####", else its last number; it is correct when math-verify finds it equal to the
reference (``reference(record)``). "format" is 1 for a terminated response that marks its answer
with one of the task's ``answer_markers``; reward = correct + format_weight * format.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

import abc
import os
import string
from collections.abc import Mapping
from typing import Any

from gspo_jax.tasks import math_answers, released
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

    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        correct, found = math_answers.score_response(as_str(self.reference(record)), text)
        well_formed = float(
            terminated and found is not None and found.source in self.answer_markers
        )
        return Verdict(
            reward=correct + self.format_weight * well_formed, correct=correct, format=well_formed
        )
