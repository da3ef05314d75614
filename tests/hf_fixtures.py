"""Helpers for tests that write Hugging Face checkpoint folders."""

import jax
import numpy as np
from flax import nnx

from gspo_jax import models


def random_model(cfg: models.ModelConfig, seed: int = 0, std: float = 0.05):
    """A model of cfg with random numpy weights (normal(0, std), norm scales 1): no initializer
    is compiled, which costs more than a tiny checkpoint's whole test on a busy CPU."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: models.create_model(cfg)))
    rng = np.random.default_rng(seed)

    def fill(path, a):
        if "scale" in str(path[-1]):
            return np.ones(a.shape, a.dtype)
        return (std * rng.standard_normal(a.shape)).astype(a.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))
