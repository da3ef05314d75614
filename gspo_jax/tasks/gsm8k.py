"""GSM8K from the TFDS catalogue: the path a real dataset takes through the same pipeline.

The data is never downloaded here (the codebase must run offline); ``data.make_train_iterator``
reads it from a ``data_dir`` where ``tfds.data_source("gsm8k")`` was prepared in array_record format
beforehand, and raises a message saying how to prepare it when it is missing.

Prompt "Q: <question>\nA:"; the verifier takes the number after the last "####" (or, failing that,
the last number in the response), strips commas and compares it numerically with the reference
short answer. Byte-level ASCII tokenizer (one id per printable character), so prompts are long;
this task exists to exercise the real-data path, not to be trained on a CPU.

Dimension legend: none beyond task.py.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.task import Task, Verdict, as_str
from gspo_jax.tasks.tokenizer import CharTokenizer

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The final numeric answer in a response, normalised ("1,234" -> "1234"), or None."""
    tail = text[text.rfind("####") + 4 :] if "####" in text else text
    numbers = _NUMBER_RE.findall(tail[-1000:])
    if not numbers:
        return None
    return numbers[-1 if "####" not in text else 0].replace(",", "").rstrip(".")


def _same_number(a: str, b: str) -> bool:
    try:  # both strings hold at most a few hundred characters matched by _NUMBER_RE
        return abs(float(a) - float(b)) < 1e-6
    except (ValueError, OverflowError):
        return False


class Gsm8kTask(Task):
    """Grade-school math word problems (TFDS catalogue dataset "gsm8k")."""

    name = "gsm8k"
    catalogue_name = "gsm8k"
    record_fields = ("short_answer", "annotation")

    def __init__(
        self, *, max_prompt_len: int = 768, max_response_len: int = 512, format_weight: float = 0.1
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
        )
        self.max_prompt_len, self.max_response_len = max_prompt_len, max_response_len
        self.format_weight = format_weight
        self.tokenizer = CharTokenizer(string.printable)

    def tfds_features(self) -> dict[str, Any]:
        raise ValueError("gsm8k comes from the TFDS catalogue; it has no generated builder.")

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        raise ValueError("gsm8k comes from the TFDS catalogue; it is not generated.")

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        return f"Q: {as_str(record['question']).strip()}\nA:"

    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        del rng
        return f" {as_str(record['annotation']).strip()}\n#### {as_str(record['short_answer'])}"

    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        answer = extract_answer(text)
        reference = as_str(record["short_answer"]).strip().replace(",", "")
        correct = float(answer is not None and _same_number(answer, reference))
        well_formed = float(terminated and "####" in text and answer is not None)
        return Verdict(
            reward=correct + self.format_weight * well_formed, correct=correct, format=well_formed
        )
