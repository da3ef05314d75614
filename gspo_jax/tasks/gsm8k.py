"""GSM8K: grade-school math word problems, from the released files or the TFDS catalogue.

Two sources, chosen by the ``data_path`` knob:

* a folder of the released files (``data_path``, data/files.py): ``train.jsonl`` / ``test.jsonl``
  as OpenAI released them (one {"question", "answer"} object per line), or Hugging Face's parquet
  shards (``main/train-00000-of-00001.parquet``, ...). Converted once into the cache, no
  TensorFlow needed.
* "" (default): the TFDS catalogue dataset "gsm8k", prepared in array_record format under
  ``data_dir`` beforehand (the codebase never downloads); its module is imported so that TFDS finds
  the builder by name.

Records have TFDS's fields: question, answer (the worked solution ending "#### <short answer>"),
annotation (the solution before the last "####") and short_answer. ``record_from_example`` turns
a released row into such a record, as the TFDS builder does; ``read_jsonl`` reads a file of them
(tests/data/gsm8k_sample.jsonl is a small one in that format).

Prompts, demonstrations and scoring: word_problems.py. Character mode's prompt is
"Q: <question>\nA:" and its demonstration "<annotation>\n#### <short answer>"; the reference is
the short answer (so "1,000", "1000.0", "$1000" and "\boxed{1000}" all match 1000), and an answer
marked by ``\boxed{}`` or "####" counts as well formed.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from gspo_jax.tasks import math_answers
from gspo_jax.tasks.task import as_str
from gspo_jax.tasks.word_problems import CHAT_INSTRUCTION, WordProblemTask

__all__ = ["CHAT_INSTRUCTION", "Gsm8kTask", "extract_answer", "read_jsonl", "record_from_example"]


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


class Gsm8kTask(WordProblemTask):
    """Grade-school math word problems (GSM8K: released files, or the TFDS catalogue)."""

    name = "gsm8k"
    catalogue_name = "gsm8k"
    catalogue_module = "tensorflow_datasets.text.gsm8k"
    # the question too: a tool environment renders it as the chat's user message (envs/)
    record_fields = ("short_answer", "annotation", "question")
    question_field = "question"
    answer_markers = ("boxed", "####")

    def record_from_example(self, example: Mapping[str, Any]) -> dict[str, str]:
        return record_from_example(example)

    def reference(self, record: Mapping[str, Any]) -> str:
        return as_str(record["short_answer"])

    def plain_prompt(self, question: str) -> str:
        return f"Q: {question}\nA:"

    def worked_solution(self, record: Mapping[str, Any]) -> str:
        return as_str(record["annotation"])

    def plain_demonstration(self, record: Mapping[str, Any]) -> str:
        annotation = as_str(record["annotation"]).strip()
        return f" {annotation}\n#### {as_str(record['short_answer']).strip()}"
