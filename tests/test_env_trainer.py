"""Multi-turn rows in the trainer (config.env, rl/episodes.py): the refusals of what an
environment run does not carry, each in one line; a runlocal products run of 2 RL steps with the
real sandboxed Python tool, whose batch carries the action mask and whose metrics log tool calls,
failed calls and turns per episode; and the one-turn path untouched by config.env's fields."""

from __future__ import annotations

import json
import os

import flax
import numpy as np
import pytest
from flax import nnx
from hf_fixtures import random_model
from test_sandbox import needs_sandbox

from gspo_jax import config as config_lib
from gspo_jax import envs, models, rollout
from gspo_jax.config import ConfigError, combinations
from gspo_jax.rl import build, episodes, trainer
from gspo_jax.rollout import multi_turn
from gspo_jax.runtime import rundir
from gspo_jax.tasks import products

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(REPO, "configs", "tools.py")


def tools_config(tmp_path, **fields):
    c = config_lib.load_config_file(TOOLS + ":runlocal")
    base = {
        "init.kind": "random",
        "data.data_dir": str(tmp_path / "data"),
        "init.cache_dir": str(tmp_path / "cache"),
    }
    for k, v in {**base, **fields}.items():
        config_lib.set_field(c, k, v)
    return c


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("env.name", "bash", "is not an environment"),
        ("rl.rollout_logp_noise", 0.1, "rollout_logp_noise"),
        ("env.max_turns", 0, "max_turns"),
        ("rl.rollout_engine", "paged", "multi-turn engines"),
    ],
)
def test_an_environment_refuses_what_it_does_not_carry_in_one_line(tmp_path, field, value, words):
    c = tools_config(tmp_path, **{field: value})
    with pytest.raises(ConfigError, match=words) as e:
        episodes.envs_refusals(c)
    assert "\n" not in str(e.value) and "config.env" in str(e.value)


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("rl.max_staleness", 1, "asynchronous pipeline"),
        ("rl.partial_rollout", 1, "partial rollouts"),
        ("population.seeds", (0, 1), "population"),
        ("rl.dynamic_sampling", True, "dynamic sampling"),
        ("rl.routing_replay", True, "routing replay"),
    ],
)
def test_the_features_an_environment_does_not_carry_are_the_tables_rows(
    tmp_path, field, value, words
):
    """config/combinations.py refuses them, one line naming config.env.name and the feature."""
    c = tools_config(tmp_path, **{field: value})
    if field == "rl.partial_rollout":
        config_lib.set_field(c, "rl.rollout_engine", "continuous")
    line = combinations.refusal(c, combinations.Setting(moe=field == "rl.routing_replay"))
    assert line is not None and "\n" not in line
    assert words in line and "config.env.name='python'" in line


def test_one_turn_needs_no_environment(tmp_path):
    c = tools_config(tmp_path, **{"env.name": "", "rl.partial_rollout": 1})
    episodes.envs_refusals(c)  # nothing of config.env's to refuse
    assert episodes.make_env_rollout(c, None, prompt_len=4, response_len=4) is None


@flax.struct.dataclass
class FakeEpisodeBatch:
    """rollout/multi_turn.py's EpisodeBatch fields (until the engine branch is merged)."""

    prompts: np.ndarray
    prompt_lengths: np.ndarray
    sample: rollout.SampleOutput
    action_mask: np.ndarray
    rewards: np.ndarray
    infos: tuple = flax.struct.field(pytree_node=False, default=())


