"""Hugging Face checkpoints: import onto the one decoder (load_hf_checkpoint) and export from it.

    model = models.load_hf_checkpoint(path, dtype="float32", mesh=None)   # -> models.Transformer
    models.save_hf_checkpoint(model, path)                                  # same names and shapes
    logits = model(input_ids)                                               # [B, S, V] float32

A checkpoint directory holds config.json and model.safetensors, or shards named by
model.safetensors.index.json. Which architectures are supported and how config.json maps onto a
ModelConfig is models/hf_config.py; which stored tensor holds each parameter, and how the axes
correspond, is models/hf_layout.py. This module reads and writes the files.

Sharded import. With a mesh, every parameter is created by jax.make_array_from_callback with the
shardings of the abstract model (gspo_jax/sharding.py state_shardings), and the callback
reads only the slice of the stored tensor that the device's shard covers (safetensors get_slice; the
slice index is permuted to the stored layout and a layer- or expert-stacked parameter is read one
layer's / expert's slice at a time). So each process reads only what its devices hold, and no host
ever holds a whole sharded tensor of, say, a 30B checkpoint. Parameters are float32 whatever the
stored dtype (bfloat16 weights load exactly into float32); `dtype` is the compute dtype.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import math
import os

import chex
import jax
import numpy as np
from flax import nnx

from gspo_jax.models.config import _DTYPES, ModelConfig
from gspo_jax.models.hf_config import (
    SUPPORTED,
    architecture_of,
    config_from_hf,
    config_to_hf,
)
from gspo_jax.models.hf_layout import (
    Spec,
    hf_tensors,
    ignorable,
    path_key,
    read_block,
    tensor_specs,
)
from gspo_jax.models.transformer import Transformer, create_model
from gspo_jax.sharding import state_shardings

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size, "5GB"


def _safetensors():
    """The safetensors package, imported on first use so that the models package imports
    without it."""
    try:
        import safetensors
        import safetensors.numpy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Hugging Face checkpoints need the safetensors package: pip install safetensors."
        ) from e
    return safetensors


# ---------------------------------------------------------------------------------- import


class _Reader:
    """Open safetensors files of a checkpoint directory, by tensor name."""

    def __init__(self, path: str, stack: contextlib.ExitStack):
        safe_open = _safetensors().safe_open
        single, index = os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)
        if os.path.exists(single):
            self.files = {WEIGHTS_FILE: stack.enter_context(safe_open(single, framework="numpy"))}
            self.weight_map = dict.fromkeys(self.files[WEIGHTS_FILE].keys(), WEIGHTS_FILE)
            return
        if not os.path.exists(index):
            raise FileNotFoundError(
                f"No weights in {path}: neither {WEIGHTS_FILE} nor {INDEX_FILE} (with the shards "
                "it names) is there. Hugging Face safetensors checkpoints are supported; "
                "convert .bin / .pth weights to safetensors first."
            )
        with open(index) as f:
            self.weight_map = dict(json.load(f)["weight_map"])
        self.files = {}
        for name in sorted(set(self.weight_map.values())):
            shard = os.path.join(path, name)
            if not os.path.exists(shard):
                raise FileNotFoundError(
                    f"{INDEX_FILE} in {path} names the shard {name}, which is not there."
                )
            self.files[name] = stack.enter_context(safe_open(shard, framework="numpy"))

    def slicer(self, name: str):
        return self.files[self.weight_map[name]].get_slice(name)


def _check_tensors(reader: _Reader, specs: dict, shapes: dict, cfg: ModelConfig, path: str):
    """Every tensor present with its expected shape, and none the model would silently drop."""
    expected = {}
    for key, spec in specs.items():
        for name in spec.names:
            expected[name] = spec.stored_shape(shapes[key])
    missing = [n for n in expected if n not in reader.weight_map]
    if missing:
        raise ValueError(
            f"{len(missing)} tensor(s) missing from the checkpoint in {path}, e.g. "
            f"{missing[:3]}; a {architecture_of(cfg)} with this config.json needs them."
        )
    extra = sorted(n for n in reader.weight_map if n not in expected and not ignorable(n, cfg))
    if extra:
        raise ValueError(
            f"The checkpoint in {path} has tensor(s) this model has no parameter for, e.g. "
            f"{extra[:3]} (biases, shared experts, ... that the decoder does not compute); "
            f"supported: {', '.join(SUPPORTED)} as described in gspo_jax/models/hf_config.py."
        )
    for name, shape in expected.items():
        got = tuple(reader.slicer(name).get_shape())
        if got != shape:
            raise ValueError(
                f"Tensor {name} in {path} has shape {got}; config.json implies {shape}."
            )


def load_hf_checkpoint(
    path: str | os.PathLike, dtype: str = "float32", mesh: jax.sharding.Mesh | None = None
) -> Transformer:
    """A Transformer with the weights of the Hugging Face checkpoint directory `path`.

    dtype: the compute dtype (parameters are always float32). mesh: create every parameter
    already sharded, each process reading only the slices its devices hold (module docstring).
    Raises FileNotFoundError for a missing config.json, weights file or shard, ValueError for an
    unsupported architecture or config field and for missing, extra or misshapen tensors.
    """
    path = os.fspath(path)
    cfg_file = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(cfg_file):
        raise FileNotFoundError(
            f"No {CONFIG_FILE} in {path}: a Hugging Face checkpoint directory holds {CONFIG_FILE} "
            f"and {WEIGHTS_FILE} (or {INDEX_FILE} and its shards); supported architectures: "
            f"{', '.join(SUPPORTED)}."
        )
    with open(cfg_file) as f:
        cfg = config_from_hf(json.load(f), dtype=dtype)
    graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: create_model(cfg)))
    abstract = nnx.to_pure_dict(abs_state)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    else:
        shardings = nnx.to_pure_dict(state_shardings(abs_state, mesh))
    flat_abs = {path_key(p): a for p, a in jax.tree_util.tree_leaves_with_path(abstract)}
    specs = tensor_specs(cfg)
    if set(specs) != set(flat_abs):  # the table and the modules describe the same parameters
        raise AssertionError(f"hf_layout.py table mismatch: {sorted(set(specs) ^ set(flat_abs))}")
    param_dtype = np.dtype(cfg.params_dtype)

    with contextlib.ExitStack() as stack:
        reader = _Reader(path, stack)
        _check_tensors(reader, specs, {k: a.shape for k, a in flat_abs.items()}, cfg, path)

        def load(p, a, sharding):
            spec, shape = specs[path_key(p)], a.shape

            def callback(index) -> np.ndarray:
                ranges = []
                for s, n in zip(index, shape, strict=True):
                    start, stop, step = s.indices(n)
                    assert step == 1, index
                    ranges.append((start, stop))
                # One read per tensor the shard covers (layer, expert), each only its slice.
                lead, rest = ranges[: spec.lead], ranges[spec.lead :]
                blocks = []
                for idx in itertools.product(*(range(a, b) for a, b in lead)):
                    name = spec.names[int(np.ravel_multi_index(idx, shape[: spec.lead]))]
                    blocks.append(read_block(reader.slicer(name), spec, shape, rest))
                block = np.stack(blocks).reshape(*(b - a for a, b in lead), *blocks[0].shape)
                return np.ascontiguousarray(block, dtype=param_dtype)

            return jax.make_array_from_callback(shape, sharding, callback)

        params = jax.tree_util.tree_map_with_path(load, abstract, shardings)
    nnx.replace_by_pure_dict(abs_state, params)
    model = nnx.merge(graphdef, abs_state)
    chex.assert_shape(model.embed[...], (cfg.vocab_size, cfg.hidden_size))
    return model


# ---------------------------------------------------------------------------------- export


def _host_array(x: jax.Array) -> np.ndarray:
    """The whole array on this host (an all-gather when other processes hold parts of it)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _export_units(specs: dict[tuple, Spec], num_layers: int) -> list[tuple[tuple, int | None]]:
    """(parameter path, layer or None) in Hugging Face's tensor order: the embedding, then layer
    by layer every per-layer parameter, then the rest. A unit is what export gathers at once."""
    layered = [k for k in specs if k[0] == "layers"]
    rest = [(k, None) for k in specs if k[0] != "layers" and k != ("embed",)]
    return [(("embed",), None), *((k, i) for i in range(num_layers) for k in layered), *rest]


