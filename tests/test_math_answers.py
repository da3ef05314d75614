"""Math answers (gspo_jax/tasks/math_answers.py): extraction, equivalence through math-verify, the
bounds that keep a verdict 0/1 and quick on garbage (also off the main thread), the answer corpus
(tests/math_answer_corpus.py: every class of MATH answer, its rewrites and near misses, scored
once through the worker pool of gspo_jax/tasks/scoring.py), the pool's limit, and the gsm8k and
math tasks scoring through it (tests/data/gsm8k_sample.jsonl)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import math_answer_corpus as corpus
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gspo_jax import data, tasks
from gspo_jax.tasks import gsm8k, scoring
from gspo_jax.tasks import math_answers as ma

FIXTURE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"
TIME_BOUND_S = 5.0  # one verdict: the input bounds keep each well under a second

# (reference, response): the response's final answer equals the reference
EQUIVALENT = [
    ("0.5", r"so the answer is \boxed{\frac{1}{2}}"),
    ("1/2", r"\boxed{\dfrac{1}{2}}"),
    (r"\frac{1}{2}", "#### 0.5"),
    ("0.5", "#### 1/2"),
    (r"\dfrac{3}{4}", r"\boxed{0.75}"),
    ("1000", "#### 1,000"),
    ("1,000", "The answer is 1000."),
    ("1234567", r"\boxed{1,234,567}"),
    ("5", "It costs $5."),
    ("5", r"\boxed{\$5}"),
    ("5", "She pays 5 dollars."),
    ("5", r"\boxed{5 \text{ dollars}}"),
    ("5", r"\boxed{\text{5}}"),
    ("3", "#### 3.0"),
    ("3.0", r"\boxed{3}"),
    ("-7", "#### -7"),
    ("-7", "it fell to \u22127 degrees"),  # unicode minus
    ("50", "#### 50%"),
    (r"50\%", r"\boxed{0.5}"),
    (r"\frac{\sqrt{2}}{2}", r"\boxed{\sqrt{2}/2}"),
    (r"\sqrt{2}", r"\boxed{2^{1/2}}"),
    (r"2\sqrt{3}", r"\boxed{\sqrt{12}}"),
    ("2^{10}", r"\boxed{1024}"),
    ("42", r"\boxed{x = 42}"),
    ("18", r"so \boxed{18}. Check: 18 = 9 * 2"),  # the box wins over later numbers
    ("42", "#### 42 (from 6 * 7)"),  # the first number after the marker
    ("42", r"\boxed{41}? No: \boxed{42}"),  # the last box
    ("42", r"\boxed{42} and then \boxed{43"),  # the last *complete* box
    ("1/3", "#### 0.333333"),  # math-verify rounds to 6 decimals
]

NOT_EQUIVALENT = [
    ("0.5", r"\boxed{\frac{1}{3}}"),
    ("1000", "#### 100"),
    ("42", "#### 41"),
    ("3", "#### 3.01"),
    ("-7", "#### 7"),
    ("-7", "10-7"),  # a subtraction, not a negative answer: the last number is 7
    ("42", r"\boxed{42, 43}"),  # hedging between answers
    ("42", r"\boxed{x}"),
    ("42", r"\boxed{42} was my guess, but \boxed{41}"),
    ("42", "I think 42, or maybe 43"),  # last number: 43
    ("42", "42\n#### 41"),  # the marker wins over earlier numbers
    ("1/3", "#### 0.33"),
    ("18", "#### eighteen"),
]

GARBAGE = [
    "",
    " ",
    "####",
    r"\boxed{}",
    r"\boxed{",
    "}{",
    "{" * 300,
    "}" * 300 + "{",
    r"\boxed{" * 100,
    "9" * 5000,
    "#### " + "9" * 5000,
    r"\boxed{" + "9" * 5000 + "}",
    r"\boxed{9^{9^{9}}}",  # 9^387420489: rejected before SymPy computes it
    r"\boxed{10^{10^{10}}}",
    r"\boxed{99999999!}",
    r"\boxed{((10^{999})^{99})^{99}}",
    r"\boxed{e^{10^{10}}}",
    "\u2603 \u00e9 \U0001f600 \u202e",
    "\x00\x01\x7f",
    r"\frac{",
    r"\boxed{\frac{}{}}",
    r"\boxed{\sqrt{}}",
    "$$$$",
    r"\boxed{1/0}",
    r"\boxed{0/0}",
    r"\boxed{\infty}",
    "nan inf",
    r"\boxed{\begin{pmatrix} 1 & 2 \end{pmatrix}}",
    r"\boxed{" + "{" * 120 + "1" + "}" * 120 + "}",
    r"\boxed{\left(\right.}",
]


def _verdict(reference: str, response: str) -> float:
    start = time.perf_counter()
    verdict, _ = ma.score_response(reference, response)
    elapsed = time.perf_counter() - start
    assert verdict in (0.0, 1.0) and isinstance(verdict, float), verdict
    assert elapsed < TIME_BOUND_S, (response[:80], elapsed)
    return verdict


@pytest.mark.parametrize("reference,response", EQUIVALENT)
def test_equivalent_answers(reference, response):
    assert _verdict(reference, response) == 1.0


@pytest.mark.parametrize("reference,response", NOT_EQUIVALENT)
def test_different_answers(reference, response):
    assert _verdict(reference, response) == 0.0


@pytest.mark.parametrize("response", GARBAGE)
def test_garbage_scores_zero(response):
    assert _verdict("42", response) == 0.0
    assert not ma.is_equivalent(response, "42")  # garbage as the reference: no raise either


def test_extraction_rules():
    E = ma.Extracted
    assert ma.extract_answer(r"\boxed{\frac{1}{2}}") == E(r"\frac{1}{2}", "boxed")
    assert ma.extract_answer(r"\fbox{7} then \boxed{ \{1, 2\} }") == E(r"\{1, 2\}", "boxed")
    assert ma.extract_answer(r"\boxed{3} and \boxed{4") == E("3", "boxed")
    assert ma.extract_answer(r"\boxed{} 12") == E("12", "last_number")
    assert ma.extract_answer("work 5 + 6\n#### 1,000 dollars. 7") == E("1,000", "####")
    assert ma.extract_answer("#### none, so 8") == E("8", "####")  # the first number after it
    assert ma.extract_answer("so 3/4 of them") == E("3/4", "last_number")
    assert ma.extract_answer("10-3=7") == E("7", "last_number")
    assert ma.extract_answer("it is -2.5.") == E("-2.5", "last_number")
    assert ma.extract_answer("a 25 % rise") == E("25 %", "last_number")
    for text in ["", "no number", "####", r"\boxed{}", "1" * (ma.MAX_ANSWER_CHARS + 1)]:
        assert ma.extract_answer(text) is None, text
    assert gsm8k.extract_answer("so 12\n#### 12") == "12"


def test_reference_answer():
    assert ma.reference_answer("Half of 84 is <<84/2=42>>42.\n#### 42") == "42"
    assert ma.reference_answer(r"So $x = \boxed{\frac{\pi}{2}}$.") == r"\frac{\pi}{2}"
    assert ma.reference_answer(" 17 ") == "17"


def test_no_alarm_decides_a_verdict(monkeypatch):
    """math-verify is always called with its time limits off (a verdict must not depend on the
    machine's load), and still answers correctly, and quickly on a tower, off the main thread."""
    import math_verify

    seen = []
    parse, verify = math_verify.parse, math_verify.verify

    def spy_parse(*args, **kwargs):
        seen.append(("parse", kwargs["parsing_timeout"]))
        return parse(*args, **kwargs)

    def spy_verify(*args, **kwargs):
        seen.append(("verify", kwargs["timeout_seconds"]))
        return verify(*args, **kwargs)

    ma._parse.cache_clear()  # parses are cached: make this test's calls reach the library
    monkeypatch.setattr(math_verify, "parse", spy_parse)
    monkeypatch.setattr(math_verify, "verify", spy_verify)
    assert ma.is_equivalent("0.5", r"\frac{1}{2}")
    results = {}

    def work():
        results["right"] = ma.score_response("0.5", r"\boxed{\dfrac{1}{2}}")[0]
        results["wrong"] = ma.score_response("0.5", "#### 0.6")[0]
        results["tower"] = ma.score_response("42", r"\boxed{9^{9^{9}}}")[0]
        results["expansion"] = ma.score_response("1", r"\boxed{(x+y+z)^{20}}")[0]

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(60)  # without the size guards the tower and the expansion would run for long
    assert not thread.is_alive()
    assert results == {"right": 1.0, "wrong": 0.0, "tower": 0.0, "expansion": 0.0}
    assert {kind for kind, _ in seen} == {"parse", "verify"}
    assert all(t is None for _, t in seen), seen


_SOUP = st.sampled_from(
    [r"\frac", "{", "}", "^", r"\sqrt", "2", "9", "0", "!", r"\boxed{", "####", " ", "-", "/"]
    + [".", ",", "%", r"\text{", "x", r"\$", "$", "\n", "(", ")", "=", r"\left(", r"\right)"]
)


@settings(max_examples=150, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.lists(_SOUP, max_size=60).map("".join),
        st.integers(0, 400).map(lambda n: r"\boxed{" + "{" * n + "42" + "}" * n + "}"),
        st.integers(0, 400).map(lambda n: r"\boxed{" + "{" * n + "42"),
        st.integers(1, 6000).map(lambda n: "#### " + "9" * n),
        st.integers(1, 6000).map(lambda n: r"\boxed{1" + "0" * n + "}"),
    )
)
def test_fuzz_verdicts_are_binary_and_quick(text):
    _verdict("42", text)
    _verdict(r"\frac{1}{2}", text)


