"""GSM8K from the TFDS catalogue: the path a real dataset takes through the same pipeline.

The data is never downloaded here (the codebase must run offline); ``data.make_train_iterator``
reads it from a ``data_dir`` where ``tfds.data_source("gsm8k")`` was prepared in array_record format
beforehand, and raises a message saying how to prepare it when it is missing. Records have TFDS's
fields: question, answer (the worked solution ending "#### <short answer>"), annotation (the
solution before "#### ") and short_answer. ``record_from_example`` turns a line of the original
JSONL release (question, answer) into such a record, as the TFDS builder does; ``read_jsonl``
reads a file of them (tests/data/gsm8k_sample.jsonl is a small one in that format).

Two tokenizers, chosen by the ``tokenizer_path`` knob:

* "" (default): a character tokenizer over ASCII printables, prompt "Q: <question>\\nA:",
  demonstrations "<annotation>\\n#### <short answer>". Prompts are long; this mode exercises the
  real-data path, not something to train on a CPU.
* a checkpoint folder (tokenizer.json, tokenizer_config.json; see hf_tokenizer.py): the question
  is a user message rendered by the model's chat template with the generation prompt (and
  ``enable_thinking``, Qwen3's switch; off by default, so responses stay short), asking for the
  final answer in ``\\boxed{}`` as Qwen's math prompts do; demonstrations end in ``\\boxed{}``.

Scoring (math_answers.py): the response's final answer is its last ``\\boxed{}``, else the number
after its last "####", else its last number; it is correct when math-verify finds it equal to the
short answer (so "1,000", "1000.0", "$1000" and "\\boxed{1000}" all match 1000). "format" is 1 for
a terminated response that marks its answer (``\\boxed{}`` or "####"); reward = correct +
format_weight * format.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks import math_answers
from gspo_jax.tasks.hf_tokenizer import HFTokenizer
from gspo_jax.tasks.task import Task, Verdict, as_str
from gspo_jax.tasks.tokenizer import CharTokenizer

# The instruction Qwen's math evaluations append to a question; asks for the \boxed{} answer.
CHAT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def extract_answer(text: str) -> str | None:
    """The final answer a response states (math_answers.extract_answer), or None."""
    found = math_answers.extract_answer(text)
    return None if found is None else found.text


def record_from_example(example: Mapping[str, Any]) -> dict[str, str]:
    """A GSM8K JSONL example {"question", "answer": "...#### 42"} as the TFDS record (question,
    answer, annotation, short_answer), split at the last "#### " as the TFDS builder splits it."""
    question, answer = as_str(example["question"]), as_str(example["answer"])
    if "####" not in answer:
        raise ValueError(f"GSM8K answer without '####': {answer[-80:]!r}")
    annotation, _, short = answer.rpartition("####")
    return dict(
        question=question,
        answer=answer,
        annotation=annotation,
        short_answer=short.strip(),
    )


def read_jsonl(path: str | os.PathLike) -> list[dict[str, str]]:
    """Records of a GSM8K-format JSONL file (one {"question", "answer"} object per line)."""
    with open(path, encoding="utf-8") as f:
        return [record_from_example(json.loads(line)) for line in f if line.strip()]


class Gsm8kTask(Task):
    """Grade-school math word problems (TFDS catalogue dataset "gsm8k")."""

    name = "gsm8k"
    catalogue_name = "gsm8k"
    record_fields = ("short_answer", "annotation")

    def __init__(
        self,
        *,
        max_prompt_len: int = 768,
        max_response_len: int = 512,
        format_weight: float = 0.1,
        tokenizer_path: str = "",
        enable_thinking: bool = False,
    ):
        if max_prompt_len < 2 or max_response_len < 2:
            raise ValueError(
                f"max_prompt_len and max_response_len must be >= 2 (bos or eos plus "
                f"one character), got {max_prompt_len}, {max_response_len}."
            )
        self.config = dict(
            max_prompt_len=max_prompt_len,
            max_response_len=max_response_len,
            format_weight=format_weight,
            tokenizer_path=tokenizer_path,
            enable_thinking=enable_thinking,
        )
        self.max_prompt_len, self.max_response_len = max_prompt_len, max_response_len
        self.format_weight = format_weight
        self.enable_thinking = enable_thinking
        self.tokenizer: CharTokenizer | HFTokenizer
        if tokenizer_path:
            self.tokenizer = HFTokenizer(tokenizer_path)
            if self.tokenizer.chat_template is None:
                raise ValueError(
                    f"tokenizer_path={tokenizer_path!r} has no chat template; the gsm8k task "
                    "renders its prompts with the model's template."
                )
        else:
            self.tokenizer = CharTokenizer(string.printable)

    @property
    def chat(self) -> bool:
        """Whether prompts go through a checkpoint's chat template (tokenizer_path set)."""
        return isinstance(self.tokenizer, HFTokenizer)

    def tfds_features(self) -> dict[str, Any]:
        raise ValueError("gsm8k comes from the TFDS catalogue; it has no generated builder.")

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        raise ValueError("gsm8k comes from the TFDS catalogue; it is not generated.")

    def messages(self, record: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat of one problem: a single user turn, the question and the instruction."""
        question = as_str(record["question"]).strip()
        return [{"role": "user", "content": f"{question}\n{CHAT_INSTRUCTION}"}]

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        if self.chat:
            return self.tokenizer.apply_chat_template(
                self.messages(record),
                add_generation_prompt=True,
                enable_thinking=self.enable_thinking,
            )
        return f"Q: {as_str(record['question']).strip()}\nA:"

    def prompt_ids(self, record: Mapping[str, Any]) -> list[int]:
        """Character mode: Task's (bos + prompt). Chat mode: the rendered template's ids without
        an added bos (the template writes the bos its model expects); longer prompts keep their
        end (the generation prompt) either way."""
        if not self.chat:
            return super().prompt_ids(record)
        ids = self.tokenizer.encode(self.prompt_text(record))
        return ids if len(ids) <= self.max_prompt_len else ids[-self.max_prompt_len :]

    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        del rng
        annotation = as_str(record["annotation"]).strip()
        short = as_str(record["short_answer"]).strip()
        if self.chat:
            return f"{annotation}\nThe final answer is $\\boxed{{{short}}}$."
        return f" {annotation}\n#### {short}"

    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        reference = as_str(record["short_answer"])
        correct, found = math_answers.score_response(reference, text)
        well_formed = float(terminated and found is not None and found.source != "last_number")
        return Verdict(
            reward=correct + self.format_weight * well_formed, correct=correct, format=well_formed
        )