def save_hf_checkpoint(
    model: Transformer,
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    """Writes config.json and model.safetensors (or model-0000i-of-0000n.safetensors shards and
    model.safetensors.index.json when the weights exceed max_shard_bytes) with Hugging Face's
    tensor names and shapes, so transformers' from_pretrained and load_hf_checkpoint read it.

    dtype: the stored dtype and config.json torch_dtype ("float32" keeps an export -> import
    round trip bit-identical; "bfloat16" halves the size and rounds). Weight files of an earlier
    export in `path` are removed first, so a stale model.safetensors cannot shadow new shards. In
    a multi-process run every process must call this (parameters are gathered tensor by tensor);
    only process 0 writes.
    """
    save_file = _safetensors().numpy.save_file
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}.")
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be >= 1.")
    cfg = model.cfg
    hf_cfg = config_to_hf(cfg, torch_dtype=dtype)
    specs = tensor_specs(cfg)
    params = {
        path_key(p): x
        for p, x in jax.tree_util.tree_leaves_with_path(
            nnx.to_pure_dict(nnx.state(model, nnx.Param))
        )
    }
    if set(specs) != set(params):
        raise ValueError(
            "The model's parameters are not those of a "
            f"{architecture_of(cfg)}: {sorted(set(specs) ^ set(params))[:5]}."
        )
    out_dtype = np.dtype(_DTYPES[dtype])
    # Plan the shards from shapes alone, then convert one shard at a time (peak host memory:
    # one shard, not the model). A stacked per-layer parameter is split into its layers.
    L = cfg.num_layers
    units = _export_units(specs, L)

    def unit_spec(key, i) -> Spec:
        return specs[key] if i is None else specs[key].sub(i, L)

    def unit_shape(key, i) -> tuple[int, ...]:
        shape = params[key].shape
        return shape if i is None else shape[1:]

    sizes = {
        u: len(unit_spec(*u).names)
        * math.prod(unit_spec(*u).stored_shape(unit_shape(*u)))
        * out_dtype.itemsize
        for u in units
    }
    shards: list[list[tuple]] = [[]]
    used = 0
    for u in units:
        if shards[-1] and used + sizes[u] > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(u)
        used += sizes[u]
    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    if n == 1:
        files = [WEIGHTS_FILE]
    path = os.fspath(path)
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
        stale = [os.path.join(path, WEIGHTS_FILE), os.path.join(path, INDEX_FILE)]
        stale += glob.glob(os.path.join(path, "model-*-of-*.safetensors"))
        for f in stale:
            if os.path.exists(f):
                os.remove(f)
    weight_map = {}
    for keys, fname in zip(shards, files, strict=True):
        tensors = {}
        for key, i in keys:
            x = _host_array(params[key] if i is None else params[key][i])
            for name, t in hf_tensors(unit_spec(key, i), x):
                tensors[name] = t.astype(out_dtype)
                weight_map[name] = fname
        if writer:
            save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})
    if not writer:
        return
    if n > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        with open(os.path.join(path, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)
