"""The environment seam (gspo_jax/envs): tasks as one-turn environments (the same reward as
task.score), Qwen3 tool calls parsed and answered (malformed ones with an error, never a crash),
the token stream through the real chat template and the plain format, the limits, and full
episodes of the products task with a scripted policy and the sandboxed Python tool."""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_hf_tokenizer as hft
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sandbox import needs_sandbox

from gspo_jax import envs, tasks
from gspo_jax.envs.tool_calls import MalformedCall, ToolCall
from gspo_jax.tasks.hf_tokenizer import HFTokenizer

# Qwen3's released template with its tool-declaration header (test_hf_tokenizer.py's fixture
# template has all but the header): the system turn lists the tools when they are given.
TOOLS_HEADER = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
"""  # noqa: E501 - the released template's lines, verbatim
_FIRST_LINES = hft.QWEN3_TEMPLATE.split("\n", 3)
assert _FIRST_LINES[0].startswith("{%- if messages[0].role == 'system' %}")
QWEN3_TOOLS_TEMPLATE = TOOLS_HEADER + _FIRST_LINES[3]


def echo_tool(answer: str = "42\n") -> envs.Tool:
    """A python tool that answers without running anything (for tests of the format)."""
    return envs.Tool(
        name="python",
        description="Run a Python program and return what it prints.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
        fn=lambda code: answer,
    )


def call_text(name="python", **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> HFTokenizer:
    folder = tmp_path_factory.mktemp("qwen_tools")
    config = {**hft.QWEN_CONFIG, "chat_template": QWEN3_TOOLS_TEMPLATE}
    return HFTokenizer(hft.write_folder(folder, config, dict(eos_token_id=[2, 0])))


# ------------------------------------------------------------------------------ one-turn tasks


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_a_task_as_an_environment_gives_task_score_reward(name):
    task = tasks.get_task(name)
    records = task.generate_split("test")[:12]
    rng = np.random.default_rng(0)
    texts = [task.demonstration(r, rng) for r in records]
    texts[1] = texts[1][:-1]  # a wrong or malformed one
    ids = [task.tokenizer.encode(t, add_eos=i != 2) for i, t in enumerate(texts)]  # 2: truncated
    width = max(map(len, ids))
    responses = np.full((len(ids), width), task.tokenizer.pad_id, np.int32)
    mask = np.zeros_like(responses)
    for b, row in enumerate(ids):
        responses[b, : len(row)], mask[b, : len(row)] = row, 1
    batch = {k: np.asarray([r[k] for r in records]) for k in ("prompt", *task.record_fields)}
    want = task.score(batch, responses, mask, group_size=1)

    env = envs.TaskEnvironment(task)
    got = []
    for r, row in zip(records, ids, strict=True):
        episode = env.start(r)
        assert episode.prompt_ids == task.prompt_ids(r)
        t = episode.step(row)
        assert t.done and t.observation_ids == () and t.info["correct"] in (0.0, 1.0)
        got.append(t.reward)
    np.testing.assert_array_equal(np.float32(got), want["reward"])
    assert len(set(got)) > 1  # the rows differ: the comparison can fail


# ------------------------------------------------------------------------------ tool calls


def test_tool_calls_parse_in_qwen3_format():
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
        '<tool_call>{"name": "calc", "arguments": "{\\"x\\": 2}"}</tool_call>'
    )
    assert envs.parse_tool_calls(text) == [
        ToolCall("python", {"code": "print(1)"}),
        ToolCall("calc", {"x": 2}),  # arguments as a JSON string, as the template allows
    ]
    assert envs.parse_tool_calls("no call here") == []


@pytest.mark.parametrize(
    "text,error",
    [
        ("<tool_call>{name: python}</tool_call>", "not valid JSON"),
        ('<tool_call>["python"]</tool_call>', "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "python", "arguments": {}}', "without </tool_call>"),
        ("<tool_call>" + "[" * 100000 + "</tool_call>", "not valid JSON"),
    ],
)
def test_malformed_calls_become_errors(text, error):
    (call,) = envs.parse_tool_calls(text)
    assert isinstance(call, MalformedCall) and error in call.error
    assert envs.answer_call({}, call)().startswith("error:")


def test_calls_are_checked_against_the_tool():
    tools = {"python": echo_tool()}
    answer = lambda call: envs.answer_call(tools, call)()  # noqa: E731
    assert answer(ToolCall("python", {"code": "x"})) == "42\n"
    assert "unknown tool 'shell'" in answer(ToolCall("shell", {"cmd": "ls"}))
    assert "missing ['code']" in answer(ToolCall("python", {}))
    assert "unexpected ['path']" in answer(ToolCall("python", {"code": "1", "path": "/"}))
    assert "must be a string" in answer(ToolCall("python", {"code": 3}))
    broken = envs.Tool("python", "", tools["python"].parameters, fn=lambda code: 1 / 0)
    assert (
        "ZeroDivisionError"
        in envs.answer_call({"python": broken}, ToolCall("python", {"code": ""}))()
    )


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from('<>/tool_call{}":, abc[]\\\n'), max_size=80))
def test_any_text_is_answered_never_raised(text):
    env = envs.ProductsEnvironment(digits=3, tool=echo_tool())
    episode = env.start(env.problems("test", 1)[0])
    t = episode.step(env.chat.tokenizer.encode(text, add_eos=True))
    assert t.done or t.observation_ids


# ------------------------------------------------------------------------------ the token stream


def template_env(qwen: HFTokenizer) -> envs.ProductsEnvironment:
    """The products task through Qwen3's template, its tool answering 17 * 23."""
    return envs.ProductsEnvironment(
        digits=3,
        chat=envs.TemplateChat(qwen, enable_thinking=False),
        tool=echo_tool("391\n"),
        limits=envs.EpisodeLimits(max_total_tokens=4096),
    )


