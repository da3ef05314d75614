"""Datasets from files (gspo_jax/data/files.py) for the gsm8k and math tasks: the released JSONL
and Hugging Face parquet layouts, the content-keyed array_record cache, one-line errors naming the
file and line, a TFDS-prepared catalogue folder, gold answers scoring 1 through each task's own
scoring, and over-long demonstrations dropped from the warm start with a count."""

import concurrent.futures
import json
import os
import time
from pathlib import Path

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gspo_jax import config as config_lib
from gspo_jax import data, tasks
from gspo_jax.data import files as data_files
from gspo_jax.rl import build, warmstart
from gspo_jax.tasks import gsm8k, math_problems

FIXTURE = Path(__file__).parent / "data" / "gsm8k_sample.jsonl"
GSM_ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
TRAIN, TEST = GSM_ROWS[:14], GSM_ROWS[14:]

# MATH-style rows: worked LaTeX solutions with boxed answers in several notations; MATH-500's
# release adds "answer", the original MATH does not (it is then the last \boxed{} of the solution).
MATH_ROWS = [
    dict(
        problem="What is $\\frac{1}{2} + \\frac{1}{3}$?",
        solution="The common denominator is 6: $\\frac36 + \\frac26 = \\boxed{\\frac{5}{6}}$.",
        answer="\\frac{5}{6}",
    ),
    dict(
        problem="Simplify $\\sqrt{50}$.",
        solution="$\\sqrt{50} = \\sqrt{25 \\cdot 2} = \\boxed{5\\sqrt{2}}$.",
    ),
    dict(
        problem="Solve $x^2 = 9$ for $x > 0$.",
        solution="Taking square roots, $x = \\pm 3$; the positive root is $\\boxed{3}$.",
        answer="3",
    ),
    dict(
        problem="For which $x$ is $x - 2 > 0$?",
        solution="Adding 2 gives $x > 2$, i.e. $x \\in \\boxed{(2, \\infty)}$.",
    ),
    dict(
        problem="What is $0.25$ as a fraction?",
        solution="$0.25 = \\frac{25}{100} = \\boxed{\\dfrac{1}{4}}$.",
        answer="\\frac{1}{4}",
    ),
]