def scripted_engine(played: list, direct=lambda record: False):
    """A generate_episodes that plays each problem's demonstration (a call of the real tool,
    then the answer; where ``direct(record)``, a wrong direct answer) through envs.run_episode:
    the rows the trainer must take as they are."""

    def generate_episodes(model, env, records, *, num_samples, max_new_tokens, pad_id, **kw):
        del model, kw
        tok, T = env.chat.tokenizer, max_new_tokens
        rows, prompts = [], []
        for record in records:
            a, b = int(record["a"]), int(record["b"])
            turns = [products.call_text(a, b), products.answer_text(a, b)]
            if direct(record):
                turns = [f"Answer: {a * b + 1}"]  # wrong also when a is 0
            row = envs.run_episode(env, record, envs.scripted_policy(turns, tok))
            n = len(env.start(record).prompt_ids)
            prompts.append(row.ids[:n])
            rows += [row] * num_samples
        played.extend((r, len(prompts[i // num_samples])) for i, r in enumerate(rows))
        B, Lp = len(rows), max(len(p) for p in prompts)
        out = {k: np.zeros((B, T), np.float32) for k in ("mask", "logp", "action")}
        tokens = np.full((B, T), pad_id, np.int32)
        for i, row in enumerate(rows):
            n = len(prompts[i // num_samples])
            ids, policy = np.asarray(row.ids[n:]), np.asarray(row.policy_mask[n:], np.float32)
            tokens[i, : len(ids)], out["mask"][i, : len(ids)] = ids, 1.0
            out["action"][i, : len(ids)] = policy
            out["logp"][i, : len(ids)] = -0.5 * policy  # the sampler's: 0 on the environment's
        prompt_arr = np.full((len(records), Lp), pad_id, np.int32)
        for p, ids in enumerate(prompts):
            prompt_arr[p, : len(ids)] = ids
        sample = rollout.SampleOutput(
            tokens=tokens,
            mask=out["mask"],
            logp=out["logp"],
            sample_logp=out["logp"],
            lengths=out["mask"].sum(-1).astype(np.int32),
        )
        return FakeEpisodeBatch(
            prompt_arr,
            np.asarray([len(p) for p in prompts], np.int32),
            sample,
            out["action"],
            np.asarray([r.reward for r in rows], np.float32),
            tuple({**r.info, "end": r.end} for r in rows),
        )

    return generate_episodes


@needs_sandbox
def test_a_products_run_trains_on_the_policys_tokens_with_the_real_tool(tmp_path, monkeypatch):
    played: list = []
    monkeypatch.setattr(episodes, "generate_episodes", lambda: scripted_engine(played))
    c = tools_config(tmp_path, **{"rl.recompute_old_logp": True})
    run = build.build_run(c, str(tmp_path / "run"))
    assert run.step.multi_turn and run.env is not None
    summary = trainer.train(c, str(tmp_path / "run"))
    # the final evaluation: with the tool (every scripted episode calls it and is right)
    assert summary["final"]["tool_call_rate"] == 1 and summary["final"]["tool_accuracy"] == 1
    # the closing block reports it too (greedy_accuracy is the one turn without the tool)
    assert "with the tool 1.000 (call rate 1.00)" in rundir.format_summary(summary)
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        steps = [json.loads(line) for line in f if '"train/loss"' in line]
    assert [m["step"] for m in steps] == [1, 2]
    B = c.rl.prompts_per_step * c.rl.group_size
    # 2 steps' rows, the final evaluation's greedy episodes and its pass_k sampled ones
    assert len(played) == 2 * B + c.eval.num_problems * (1 + c.eval.pass_k)
    for i, m in enumerate(steps):
        # every scripted episode: one call of the real tool, its answer copied: right
        assert m["rollout/tool_calls"] == 1 and m["rollout/failed_calls"] == 0
        assert m["rollout/turns"] == 2 and m["rollout/correct"] == 1
        assert m["rollout/reward"] == pytest.approx(1.1)
        # the batch carried the action mask: the policy's share of the step's response tokens
        rows = played[i * B : (i + 1) * B]
        policy = sum(sum(r.policy_mask[n:]) for r, n in rows)
        tokens = sum(len(r.ids) - n for r, n in rows)
        assert 0 < policy < tokens
        assert m["rollout/policy_token_frac"] == pytest.approx(policy / tokens)
        assert np.isfinite(m["train/loss"])


def test_a_tool_runs_summary_and_log_lines_give_the_accuracy_with_the_tool():
    """A tool-using policy opens with a call, so its one-turn greedy accuracy (no tool offered)
    can be 0 while its calls answer: the log line, the closing block and the summary's delta
    give the accuracy with the tool beside it; a run without tools prints as before."""
    base = {"eval/greedy_accuracy": 0.0, "eval/tool_accuracy": 0.25, "eval/tool_call_rate": 0.5}
    final = {"eval/greedy_accuracy": 0.0, "eval/tool_accuracy": 0.75, "eval/tool_call_rate": 1.0}
    s = rundir.make_summary("gspo", "w", base, final, steps=2, wall_s=1, warmstart_s=0, rl_s=1)
    assert s["delta_tool_accuracy"] == pytest.approx(0.5) and s["delta_greedy_accuracy"] == 0
    text = rundir.format_summary(s)
    assert "with the tool 0.750 (call rate 1.00)" in text and "+50.0 points with the tool" in text
    assert trainer._fmt_eval(final).endswith("with the tool 0.750 (call rate 1.00)")
    plain = rundir.make_summary(
        "gspo", "w", {"eval/greedy_accuracy": 0.5}, {"eval/greedy_accuracy": 0.75},
        steps=2, wall_s=1, warmstart_s=0, rl_s=1,
    )  # fmt: skip
    assert "delta_tool_accuracy" not in plain and "tool" not in rundir.format_summary(plain)


@needs_sandbox
def test_tool_evaluation_logs_calls_turns_and_accuracy_with_and_without_a_call(
    tmp_path, monkeypatch
):
    from gspo_jax.rl import evaluation

    played: list = []
    odd = lambda record: int(record["a"]) % 2 == 1  # noqa: E731 (these answer directly, wrong)
    monkeypatch.setattr(episodes, "generate_episodes", lambda: scripted_engine(played, odd))
    task = products.ProductsTask(digits=3, num_train=20, num_test=8)
    env = envs.TaskToolEnvironment(task, tools=[envs.python_tool()])
    model = random_model(models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size))
    out = evaluation.evaluate_tools(
        model, env, "test", 8, batch_size=4, data_dir=str(tmp_path), with_episodes=True
    )
    calls = np.asarray([not odd(r) for r in task.generate_split("test")], float)
    assert out["tool_num_problems"] == 8 and 0 < calls.mean() < 1
    assert out["tool_call_rate"] == pytest.approx(calls.mean())
    assert out["tool_calls_per_episode"] == pytest.approx(calls.mean())
    assert out["turns_per_episode"] == pytest.approx(1 + calls.mean())
    assert out["failed_calls_per_episode"] == 0
    assert out["tool_accuracy"] == pytest.approx(calls.mean())
    assert out["tool_accuracy_with_call"] == 1 and out["tool_accuracy_without_call"] == 0
    assert [e["tool_calls"] for e in out["episodes"]] == calls.tolist()


@needs_sandbox
def test_tool_evaluation_breaks_the_call_rate_and_accuracy_down_by_difficulty(
    tmp_path, monkeypatch
):
    """Operands of 1-3 digits mixed: tool_call_rate/<level> and tool_accuracy/<level> are the
    scripted policy's per-length counts (here it calls the tool on the 3-digit problems only)."""
    from gspo_jax.rl import evaluation

    long = lambda record: len(str(int(record["a"]))) == 3  # noqa: E731 (calls; others wrong)
    direct = lambda record: not long(record)  # noqa: E731
    monkeypatch.setattr(episodes, "generate_episodes", lambda: scripted_engine([], direct))
    task = products.ProductsTask(digits=3, min_digits=1, num_train=20, num_test=12)
    env = envs.TaskToolEnvironment(task, tools=[envs.python_tool()])
    model = random_model(models.get_model_config("tiny", vocab_size=task.tokenizer.vocab_size))
    out = evaluation.evaluate_tools(model, env, "test", 12, batch_size=4, data_dir=str(tmp_path))
    test = task.generate_split("test")
    lengths = {len(str(r["a"])) for r in test}
    assert len(lengths) > 1  # the draw mixed the lengths
    for d in lengths:
        slug = f"{d}_digit{'s' * (d > 1)}"
        expected = float(d == 3)
        assert out[f"tool_call_rate/{slug}"] == expected
        assert out[f"tool_accuracy/{slug}"] == expected
    assert out["tool_call_rate"] == pytest.approx(np.mean([long(r) for r in test]))
    # sampled episodes (3 per problem; the scripted policy plays the same turns at any
    # temperature): the same per-level figures under tool_sample_, counted over every sample
    sampled = evaluation.evaluate_tools(
        model, env, "test", 12, batch_size=4, data_dir=str(tmp_path), samples=3
    )
    for d in lengths:
        slug = f"{d}_digit{'s' * (d > 1)}"
        assert sampled[f"tool_sample_call_rate/{slug}"] == float(d == 3)
        assert sampled[f"tool_sample_accuracy/{slug}"] == float(d == 3)
        with_call = sampled[f"tool_sample_accuracy_with_call/{slug}"]
        assert with_call == 1.0 if d == 3 else np.isnan(with_call)
    assert sampled["tool_sample_call_rate"] == pytest.approx(out["tool_call_rate"])
    assert sampled["tool_num_problems"] == 12 and "tool_sample_call_rate" not in out


@needs_sandbox
@pytest.mark.long  # a products run per engine (about 30 s each): after the README's command
@pytest.mark.parametrize("engine", sorted(multi_turn.ENGINES))
def test_a_products_run_with_the_multi_turn_engine(tmp_path, engine):
    """The real engine (each of rollout/multi_turn.py's) on a random tiny policy: 2 RL steps;
    the trainer's recomputed log-probs equal the sampler's on the policy's tokens (the rows'
    interleaved context read alike)."""
    fields = {"rl.recompute_old_logp": True, "eval.num_problems": 2, "rl.rollout_engine": engine}
    c = tools_config(tmp_path, **fields)
    final = trainer.train(c, str(tmp_path / "run"))["final"]
    assert final["tool_num_problems"] == 2 and 0 <= final["tool_accuracy"] <= 1
    assert final["turns_per_episode"] >= 1 and "greedy_accuracy" in final  # with and without
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        steps = [json.loads(line) for line in f if '"train/loss"' in line]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["rollout/turns"] >= 1 and m["rollout/tool_calls"] >= m["rollout/failed_calls"]
        assert m["rollout/recompute_logp_diff_absmax"] < 1e-4
        assert 0 < m["rollout/policy_token_frac"] <= 1 and np.isfinite(m["train/loss"])


def test_the_batch_plan_has_an_action_mask_only_with_an_environment(tmp_path):
    from gspo_jax.rl.batch import RLBatch

    one_turn = build.build_run(
        config_lib.load_config_file(os.path.join(REPO, "configs", "arith.py:runlocal"))
    )
    assert one_turn.env is None and RLBatch.abstract(one_turn).action_mask is None
    if needs_sandbox.args[0]:
        return  # (the environment's tool needs the sandbox)
    run = build.build_run(tools_config(tmp_path))
    B, T = run.step.rows, run.step.response_len
    assert RLBatch.abstract(run).action_mask.shape == (B, T)


def test_the_products_task_is_the_environments_problems_and_verdict():
    task = products.ProductsTask(digits=4, num_train=50, num_test=20)
    train, test = task.generate_split("train"), task.generate_split("test")
    assert not {(r["a"], r["b"]) for r in train} & {(r["a"], r["b"]) for r in test}
    env = envs.TaskToolEnvironment(task, tools=[])
    batch_record = {k: test[0][k] for k in task.record_fields}  # what a batch carries
    assert env.start(batch_record).prompt_ids == task.prompt_ids(test[0])
    right = products.answer_text(test[0]["a"], test[0]["b"])
    assert env.verdict(batch_record, right, True) == task.verify(batch_record, right, True)
    assert task.verify(batch_record, right, True).correct == 1
    assert task.verify(batch_record, right + "1", True).correct == 0
    demo = task.tokenizer.encode(task.demonstration(test[0], None), add_eos=True)
    assert len(demo) <= task.max_response_len


@needs_sandbox
def test_the_evaluate_command_adds_tool_use_with_env(tmp_path):
    """python -m gspo_jax.evaluate --env python on a products run directory: the table's line
    and the JSON's tools figures with every episode's counts."""
    import subprocess
    import sys

    from gspo_jax.rl import adapters
    from gspo_jax.runtime import checkpoint as checkpoint_lib
    from gspo_jax.runtime import rundir

    c = tools_config(tmp_path)
    workdir = str(tmp_path / "run")
    run = build.build_run(c, workdir)
    params = nnx.split(random_model(run.model_cfg), nnx.Param, ...)[1]
    rundir.write_config_json(workdir, c)
    ck = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1)
    ck.save(
        1, adapters.saved_state(run, build.initial_state(run, params)), _NoIterator(), force=True
    )
    ck.close()
    out = tmp_path / "ev.json"
    cmd = [sys.executable, "-m", "gspo_jax.evaluate", f"--checkpoint={workdir}", "--env=python"]
    cmd += [f"--data_dir={c.data.data_dir}", "--num_problems=2", "--samples=1", "--k=1"]
    cmd += ["--batch_size=2", "--resamples=50", f"--out={out}"]
    env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS="")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step 1 with the tool: accuracy" in p.stdout
    tools = json.load(open(out))["tools"]["step 1"]
    assert tools["tool_num_problems"] == 2 and len(tools["episodes"]) == 2
    assert {"tool_calls", "failed_calls", "turns", "correct", "end"} <= set(tools["episodes"][0])


class _NoIterator:
    def get_state(self):
        return {}
