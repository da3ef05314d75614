"""Warm starts kept in results/ (experiments/warmstart_store.py) and results/'s size budget
(experiments/checks/results_size.py): a kept warm start unpacks to exactly the parameters it
was packed from (float32 lossless; bfloat16 only for an entry rounded before its runs), and
results/ is checked against before-round-3 + 100 MB."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
from trainer_runs import REPO, load_repo_module

store = load_repo_module("experiments/warmstart_store.py")
size_check = load_repo_module("experiments/checks/results_size.py")


@pytest.fixture
def entry(tmp_path):
    """A copy of one committed warm start (round 2's arith family: 0.79M float32 parameters)."""
    kept = sorted(glob.glob(os.path.join(REPO, "results", "claims", "warmstart", "arith_*")))
    if not kept:
        pytest.skip("no committed warm start in this copy")
    dst = tmp_path / "cache" / os.path.basename(kept[0])
    shutil.copytree(kept[0], dst)
    return str(dst)


def test_a_kept_warm_start_unpacks_to_the_same_parameters(entry, tmp_path):
    params = store.read_params(entry)
    path = store.pack(entry, str(tmp_path / "kept"))
    assert path.endswith(".npz.xz")
    assert os.path.getsize(path) < 0.9 * sum(v.nbytes for v in params.values())  # compressed
    back = str(tmp_path / "restored" / os.path.basename(entry))
    assert store.unpack(path, back) == store.digest(params)
    again = store.read_params(back)
    assert sorted(again) == sorted(params)
    assert all(np.array_equal(again[k], params[k]) for k in params)  # bit for bit
    assert store.verify(path, back)
    with open(os.path.join(back, "meta.json")) as f, open(os.path.join(entry, "meta.json")) as g:
        assert json.load(f) == json.load(g)
    # the library reads the unpacked entry as one of its own
    from gspo_jax import models
    from gspo_jax.rl import warmstart

    with open(os.path.join(back, "meta.json")) as f:
        model_cfg = models.ModelConfig(**json.load(f)["model"])
    model = warmstart._restore(back, model_cfg, None)
    assert np.array_equal(np.asarray(model.embed[...]), params["embed"])


def test_bfloat16_only_for_an_entry_rounded_before_its_runs(entry, tmp_path):
    with pytest.raises(ValueError, match="round it .* before its first RL run"):
        store.pack(entry, str(tmp_path / "kept"), "bfloat16")
    f32 = os.path.getsize(store.pack(entry, str(tmp_path / "f32")))
    before = store.read_params(entry)
    rounded = store.round_entry(entry)
    after = store.read_params(entry)
    assert store.is_bfloat16(after) and not store.is_bfloat16(before)
    # rounding to nearest moves each value by at most half a bfloat16 step (2^-8 relative)
    for k in before:
        assert np.allclose(after[k], before[k], rtol=2**-8, atol=0)
    path = store.pack(entry, str(tmp_path / "kept"), "bfloat16")
    assert os.path.getsize(path) < 0.5 * f32
    back = str(tmp_path / "restored" / "e")
    assert store.unpack(path, back) == rounded
    assert all(np.array_equal(store.read_params(back)[k], after[k]) for k in after)
    assert store.read_kept(path)[0]["meta"]["rounded_to"] == "bfloat16"


def test_results_stay_within_their_budget():
    """results/ (tracked plus what a commit would add) within before-round-3 + 100 MB; the
    error names the excess and the fix."""
    size = size_check.results_bytes()
    assert size > 0 and size_check.over_budget(size) is None, size_check.over_budget(size)
    error = size_check.over_budget(size_check.BUDGET + 2_000_000)
    assert error.startswith("results/ holds 169.4 MB, 2.0 MB over its budget of 167.4 MB")
    assert "bfloat16" in error
