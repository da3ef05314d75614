"""config.json as transformers 4.x and 5.x write it (hf_config.py config_from_hf): 5.x's names
(num_local_experts, dtype, rope_parameters, layer_types) load the same model as 4.x's, and what the
decoder does not compute (dense layers in an MoE stack, other rope types, sliding windows,
contradicting names) is refused in one line naming the field."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from hf_fixtures import random_model

from gspo_jax import models
from gspo_jax.models import hf


def _v5(config: dict) -> dict:
    """A 4.x-style config.json dict rewritten as transformers 5 writes it."""
    c = dict(config)
    theta = c.pop("rope_theta")
    c.pop("rope_scaling", None)
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    c["dtype"] = c.pop("torch_dtype")
    if "num_experts" in c:
        c["num_local_experts"] = c.pop("num_experts")
    if c["model_type"] in ("qwen3", "qwen2"):
        c["layer_types"] = ["full_attention"] * c["num_hidden_layers"]
    return c


@pytest.fixture(scope="module", params=["tiny", "tiny_moe"])
def exported(request, tmp_path_factory):
    """(folder, model) of a random Qwen3 (dense) / Qwen3-MoE checkpoint written by
    save_hf_checkpoint (transformers 4.x names)."""
    cfg = models.get_model_config(request.param, rope_theta=1_000_000.0)
    model = random_model(cfg, seed=3)
    folder = str(tmp_path_factory.mktemp(request.param))
    models.save_hf_checkpoint(model, folder)
    return folder, model


def _rewrite(folder: str, fn) -> dict:
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    new = fn(config)
    with open(path, "w") as f:
        json.dump(new, f)
    return config


def test_transformers5_config_loads_the_same_model(exported):
    folder, model = exported
    v4 = _rewrite(folder, _v5)
    try:
        loaded = models.load_hf_checkpoint(folder)
        with open(os.path.join(folder, "config.json")) as f:
            v5 = json.load(f)
        assert "rope_theta" not in v5 and "torch_dtype" not in v5 and "dtype" in v5
        assert ("num_local_experts" in v5) == model.cfg.is_moe and "num_experts" not in v5
        assert hf.config_from_hf(v5) == hf.config_from_hf(v4)
        assert loaded.cfg.rope_theta == 1_000_000.0
        assert loaded.cfg.num_experts == model.cfg.num_experts
        want = nnx.to_pure_dict(nnx.state(model, nnx.Param))
        got = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(a, b)  # bit-identical: a float32 export
    finally:
        _rewrite(folder, lambda _: v4)


def _refused(config: dict, *names: str):
    with pytest.raises(ValueError) as e:
        hf.config_from_hf(config)
    text = str(e.value)
    assert "\n" not in text
    for n in names:
        assert n in text, text


def test_what_the_decoder_does_not_compute_is_refused(exported):
    folder, model = exported
    with open(os.path.join(folder, "config.json")) as f:
        base = json.load(f)
    v5 = _v5(base)
    _refused({**v5, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "yarn")
    _refused({**base, "rope_scaling": {"type": "linear", "factor": 2.0}}, "linear")
    per_layer = {"full_attention": v5["rope_parameters"]}
    _refused({**v5, "rope_parameters": per_layer}, "rope_parameters", "full_attention")
    _refused({**v5, "rope_theta": 10_000.0}, "rope_theta=10000.0", "rope_theta=1000000.0")
    _refused({**v5, "dtype": "float32", "torch_dtype": "bfloat16"}, "torch_dtype", "dtype")
    _refused({**base, "dtype": "int4"}, "int4")
    if model.cfg.is_moe:
        _refused({**v5, "num_experts": 8}, "num_experts", "num_local_experts")
        _refused({**v5, "mlp_only_layers": [1]}, "mlp_only_layers", "[1]")
        _refused({**v5, "decoder_sparse_step": 2}, "decoder_sparse_step", "[0]")
        # trivial settings: every layer is sparse
        assert hf.config_from_hf({**v5, "mlp_only_layers": [], "decoder_sparse_step": 1})
        missing = {k: v for k, v in v5.items() if k != "num_local_experts"}
        _refused(missing, "'num_experts' or 'num_local_experts'")
    else:
        layers = ["full_attention", "sliding_attention"]
        _refused({**v5, "layer_types": layers}, "layer_types", "sliding_attention")