@settings(max_examples=60, deadline=None)
@given(prefix=st.text(max_size=120))
def test_a_final_box_is_the_answer_whatever_precedes_it(prefix):
    assert _verdict("42", prefix + "\n\\boxed{42}") == 1.0
    assert _verdict("42", prefix + "\n\\boxed{43}") == 0.0


# ------------------------------------------------------------------------------ answer corpus


@pytest.fixture(scope="module")
def corpus_verdicts():
    """Every corpus case scored once, through the shared pool (two workers: what the test
    machine has), as {case: correct}. A (gold, answer) pair that two templates share is
    compared once: the verdict depends on the pair alone."""
    cases = corpus.cases()
    found = [ma.extract_answer(c.response) for c in cases]
    assert all(f is not None and f.source == "boxed" for f in found)
    pairs = [(c.gold, f.text) for c, f in zip(cases, found, strict=True)]
    distinct = list(dict.fromkeys(pairs))
    results = dict(zip(distinct, scoring.score_batch(distinct, workers=2), strict=True))
    assert [r.timeouts for r in results.values()] == [0] * len(distinct)
    # (pool = in-process verdicts: test_math_task_score_equals_verify_row_by_row)
    return {c: results[p].correct for c, p in zip(cases, pairs, strict=True)}


@pytest.mark.parametrize("cls", [*corpus.CLASSES, "multi_box"])
def test_corpus_near_misses_score_0_and_rewrites_1(cls, corpus_verdicts):
    got = {c: v for c, v in corpus_verdicts.items() if c.cls == cls}
    assert {c.kind for c in got} == {"equal", "near"}  # every class has both
    false_positives = [(c.gold, c.response) for c, v in got.items() if c.kind == "near" and v]
    assert false_positives == []
    false_negatives = {(c.gold, c.answer) for c, v in got.items() if c.kind == "equal" and not v}
    assert false_negatives == {k for k in corpus.KNOWN_FALSE_NEGATIVES if k in false_negatives}
    for c in got:  # the known ones are still not shown equal (else the list is stale)
        if (c.gold, c.answer) in corpus.KNOWN_FALSE_NEGATIVES:
            assert (c.gold, c.answer) in false_negatives


