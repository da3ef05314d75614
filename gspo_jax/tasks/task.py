"""The Task interface: problems, prompts, demonstrations and a defensive verifier.

A task is everything RL needs to know about a problem family besides the model: how to generate
problems (deterministically by seed, with disjoint train and held-out splits), how to render a
prompt, what a demonstration response looks like (for the supervised warm start) and how to score
any response string. Data flows as *records* (one problem: a dict of Python/numpy scalars and small
arrays, stored by the TFDS builder) and *batches* (records stacked by data.py, plus the tokenised
prompt).

Dimension legend: P prompts in a batch, G samples per prompt, B = P * G response rows
(group-contiguous: row b answers prompt b // G), Lp padded prompt length, T padded response length.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np

from gspo_jax.tasks.tokenizer import CharTokenizer


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one response; every part is a float in [0, 1] (reward may be
    larger: it adds the format bonus to the correctness part)."""

    reward: float
    correct: float
    format: float
    extras: Mapping[str, float] = dataclasses.field(default_factory=dict)


class Task(abc.ABC):
    """Base class of verifiable tasks.

    Subclasses set ``name``, ``tokenizer``, ``max_prompt_len`` (Lp, includes bos),
    ``max_response_len`` (a T that fits every demonstration, including eos), ``config`` (every
    knob, JSON-serialisable: it names the dataset on disk and keys the warm-start cache) and
    ``score_keys`` (the per-row arrays ``score`` returns).
    """

    name: str
    tokenizer: CharTokenizer
    max_prompt_len: int
    max_response_len: int
    config: dict[str, Any]
    score_keys: tuple[str, ...] = ("reward", "correct", "format")
    # Response formats the task distinguishes (e.g. worked vs direct); empty if only one.
    formats: tuple[str, ...] = ()
    # Record fields batches carry (beside prompt/prompt_length): what verify/demonstration read.
    record_fields: tuple[str, ...] = ()
    # Default warm-start length (warmstart.WarmStartConfig(steps=None)). Tasks set it where the
    # held-out accuracy of the "small" preset's warm start has levelled off; 2400 is a fallback
    # for tasks that have not measured theirs.
    warm_start_steps: int = 2400
    # TFDS catalogue name when the data comes from a real dataset; None for generated tasks. The
    # module that registers its builder (TFDS finds a catalogue builder only once it is imported).
    catalogue_name: str | None = None
    catalogue_module: str | None = None
    # A folder of released split files the data is read from instead (data/files.py); "" if none.
    data_path: str = ""
    # The splits the task's dataset has (what evaluation and the data loader may read); known
    # before any data is generated, so a config naming another split fails at validation.
    splits: tuple[str, ...] = ("train", "test")
    # Knobs of ``config`` that shape only the RL reward: the problems and the supervised warm start
    # are the same whatever they are, so they name neither the dataset nor the warm-start cache
    # entry (``data_config``).
    reward_only_fields: tuple[str, ...] = ()

    @property
    def data_config(self) -> dict[str, Any]:
        """``config`` without the reward-only knobs: what names the dataset on disk and keys the
        warm-start cache."""
        return {k: v for k, v in self.config.items() if k not in self.reward_only_fields}

    # ---- data ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def tfds_features(self) -> dict[str, Any]:
        """Feature spec of one record, as a dict of ``tfds.features`` (must include "prompt")."""

    @abc.abstractmethod
    def generate_split(self, split: str) -> list[dict[str, Any]]:
        """All records of ``split`` ("train" or "test"), deterministic by the task's seed; the
        held-out split shares no problem with the train split."""

    def prompt_text(self, record: Mapping[str, Any]) -> str:
        return as_str(record["prompt"])

    def prompt_ids(self, record: Mapping[str, Any]) -> list[int]:
        """Token ids of the prompt (bos + prompt text), at most max_prompt_len: longer prompts keep
        their end (where the question is asked)."""
        ids = self.tokenizer.encode(self.prompt_text(record), add_bos=True)
        return ids if len(ids) <= self.max_prompt_len else ids[-self.max_prompt_len :]

    # ---- warm start ---------------------------------------------------------------------------
    @abc.abstractmethod
    def demonstration(self, record: Mapping[str, Any], rng: np.random.Generator) -> str:
        """A demonstration response (without eos) for the supervised warm start; may be wrong on
        purpose (the demonstration mix is what makes the base policy mediocre)."""

    # ---- verifier -----------------------------------------------------------------------------
    @abc.abstractmethod
    def verify(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        """Judge one response. Must not raise on any string and must not eval/exec it."""

    def difficulty(self, record: Mapping[str, Any]) -> str:
        """The problem's difficulty level, for figures broken down by difficulty ("" when the
        task has no levels); levels sort by (length, text), so "2 digits" < "10 digits"."""
        del record
        return ""

    def response_format(self, text: str) -> str:
        """Which of ``formats`` a response uses ("" when the task has one format)."""
        del text
        return ""

    def split_response(self, tokens: np.ndarray, mask: np.ndarray) -> tuple[str, bool]:
        """Decode one response row [T]: text before the first eos, and whether an eos was there.

        A row without eos inside its mask was truncated by the length limit; the verifier sees the
        truncated text with terminated=False.
        """
        tokens = np.asarray(tokens)[np.asarray(mask) > 0]
        eos = np.flatnonzero(tokens == self.tokenizer.eos_id)
        if eos.size:
            return self.tokenizer.decode(tokens[: eos[0]]), True
        return self.tokenizer.decode(tokens), False

    def record_from_batch(self, batch: Mapping[str, np.ndarray], p: int) -> dict[str, Any]:
        missing = [k for k in self.record_fields if k not in batch]
        if missing:
            raise ValueError(
                f"batch lacks fields {missing} that the {self.name} verifier needs; pass the batch "
                "from data.make_train_iterator / data.make_eval_batches unchanged."
            )
        return {k: batch[k][p] for k in self.record_fields}

    def score(
        self,
        batch: Mapping[str, np.ndarray],
        responses: np.ndarray,  # [B, T] int
        response_mask: np.ndarray,  # [B, T] (1 up to and including eos)
        group_size: int,
    ) -> dict[str, np.ndarray]:
        """Rewards of B = P * group_size responses (row b answers prompt b // group_size).

        Returns ``score_keys`` -> float32 [B]: "reward" (what RL maximises), "correct" (0/1),
        "format" (0/1, well-formed and terminated), plus task-specific parts.
        """
        responses, response_mask = self._check_score_args(
            batch, responses, response_mask, group_size
        )
        out = {k: np.zeros(responses.shape[0], np.float32) for k in self.score_keys}
        records = [self.record_from_batch(batch, p) for p in range(len(batch["prompt"]))]
        for b in range(responses.shape[0]):
            text, terminated = self.split_response(responses[b], response_mask[b])
            verdict = self.verify(records[b // group_size], text, terminated)
            parts = {"reward": verdict.reward, "correct": verdict.correct, "format": verdict.format}
            parts.update(verdict.extras)
            for k in self.score_keys:
                out[k][b] = parts.get(k, 0.0)
        return out

    def _check_score_args(
        self,
        batch: Mapping[str, np.ndarray],
        responses: np.ndarray,
        response_mask: np.ndarray,
        group_size: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """score's arguments as arrays, or a ValueError naming what is wrong with them."""
        responses = np.asarray(responses)
        response_mask = np.asarray(response_mask)
        if responses.ndim != 2 or responses.shape != response_mask.shape:
            raise ValueError(
                f"responses {responses.shape} and response_mask {response_mask.shape} must both "
                "be [B, T]; pass the sampler's tokens and mask."
            )
        num_prompts = len(batch["prompt"])
        if group_size < 1 or responses.shape[0] != num_prompts * group_size:
            raise ValueError(
                f"got {responses.shape[0]} responses for {num_prompts} prompts with group_size="
                f"{group_size}; B must equal P * group_size (group-contiguous rows)."
            )
        return responses, response_mask

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({knobs})"


def check_split(split: str) -> None:
    """Generated tasks have the splits of Task.splits; anything else is a ValueError."""
    if split not in Task.splits:
        raise ValueError(f"unknown split {split!r}; use one of {list(Task.splits)}.")


def check_split_sizes(num_train: int, num_test: int) -> None:
    """A generated task's split sizes, or a ValueError naming them."""
    if num_train < 1 or num_test < 1:
        raise ValueError(
            f"num_train and num_test must be >= 1 (an empty split cannot train), "
            f"got {num_train}, {num_test}."
        )


def disjoint_problems(
    draw: Callable[[np.random.Generator], Hashable], seed: int, split: str, counts: Mapping
) -> list:
    """The distinct problems of ``split`` (counts["num_train"] or counts["num_test"] of them),
    each ``draw(rng)`` from the split's own generator; the train split skips every test problem,
    so the held-out split never depends on the train split's size and shares nothing with it."""
    check_split(split)

    def sample(which: str, exclude: set) -> list:
        rng, seen, out = split_seed(seed, which), set(exclude), []
        while len(out) < counts[f"num_{which}"]:
            key = draw(rng)
            if key not in seen:
                seen.add(key)
                out.append(key)
        return out

    test = sample("test", set())
    return test if split == "test" else sample("train", set(test))


def split_seed(seed: int, split: str) -> np.random.Generator:
    """Independent generator per (seed, split): the held-out split never depends on train size."""
    return np.random.default_rng([seed, {"train": 0, "test": 1}[split]])


def as_str(x: Any) -> str:
    """A record text field (TFDS gives bytes) as str."""
    if isinstance(x, bytes | np.bytes_):
        return x.decode("utf-8", errors="replace")
    return str(x)
