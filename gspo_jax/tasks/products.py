"""A laptop-sized problem where a tool matters: the product of two large numbers.

    task = tasks.get_task("products", digits=8)
    records = task.generate_split("train")             # {"prompt", "a", "b", "target"}

A small model cannot multiply two 8-digit numbers in its head reliably (every digit of the
product depends on many digit products and carries), but it can call the Python tool and copy the
number it prints (envs.ProductsEnvironment, config.env.name="python"). With ``digits`` 1-2 the
answer is easy without the tool, so the tool-call rate by difficulty shows whether a policy
learned where the tool helps. Two ways to mix difficulties in one task: ``min_digits`` <
``digits`` mixes the operand lengths (each problem draws its length uniformly from
min_digits..digits, both operands the same length); ``easy_fraction`` makes that share of the
problems a * 10^(d-1) (the smallest d-digit number: the product is a with d-1 zeros appended, which
a small model computes by copying), keeping every question the same length, so that the position
of each digit to copy is the same in every problem (a small model learns copying at fixed offsets
far sooner: docs/tools.md). ``difficulty`` names a problem's level ("4 digits", "power of ten").

The final turn answers ``Answer: <number>``. Reward: correct (1/0: the last "Answer:" holds the
product and the turn ended with eos) + format_weight * format (1/0: it ended with eos and holds an
"Answer:" with digits). The task's own demonstration is the direct answer; the worked example
with a tool call is the environment's (envs/products.py ``demonstration``), since only an
environment can run the call.

Tokens: characters of printable ASCII and newline (the project's small models).
max_response_len fits one tool round trip in the plain format (call, response, answer).

Dimension legend: none beyond task.py (records are scalars).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.task import Task, Verdict, check_split_sizes, disjoint_problems
from gspo_jax.tasks.tokenizer import CharTokenizer

ALPHABET = "\n" + "".join(c for c in string.printable if c.isprintable())  # ASCII 32-126
_ANSWER = re.compile(r"Answer:\s*(\d{1,40})")
# Qwen3's call format (envs/tool_calls.py parses it; tasks/ sits below envs/ and writes it here)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def question(a: int, b: int) -> str:
    return f"What is {a} * {b}? End with: Answer: <the product>\n"


def answer_text(a: int, b: int) -> str:
    return f"Answer: {a * b}"


def call_text(a: int, b: int) -> str:
    """The policy's call of the Python tool that prints a * b."""
    call = {"name": "python", "arguments": {"code": f"print({a} * {b})"}}
    return f"{CALL_OPEN}{json.dumps(call)}{CALL_CLOSE}"


def _lo(digits: int) -> int:
    """The smallest operand of ``digits`` digits (0 for one digit: 0-9)."""
    return 10 ** (digits - 1) if digits > 1 else 0


def _hi(digits: int) -> int:
    return 10**digits


def _power_of_ten(digits: int) -> int:
    """The easy operand of ``digits`` digits: 10^(digits-1)."""
    return 10 ** (digits - 1)