def test_known_false_negatives_are_in_the_corpus():
    cases = {(c.gold, c.answer) for c in corpus.cases() if c.kind == "equal"}
    assert set(corpus.KNOWN_FALSE_NEGATIVES) <= cases


def test_pool_counts_logs_and_retries_what_runs_past_its_limit(caplog):
    """A worker that dies (killed here) has its pair retried in a fresh one (attempt 1); with a
    limit of 0 s the retry runs past it (attempt 2 of ATTEMPTS): the pair scores 0, both logged,
    the expiry counted. The pool scores normally afterwards. (Three process starts in all.)"""
    assert scoring.ATTEMPTS == 2
    pool = scoring.Pool(1)
    try:
        pool.workers[0].process.kill()
        pool.workers[0].process.join()
        with caplog.at_level("WARNING", logger=scoring.__name__):
            (result,) = pool.map([("1/2", "0.5")], limit_s=0.0)
        messages = [r.getMessage() for r in caplog.records]
        assert result == scoring.Result(0.0, timeouts=1)
        assert [("killed its worker" in m, "ran past 0 s" in m) for m in messages] == [
            (True, False),
            (False, True),
        ]
        assert "retrying" in messages[0] and "scored 0" in messages[1]
        assert pool.map([("1/2", "0.5"), ("1/2", "0.6")]) == [
            scoring.Result(1.0),
            scoring.Result(0.0),
        ]
    finally:
        pool.close()


