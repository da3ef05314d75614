"""Where a chainsum policy's greedy answers first go wrong (issue 52, docs/testbed.md).

    python experiments/testbed_errors.py --config RUN_DIR [--step N] [--problems 128]
    python experiments/testbed_errors.py --config configs/testbed.py:draw=902

With a run folder, ``--step`` picks its checkpoint (none: the policy the run started from, its
warm start, under the run's own config.json); with a config file, its base. Each greedy response
to the first ``--problems`` held-out problems is compared with the worked answer entry by entry,
and each wrong one is counted at its first wrong column entry: by column (least significant
first, then the answer) and by step. Why: a base whose errors sit in one column of every step
has one rule to fix (RL fixes it in a jump), one whose errors spread over columns and steps
makes RL climb step by step; accuracy alone does not tell them apart.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gspo_jax import config as config_lib  # noqa: E402
from gspo_jax import data, rollout  # noqa: E402
from gspo_jax.rl import policies  # noqa: E402
from gspo_jax.tasks import chain_sum  # noqa: E402


def first_wrong_entry(want: str, got: str) -> tuple[int, int] | None:
    """(step, column) of the first column entry where ``got`` differs from the worked answer
    ``want`` (column = W for the answer after "A", and for a response that stops early or runs
    on); None when the response is the worked answer."""
    if got == want:
        return None
    body_w, _, ans_w = want.partition("A")
    body_g, _, ans_g = got.partition("A")
    steps_w, steps_g = body_w.split(";"), body_g.split(";")
    width = len(steps_w[0].split(","))
    for j, step_w in enumerate(steps_w):
        step_g = steps_g[j] if j < len(steps_g) else ""
        cols_w, cols_g = step_w.split(","), step_g.split(",")
        for c, col in enumerate(cols_w):
            if c >= len(cols_g) or cols_g[c] != col:
                return j, c
    return len(steps_w) - 1, width  # every step right: the answer (or what follows it) is wrong


def error_table(task, tokens: np.ndarray, mask: np.ndarray, records: list[dict]) -> dict:
    """Counts of the first wrong entry by column and by step over ``records``' responses
    ``tokens`` [n, T] (``mask`` [n, T])."""
    by_col, by_step, right = collections.Counter(), collections.Counter(), 0
    for p, rec in enumerate(records):
        k = int(rec["num_terms"])
        ops = [int(x) for x in rec["operands"][:k]]
        want = chain_sum.worked_text(ops, task.width, task.tagged)
        got = task.tokenizer.decode(tokens[p][mask[p].astype(bool)])
        where = first_wrong_entry(want, got.rstrip())
        if where is None:
            right += 1
            continue
        by_step[where[0]] += 1
        by_col[where[1]] += 1
    return dict(
        problems=len(records),
        right=right,
        first_wrong_by_column={int(c): n for c, n in sorted(by_col.items())},
        first_wrong_by_step={int(s): n for s, n in sorted(by_step.items())},
    )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a run folder or a config file[:args]")
    ap.add_argument("--step", type=int, default=None, help="a run folder's checkpoint")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--out", default=None, help="write the table as JSON")
    a = ap.parse_args(argv)
    if a.step is not None:
        run, model, _ = policies.run_policy(a.config, a.step)
    else:
        is_run = policies.is_run_dir(a.config)
        cfg = (
            policies.read_run_config(a.config) if is_run else config_lib.load_config_file(a.config)
        )
        run, model = policies.config_base_policy(cfg)
    task = run.task
    if task.name != "chainsum":
        raise SystemExit(f"{a.config}: task {task.name!r}; this table reads chainsum's steps.")
    batches = data.make_eval_batches(task, split="test", num_problems=a.problems, batch_size=64)
    tokens, masks, records = [], [], []
    for batch, n in batches:
        out = rollout.generate(
            model,
            batch["prompt"],
            batch["prompt_length"],
            num_samples=1,
            rng=jax.random.key(0),
            temperature=0.0,
            max_new_tokens=task.max_response_len,
            eos_id=task.tokenizer.eos_id,
            pad_id=task.tokenizer.pad_id,
        )
        tokens.append(np.asarray(out.tokens)[:n])
        masks.append(np.asarray(out.mask)[:n])
        records += [task.record_from_batch(batch, p) for p in range(n)]
    table = error_table(task, np.concatenate(tokens), np.concatenate(masks), records)
    wrong = table["problems"] - table["right"]
    print(f"{a.config}: {table['right']}/{table['problems']} right (greedy)")
    print(f"first wrong entry of the {wrong} wrong, by column (0 = least significant; ", end="")
    print(f"{task.width} = the answer):", table["first_wrong_by_column"])
    print("by step (0 = the first operand added):", table["first_wrong_by_step"])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(config=a.config, step=a.step, **table), f, indent=1)
    return table


if __name__ == "__main__":
    main()
