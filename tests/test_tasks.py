"""Tasks: tokenizer, problem generation, demonstrations and defensive verifiers."""

import random
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo_jax import tasks
from gspo_jax.tasks import arithmetic, countdown, gsm8k


@pytest.fixture(scope="module")
def arith():
    return tasks.get_task("arith", max_digits=4, num_train=300, num_test=50)


@pytest.fixture(scope="module")
def cd():
    return tasks.get_task("countdown", num_train=300, num_test=50)


# ---------------------------------------------------------------------------- tokenizer


def test_tokenizer_roundtrip_and_specials(arith):
    tok = arith.tokenizer
    ids = tok.encode("12+34=", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "12+34="
    assert tok.vocab_size % 8 == 0 and max(ids) < tok.vocab_size
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    # Unknown characters map to unk on encode; any id decodes without raising.
    assert tok.encode("x") == [tok.unk_id]
    assert tok.decode([tok.vocab_size - 1, 10**6, -5, tok.unk_id]) == "????"


def test_get_task_rejects_unknown_names_and_knobs():
    with pytest.raises(ValueError, match="valid tasks"):
        tasks.get_task("sorting")
    with pytest.raises(ValueError, match="valid knobs"):
        tasks.get_task("arith", digits=3)
    with pytest.raises(ValueError, match="max_digits"):
        tasks.get_task("arith", min_digits=4, max_digits=3)


# ---------------------------------------------------------------------------- generation


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_generation_is_deterministic_and_splits_disjoint(name):
    task = tasks.get_task(name, num_train=500, num_test=100)
    train, test = task.generate_split("train"), task.generate_split("test")
    assert len(train) == 500 and len(test) == 100
    again = tasks.get_task(name, num_train=500, num_test=100).generate_split("train")
    assert [r["prompt"] for r in train] == [r["prompt"] for r in again]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    other_seed = tasks.get_task(name, num_train=500, num_test=100, seed=1).generate_split("train")
    assert [r["prompt"] for r in train] != [r["prompt"] for r in other_seed]


def test_held_out_split_does_not_depend_on_train_size():
    a = tasks.get_task("arith", num_train=100, num_test=50).generate_split("test")
    b = tasks.get_task("arith", num_train=900, num_test=50).generate_split("test")
    assert [r["prompt"] for r in a] == [r["prompt"] for r in b]


def test_prompts_and_demonstrations_fit_their_lengths(arith, cd):
    rng = np.random.default_rng(0)
    for task in (arith, cd):
        for r in task.generate_split("train"):
            assert len(task.prompt_ids(r)) <= task.max_prompt_len
            demo = task.demonstration(r, rng)
            assert len(task.tokenizer.encode(demo, add_eos=True)) <= task.max_response_len


# ---------------------------------------------------------------------------- arithmetic


def test_worked_text_and_carryless_sum():
    assert arithmetic.worked_text(1234, 5678, 4) == "W48=12,37=11,26=09,15=06A06912"
    assert arithmetic.worked_text(95, 7, 2) == "W57=12,90=10A102"
    assert arithmetic.worked_text(95, 7, 3) == "W57=12,90=10,00=01A0102"
    assert arithmetic.carryless_sum(1234, 5678) == 6802
    assert arithmetic.carryless_sum(95, 7) == 92
    assert arithmetic.carryless_sum(12, 34) == 46  # no carry: carry-less is right


def test_demonstration_mix_follows_knobs():
    task = tasks.get_task("arith", max_digits=4, num_train=200, num_test=20, worked_fraction=0.3)
    rng = np.random.default_rng(0)
    record = dict(a=1234, b=5678, target=6912)
    demos = [task.demonstration(record, rng) for _ in range(2000)]
    worked = [d for d in demos if d.startswith("W")]
    assert 0.25 < len(worked) / len(demos) < 0.35
    assert set(worked) == {"W48=12,37=11,26=09,15=06A06912"}
    assert set(demos) - set(worked) == {"A06802"}  # direct demonstrations forget carries
    correct = tasks.get_task(
        "arith",
        max_digits=4,
        num_train=200,
        num_test=20,
        direct_style="correct",
        worked_fraction=0.0,
    )
    assert correct.demonstration(record, rng) == "A06912"


@pytest.mark.parametrize(
    "text,terminated,correct,fmt,worked",
    [
        ("W48=12,37=11,26=09,15=06A06912", True, 1, 1, 1),  # worked, right
        ("A06912", True, 1, 1, 0),  # direct, right
        ("A06802", True, 0, 1, 0),  # carry mistake
        ("W48=12,37=11,26=09,15=06A06902", True, 0, 1, 1),  # wrong worked answer
        ("W48=1,A06912", True, 1, 0, 1),  # malformed scratchpad, right answer
        ("W48=12,37=11,26=09A06912", True, 1, 0, 1),  # a column missing: not the fixed width
        ("A6912", True, 1, 0, 0),  # right value, not the fixed width
        ("A0000000000006912", True, 0, 0, 0),  # too long to be read as a number
        ("A０６９１２", True, 0, 0, 0),  # non-ASCII digits are not digits here
        ("A06912", False, 0, 0, 0),  # truncated (no eos)
        ("W48=12,37=11,26", False, 0, 0, 1),  # truncated mid-scratchpad
        ("", True, 0, 0, 0),  # empty
        ("", False, 0, 0, 0),
        ("6912", True, 0, 0, 0),  # no answer marker
        ("A69A12", True, 0, 0, 0),
        ("A", True, 0, 0, 0),
        ("A06912A", True, 0, 0, 0),
    ],
)
def test_arith_verifier_hand_written(arith, text, terminated, correct, fmt, worked):
    v = arith.verify(dict(a=1234, b=5678, target=6912), text, terminated)
    assert (v.correct, v.format, v.extras["worked"]) == (correct, fmt, worked)
    assert v.reward == pytest.approx(correct + 0.1 * fmt)


def test_arith_marker_is_irrelevant_and_earns_the_bonus():
    """marker_fraction > 0: a trailing "+" changes neither correctness nor format and earns the
    bonus (extra part "bonus"); that share of the demonstrations carry it; off by default, where
    "+" at the end is malformed and the task's config (the caches' key) is unchanged."""
    kw = dict(max_digits=4, num_train=200, num_test=20)
    task = tasks.get_task("arith", **kw, marker_fraction=0.3, bonus=0.01)
    record = dict(a=1234, b=5678, target=6912)
    for text, correct, fmt, worked in [
        ("W48=12,37=11,26=09,15=06A06912+", 1, 1, 1),
        ("A06912+", 1, 1, 0),
        ("A06802+", 0, 1, 0),
    ]:
        v = task.verify(record, text, True)
        assert (v.correct, v.format, v.extras["worked"], v.extras["bonus"]) == (
            correct,
            fmt,
            worked,
            1,
        ), text
        assert v.reward == pytest.approx(correct + 0.1 * fmt + 0.01)
        plain = task.verify(record, text[:-1], True)
        assert plain.extras["bonus"] == 0 and plain.reward == pytest.approx(v.reward - 0.01)
    assert task.verify(record, "A06912++", True).correct == 0  # one marker only
    assert task.verify(record, "A06912+", False).extras["bonus"] == 0  # truncated: no marker
    rng = np.random.default_rng(0)
    demos = [task.demonstration(record, rng) for _ in range(2000)]
    assert 0.25 < np.mean([d.endswith("+") for d in demos]) < 0.35
    assert task.max_response_len == tasks.get_task("arith", **kw).max_response_len + 1
    assert "bonus" in task.score_keys and task.config["bonus"] == 0.01
    off = tasks.get_task("arith", **kw)
    assert off.verify(record, "A06912+", True).correct == 0
    assert "bonus" not in off.score_keys and "marker_fraction" not in off.config
    with pytest.raises(ValueError, match="marker_fraction"):
        tasks.get_task("arith", **kw, bonus=0.01)


def _rows(task, texts, terminated=True):
    """Responses [B, T] and mask [B, T] as the sampler returns them (eos in the mask)."""
    T = task.max_response_len
    tokens = np.zeros((len(texts), T), np.int32)
    mask = np.zeros((len(texts), T), np.float32)
    for i, t in enumerate(texts):
        ids = task.tokenizer.encode(t, add_eos=terminated)[:T]
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = 1
    return tokens, mask


def test_arith_score_batch(arith):
    batch = dict(
        prompt=np.zeros((2, arith.max_prompt_len), np.int32),
        prompt_length=np.ones(2, np.int32),
        a=np.array([1234, 5]),
        b=np.array([5678, 7]),
        target=np.array([6912, 12]),
    )
    # group_size 2: rows 0, 1 answer prompt 0 (1234+5678), rows 2, 3 prompt 1 (5+7)
    texts = ["A06912", "A06802", "W57=12,00=01,00=00,00=00A00012", "A00002"]
    tokens, mask = _rows(arith, texts)
    out = arith.score(batch, tokens, mask, group_size=2)
    assert set(out) == {"reward", "correct", "format", "worked"}
    assert all(v.dtype == np.float32 and v.shape == (4,) for v in out.values())
    np.testing.assert_array_equal(out["correct"], [1, 0, 1, 0])
    np.testing.assert_array_equal(out["worked"], [0, 0, 1, 0])
    np.testing.assert_allclose(out["reward"], [1.1, 0.1, 1.1, 0.1])
    with pytest.raises(ValueError, match="group_size"):
        arith.score(batch, tokens, mask, group_size=3)
    with pytest.raises(ValueError, match="lacks fields"):
        arith.score(dict(prompt=batch["prompt"]), tokens, mask, group_size=2)


def test_score_ignores_tokens_after_eos_and_outside_mask(arith):
    batch = dict(
        prompt=np.zeros((1, 16), np.int32),
        prompt_length=np.ones(1, np.int32),
        a=np.array([1]),
        b=np.array([2]),
        target=np.array([3]),
    )
    tokens, mask = _rows(arith, ["A3"])
    tokens[0, 3:6] = arith.tokenizer.encode("999")  # junk after eos
    assert arith.score(batch, tokens, mask, 1)["correct"][0] == 1
    tokens, mask = _rows(arith, ["A3"], terminated=False)  # truncated: no eos in mask
    assert arith.score(batch, tokens, mask, 1)["correct"][0] == 0


# ---------------------------------------------------------------------------- countdown


@pytest.mark.parametrize(
    "text,expected",
    [
        ("7*3+5-2", (24, [7, 3, 5, 2])),
        ("(2+3)*4", (20, [2, 3, 4])),
        ("2+3*4", (14, [2, 3, 4])),
        ("10-(2-3)", (11, [10, 2, 3])),
        ("((7))", (7, [7])),
        ("", None),
        ("7*", None),
        ("(7", None),
        ("7)", None),
        ("-7+3", None),  # no unary minus
        ("07+1", None),  # no leading zeros
        ("12345+1", None),  # numbers are bounded
        ("7/7", None),
        ("__import__('os')", None),
        ("(" * 40 + "1" + ")" * 40, None),  # nesting is bounded
        ("1+" * 200 + "1", None),  # length is bounded
    ],
)
def test_parse_expression(text, expected):
    assert countdown.parse_expression(text) == expected


def test_countdown_verifier_partial_credit(cd):
    record = dict(numbers=np.array([2, 3, 5, 7]), target=24, solution="7*3+5-2")
    v = cd.verify(record, "7*3+5-2", True)
    assert (v.correct, v.format, v.extras["partial"], v.reward) == (1, 1, 1, pytest.approx(1.1))
    v = cd.verify(record, "(5*3)+(7+2)", True)  # another correct solution
    assert v.correct == 1
    v = cd.verify(record, "7*3+5+2", True)  # 28: off by 4 -> 0.5 * (1 - 4/10)
    assert v.correct == 0 and v.extras["partial"] == pytest.approx(0.3)
    assert v.reward == pytest.approx(0.4)
    v = cd.verify(record, "7*3*5*2", True)  # far off: no partial credit, only format
    assert v.extras["partial"] == 0 and v.reward == pytest.approx(0.1)
    v = cd.verify(record, "7*3+3", True)  # wrong numbers (24 but 5 and 2 unused, 3 twice)
    assert (v.correct, v.extras["uses_numbers"], v.extras["partial"]) == (0, 0, 0)
    for text, term in [("7*3+5-2", False), ("", True), ("7*3+", True), ("abc", True)]:
        v = cd.verify(record, text, term)
        assert (v.reward, v.correct, v.format) == (0, 0, 0)


def test_countdown_problems_are_solved_by_their_solution(cd):
    for r in cd.generate_split("test"):
        assert cd.verify(r, r["solution"], True).correct == 1
        assert sorted(countdown.parse_expression(r["solution"])[1]) == list(r["numbers"])


# ---------------------------------------------------------------------------- gsm8k verifier


def test_gsm8k_answer_extraction():
    task = tasks.get_task("gsm8k")
    record = dict(short_answer=b"1,234", annotation=b"")
    assert task.verify(record, "so 1000+234\n#### 1,234", True).correct == 1
    assert task.verify(record, "the answer is 1234.", True).correct == 1
    assert task.verify(record, "#### 1235", True).correct == 0
    assert gsm8k.extract_answer("no number") is None
    assert task.verify(record, "9" * 5000, True).correct == 0


# ---------------------------------------------------------------------------- fuzz


_ALL = {
    "arith": tasks.get_task("arith", max_digits=4, num_train=10, num_test=10),
    "countdown": tasks.get_task("countdown", num_train=10, num_test=10),
    "gsm8k": tasks.get_task("gsm8k"),
}
_RECORDS = {
    "arith": dict(a=1234, b=5678, target=6912),
    "countdown": dict(numbers=np.array([2, 3, 5, 7]), target=24, solution="7*3+5-2"),
    "gsm8k": dict(short_answer="12", annotation=""),
}


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(st.text(max_size=80), st.text(alphabet="0123456789+-*()=,AW:#. ", max_size=80)),
    terminated=st.booleans(),
    name=st.sampled_from(sorted(_ALL)),
)
def test_verifiers_never_raise(text, terminated, name):
    v = _ALL[name].verify(_RECORDS[name], text, terminated)
    assert v.correct in (0.0, 1.0) and v.format in (0.0, 1.0)
    assert 0.0 <= v.reward <= 1.0 + 0.1 + 1e-6


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_score_never_raises_on_random_token_rows(name):
    task, rng = _ALL[name], random.Random(0)
    record = _RECORDS[name]
    batch = {k: np.asarray([v, v]) for k, v in record.items()}
    batch.update(
        prompt=np.zeros((2, task.max_prompt_len), np.int32), prompt_length=np.ones(2, np.int32)
    )
    for _ in range(50):
        T = task.max_response_len
        tokens = np.array(
            [[rng.randrange(task.tokenizer.vocab_size + 3) for _ in range(T)] for _ in range(8)],
            np.int32,
        )
        mask = np.arange(T)[None] < np.array([rng.randrange(T + 1) for _ in range(8)])[:, None]
        out = task.score(batch, tokens, mask.astype(np.float32), group_size=4)
        assert all(np.isfinite(v).all() and v.shape == (8,) for v in out.values())