class ProductsTask(Task):
    """a * b with operands of ``digits`` digits (the difficulty knob), or of a length drawn per
    problem from ``min_digits``..``digits``.

    Knobs: digits, min_digits (None: = digits), easy_fraction (the share of a * 10^(d-1)),
    format_weight, num_train, num_test, seed.
    """

    name = "products"
    record_fields = ("a", "b", "target")
    warm_start_steps = 600

    def __init__(
        self,
        *,
        digits: int = 6,
        min_digits: int | None = None,
        easy_fraction: float = 0.0,
        format_weight: float = 0.1,
        num_train: int = 20000,
        num_test: int = 1000,
        seed: int = 0,
    ):
        if not 1 <= digits <= 9:  # the product fits the records' int64
            raise ValueError(f"digits must lie in [1, 9], got {digits}.")
        min_digits = digits if min_digits is None else min_digits
        if not 1 <= min_digits <= digits:
            raise ValueError(f"min_digits must lie in [1, digits={digits}], got {min_digits}.")
        if not 0.0 <= easy_fraction < 1.0:
            raise ValueError(f"easy_fraction must lie in [0, 1), got {easy_fraction}.")
        check_split_sizes(num_train, num_test)
        # the problems each length can hold: (operands of that length)^2
        space = sum((_hi(d) - _lo(d)) ** 2 for d in range(min_digits, digits + 1))
        if num_train + num_test > space // 4:
            raise ValueError(
                f"{num_train + num_test} problems asked of {min_digits}-{digits}-digit operands: "
                f"at most {space // 4}; lower num_train/num_test or raise digits."
            )
        self.digits, self.min_digits, self.format_weight = digits, min_digits, format_weight
        self.easy_fraction = easy_fraction
        self.config = dict(
            digits=digits,
            **({"min_digits": min_digits} if min_digits != digits else {}),
            **({"easy_fraction": easy_fraction} if easy_fraction else {}),
            format_weight=format_weight,
            num_train=num_train,
            num_test=num_test,
            seed=seed,
        )
        self.tokenizer = CharTokenizer(ALPHABET)
        big = 10**digits - 1
        self.max_prompt_len = 1 + len(question(big, big))  # bos + the question
        # a call, its eos, the plain tool response (<tool_response>product\n</tool_response>),
        # the answer and its eos
        response = f"<tool_response>{big * big}\n</tool_response>"
        self.max_response_len = (
            len(call_text(big, big)) + len(response) + len(answer_text(big, big)) + 2
        )

    # ---- data ---------------------------------------------------------------------------------
    def tfds_features(self) -> dict[str, Any]:
        import tensorflow_datasets as tfds

        return {
            "prompt": tfds.features.Text(),
            "a": tfds.features.Scalar(np.int64),
            "b": tfds.features.Scalar(np.int64),
            "target": tfds.features.Scalar(np.int64),
        }

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        lengths, easy = range(self.min_digits, self.digits + 1), self.easy_fraction

        def draw(rng: np.random.Generator) -> tuple[int, int]:
            # one length and no easy share: the fixed-length task's draws, seed for seed
            d = int(rng.integers(lengths.start, lengths.stop)) if len(lengths) > 1 else lengths[0]
            a, b = int(rng.integers(_lo(d), _hi(d))), int(rng.integers(_lo(d), _hi(d)))
            if easy and rng.random() < easy:
                b = _power_of_ten(d)
            return a, b

        pairs = disjoint_problems(
            draw,
            self.config["seed"],
            split,
            self.config,
        )
        return [dict(prompt=question(a, b), a=a, b=b, target=a * b) for a, b in pairs]

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        """The question, from the operands (what batches carry: record_fields)."""
        return question(int(record["a"]), int(record["b"]))

    def difficulty(self, record: Mapping[str, Any]) -> str:
        """The operands' length, "<d> digit(s)" (both operands have it), or "power of ten" for
        an easy_fraction problem."""
        d = len(str(int(record["a"])))
        if self.easy_fraction and int(record["b"]) == _power_of_ten(d) and d > 1:
            return "power of ten"
        return f"{d} digit{'s' * (d > 1)}"

    # ---- warm start ---------------------------------------------------------------------------
    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        del rng
        return answer_text(int(record["a"]), int(record["b"]))

    def tool_demonstration(self, record: Mapping[str, Any]) -> list[str]:
        """The policy's turns of a worked example with the Python tool: the call, then the
        answer (the tool's response comes between them when an environment plays them)."""
        a, b = int(record["a"]), int(record["b"])
        return [call_text(a, b), answer_text(a, b)]

    # ---- verifier -----------------------------------------------------------------------------
    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        answers = _ANSWER.findall(text)
        well_formed = float(terminated and bool(answers))
        correct = float(well_formed > 0 and int(answers[-1]) == int(record["target"]))
        return Verdict(correct + self.format_weight * well_formed, correct, well_formed)
