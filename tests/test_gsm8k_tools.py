"""GSM8K with the Python tool on a Qwen3 checkpoint's config (configs/qwen3_gsm8k.py:tools): a tiny
random checkpoint with the test tokenizer and Qwen3's released template with its tools header.
One full tool round trip: the policy's call parsed, the sandbox run, the response rendered by
the template and appended, the episode scored by GSM8K's verifier (the policy's turns scripted:
a tiny random model does not write a call); and the multi-turn engine playing the tiny model's
own episodes of the run's environment, the rows' tokens its sampled ones and the template's."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from test_envs import QWEN3_TOOLS_TEMPLATE
from test_hf_tokenizer import QWEN_CONFIG
from test_qwen3_recipe import tiny_checkpoint_and_gsm8k
from test_sandbox import needs_sandbox

from gspo_jax import config as config_lib
from gspo_jax import data, envs, models
from gspo_jax.rl import build

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    """The run of configs/qwen3_gsm8k.py:runlocal,tools=True on a tiny checkpoint and the
    fixture's GSM8K files: (run, data_dir)."""
    root = tmp_path_factory.mktemp("gsm8k_tools")
    config_json = {**QWEN_CONFIG, "chat_template": QWEN3_TOOLS_TEMPLATE}
    ckpt, gsm = tiny_checkpoint_and_gsm8k(root, config_json, max_seq_len=1024)
    config = config_lib.load_config_file(
        f"{REPO}/configs/qwen3_gsm8k.py:runlocal,tools=True,checkpoint={ckpt},data={gsm}"
    )
    config.unlock()
    config.data.data_dir, config.init.cache_dir = str(root / "data"), str(root / "cache")
    config.rl.max_new_tokens = 160
    return build.build_run(config), str(root / "data")


def first_record(run, data_dir):
    batch, _ = data.make_eval_batches(run.task, "test", batch_size=1, data_dir=data_dir)[0]
    return run.task.record_from_batch(batch, 0)


@needs_sandbox
def test_one_full_tool_round_trip_on_a_qwen3_checkpoint(tool_run):
    run, data_dir = tool_run
    env, tok = run.env.env, run.task.tokenizer
    assert run.config.env.name == "python" and isinstance(env.chat, envs.TemplateChat)
    record = first_record(run, data_dir)
    reference = record["short_answer"]
    episode = env.start(record)
    prompt = tok.decode(episode.prompt_ids)
    assert "# Tools" in prompt and '"name": "python"' in prompt  # the template's tools header
    assert str(record["question"]).strip() in prompt and len(episode.prompt_ids) <= (
        run.task.max_prompt_len
    )
    call = json.dumps({"name": "python", "arguments": {"code": f"print({reference} * 1)"}})
    turns = [f"<tool_call>\n{call}\n</tool_call>", f"The answer is \\boxed{{{reference}}}."]
    row = envs.run_episode(env, record, envs.scripted_policy(turns, tok))
    assert row.end == "answer" and row.info["tool_calls"] == 1 and row.info["failed_calls"] == 0
    ids, policy = np.asarray(row.ids), np.asarray(row.policy_mask)
    assert tok.decode(ids[policy == 1]).count("<tool_call>") == 1
    env_text = tok.decode(ids[len(episode.prompt_ids) :][policy[len(episode.prompt_ids) :] == 0])
    # the sandbox's output, rendered by the template as a tool response in a user turn
    assert f"<|im_start|>user\n<tool_response>\n{reference}\n" in env_text
    assert env_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert row.info["correct"] == 1 and row.reward == pytest.approx(1.1)  # GSM8K's verifier


@needs_sandbox
def test_the_tiny_checkpoint_plays_its_own_episodes_of_the_run(tool_run):
    run, data_dir = tool_run
    model = models.load_hf_checkpoint(run.config.init.checkpoint, dtype="float32")
    spec = run.step
    batch_local, _ = data.make_eval_batches(run.task, "test", batch_size=1, data_dir=data_dir)[0]
    key = jax.random.key_data(jax.random.key(0))
    batch, scores = run.env.play(model, batch_local, key, spec)
    B, T = spec.group_size, spec.response_len
    assert batch.sample.tokens.shape == (B, T) and batch.prompts.shape == (1, spec.prompt_len)
    assert np.all(np.asarray(batch.action_mask) <= np.asarray(batch.sample.mask))
    assert set(scores) >= {"reward", "turns", "tool_calls", "failed_calls"}
    assert np.all(scores["turns"] >= 1)