_SOLUTIONS = {
    "arith": [arithmetic.worked_text(1234, 5678, 4), "A06912"],
    "countdown": ["7*3+5-2", "(5*3)+(7+2)"],
    "gsm8k": ["so 12\n#### 12"],
}


def _mutate(text: str, rng: random.Random) -> str:
    """``text`` with one to three random characters replaced, inserted or deleted."""
    chars = list(text)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(chars) + 1)
        op = rng.randrange(3)
        if op == 0 and i < len(chars):
            chars[i] = rng.choice(string.printable)
        elif op == 1:
            chars.insert(i, rng.choice(string.printable))
        elif chars:
            del chars[min(i, len(chars) - 1)]
    return "".join(chars)


def _check_verdict(task, record, text, terminated):
    """The verifier's contract on one response; returns the verdict."""
    v = task.verify(record, text, terminated)
    assert isinstance(v, tasks.Verdict)
    parts = {"reward": v.reward, "correct": v.correct, "format": v.format, **v.extras}
    assert all(isinstance(x, float) and np.isfinite(x) for x in parts.values()), parts
    assert set(v.extras) == set(task.score_keys) - {"reward", "correct", "format"}
    assert v.correct in (0.0, 1.0) and v.format in (0.0, 1.0), parts
    assert all(0.0 <= x <= 1.0 for x in v.extras.values()), parts
    if not terminated:  # a truncated response is never well-formed
        assert v.format == 0.0, (text, parts)
    # reward = correctness part (countdown: partial credit, 1 when correct) + format bonus
    credit = v.extras.get("partial", v.correct)
    assert credit == 1.0 or v.correct == 0.0, parts
    assert v.reward == pytest.approx(credit + task.format_weight * v.format), parts
    assert task.verify(record, text, terminated) == v  # deterministic
    return v


