"""Countdown: combine the given numbers with + - * and parentheses to reach a target.

    prompt    "6,8,16:88="            the numbers (sorted: their order gives nothing away), target
    response  "16*6-8"                an expression that uses every number exactly once

Why this task: its rewards are not only 0/1. An expression that uses exactly the given numbers but
misses the target earns partial credit that falls linearly with the distance to the target, which
is the situation the Dr. GRPO paper's remark about per-group reward std is about. Finding an
expression is a search, so a small model trained on demonstrations stays mediocre at it.

The verifier parses the expression with its own recursive-descent parser (never eval/exec) and
bounds its length, nesting and number size, so any string yields a verdict.

Reward = partial + format_weight * format, where partial = 1 when correct, else
partial_weight * max(0, 1 - |value - target| / closeness_scale) when the expression is valid and
uses exactly the given numbers, else 0; correct and format are 0/1.

Demonstrations: the expression that generated the target (problems are made by sampling numbers and
operators and computing the value); a share ``wrong_fraction`` has one operator changed.

Dimension legend: N = num_numbers (numbers per problem).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.task import (
    Task,
    Verdict,
    as_str,
    check_split,
    check_split_sizes,
    split_seed,
)
from gspo_jax.tasks.tokenizer import CharTokenizer

_ALPHABET = "0123456789+-*(),:="
_OPS = "+-*"
_MAX_EXPR_CHARS = 256
_MAX_DEPTH = 16
_MAX_NUMBER_DIGITS = 4


class _ParseError(Exception):
    pass


class _Parser:
    """expr := term (("+"|"-") term)* ; term := factor ("*" factor)* ; factor := int | "(" expr ")".

    Integers only (no unary minus, no division), so values are exact Python ints; the length and
    depth bounds keep every value and the recursion small.
    """

    def __init__(self, text: str):
        self.text, self.pos, self.numbers = text, 0, []

    def parse(self) -> int:
        value = self._expr(0)
        if self.pos != len(self.text):
            raise _ParseError(f"trailing text at {self.pos}")
        return value

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expr(self, depth: int) -> int:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> int:
        value = self._factor(depth)
        while self._peek() == "*":
            self.pos += 1
            value *= self._factor(depth)
        return value

    def _factor(self, depth: int) -> int:
        if depth > _MAX_DEPTH:
            raise _ParseError("too deeply nested")
        c = self._peek()
        if c == "(":
            self.pos += 1
            value = self._expr(depth + 1)
            if self._peek() != ")":
                raise _ParseError("missing )")
            self.pos += 1
            return value
        start = self.pos
        while self._peek().isdigit() and self._peek() in "0123456789":
            self.pos += 1
        digits = self.text[start : self.pos]
        if not digits or len(digits) > _MAX_NUMBER_DIGITS or (len(digits) > 1 and digits[0] == "0"):
            raise _ParseError(f"bad number at {start}")
        self.numbers.append(int(digits))
        return int(digits)


def parse_expression(text: str) -> tuple[int, list[int]] | None:
    """(value, numbers used in order) of an expression, or None if it does not parse."""
    if not isinstance(text, str) or not text or len(text) > _MAX_EXPR_CHARS:
        return None
    parser = _Parser(text)
    try:
        return parser.parse(), parser.numbers
    except _ParseError:
        return None


class CountdownTask(Task):
    """Reach ``target`` from ``num_numbers`` numbers in [1, max_number] (the difficulty knobs).

    The defaults (3 numbers up to 20, targets up to 99) leave about 10,000 distinct problems, of
    which the splits take 7,000. Why the base stays mediocre: finding an expression is a search
    that a small decoder cannot do in one left-to-right pass, so it learns heuristics from 6,000
    train problems. Its held-out greedy accuracy levels off within 4,800 warm-start steps, while
    accuracy on train problems goes on rising (longer training memorises, it does not generalise;
    experiments/warmstart_curve.py, figures in docs/getting_started.md), hence
    ``warm_start_steps = 4800``. A 2,400-step warm start had not levelled off.

    Knobs: num_numbers, max_number, max_target, wrong_fraction (share of demonstrations with one
    operator changed), partial_weight, closeness_scale, format_weight, num_train, num_test, seed.
    """

    name = "countdown"
    score_keys = ("reward", "correct", "format", "partial", "uses_numbers")
    record_fields = ("numbers", "target", "solution")
    warm_start_steps = 4800

    def __init__(
        self,
        *,
        num_numbers: int = 3,
        max_number: int = 20,
        max_target: int = 99,
        wrong_fraction: float = 0.0,
        partial_weight: float = 0.5,
        closeness_scale: float = 10.0,
        format_weight: float = 0.1,
        num_train: int = 6000,
        num_test: int = 1000,
        seed: int = 0,
    ):
        if not 2 <= num_numbers <= 6:
            raise ValueError(f"num_numbers must be in [2, 6], got {num_numbers}.")
        if not 2 <= max_number <= 99:
            raise ValueError(f"max_number must be in [2, 99], got {max_number}.")
        if max_target < 1 or closeness_scale <= 0:
            raise ValueError(
                f"max_target must be >= 1 and closeness_scale > 0, got {max_target}, "
                f"{closeness_scale}."
            )
        if not 0.0 <= wrong_fraction <= 1.0:
            raise ValueError(f"wrong_fraction must lie in [0, 1], got {wrong_fraction}.")
        check_split_sizes(num_train, num_test)
        self.config = dict(
            num_numbers=num_numbers,
            max_number=max_number,
            max_target=max_target,
            wrong_fraction=wrong_fraction,
            partial_weight=partial_weight,
            closeness_scale=closeness_scale,
            format_weight=format_weight,
            num_train=num_train,
            num_test=num_test,
            seed=seed,
        )
        self.num_numbers, self.max_number, self.max_target = num_numbers, max_number, max_target
        self.wrong_fraction, self.partial_weight = wrong_fraction, partial_weight
        self.closeness_scale, self.format_weight = closeness_scale, format_weight
        self.tokenizer = CharTokenizer(_ALPHABET)
        nd, td = len(str(max_number)), len(str(max_target))
        # Exact lengths: bos, the numbers with commas, ":", target, "=".
        self.max_prompt_len = 1 + num_numbers * (nd + 1) + td + 1
        # Demonstrations are flat (numbers and operators, plus eos); 4 spare tokens for the
        # parentheses a policy may learn to use.
        self.max_response_len = num_numbers * (nd + 1) - 1 + 4 + 1

    # ---- data ---------------------------------------------------------------------------------
    def tfds_features(self) -> dict[str, Any]:
        import tensorflow_datasets as tfds

        return {
            "prompt": tfds.features.Text(),
            "numbers": tfds.features.Tensor(shape=(self.num_numbers,), dtype=np.int64),
            "target": tfds.features.Scalar(np.int64),
            "solution": tfds.features.Text(),
        }

    def _problems(self, split: str, n: int, exclude: set) -> list[dict[str, Any]]:
        rng, seen, out = split_seed(self.config["seed"], split), set(exclude), []
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 200 * n + 10000:
                raise ValueError(
                    f"could not find {n} distinct countdown problems for split {split!r}; lower "
                    "num_train/num_test or raise num_numbers/max_number/max_target."
                )
            nums = [int(x) for x in rng.integers(1, self.max_number + 1, self.num_numbers)]
            ops = [str(o) for o in rng.choice(list(_OPS), self.num_numbers - 1)]
            expr = str(nums[0]) + "".join(o + str(x) for o, x in zip(ops, nums[1:], strict=True))
            value = parse_expression(expr)[0]
            key = (tuple(sorted(nums)), value)
            if not 0 <= value <= self.max_target or key in seen:
                continue
            seen.add(key)
            out.append(
                dict(
                    prompt=self.prompt_text(dict(numbers=sorted(nums), target=value)),
                    numbers=np.asarray(sorted(nums), np.int64),
                    target=value,
                    solution=expr,
                )
            )
        return out

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        """The question from the numbers (sorted) and the target (what batches carry,
        record_fields): the environments render it as the user's message."""
        numbers = ",".join(str(int(x)) for x in record["numbers"])
        return f"{numbers}:{int(record['target'])}="

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        check_split(split)
        test = self._problems("test", self.config["num_test"], set())
        if split == "test":
            return test
        keys = {(tuple(int(x) for x in r["numbers"]), r["target"]) for r in test}
        return self._problems("train", self.config["num_train"], keys)

    # ---- warm start ---------------------------------------------------------------------------
    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        expr = as_str(record["solution"])
        if rng.random() < self.wrong_fraction:
            positions = [i for i, c in enumerate(expr) if c in _OPS]
            i = int(rng.choice(positions))
            new_op = str(rng.choice([o for o in _OPS if o != expr[i]]))
            expr = expr[:i] + new_op + expr[i + 1 :]
        return expr

    # ---- verifier -----------------------------------------------------------------------------
    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        parsed = parse_expression(text) if terminated else None
        if parsed is None:
            return Verdict(
                reward=0.0, correct=0.0, format=0.0, extras={"partial": 0.0, "uses_numbers": 0.0}
            )
        value, used = parsed
        target = int(record["target"])
        uses = float(sorted(used) == sorted(int(x) for x in np.ravel(record["numbers"])))
        correct = float(uses == 1.0 and value == target)
        if correct:
            partial = 1.0
        elif uses:
            partial = self.partial_weight * max(
                0.0, 1.0 - abs(value - target) / self.closeness_scale
            )
        else:
            partial = 0.0
        return Verdict(
            reward=partial + self.format_weight,
            correct=correct,
            format=1.0,
            extras={"partial": partial, "uses_numbers": uses},
        )
