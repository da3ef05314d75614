"""HFTokenizer (gspo_jax/tasks/hf_tokenizer.py): a tokenizer.json + tokenizer_config.json folder
with a Qwen3-style chat template, built here from a tiny byte-level BPE trained on a few
sentences, and the gsm8k task running on it (text -> template -> ids -> response ids -> text ->
verifier)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo_jax import data, tasks
from gspo_jax.tasks import gsm8k
from gspo_jax.tasks.hf_tokenizer import HFTokenizer

FIXTURE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"

# Qwen3's chat template, without its tool-declaration header (the rest as released), plus an
# unknown-role branch that calls raise_exception (as other models' templates do).
QWEN3_TEMPLATE = r"""{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif not (message.role == "system" and loop.first) %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501 - the released template's lines, verbatim

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SENTENCES = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "How many clips did Natalia sell altogether in April and May?",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "The final answer is 72. She makes 24 + 18 = 42 muffins.",
]


def train_tokenizer():
    """A byte-level BPE (as Qwen's) trained on SENTENCES, with Qwen's special tokens and the
    non-special <think> tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")]
    )
    return tok


def write_folder(folder: Path, config: dict, generation_config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


QWEN_CONFIG = dict(
    bos_token=None,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    chat_template=QWEN3_TEMPLATE,
    model_max_length=131072,
)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen_style")
    return write_folder(folder, QWEN_CONFIG, dict(eos_token_id=[2, 0], pad_token_id=0))


@pytest.fixture(scope="module")
def tok(qwen_dir) -> HFTokenizer:
    return HFTokenizer(qwen_dir)


# ------------------------------------------------------------------------------ special ids


def test_special_ids_come_from_the_config(tok):
    assert [tok.token_to_id(t) for t in SPECIALS] == [0, 1, 2]  # trainer order
    assert tok.eos_id == 2 and tok.pad_id == 0 and tok.bos_id is None
    assert tok.eos_ids == (2, 0)  # the config's eos first, then the generation config's
    assert tok.num_ids == tok.token_to_id("</think>") + 1
    assert tok.vocab_size % 8 == 0 and tok.num_ids <= tok.vocab_size < tok.num_ids + 8
    assert tok.encode("hi", add_bos=True) == tok.encode("hi")  # no bos token: nothing added


def test_pad_falls_back_to_eos(tmp_path):
    config = {k: v for k, v in QWEN_CONFIG.items() if k != "pad_token"}
    t = HFTokenizer(write_folder(tmp_path / "a", config))
    assert t.pad_id == t.eos_id == 2 and t.eos_ids == (2,)
    # eos only in generation_config.json (list form): the first id is eos, pad falls back to it
    config = {k: v for k, v in config.items() if k != "eos_token"}
    t = HFTokenizer(write_folder(tmp_path / "b", config, dict(eos_token_id=[0, 2])))
    assert (t.eos_id, t.eos_ids, t.pad_id) == (0, (0, 2), 0)


def test_bad_folders_fail_with_a_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json"):
        HFTokenizer(tmp_path)
    config = {k: v for k, v in QWEN_CONFIG.items() if k != "eos_token"}
    with pytest.raises(ValueError, match="no eos token"):
        HFTokenizer(write_folder(tmp_path / "no_eos", config))
    with pytest.raises(ValueError, match="not in tokenizer.json"):
        HFTokenizer(write_folder(tmp_path / "bad_eos", {**QWEN_CONFIG, "eos_token": "<eos>"}))
    config = {k: v for k, v in QWEN_CONFIG.items() if k != "chat_template"}
    plain = write_folder(tmp_path / "no_template", config)
    with pytest.raises(ValueError, match="no chat template"):
        HFTokenizer(plain).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="no chat template"):
        tasks.get_task("gsm8k", tokenizer_path=str(plain))


# ------------------------------------------------------------------------------ encode / decode


def test_ids_round_trip(tok):
    im_start, think = tok.token_to_id("<|im_start|>"), tok.token_to_id("<think>")
    for text in [
        "Natalia sold 48 clips.",
        "unicode: é ñ 中文 😀, tabs\tand\nnewlines, double  spaces ",
        "<|im_start|>user\nhi<think>\nhmm</think>",
        "",
    ]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.decode(tok.encode(text, add_eos=True) + [tok.pad_id] * 3) == text
        assert tok.encode(text, add_eos=True) == ids + [tok.eos_id]
    # special tokens written in the text are single ids, never split into bytes
    assert tok.encode("<|im_start|>") == [im_start] and tok.encode("<think>") == [think]
    assert tok.encode("<|im_start|>user")[0] == im_start


def test_decode_never_raises_and_marks_unknown_ids(tok):
    ids = tok.encode("12") + [-5, tok.num_ids, 10**12] + tok.encode("34")
    assert tok.decode(ids) == "12???34"
    assert tok.decode(np.array([tok.eos_id, tok.pad_id], np.int32)) == ""


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=60))
def test_any_text_round_trips(tok, text):
    if any(s in text for s in SPECIALS):
        return
    assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------------------ chat template


CHAT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]
RENDERED = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"  # earlier turns lose their thinking
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
)


def test_qwen3_template_renders_as_transformers_does(tok):
    no_think = tok.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False)
    assert no_think == RENDERED + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    for thinking in (True, None):  # the switch on, or not passed at all
        rendered = tok.apply_chat_template(
            CHAT, add_generation_prompt=True, enable_thinking=thinking
        )
        assert rendered == RENDERED + "<|im_start|>assistant\n"
    assert tok.apply_chat_template(CHAT) == RENDERED
    # the last assistant turn keeps its thinking; tool-call arguments go through tojson
    chat = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "<think>\nhmm\n</think>\n\nHello",
            "tool_calls": [{"function": {"name": "calc", "arguments": {"expr": "2×3"}}}],
        },
        {"role": "tool", "content": "6"},
    ]
    assert tok.apply_chat_template(chat) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello\n"
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2×3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
    )
    ids = tok.encode_chat(CHAT, add_generation_prompt=True, enable_thinking=False)
    assert ids == tok.encode(no_think) and ids.count(tok.token_to_id("<|im_start|>")) == 5


def test_template_environment(tok, tmp_path):
    """trim_blocks + lstrip_blocks, raise_exception, tojson, the sandbox, the generation tag,
    bos_token, and chat_template.jinja taking precedence over the config's template."""
    template = (
        "{{ bos_token }}{% for m in messages %}\n"
        "    {% generation %}[{{ m['role'] }}]{% endgeneration %}{{ m | tojson }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}[go]{% endif %}"
    )
    config = {
        "bos_token": {"content": "<|endoftext|>", "special": True},  # AddedToken dict form
        "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": template}, {"name": "x", "template": ""}],
    }
    t = HFTokenizer(write_folder(tmp_path / "llama", config))
    assert t.bos_id == 0
    messages = [{"role": "user", "content": "é"}]
    out = t.apply_chat_template(messages, add_generation_prompt=True)
    assert out == '<|endoftext|>[user]{"role": "user", "content": "é"}\n[go]'
    ids = t.encode_chat(messages)
    assert ids[0] == t.bos_id and ids[1] != t.bos_id  # the template's bos, not a second one
    assert t.encode("x", add_bos=True)[0] == t.bos_id

    (tmp_path / "llama" / "chat_template.jinja").write_text("{{ messages | length }}")
    assert HFTokenizer(tmp_path / "llama").apply_chat_template(messages) == "1"

    with pytest.raises(jinja2.TemplateError, match="Unknown role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    for evil in ("{{ ''.__class__.__mro__ }}", "{% set _ = messages.append(1) %}"):
        (tmp_path / "llama" / "chat_template.jinja").write_text(evil)
        with pytest.raises(jinja2.exceptions.SecurityError):
            HFTokenizer(tmp_path / "llama").apply_chat_template(messages)


# ------------------------------------------------------------------------------ gsm8k on it


def _gsm8k_prompt(question: str, thinking: bool) -> str:
    block = "" if thinking else "<think>\n\n</think>\n\n"
    return (
        f"<|im_start|>user\n{question}\nPlease reason step by step, and put your final answer "
        f"within \\boxed{{}}.<|im_end|>\n<|im_start|>assistant\n{block}"
    )


def test_gsm8k_task_with_the_tokenizer(qwen_dir):
    """Fixture problems: prompt text -> template -> ids; demonstrations (right) and perturbed
    answers (wrong) -> ids + eos -> score: the verifier reads the decoded text."""
    task = tasks.get_task("gsm8k", tokenizer_path=str(qwen_dir))
    tok = task.tokenizer
    assert isinstance(tok, HFTokenizer) and task.config["tokenizer_path"] == str(qwen_dir)
    records = gsm8k.read_jsonl(FIXTURE)
    for r in records[:3]:
        assert task.prompt_text(r) == _gsm8k_prompt(r["question"], thinking=False)
    thinking = tasks.get_task("gsm8k", tokenizer_path=str(qwen_dir), enable_thinking=True)
    assert thinking.prompt_text(records[0]) == _gsm8k_prompt(records[0]["question"], True)

    batch = data.collate([data.encode_record(task, r) for r in records])  # as the loader does
    for p, r in enumerate(records):
        n = int(batch["prompt_length"][p])
        assert batch["prompt"][p, :n].tolist() == tok.encode(task.prompt_text(r))
        assert (batch["prompt"][p, n:] == tok.pad_id).all()

    T = task.max_response_len
    texts = []
    for r in records:
        wrong = float(r["short_answer"].replace(",", "")) + 1
        texts += [task.demonstration(r, np.random.default_rng(0)), f"so \\boxed{{{wrong:g}}}"]
    rows = np.full((len(texts), T), tok.pad_id, np.int32)
    mask = np.zeros((len(texts), T), np.float32)
    for b, text in enumerate(texts):
        ids = tok.encode(text, add_eos=True)
        assert len(ids) <= T
        rows[b, : len(ids)], mask[b, : len(ids)] = ids, 1
    scores = task.score(batch, rows, mask, group_size=2)
    np.testing.assert_array_equal(scores["correct"], [1.0, 0.0] * len(records))
    np.testing.assert_array_equal(scores["format"], np.ones(len(texts)))
    np.testing.assert_allclose(scores["reward"], [1.1, 0.1] * len(records), rtol=1e-6)
    # truncated (no eos inside the mask): still correct, not well-formed
    mask[0, int(mask[0].sum()) - 1] = 0
    truncated = task.score(batch, rows, mask, group_size=2)
    assert (truncated["correct"][0], truncated["format"][0]) == (1.0, 0.0)