def _jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The GSM8K sample as OpenAI released it (train.jsonl / test.jsonl) and as Hugging Face does
    (main/train-0000i-of-00002.parquet in two shards, main/test-00000-of-00001.parquet)."""
    root = tmp_path_factory.mktemp("files")
    _jsonl(root / "jsonl" / "train.jsonl", TRAIN)
    _jsonl(root / "jsonl" / "test.jsonl", TEST)
    hf = root / "hf" / "main"
    _parquet(hf / "train-00000-of-00002.parquet", TRAIN[:8])
    _parquet(hf / "train-00001-of-00002.parquet", TRAIN[8:])
    _parquet(hf / "test-00000-of-00001.parquet", TEST)
    _jsonl(root / "math" / "test.jsonl", MATH_ROWS)
    _parquet(root / "math" / "train-00000-of-00001.parquet", MATH_ROWS[::-1])
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def _records(task, split, data_dir):
    source = data.load_source(task, split, data_dir)
    return [source[i] for i in range(len(source))]


def test_jsonl_and_parquet_folders_load_with_counts_and_fields(folders, data_dir):
    want = {"train": [gsm8k.record_from_example(r) for r in TRAIN]}
    want["test"] = [gsm8k.record_from_example(r) for r in TEST]
    for layout in ("jsonl", "hf"):  # "hf": the parquet shards one level down, in main/
        task = tasks.get_task("gsm8k", data_path=str(folders / layout))
        for split in ("train", "test"):
            got = _records(task, split, data_dir)
            assert len(got) == {"train": 14, "test": 6}[split]
            assert got == want[split]  # question, answer, annotation, short_answer; in order
        batch = next(data.make_train_iterator(task, batch_size=4, seed=0, data_dir=data_dir))
        assert batch["prompt"].shape == (4, task.max_prompt_len)
        # the question too: a multi-turn environment renders it as the user's message
        assert set(batch) == {"prompt", "prompt_length", "short_answer", "annotation", "question"}
        short = {r["short_answer"] for r in want["train"]}
        assert set(batch["short_answer"].tolist()) <= short
    assert sorted(data.prepare(task, data_dir)) == ["test", "train"]


def test_conversion_is_cached_and_keyed_by_content(folders, data_dir, tmp_path):
    folder = tmp_path / "g"
    _jsonl(folder / "train.jsonl", TRAIN)
    _jsonl(folder / "test.jsonl", TEST)
    task = tasks.get_task("gsm8k", data_path=str(folder))
    first = data_files.prepare_split(task, "train", data_dir)
    mtime = os.stat(first).st_mtime_ns
    assert data_files.prepare_split(task, "train", data_dir) == first  # not converted again
    assert os.stat(first).st_mtime_ns == mtime
    key = task.data_fingerprint()
    _jsonl(folder / "train.jsonl", TRAIN[:5])  # an edited file is another dataset
    second = data_files.prepare_split(task, "train", data_dir)
    assert second != first and len(data.load_source(task, "train", data_dir)) == 5
    assert task.data_fingerprint() != key


def test_runs_started_together_convert_once(folders, tmp_path, monkeypatch):
    """Concurrent first reads (parallel runs, a pod's hosts) convert a split once, under the
    entry's file lock; the others wait and read the same file (threads here: flock excludes
    open files, not processes)."""
    calls, convert = [], data_files._write_records

    def slow_convert(*args):
        calls.append(1)
        time.sleep(0.3)  # wide enough for the others to find the entry missing too
        return convert(*args)

    monkeypatch.setattr(data_files, "_write_records", slow_convert)
    task = tasks.get_task("gsm8k", data_path=str(folders / "jsonl"))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        paths = list(
            pool.map(lambda _: data_files.prepare_split(task, "train", str(tmp_path)), range(3))
        )
    assert len(calls) == 1 and len(set(paths)) == 1
    assert len(data_files.JsonRecords(paths[0])) == len(TRAIN)


def _one_line_error(exc_type, fn, *match):
    with pytest.raises(exc_type) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text, text
    for m in match:
        assert m in text, text
    return text


def test_bad_files_give_one_line_errors_naming_them(folders, data_dir, tmp_path):
    bad = tmp_path / "bad"
    lines = [json.dumps(r) for r in TRAIN[:3]]
    (bad / "train.jsonl").parent.mkdir()
    (bad / "train.jsonl").write_text("\n".join([*lines[:2], '{"question": "q", "answer"', *lines]))
    _jsonl(bad / "test.jsonl", [{"question": "How many?", "answer": "It is 4."}])
    task = tasks.get_task("gsm8k", data_path=str(bad))
    train = str(bad / "train.jsonl")
    _one_line_error(
        ValueError, lambda: data.load_source(task, "train", data_dir), f"{train}:3", "malformed"
    )
    test = str(bad / "test.jsonl")
    _one_line_error(
        ValueError, lambda: data.load_source(task, "test", data_dir), f"{test}:1", "####"
    )
    _jsonl(bad / "test.jsonl", [{"problem": "How many?", "answer": "#### 4"}])
    _one_line_error(
        ValueError, lambda: data.load_source(task, "test", data_dir), f"{test}:1", "'question'"
    )
    broken = tmp_path / "broken" / "main"
    _parquet(broken / "test-00000-of-00001.parquet", TEST)
    (broken / "train-00000-of-00001.parquet").write_bytes(b"PAR1 not really")
    task = tasks.get_task("gsm8k", data_path=str(broken.parent))
    _one_line_error(
        ValueError,
        lambda: data.load_source(task, "train", data_dir),
        str(broken / "train-00000-of-00001.parquet"),
        "not a readable parquet file",
    )
    assert not list((Path(data_dir) / "files").glob("*/*.tmp-*"))  # nothing half-written is left
    only_test = tmp_path / "only_test"
    _jsonl(only_test / "test.jsonl", TEST)
    task = tasks.get_task("gsm8k", data_path=str(only_test))
    _one_line_error(
        data_files.DataFileError,
        lambda: data.load_source(task, "train", data_dir),
        "no 'train' split",
    )
    cfg = ml_collections.ConfigDict(dict(eval=dict(split="test", num_problems=8)))
    with pytest.raises(config_lib.ConfigError, match=r"has no \['train'\] split"):
        build.check_eval_split(cfg, task)  # a run fails at validation, before any work
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "train.csv").write_text("question,answer\n")
    _one_line_error(
        ValueError,
        lambda: tasks.get_task("gsm8k", data_path=str(tmp_path / "csv")),
        "unknown dataset layout",
        "train.csv",
    )
    _one_line_error(
        ValueError,
        lambda: tasks.get_task("gsm8k", data_path=str(tmp_path / "nowhere")),
        "is not a folder",
    )
    two = tmp_path / "two"  # GSM8K's Hugging Face repository has two configurations
    _parquet(two / "main" / "train-00000-of-00001.parquet", TRAIN)
    _parquet(two / "socratic" / "train-00000-of-00001.parquet", TRAIN)
    _one_line_error(
        ValueError, lambda: tasks.get_task("gsm8k", data_path=str(two)), "main, socratic"
    )
    _one_line_error(ValueError, lambda: tasks.get_task("math"), "data_path")


def test_tfds_prepared_array_record_folder_is_accepted(tmp_path):
    """A folder prepared by TFDS's own gsm8k builder in array_record format (here from the
    fixture instead of the download) is found by name and accepted by the format check."""
    from tensorflow_datasets.text.gsm8k import gsm8k as tfds_gsm8k

    class LocalGsm8k(tfds_gsm8k.Gsm8k, skip_registration=True):
        name = "gsm8k"

        def _split_generators(self, dl_manager):
            return {s: self._generate_examples(str(FIXTURE)) for s in ("train", "test")}

    LocalGsm8k(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    task = tasks.get_task("gsm8k")
    source = data.load_source(task, "test", tmp_path)
    assert len(source) == len(GSM_ROWS)
    got = {gsm8k.as_str(source[i]["question"]): source[i] for i in range(len(source))}
    for row in GSM_ROWS:
        want = gsm8k.record_from_example(row)
        assert gsm8k.as_str(got[row["question"]]["short_answer"]) == want["short_answer"]
    batches = data.make_eval_batches(task, "test", batch_size=8, data_dir=tmp_path)
    assert sum(n for _, n in batches) == len(GSM_ROWS)
    # first: a slice from that record on (negative counts from the end), e.g. the warm start's
    # stopping rule on the last problems, which RL's evaluation of the first ones never sees.
    (last, n), *_ = data.make_eval_batches(task, "test", batch_size=8, data_dir=tmp_path, first=-1)
    assert n == 1
    np.testing.assert_array_equal(last["prompt"][0], batches[-1][0]["prompt"][batches[-1][1] - 1])
    # more from the end than the split holds: all of it (a stopping rule on a small split)
    every = data.make_eval_batches(task, "test", batch_size=8, data_dir=tmp_path, first=-1000)
    assert sum(n for _, n in every) == len(GSM_ROWS)
    np.testing.assert_array_equal(every[0][0]["prompt"], batches[0][0]["prompt"])
    with pytest.raises(ValueError, match="selects no problem"):
        data.make_eval_batches(task, "test", batch_size=8, data_dir=tmp_path, first=len(GSM_ROWS))


def _score_gold(task, data_dir, split="test"):
    """The task's demonstrations of a split as response rows, scored by task.score."""
    scores = []
    for batch, n in data.make_eval_batches(task, split, batch_size=8, data_dir=data_dir):
        records = [task.record_from_batch(batch, p) for p in range(len(batch["prompt"]))]
        ids = [task.tokenizer.encode(task.demonstration(r, None), add_eos=True) for r in records]
        T = max(map(len, ids))
        tokens = np.full((len(ids), T), task.tokenizer.pad_id, np.int32)
        mask = np.zeros((len(ids), T), np.float32)
        for b, row in enumerate(ids):
            tokens[b, : len(row)], mask[b, : len(row)] = row, 1.0
        out = task.score(batch, tokens, mask, group_size=1)
        scores.append({k: v[:n] for k, v in out.items()})
    return {k: np.concatenate([s[k] for s in scores]) for k in scores[0]}