def test_the_chat_template_renders_tools_and_responses(qwen):
    env = template_env(qwen)
    record = {"a": 17, "b": 23, "target": 391}
    episode = env.start(record)
    prompt = qwen.apply_chat_template(
        env.first_messages(record),
        tools=[env.tools["python"].schema()],
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert episode.prompt_ids == qwen.encode(prompt)
    assert (
        "# Tools" in prompt
        and '"name": "python"' in prompt
        and prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    )
    t = episode.step(qwen.encode(call_text(code="print(17 * 23)"), add_eos=True))
    assert not t.done
    # the template's text after the turn (a "tool" message in a user turn), encoded on its own
    assert list(t.observation_ids) == qwen.encode(
        "\n<|im_start|>user\n<tool_response>\n391\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    t = episode.step(qwen.encode("Answer: 391", add_eos=True))
    assert t.done and t.end == "answer" and t.reward == pytest.approx(1.1)
    assert t.info["tool_calls"] == 1 and t.info["failed_calls"] == 0


def test_the_row_marks_the_policys_tokens(qwen):
    env = template_env(qwen)
    record = {"a": 17, "b": 23, "target": 391}
    turns = [call_text(code="print(17 * 23)"), "Answer: 391"]
    row = envs.run_episode(env, record, envs.scripted_policy(turns, qwen))
    ids, mask = np.asarray(row.ids), np.asarray(row.policy_mask)
    policy = [qwen.encode(t, add_eos=True) for t in turns]
    assert ids[mask == 1].tolist() == policy[0] + policy[1]
    episode = env.start(record)
    obs = episode.step(policy[0]).observation_ids
    assert row.ids == (*episode.prompt_ids, *policy[0], *obs, *policy[1])
    assert mask.tolist() == [0] * len(episode.prompt_ids) + [1] * len(policy[0]) + [0] * len(
        obs
    ) + [1] * len(policy[1])


# ------------------------------------------------------------------------------ limits


def test_the_turn_limit_ends_an_episode_of_calls():
    limits = envs.EpisodeLimits(max_turns=3, max_total_tokens=4096)
    env = envs.ProductsEnvironment(digits=3, tool=echo_tool(), limits=limits)
    record = env.problems("test", 1)[0]
    row = envs.run_episode(
        env, record, envs.scripted_policy([call_text(code="1")] * 10, env.chat.tokenizer)
    )
    assert row.end == "turns" and row.reward == 0.0
    assert row.info["turns"] == 3 and row.info["tool_calls"] == 3


def test_the_total_length_limit_ends_an_episode():
    limits = envs.EpisodeLimits(max_turns=10, max_total_tokens=200)
    env = envs.ProductsEnvironment(digits=3, tool=echo_tool("7" * 60), limits=limits)
    record = env.problems("test", 1)[0]
    policy = envs.scripted_policy([call_text(code="1")] * 10, env.chat.tokenizer)
    row = envs.run_episode(env, record, policy)
    assert row.end == "length" and len(row.ids) <= 200 and row.info["turns"] < 10


def test_a_turn_cut_by_the_budget_is_truncated():
    limits = envs.EpisodeLimits(max_total_tokens=90)
    env = envs.ProductsEnvironment(digits=3, tool=echo_tool(), limits=limits)
    record = env.problems("test", 1)[0]
    row = envs.run_episode(env, record, lambda ids, budget: [5] * (budget + 10))
    assert row.end == "truncated" and len(row.ids) == 90 and row.reward == 0.0


def test_tool_responses_are_clipped_to_their_tokens():
    limits = envs.EpisodeLimits(max_tool_response_tokens=16)
    env = envs.ProductsEnvironment(digits=3, tool=echo_tool("x" * 1000), limits=limits)
    episode = env.start(env.problems("test", 1)[0])
    t = episode.step(env.chat.tokenizer.encode(call_text(code="1"), add_eos=True))
    text = env.chat.tokenizer.decode(t.observation_ids)
    assert text == "<tool_response>" + "x" * 16 + "\n[truncated]</tool_response>"


def test_bad_limits_and_knobs_fail():
    with pytest.raises(ValueError, match="episode limit"):
        envs.EpisodeLimits(max_turns=0)
    with pytest.raises(ValueError, match="digits"):
        envs.ProductsEnvironment(digits=0)
    with pytest.raises(ValueError, match="problems asked"):
        envs.ProductsEnvironment(digits=1, tool=echo_tool()).problems("train", 1000)


# ------------------------------------------------------------------------------ products task


def test_the_python_tool_refuses_where_the_sandbox_is_unavailable(monkeypatch):
    from gspo_jax.tools import SandboxUnavailable, sandbox

    sandbox.check_available.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            envs.ProductsEnvironment(digits=3)
    finally:
        sandbox.check_available.cache_clear()


def test_products_problems_are_deterministic_and_held_out():
    env = envs.ProductsEnvironment(digits=4, tool=echo_tool())
    train, test = env.problems("train", 200), env.problems("test", 50)
    assert train == env.problems("train", 200)
    assert not {(r["a"], r["b"]) for r in train} & {(r["a"], r["b"]) for r in test}
    assert all(1000 <= r["a"] < 10000 and r["target"] == r["a"] * r["b"] for r in train)


def test_products_mix_difficulties_by_length_or_by_an_easy_share():
    """min_digits mixes the operand lengths, each level named by its length; easy_fraction makes
    about that share a * 10^(d-1) ("power of ten"), every question the same length; with neither,
    the draws are the fixed-length task's, seed for seed."""
    from gspo_jax.tasks import products

    by_length = products.ProductsTask(digits=3, min_digits=1, num_train=100, num_test=300)
    test = by_length.generate_split("test")
    assert {by_length.difficulty(r) for r in test} == {"1 digit", "2 digits", "3 digits"}
    assert all(len(str(r["a"])) == len(str(r["b"])) or r["a"] < 10 for r in test)
    easy = products.ProductsTask(digits=4, easy_fraction=0.5, num_train=100, num_test=400)
    test = easy.generate_split("test")
    levels = [easy.difficulty(r) for r in test]
    assert 0.4 < levels.count("power of ten") / len(test) < 0.6
    assert all(r["b"] == 1000 for r, lv in zip(test, levels, strict=True) if lv == "power of ten")
    assert all(r["target"] == r["a"] * r["b"] for r in test)
    assert len({len(r["prompt"]) for r in test}) == 1  # the digits to copy at fixed offsets
    # the fixed-length task's first problems, as the code before min_digits/easy_fraction drew them
    plain = products.ProductsTask(digits=3, num_train=20, num_test=8).generate_split("test")
    assert [(r["a"], r["b"]) for r in plain[:2]] == [(569, 900), (993, 601)]
    with pytest.raises(ValueError, match="easy_fraction"):
        products.ProductsTask(digits=4, easy_fraction=1.0)
    with pytest.raises(ValueError, match="min_digits"):
        products.ProductsTask(digits=3, min_digits=4)


@needs_sandbox
def test_a_full_episode_with_the_python_tool():
    env = envs.ProductsEnvironment(digits=9)
    tok = env.chat.tokenizer
    record = env.problems("test", 1)[0]
    row = envs.run_episode(env, record, envs.scripted_policy(env.demonstration(record), tok))
    assert row.end == "answer" and row.reward == pytest.approx(1.1)
    assert row.info == pytest.approx(
        {"correct": 1, "format": 1, "turns": 2, "tool_calls": 1, "failed_calls": 0}
    )
    env_text = tok.decode([i for i, m in zip(row.ids, row.policy_mask, strict=True) if not m])
    assert env_text.endswith(f"<tool_response>{record['target']}\n</tool_response>")
    # without the tool: the answer alone; a wrong answer earns the format part only
    direct = env.demonstration(record, with_tool=False)
    assert envs.run_episode(env, record, envs.scripted_policy(direct, tok)).reward == 1.1
    wrong = [f"Answer: {record['target'] + 1}"]
    assert envs.run_episode(env, record, envs.scripted_policy(wrong, tok)).reward == 0.1


@needs_sandbox
def test_a_malformed_call_and_a_failing_program_are_observations():
    env = envs.ProductsEnvironment(digits=5)
    tok = env.chat.tokenizer
    record = env.problems("test", 1)[0]
    turns = [
        '<tool_call>{"name": "python", "arguments": {"code": print(1)}}</tool_call>',
        call_text(code="1/0"),
        f"Answer: {record['target']}",
    ]
    episode = env.start(record)
    t1 = episode.step(tok.encode(turns[0], add_eos=True))
    assert "error: the tool call is not valid JSON" in tok.decode(t1.observation_ids)
    t2 = episode.step(tok.encode(turns[1], add_eos=True))
    assert "status error" in tok.decode(t2.observation_ids)
    assert "ZeroDivisionError" in tok.decode(t2.observation_ids)
    t3 = episode.step(tok.encode(turns[2], add_eos=True))
    assert t3.done and t3.reward == pytest.approx(1.1)
    assert t3.info["tool_calls"] == 2 and t3.info["failed_calls"] == 2 and t3.info["turns"] == 3


@needs_sandbox
def test_an_episodes_jobs_run_on_the_pool_as_in_step():
    """begin / jobs on a ToolPool / finish gives the transition step gives."""
    from gspo_jax.tools import ToolPool

    env = envs.ProductsEnvironment(digits=6)
    tok = env.chat.tokenizer
    record = env.problems("test", 1)[0]
    turn = tok.encode(env.demonstration(record)[0] + call_text(code="print('two')"), add_eos=True)
    want = env.start(record).step(turn)
    episode = env.start(record)
    pending = episode.begin(turn)
    with ToolPool(2) as pool:
        responses = [f.result() for f in [pool.submit_job(job) for job in pending.jobs]]
    assert responses == [f"{record['target']}\n", "two\n"]
    assert episode.finish(pending, responses) == want and not want.done
