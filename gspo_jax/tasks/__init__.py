"""Verifiable tasks: problem generators, tokenizers, prompt formats, demonstrations, verifiers.

    task = tasks.get_task("arith", max_digits=5)      # default task (worked vs direct answers)
    task = tasks.get_task("countdown", num_numbers=4)  # partial-credit task
    task = tasks.get_task("chainsum", max_terms=10)    # the testbed: long worked answers
    task = tasks.get_task("products", digits=8)        # where the Python tool matters (envs/)
    task = tasks.get_task("gsm8k")                     # TFDS catalogue data, read from data_dir
    task = tasks.get_task("gsm8k", data_path=folder)   # train.jsonl/test.jsonl or HF parquet
    task = tasks.get_task("math", data_path=folder)    # MATH / MATH-500 records, boxed answers
    task = tasks.get_task("gsm8k", tokenizer_path=ckpt)  # a checkpoint's tokenizer + chat template

Each task has ``tokenizer`` (encode/decode/vocab_size/pad_id/eos_id), ``max_prompt_len`` (Lp),
``max_response_len`` (T that fits every demonstration), ``config`` (all knobs) and
``score(batch, responses [B, T], response_mask [B, T], group_size) -> dict of float32 [B]``.
Tokenizers: CharTokenizer (the generated tasks) or HFTokenizer (a released model's tokenizer.json
and chat template, hf_tokenizer.py). Math answers (extraction, equivalence by math-verify):
math_answers.py.
"""

from __future__ import annotations

import inspect

from gspo_jax.tasks.arithmetic import ArithmeticTask
from gspo_jax.tasks.chain_sum import ChainSumTask
from gspo_jax.tasks.countdown import CountdownTask, parse_expression
from gspo_jax.tasks.gsm8k import Gsm8kTask
from gspo_jax.tasks.hf_tokenizer import HFTokenizer
from gspo_jax.tasks.math_problems import MathTask
from gspo_jax.tasks.products import ProductsTask
from gspo_jax.tasks.task import Task, Verdict
from gspo_jax.tasks.tokenizer import CharTokenizer

TASKS = {
    "arith": ArithmeticTask,
    "chainsum": ChainSumTask,
    "countdown": CountdownTask,
    "gsm8k": Gsm8kTask,
    "math": MathTask,
    "products": ProductsTask,
}

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "ChainSumTask",
    "CharTokenizer",
    "CountdownTask",
    "Gsm8kTask",
    "HFTokenizer",
    "MathTask",
    "ProductsTask",
    "Task",
    "Verdict",
    "get_task",
    "parse_expression",
]


def get_task(name: str, **knobs) -> Task:
    """A task by name with keyword knobs; unknown names or knobs raise ValueError naming the
    valid ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {sorted(TASKS)}.")
    cls = TASKS[name]
    valid = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
        raise ValueError(f"unknown knobs {unknown} for task {name!r}; valid knobs: {valid}.")
    return cls(**knobs)