def test_gold_answers_score_one_through_the_task(folders, data_dir):
    task = tasks.get_task("gsm8k", data_path=str(folders / "hf"), max_response_len=512)
    out = _score_gold(task, data_dir)
    assert len(out["correct"]) == len(TEST)
    np.testing.assert_array_equal(out["correct"], 1.0)
    np.testing.assert_array_equal(out["format"], 1.0)  # "#### <answer>", terminated


def test_math_records_and_gold_solutions_score_one(folders, data_dir):
    task = tasks.get_task("math", data_path=str(folders / "math"), max_response_len=256)
    assert task.record_fields == ("problem", "solution", "answer")
    test = _records(task, "test", data_dir)
    assert [r["answer"] for r in test] == [
        "\\frac{5}{6}",
        "5\\sqrt{2}",  # no "answer" field: the last \boxed{} of the solution
        "3",
        "(2, \\infty)",
        "\\frac{1}{4}",
    ]
    assert [r["problem"] for r in test] == [r["problem"] for r in MATH_ROWS]
    assert len(_records(task, "train", data_dir)) == len(MATH_ROWS)  # the parquet split
    batch, n = data.make_eval_batches(task, "test", batch_size=8, data_dir=data_dir)[0]
    assert task.record_from_batch(batch, 1) == test[1]  # problem, solution, answer come back
    out = _score_gold(task, data_dir)
    np.testing.assert_array_equal(out["correct"], 1.0)
    np.testing.assert_array_equal(out["format"], 1.0)
    wrong = task.verify(test[0], "so it is $\\boxed{\\frac{1}{6}}$", True)
    assert wrong.correct == 0.0 and wrong.format == 1.0
    with pytest.raises(ValueError, match="boxed"):
        math_problems.record_from_example({"problem": "p", "solution": "no box"})