def _math_task():
    """A MathTask without a data folder (verify and score read only records and responses)."""
    import string

    from gspo_jax.tasks import math_problems
    from gspo_jax.tasks.tokenizer import CharTokenizer

    task = object.__new__(math_problems.MathTask)
    task.format_weight, task.tokenizer = 0.1, CharTokenizer(string.printable)
    return task


def test_math_task_counts_only_boxed_answers():
    """MATH's answers are expressions: the last number of an unboxed response is one number
    read out of one (of "6 - 5i" here), so it never counts as correct; GSM8K keeps the rule."""
    record = {"problem": "p", "solution": r"\boxed{5}", "answer": "5"}
    task = _math_task()
    v = task.verify(record, "so z = 6 - 5i", True)
    assert (v.correct, v.format) == (0.0, 0.0)
    v = task.verify(record, r"so z = \boxed{5}", True)
    assert (v.correct, v.format, v.extras) == (1.0, 1.0, {"verify_timeouts": 0.0})
    assert tasks.get_task("gsm8k").verify({"short_answer": "5"}, "so z = 6 - 5", True).correct == 1


def test_math_task_score_equals_verify_row_by_row(corpus_verdicts):
    """task.score (the pool) and task.verify (in-process) agree on a batch of corpus responses,
    unterminated rows and rows without a box included; verify_timeouts is 0 on every row."""
    task = _math_task()
    tok = task.tokenizer
    cases = list(corpus_verdicts)[::17][:40]  # P = 40 prompts, G = 1, every class
    texts = [c.response for c in cases[:-2]] + ["so z = 6 - 5i", r"\boxed{12"]
    batch = {
        "prompt": np.zeros((len(cases), 1), np.int32),
        "problem": np.array(["p"] * len(cases)),
        "solution": np.array(["s"] * len(cases)),
        "answer": np.array([c.gold for c in cases]),
    }
    T = max(len(t) for t in texts) + 1
    rows = np.full((len(texts), T), tok.pad_id, np.int32)
    mask = np.zeros((len(texts), T), np.float32)
    for b, text in enumerate(texts):
        ids = tok.encode(text, add_eos=b % 3 != 0)  # every third row truncated (no eos)
        rows[b, : len(ids)], mask[b, : len(ids)] = ids, 1
    scores = task.score(batch, rows, mask, group_size=1)
    assert set(scores) == set(task.score_keys)
    for b, (c, text) in enumerate(zip(cases, texts, strict=True)):
        v = task.verify({"answer": c.gold}, text, b % 3 != 0)
        assert (scores["reward"][b], scores["correct"][b], scores["format"][b]) == (
            np.float32(v.reward),
            v.correct,
            v.format,
        ), (c, text)
    np.testing.assert_array_equal(scores["verify_timeouts"], 0.0)
    assert scores["correct"].any() and not scores["correct"].all()


