"""Addition chains worked step by step: the testbed task (docs/testbed.md).

A problem is a sum of ``num_terms`` operands of ``digits`` digits; the number of terms is drawn
per problem from [min_terms, max_terms] (the difficulty knob: each term is one more worked step).
Everything is written with a fixed width W = digits + 1 (zero-padded), which holds any sum of up
to ten operands, so every digit sits at a fixed position. The prompt and the one response format
with digits=3 (``<eos>`` ends every response):

    prompt    "492+438+127+005="
    response  "28=10,93=13,44=09,00=00;07=07,32=05,91=10,00=01;75=12,50=06,00=00,10=01A1062"

Each step adds the next operand to the running sum, column by column, least significant column
first: the column's digit of the running sum, the operand's digit, "=", and the column sum plus
the incoming carry as two digits (the carry is the first of them). Steps are separated by ";" and
the response ends with "A" and the total (W digits). Its length is 6 W (num_terms - 1) + W + 1
tokens with eos: 77 to 221 for the default 4-10 terms of 3 digits, a uniform spread of lengths.

Why this design (issue 52): the round-2 testbed ended at its ceiling because the base policy had a
second, better format to switch to (arith's direct vs worked answers). Here there is one format,
and every step of it is a local lookup (a digit of the previous step a fixed 6 W positions back,
a digit of the prompt, the carry of the column before), so a small decoder can learn it, while a
warm start stopped early (configs/testbed.py: a stopping rule with a ceiling on the held-out
accuracy) slips now and then. A problem is right only if every one of its 4 W (num_terms - 1)
column entries is, so accuracy is a product of per-step accuracies: long problems stay hard
after short ones are solved, and RL has a gradual slope to climb, not a switch to find. Response
length varies with the problem (1:3 between the shortest and the longest), so sequence-level and
token-level objectives weigh responses differently.

Reward: correct (1/0: the digits after the last "A" have the value of the total, and the response
ended with eos) + format_weight * format (1/0: the whole response is num_terms - 1 well-formed
steps of W columns each, then "A" and W digits) + step_credit * the share of the W (num_terms - 1)
column entries written as the worked answer writes them (0 by default). Correctness is the
answer's value alone, and a wrong value is never right: the step credit only ranks wrong
responses by how far they got, a denser signal for RL where every sample of a group is wrong (at
most step_credit + format_weight < 1 for a wrong answer, the knob's bound).

Tagged (``tagged=True``): each operand carries its letter in the prompt and each step starts
with the letter of the operand it adds ("a492+b438+c127+d005=" -> "b28=10,...;c07=07,...;d75=
12,...A1062"). Untagged, the operand's digit an entry copies sits in the prompt at a place that
depends on the step's index, which the model must count; the pilot found accuracy falling off a
cliff with the number of terms (docs/testbed.md). Tagged, the step's letter follows the letter a
fixed 6 W + 1 positions back, and the operand is found by its letter's content: every lookup is
local or by content, whatever the step. One token more per step and per operand.

Dimension legend: none beyond task.py (records are scalars and a [max_terms] operand array).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.arithmetic import answer_is
from gspo_jax.tasks.task import Task, Verdict, check_split_sizes, disjoint_problems
from gspo_jax.tasks.tokenizer import CharTokenizer

_ALPHABET = "0123456789+=,;A"
_TAGS = "abcdefghij"  # the operands' letters (tagged): one per operand, _MAX_TERMS of them
_MAX_TERMS = 10  # W = digits + 1 holds a sum of at most ten operands of `digits` digits


def _digits_lsd(x: int, n: int) -> list[int]:
    """The n least significant digits of x, least significant first (zero-padded)."""
    return [(x // 10**i) % 10 for i in range(n)]


def worked_steps(operands: list[int], width: int, tagged: bool = False) -> list[str]:
    """The correct worked steps of operands[0] + operands[1] + ..., one string per addition
    (tagged: each starting with its operand's letter)."""
    total, steps = operands[0], []
    for j, x in enumerate(operands[1:], start=1):
        carry, cols = 0, []
        for da, db in zip(_digits_lsd(total, width), _digits_lsd(x, width), strict=True):
            s = da + db + carry
            cols.append(f"{da}{db}={s:02d}")
            carry = s // 10
        steps.append(_TAGS[j] * tagged + ",".join(cols))
        total += x
    return steps


def worked_text(operands: list[int], width: int, tagged: bool = False) -> str:
    """The correct response (without eos) for the sum of ``operands`` at ``width`` digits."""
    return ";".join(worked_steps(operands, width, tagged)) + f"A{sum(operands):0{width}d}"


def response_length(num_terms: int, digits: int, tagged: bool = False) -> int:
    """Tokens of the worked response to a num_terms-operand problem, eos included."""
    width = digits + 1
    return (6 * width + tagged) * (num_terms - 1) + width + 1


class ChainSumTask(Task):
    """Sums of ``min_terms``..``max_terms`` operands of ``digits`` digits, worked step by step.

    Knobs (all part of ``config``): min_terms, max_terms (the difficulty knob: steps per
    problem), digits (operand digits; the width of every column entry is digits + 1),
    format_weight, step_credit (the reward's credit for correct column entries), tagged (the
    operands' letters in the prompt and the steps, module docstring), num_train, num_test, seed.
    """

    reward_only_fields = ("step_credit",)

    name = "chainsum"
    record_fields = ("operands", "num_terms", "target")

    def __init__(
        self,
        *,
        min_terms: int = 4,
        max_terms: int = 10,
        digits: int = 3,
        format_weight: float = 0.1,
        step_credit: float = 0.0,
        tagged: bool = False,
        num_train: int = 20000,
        num_test: int = 1000,
        seed: int = 0,
    ):
        if not 2 <= min_terms <= max_terms <= _MAX_TERMS:
            raise ValueError(
                f"need 2 <= min_terms <= max_terms <= {_MAX_TERMS} (the width digits + 1 holds "
                f"at most {_MAX_TERMS} operands), got {min_terms}, {max_terms}."
            )
        if not 1 <= digits <= 6:
            raise ValueError(f"digits must lie in [1, 6], got {digits}.")
        if not 0.0 <= step_credit < 1.0 - format_weight:
            raise ValueError(
                f"step_credit must lie in [0, 1 - format_weight) = [0, {1.0 - format_weight:g}) so "
                f"that no wrong answer earns what a right one does, got {step_credit}."
            )
        check_split_sizes(num_train, num_test)
        space = (10**digits) ** min_terms
        if num_train + num_test > 0.5 * space:
            raise ValueError(
                f"{num_train + num_test} problems requested but only {space} exist with "
                f"{min_terms} operands of {digits} digits; lower num_train/num_test or raise "
                "digits or min_terms."
            )
        self.config = dict(
            min_terms=min_terms,
            max_terms=max_terms,
            digits=digits,
            format_weight=format_weight,
            step_credit=step_credit,
            num_train=num_train,
            num_test=num_test,
            seed=seed,
        )
        if tagged:  # only when set: the untagged task's datasets and warm starts keep their keys
            self.config["tagged"] = True
        self.tagged = tagged
        self.min_terms, self.max_terms, self.digits = min_terms, max_terms, digits
        self.format_weight, self.step_credit = format_weight, step_credit
        self.width = digits + 1
        self.tokenizer = CharTokenizer(_ALPHABET + _TAGS * tagged)
        # bos + max_terms operands of `digits` digits (tagged: and a letter), each followed by "+"
        # (the last by "=").
        self.max_prompt_len = 1 + max_terms * (digits + 1 + tagged)
        self.max_response_len = response_length(max_terms, digits, tagged)
        w = self.width
        col = r"[0-9]{2}=[0-9]{2}"
        self._step_re = rf"{col}(?:,{col}){{{w - 1}}}"
        self._answer_re = rf"A[0-9]{{{w}}}"

    # ---- data ---------------------------------------------------------------------------------
    def tfds_features(self) -> dict[str, Any]:
        import tensorflow_datasets as tfds

        return {
            "prompt": tfds.features.Text(),
            "operands": tfds.features.Tensor(shape=(self.max_terms,), dtype=np.int64),
            "num_terms": tfds.features.Scalar(np.int64),
            "target": tfds.features.Scalar(np.int64),
        }

    def _draw(self, rng: np.random.Generator) -> tuple[int, ...]:
        k = int(rng.integers(self.min_terms, self.max_terms + 1))
        return tuple(int(x) for x in rng.integers(0, 10**self.digits, size=k))

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        """The question from the operands (what batches carry, record_fields; zero after
        num_terms): the environments render it as the user's message."""
        ops = [int(x) for x in record["operands"][: int(record["num_terms"])]]
        tags = _TAGS if self.tagged else [""] * len(ops)
        return "+".join(f"{t}{x:0{self.digits}d}" for t, x in zip(tags, ops, strict=False)) + "="

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        problems = disjoint_problems(self._draw, self.config["seed"], split, self.config)
        return [
            dict(
                prompt=self.prompt_text(dict(operands=ops, num_terms=len(ops))),
                # [max_terms], zero after num_terms: a fixed shape for TFDS and the batches
                operands=np.array(list(ops) + [0] * (self.max_terms - len(ops)), np.int64),
                num_terms=len(ops),
                target=sum(ops),
            )
            for ops in problems
        ]

    def difficulty(self, record: Mapping[str, Any]) -> str:
        """The number of terms (the knob the problems are drawn by; a response's length)."""
        return f"{int(record['num_terms']):02d} terms"

    # ---- warm start ---------------------------------------------------------------------------
    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        """The correct worked response: the base is mediocre by how far it was trained
        (configs/testbed.py stops it early), never by wrong demonstrations."""
        del rng
        k = int(record["num_terms"])
        operands = [int(x) for x in np.asarray(record["operands"])[:k]]
        return worked_text(operands, self.width, self.tagged)

    # ---- verifier -----------------------------------------------------------------------------
    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        k = int(record["num_terms"])
        if self.tagged:  # each step led by its own operand's letter
            grammar = ";".join(_TAGS[j] + self._step_re for j in range(1, k)) + self._answer_re
        else:
            grammar = rf"{self._step_re}(?:;{self._step_re}){{{k - 2}}}{self._answer_re}"
        well_formed = float(terminated and re.fullmatch(grammar, text) is not None)
        # A wrong value is never right: the answer's value alone decides (arithmetic.answer_is).
        correct = answer_is(text, int(record["target"]), terminated)
        reward = correct + self.format_weight * well_formed
        if self.step_credit:
            reward += self.step_credit * self.entries_right(record, text)
        return Verdict(
            reward=reward,
            correct=correct,
            format=well_formed,
        )

    def entries_right(self, record: Mapping[str, Any], text: str) -> float:
        """The share of the problem's W (num_terms - 1) column entries that the response writes as
        the worked answer does, entry by entry in order (step i's column j against step i's
        column j; a missing or extra entry earns nothing)."""
        k = int(record["num_terms"])
        want = [
            step.split(",")
            for step in worked_steps(
                [int(x) for x in np.asarray(record["operands"])[:k]], self.width, self.tagged
            )
        ]
        got = [step.split(",") for step in text.split("A", 1)[0].split(";")]
        if self.tagged:  # the entries alone: a step's letter is the format's, not an entry
            want, got = ([[s[0].lstrip(_TAGS), *s[1:]] for s in steps] for steps in (want, got))
        # zip stops at the shorter list: missing entries earn nothing, extra ones are ignored
        right = sum(
            a == b
            for want_step, got_step in zip(want, got, strict=False)
            for a, b in zip(want_step, got_step, strict=False)
        )
        return right / (self.width * (k - 1))
