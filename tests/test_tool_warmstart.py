"""The tool task's warm start (rl/warmstart_demos.py): a share of the demonstrations are tool
episodes played with the real sandboxed tool, the loss on the policy's tokens only (the tool's
response and the prompt masked out); the share keys the cache only when set, so every one-turn
warm start keeps its cache key."""

from __future__ import annotations

import numpy as np
import pytest
from test_sandbox import needs_sandbox

from gspo_jax import models
from gspo_jax.rl import warmstart
from gspo_jax.tasks import products

TASK = products.ProductsTask(digits=3, num_train=64, num_test=16)


@needs_sandbox
def test_a_tool_demonstration_is_the_episode_with_the_tool_response_masked():
    env = warmstart.tool_environment(TASK)
    record = TASK.generate_split("train")[0]
    out = warmstart.encode_tool_demonstration(env, record)
    tok, n = TASK.tokenizer, int(out["prompt_length"])
    assert out["prompt"][:n].tolist() == TASK.prompt_ids(record)
    response, mask = out["response"], out["mask"]
    call, answer = TASK.tool_demonstration(record)
    policy = response[mask > 0].tolist()
    assert policy == tok.encode(call, add_eos=True) + tok.encode(answer, add_eos=True)
    real = response[: int(np.flatnonzero(response != tok.pad_id)[-1]) + 1]
    context = tok.decode(real[mask[: len(real)] == 0])
    assert context == f"<tool_response>{record['target']}\n</tool_response>"  # the tool's, masked


def test_tool_fraction_keys_the_cache_only_when_set():
    cfg = models.get_model_config("tiny", vocab_size=TASK.tokenizer.vocab_size)
    assert warmstart.cache_key(TASK, cfg, {}) == warmstart.cache_key(
        TASK, cfg, {"tool_fraction": 0.0}
    )
    assert warmstart.cache_key(TASK, cfg, {}) != warmstart.cache_key(
        TASK, cfg, {"tool_fraction": 0.5}
    )
    with pytest.raises(ValueError, match="tool_fraction"):
        warmstart.as_warm_config({"tool_fraction": 1.5})


def test_a_task_without_tool_demonstrations_refuses_a_tool_fraction():
    from gspo_jax import tasks

    with pytest.raises(ValueError, match="tool_fraction=0"):
        warmstart.tool_environment(tasks.get_task("arith"))


@needs_sandbox
def test_the_iterator_mixes_tool_episodes_and_direct_answers(tmp_path):
    env = warmstart.tool_environment(TASK)
    it = warmstart.demonstration_iterator(
        TASK, 16, seed=0, data_dir=str(tmp_path), tool_env=env, tool_fraction=0.5
    )
    batch = next(it)
    ends = (batch["response"] != TASK.tokenizer.pad_id).sum(-1)  # [P] tokens of each row
    # a tool row has context (mask 0) inside its tokens; a direct answer has none
    has_context = np.array([(m[:e] == 0).any() for m, e in zip(batch["mask"], ends, strict=True)])
    assert 0 < has_context.sum() < 16
    cfg = models.get_model_config("tiny", vocab_size=TASK.tokenizer.vocab_size)
    model, stats = warmstart.train(
        TASK,
        cfg,
        dict(steps=3, batch_size=4, tool_fraction=0.5),
        data_dir=str(tmp_path),
        progress=False,
    )
    assert stats["steps"] == 3 and np.isfinite(stats["final_loss"])