# ------------------------------------------------------------------------------ gsm8k task


@pytest.fixture(scope="module")
def records():
    return gsm8k.read_jsonl(FIXTURE)


def test_fixture_is_in_the_gsm8k_format(records):
    lines = FIXTURE.read_text().splitlines()
    assert len(records) == len(lines) == 20
    for line, r in zip(lines, records, strict=True):
        ex = json.loads(line)
        assert set(ex) == {"question", "answer"}
        annotation, short = ex["answer"].split("#### ")  # as the TFDS builder splits it
        assert (r["annotation"], r["short_answer"], r["question"]) == (
            annotation,
            short,
            ex["question"],
        )


def test_gsm8k_examples_need_the_marker():
    with pytest.raises(ValueError, match="####"):
        gsm8k.record_from_example({"question": "q", "answer": "no final answer"})


def _perturbed(short: str) -> str:
    return f"{float(short.replace(',', '')) + 1:g}"


def test_gsm8k_task_scores_the_fixture(records):
    task = tasks.get_task("gsm8k")
    rng = np.random.default_rng(0)
    for r in records:
        right = [
            task.demonstration(r, rng),
            r["answer"],
            f"{r['annotation']}The answer is \\boxed{{{r['short_answer']}}}.",
        ]
        for text in right:
            v = task.verify(r, text, True)
            assert (v.correct, v.format, v.reward) == (1.0, 1.0, pytest.approx(1.1)), text
        wrong = [
            f"{r['annotation']}#### {_perturbed(r['short_answer'])}",
            f"\\boxed{{{_perturbed(r['short_answer'])}}}",
            r["annotation"] + "#### 0",  # the marker wins over the right numbers before it
        ]
        for text in wrong:
            v = task.verify(r, text, True)
            assert (v.correct, v.reward) == (0.0, pytest.approx(0.1)), text
        # no marker: the last number is read (right here), but the format part is 0
        v = task.verify(r, f"so it is {r['short_answer']}.", True)
        assert (v.correct, v.format) == (1.0, 0.0)


def test_gsm8k_score_through_token_ids(records):
    """The character-tokenizer path end to end: records -> batch (data.encode_record) ->
    response ids -> task.score."""
    task = tasks.get_task("gsm8k")
    tok = task.tokenizer
    batch = data.collate([data.encode_record(task, r) for r in records])
    T = task.max_response_len
    texts = []
    for r in records:
        texts += [task.demonstration(r, None), f" #### {_perturbed(r['short_answer'])}"]
    rows = np.full((len(texts), T), tok.pad_id, np.int32)
    mask = np.zeros((len(texts), T), np.float32)
    for b, text in enumerate(texts):
        ids = tok.encode(text, add_eos=True)
        rows[b, : len(ids)], mask[b, : len(ids)] = ids, 1
    scores = task.score(batch, rows, mask, group_size=2)
    np.testing.assert_array_equal(scores["correct"], [1.0, 0.0] * len(records))
    np.testing.assert_array_equal(scores["format"], np.ones(len(texts)))
