"""Multi-digit addition where the response may work the sum out column by column.

Operands and answers are written with a fixed width (``max_digits`` digits per operand,
``max_digits + 1`` for the answer, zero-padded), so every digit sits at a fixed position. Prompt
and the two response formats with the default max_digits=3 (``<eos>`` ends every response):

    prompt  "492+438="
    worked  "W28=10,93=13,44=09A0930"   scratchpad, least significant column first: digit of a,
                                        digit of b, "=", the column sum plus the incoming carry
                                        as two digits; then "A" and the answer
    direct  "A0930"                     the answer alone

Why this design (the default task must make response length matter, for LUSPO vs GSPO): writing
the answer most-significant digit first needs every carry before the first digit is written, which
a small model does not learn to do in one pass; the scratchpad goes least-significant first and
writes each carry down, so every step is a local lookup. A worked answer is therefore far more
often right, and four times longer (24 vs 6 tokens).

Why the base policy is mediocre by construction: the warm-start demonstrations are mostly direct
answers written by a demonstrator that *ignores carries* (carry-less addition: right only when no
column carries, "A0820" above), and only ``worked_fraction`` of them (default 40 %) are worked and
correct. Trained on that mix, the policy reproduces it: its first token is more often "A" than "W",
so greedy decoding answers directly and is right only on carry-free problems, while at temperature
1 part of the samples are worked and mostly right (the measured shares are in
docs/getting_started.md, "How good the warm start is"). Longer supervised training cannot fix that
(it only fits the mix better); RL can, by moving probability to "W". The fixed width makes both the
carry-less direct answer and the scratchpad position lookups, which a small model learns within
the warm start's CPU budget. Operand lengths are drawn uniformly from [min_digits, max_digits] and
each operand uniformly among numbers of that length.

Reward: correct (1/0: the digits after the last "A" have the value of the sum, and the response
ended with eos) + format_weight * format (1/0: the whole response matches one of the two grammars
with the fixed widths). Extra part "worked" (1 if the response starts with "W") lets the trainer
track the format shift.

An irrelevant feature, for Dr. GRPO's std-normalisation claim (off by default): with
``marker_fraction`` > 0 a response may end with the marker "+" before eos ("A0930+"), which
changes neither its correctness nor its format, and that share of the demonstrations carry it, so
the base policy writes it sometimes; ``bonus`` is added to the reward when it does. Extra part
"bonus" (1 if the marker is there) tracks it. A tiny bonus makes groups whose responses differ
only in the marker: their reward std is tiny, and a std-normalised advantage blows it up.

Dimension legend: none beyond task.py (records are scalars).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.task import Task, Verdict, check_split_sizes, disjoint_problems
from gspo_jax.tasks.tokenizer import CharTokenizer

_ALPHABET = "0123456789+=,AW"
MARKER = "+"  # the irrelevant feature's character (marker_fraction > 0): already in the alphabet
_MAX_ANSWER_CHARS = 12  # longer digit strings are never a correct answer (and never int()-ed)


def _digits_lsd(x: int, n: int) -> list[int]:
    """The n least significant digits of x, least significant first (zero-padded)."""
    return [(x // 10**i) % 10 for i in range(n)]


def worked_text(a: int, b: int, width: int) -> str:
    """The correct scratchpad response for a + b with operands of ``width`` digits."""
    carry, cols = 0, []
    for da, db in zip(_digits_lsd(a, width), _digits_lsd(b, width), strict=True):
        s = da + db + carry
        cols.append(f"{da}{db}={s:02d}")
        carry = s // 10
    return "W" + ",".join(cols) + f"A{a + b:0{width + 1}d}"


def carryless_sum(a: int, b: int) -> int:
    """Digit-wise sum modulo 10: what a demonstrator that forgets every carry writes."""
    n = max(len(str(a)), len(str(b)))
    return sum(
        ((da + db) % 10) * 10**i
        for i, (da, db) in enumerate(zip(_digits_lsd(a, n), _digits_lsd(b, n), strict=True))
    )


def answer_is(text: str, target: int, terminated: bool) -> float:
    """1.0 when the response ended (eos) and what follows its last "A" is a digit string with
    ``target``'s value, else 0.0. Leading zeros are allowed (a fixed width is a format matter, not
    a correctness one); the digit string is bounded in length before int() sees it."""
    answer = text[text.rfind("A") + 1 :] if "A" in text else ""
    return float(
        terminated
        and 0 < len(answer) <= _MAX_ANSWER_CHARS
        and answer.isascii()
        and answer.isdigit()
        and int(answer) == target
    )


class ArithmeticTask(Task):
    """Addition of two operands with ``min_digits``..``max_digits`` digits (the difficulty knob).

    Knobs (all part of ``config``): min_digits, max_digits, worked_fraction (share of worked
    demonstrations), direct_style ("carryless": direct demonstrations forget carries; "correct":
    they are right), worked_error_rate (share of worked demonstrations with one wrong column),
    format_weight, num_train, num_test, seed; and, when set, marker_fraction and bonus (the
    irrelevant feature above).
    """

    name = "arith"
    formats = ("worked", "direct")
    score_keys = ("reward", "correct", "format", "worked")
    record_fields = ("a", "b", "target")
    # The scratchpad format is learned last, and greedy accuracy (carry-less direct answers) is
    # fixed by the demonstration mix: 2400 steps is where the worked format is learned
    # (experiments/warmstart_report.py; the figures are in docs/getting_started.md).
    warm_start_steps = 2400

    def __init__(
        self,
        *,
        min_digits: int = 1,
        max_digits: int = 3,
        worked_fraction: float = 0.4,
        direct_style: str = "carryless",
        worked_error_rate: float = 0.0,
        format_weight: float = 0.1,
        num_train: int = 20000,
        num_test: int = 1000,
        seed: int = 0,
        marker_fraction: float = 0.0,
        bonus: float = 0.0,
    ):
        if not 1 <= min_digits <= max_digits <= 9:
            raise ValueError(
                f"need 1 <= min_digits <= max_digits <= 9, got {min_digits}, {max_digits}."
            )
        if not 0.0 <= worked_fraction <= 1.0 or not 0.0 <= worked_error_rate <= 1.0:
            raise ValueError(
                f"worked_fraction and worked_error_rate must lie in [0, 1], got "
                f"{worked_fraction}, {worked_error_rate}."
            )
        if not 0.0 <= marker_fraction < 1.0 or not bonus >= 0.0:
            raise ValueError(
                f"marker_fraction must lie in [0, 1) and bonus be >= 0, got {marker_fraction}, "
                f"{bonus}."
            )
        if bonus > 0 and marker_fraction == 0:
            raise ValueError(
                f"bonus={bonus} pays for the marker, which only marker_fraction > 0 allows: set "
                "marker_fraction (e.g. 0.3, the share of demonstrations with it) or bonus=0."
            )
        if direct_style not in ("carryless", "correct"):
            raise ValueError(
                f"direct_style must be 'carryless' or 'correct', got {direct_style!r}."
            )
        check_split_sizes(num_train, num_test)
        space = sum(9 * 10 ** (d - 1) + (d == 1) for d in range(min_digits, max_digits + 1)) ** 2
        if num_train + num_test > 0.5 * space:
            raise ValueError(
                f"{num_train + num_test} problems requested but only {space} exist with "
                f"{min_digits}-{max_digits} digits; lower num_train/num_test or raise max_digits."
            )
        self.config = dict(
            min_digits=min_digits,
            max_digits=max_digits,
            worked_fraction=worked_fraction,
            direct_style=direct_style,
            worked_error_rate=worked_error_rate,
            format_weight=format_weight,
            num_train=num_train,
            num_test=num_test,
            seed=seed,
        )
        if marker_fraction > 0:  # only when set: the config names the data and warm-start caches
            self.config.update(marker_fraction=marker_fraction, bonus=bonus)
            self.score_keys = (*self.score_keys, "bonus")
        self.marker_fraction, self.bonus = marker_fraction, bonus
        self.min_digits, self.max_digits = min_digits, max_digits
        self.worked_fraction, self.direct_style = worked_fraction, direct_style
        self.worked_error_rate, self.format_weight = worked_error_rate, format_weight
        self.tokenizer = CharTokenizer(_ALPHABET)
        self.width = max_digits
        # Exact lengths (no rounding): every padded slot costs compute in the warm start and RL.
        # bos + a + "+" + b + "=".
        self.max_prompt_len = 2 * max_digits + 3
        # "W" + columns ("dd=dd" and commas) + "A" + answer (max_digits + 1) + eos.
        self.max_response_len = 1 + 6 * max_digits - 1 + 1 + (max_digits + 1) + 1
        self.max_response_len += int(marker_fraction > 0)  # the marker
        w = max_digits
        self._worked_re = re.compile(
            rf"W[0-9]{{2}}=[0-9]{{2}}(?:,[0-9]{{2}}=[0-9]{{2}}){{{w - 1}}}A[0-9]{{{w + 1}}}"
        )
        self._direct_re = re.compile(rf"A[0-9]{{{w + 1}}}")

    # ---- data ---------------------------------------------------------------------------------
    def tfds_features(self) -> dict[str, Any]:
        import tensorflow_datasets as tfds

        return {
            "prompt": tfds.features.Text(),
            "a": tfds.features.Scalar(np.int64),
            "b": tfds.features.Scalar(np.int64),
            "target": tfds.features.Scalar(np.int64),
        }

    def _sample_operand(self, rng: np.random.Generator) -> int:
        d = int(rng.integers(self.min_digits, self.max_digits + 1))
        return int(rng.integers(0 if d == 1 else 10 ** (d - 1), 10**d))

    def generate_split(self, split: str) -> list[dict[str, Any]]:
        pairs = disjoint_problems(
            lambda rng: (self._sample_operand(rng), self._sample_operand(rng)),
            self.config["seed"],
            split,
            self.config,
        )
        return [
            dict(prompt=self.prompt_text(dict(a=a, b=b)), a=a, b=b, target=a + b) for a, b in pairs
        ]

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        """The question from the operands (what batches carry, record_fields): the environments
        render it as the user's message."""
        w = self.width
        return f"{int(record['a']):0{w}d}+{int(record['b']):0{w}d}="

    # ---- warm start ---------------------------------------------------------------------------
    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        a, b = int(record["a"]), int(record["b"])
        if rng.random() < self.worked_fraction:
            text = worked_text(a, b, self.width)
            if rng.random() < self.worked_error_rate:  # one slipped digit: a wrong worked answer
                wrong = a + b + int(rng.choice([-1, 1])) * 10 ** int(rng.integers(len(str(a + b))))
                text = text[: text.rindex("A")] + f"A{max(wrong, 0):0{self.width + 1}d}"
            return self._with_marker(text, rng)
        answer = carryless_sum(a, b) if self.direct_style == "carryless" else a + b
        return self._with_marker(f"A{answer:0{self.width + 1}d}", rng)

    def _with_marker(self, text: str, rng: np.random.Generator) -> str:
        """text, ending with the marker in marker_fraction of the demonstrations (none if 0)."""
        if self.marker_fraction > 0 and rng.random() < self.marker_fraction:
            return text + MARKER
        return text

    def difficulty(self, record: Mapping[str, Any]) -> str:
        """The number of digits of the longer operand (the knob the problems are drawn by)."""
        digits = len(str(max(int(record["a"]), int(record["b"]))))
        return f"{digits} digit{'s' * (digits > 1)}"

    # ---- verifier -----------------------------------------------------------------------------
    def response_format(self, text: str) -> str:
        return "worked" if text.startswith("W") else "direct"

    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        marker = float(self.marker_fraction > 0 and terminated and text.endswith(MARKER))
        if marker:  # irrelevant: judged without it (a truncated response has no marker)
            text = text[: -len(MARKER)]
        worked = float(text.startswith("W"))
        grammar = self._worked_re if worked else self._direct_re
        well_formed = float(terminated and grammar.fullmatch(text) is not None)
        correct = answer_is(text, int(record["target"]), terminated)
        return Verdict(
            reward=correct + self.format_weight * well_formed + self.bonus * marker,
            correct=correct,
            format=well_formed,
            extras={"worked": worked, **({"bonus": marker} if self.marker_fraction > 0 else {})},
        )