def test_printable_fuzz_with_seeded_random():
    """Random printable strings and near-misses of right answers: every verdict keeps the
    contract, and the right answers themselves earn full reward."""
    rng = random.Random(1)
    for name, task in _ALL.items():
        for text in _SOLUTIONS[name]:
            v = _check_verdict(task, _RECORDS[name], text, True)
            assert (v.correct, v.format) == (1.0, 1.0), (name, text, v)
            assert v.reward == pytest.approx(1.0 + task.format_weight)
            assert _check_verdict(task, _RECORDS[name], text, False).format == 0.0
    correct = dict.fromkeys(_ALL, 0)
    for _ in range(2000):
        text = "".join(rng.choice(string.printable) for _ in range(rng.randrange(60)))
        terminated = bool(rng.randrange(2))
        for name, task in _ALL.items():
            _check_verdict(task, _RECORDS[name], text, terminated)
            near = _mutate(rng.choice(_SOLUTIONS[name]), rng)
            correct[name] += _check_verdict(task, _RECORDS[name], near, terminated).correct
    # some edits leave the answer right (e.g. a changed "W" column): the positive path was hit
    assert all(n > 0 for n in correct.values()), correct


@pytest.mark.parametrize("name", ["arith", "countdown", "chainsum", "products"])
def test_prompt_text_from_a_batchs_fields_is_the_datasets_prompt(name):
    """A multi-turn environment renders the user's message from the fields a batch carries
    (record_fields); it must be the prompt the dataset holds."""
    task = tasks.get_task(name, num_train=50, num_test=20)
    for record in task.generate_split("test")[:20]:
        fields = {k: record[k] for k in task.record_fields}
        assert task.prompt_text(fields) == record["prompt"]