def test_over_long_demonstrations_are_dropped_and_counted(folders, data_dir, capsys):
    """Character mode: GSM8K's demonstrations are a few hundred characters; with a T shorter
    than some, those are skipped (and counted), and only a split where none fits is an error,
    raised at the first batch."""
    task = tasks.get_task("gsm8k", data_path=str(folders / "jsonl"))
    records = [gsm8k.record_from_example(r) for r in TRAIN]
    lengths = [
        len(task.tokenizer.encode(task.demonstration(r, None), add_eos=True)) for r in records
    ]
    T = sorted(lengths)[len(lengths) // 2]  # about half fit
    task = tasks.get_task("gsm8k", data_path=str(folders / "jsonl"), max_response_len=T)
    stats = warmstart.DemonstrationStats()
    it = warmstart.demonstration_iterator(task, 4, seed=0, data_dir=data_dir, stats=stats)
    for _ in range(8):  # over two epochs of the fitting half
        batch = next(it)
        assert batch["response"].shape == (4, T) and (batch["mask"].sum(1) <= T).all()
    too_long = sum(n > T for n in lengths)
    assert 0 < too_long < len(lengths)
    assert stats.dropped >= too_long and stats.seen == stats.dropped + 32
    assert f"dropped {stats.dropped} of {stats.seen}" in stats.summary(task)
    tight = tasks.get_task("gsm8k", data_path=str(folders / "jsonl"), max_response_len=8)
    with pytest.raises(ValueError, match="no gsm8k demonstration .* fits max_response_len=8"):
        next(warmstart.demonstration_iterator(tight, 4, seed=0, data_dir=data_dir))
