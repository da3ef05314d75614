"""TFDS builders and the grain pipeline: determinism, disjoint splits, fixed shapes, resume."""

import json

import numpy as np
import pytest

from gspo_jax import data, tasks


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def arith():
    return tasks.get_task("arith", num_train=200, num_test=40)


def _prompts(source):
    return [bytes(source[i]["prompt"]).decode() for i in range(len(source))]


@pytest.mark.parametrize("name", ["arith", "countdown"])
def test_builder_is_deterministic_cached_and_splits_disjoint(name, tmp_path):
    task = tasks.get_task(name, num_train=150, num_test=30)
    a = {s: _prompts(data.load_source(task, s, tmp_path / "a")) for s in ("train", "test")}
    b = {s: _prompts(data.load_source(task, s, tmp_path / "b")) for s in ("train", "test")}
    assert a == b  # same knobs -> the same files, in the same order, in another directory
    assert len(a["train"]) == 150 and len(a["test"]) == 30
    assert not set(a["train"]) & set(a["test"])
    builder = data.prepare(task, tmp_path / "a")  # cached: nothing is generated again
    assert builder.is_prepared()
    mtime = {p.name: p.stat().st_mtime for p in (tmp_path / "a").rglob("*.array_record*")}
    data.load_source(task, "train", tmp_path / "a")
    assert mtime == {p.name: p.stat().st_mtime for p in (tmp_path / "a").rglob("*.array_record*")}
    # Different knobs live in their own builder config.
    other = tasks.get_task(name, num_train=150, num_test=30, seed=3)
    assert _prompts(data.load_source(other, "train", tmp_path / "a")) != a["train"]


def test_batches_have_fixed_shapes(arith, data_dir):
    it = data.make_train_iterator(arith, batch_size=16, seed=0, data_dir=data_dir)
    for _ in range(30):  # 30 * 16 > 200: crosses epoch boundaries
        batch = next(it)
        assert batch["prompt"].shape == (16, arith.max_prompt_len)
        assert batch["prompt"].dtype == np.int32 and batch["prompt_length"].dtype == np.int32
        assert {k: v.shape for k, v in batch.items() if k != "prompt"} == {
            "prompt_length": (16,),
            "a": (16,),
            "b": (16,),
            "target": (16,),
        }
        for row, n in zip(batch["prompt"], batch["prompt_length"], strict=True):
            assert row[0] == arith.tokenizer.bos_id and (row[n:] == arith.tokenizer.pad_id).all()
            assert arith.tokenizer.decode(row[:n]).endswith("=")
        np.testing.assert_array_equal(batch["a"] + batch["b"], batch["target"])


def test_shuffle_by_seed_and_each_epoch_reshuffled(arith, data_dir):
    def epoch_targets(seed, n):
        it = data.make_train_iterator(arith, batch_size=20, seed=seed, data_dir=data_dir)
        return [next(it)["target"] for _ in range(n)]

    first = np.concatenate(epoch_targets(0, 20))  # two epochs of 200 records
    assert np.array_equal(first, np.concatenate(epoch_targets(0, 20)))
    assert not np.array_equal(first, np.concatenate(epoch_targets(1, 20)))
    epoch0, epoch1 = first[:200], first[200:]
    assert sorted(epoch0) == sorted(epoch1)  # every record once per epoch
    assert not np.array_equal(epoch0, epoch1)


def test_resume_from_saved_state(arith, data_dir):
    it = data.make_train_iterator(arith, batch_size=8, seed=5, data_dir=data_dir)
    for _ in range(27):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # the state survives a JSON round trip
    expected = [next(it) for _ in range(3)]
    resumed = data.make_train_iterator(arith, batch_size=8, seed=5, data_dir=data_dir)
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_per_process_shards_are_disjoint(arith, data_dir):
    seen = []
    for index in range(2):
        it = data.make_train_iterator(
            arith, batch_size=10, seed=0, data_dir=data_dir, process_index=index, process_count=2
        )
        batches = [next(it) for _ in range(10)]  # one epoch of this 100-record shard
        seen.append({(a, b) for x in batches for a, b in zip(x["a"], x["b"], strict=True)})
    assert len(seen[0]) == len(seen[1]) == 100
    assert not seen[0] & seen[1]
    with pytest.raises(ValueError, match="process_index"):
        data.make_train_iterator(
            arith, batch_size=4, seed=0, data_dir=data_dir, process_index=2, process_count=2
        )


def test_eval_batches_cover_the_split_in_order(arith, data_dir):
    batches = data.make_eval_batches(arith, "test", batch_size=16, data_dir=data_dir)
    assert [n for _, n in batches] == [16, 16, 8]
    assert all(b["prompt"].shape == (16, arith.max_prompt_len) for b, _ in batches)
    targets = np.concatenate([b["target"][:n] for b, n in batches])
    source = data.load_source(arith, "test", data_dir)
    np.testing.assert_array_equal(targets, [source[i]["target"] for i in range(len(source))])
    assert (
        len(data.make_eval_batches(arith, "test", batch_size=16, num_problems=5, data_dir=data_dir))
        == 1
    )


def test_bad_inputs_fail_with_a_message(arith, data_dir):
    with pytest.raises(ValueError, match="split"):
        data.load_source(arith, "validation", data_dir)
    with pytest.raises(ValueError, match="batch_size"):
        data.make_train_iterator(arith, batch_size=0, seed=0, data_dir=data_dir)


def test_missing_catalogue_dataset_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_path=.*download_and_prepare"):
        data.make_train_iterator(tasks.get_task("gsm8k"), batch_size=2, seed=0, data_dir=tmp_path)
