"""Qwen3 building blocks: RMSNorm, rotary embedding, GQA attention with q/k norm, SwiGLU, MoE.

Config flags select the other families on the same blocks: cfg.qk_norm (the per-head q/k RMSNorm
of Qwen3; off for Qwen2.5 and Llama) and cfg.attention_bias (Qwen2.5's q/k/v biases).

Dimension legend: B batch rows, S query slots, Sk key slots (the KV cache length when decoding),
D hidden, H query heads, K kv heads, Gq = H // K query heads per kv head, Dh head dim,
F SwiGLU hidden, E experts, k experts per token, Fe per-expert SwiGLU hidden.

Parameters are float32 (cfg.param_dtype) and carry logical axis names in their ``out_sharding``
metadata (see gspo_jax/sharding.py); activations run in cfg.dtype; normalisation,
softmaxes and the router run in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from gspo_jax.kernels import paged_attention
from gspo_jax.models import attention, moe_dispatch
from gspo_jax.models.config import ModelConfig
from gspo_jax.sharding import logical_constraint

# The parameters the layers read in float32 whatever the compute dtype (the norms' scales, the
# MoE router); every other weight is cast to the compute dtype where a layer reads it.
FLOAT32_PARAMS = ("scale", "router")


def compute_dtype_params(params, dtype):
    """The float32 parameters as the layers read them when they compute in ``dtype``: every
    weight cast to ``dtype`` except FLOAT32_PARAMS. A model of compute dtype ``dtype`` merged
    with them computes bit for bit what it computes from the float32 parameters (its layers cast
    at use, and casting twice is casting once), from half the bytes: what a bf16 rollout needs
    from the trainer (rl/pipeline.py's sync)."""
    dtype = jnp.dtype(dtype)

    def cast(path, x):  # path: the module attributes' names (DictKey), then the leaf's .value
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        if (names and names[-1] in FLOAT32_PARAMS) or not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return x.astype(dtype)

    return jax.tree_util.tree_map_with_path(cast, params)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _truncated_normal(key, shape, dtype, std):
    # One compiled initializer per (shape, dtype): eager construction would otherwise compile
    # every primitive of truncated_normal separately for every parameter shape.
    return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


def make_param(
    rngs: nnx.Rngs | None,
    shape,
    axes,
    cfg: ModelConfig,
    init: str = "normal",
    std: float | None = None,
) -> nnx.Param:
    """A float32 parameter with logical axis names (out_sharding metadata, sharded lazily)."""
    dtype = cfg.params_dtype
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        std = cfg.init_std if std is None else std
        value = _truncated_normal(rngs.params(), tuple(shape), dtype, float(std))
    return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, computed in float32 and cast back to the input dtype."""

    def __init__(self, dim: int, cfg: ModelConfig, axes=("act_embed",)):
        self.eps = cfg.rms_eps
        self.scale = make_param(None, (dim,), axes, cfg, init="ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding (rotate-half convention, as Qwen3/Llama). x [B,S,N,Dh], positions [B,S]."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])  # [Dh/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, S, Dh/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention with per-head q/k RMSNorm (cfg.qk_norm), optional q/k/v biases
    (cfg.attention_bias) and an optional KV cache; the kernel is models/attention.py's
    (cfg.attention, cfg.attention_block).

    Caches (attention.init_cache / attention.shared_prefix_cache, built by Transformer and the
    sampler) hold every layer's part, each leaf stacked on a leading [L] axis; this block is
    layer `layer` of them, writes its part in place and reads its slices (attention.write_cache,
    write_generated, layer_cache):
    - plain {"k": [L, B, K, Dh, Sk], "v": [L, B, K, Sk, Dh]}: new keys/values go to slot
      `write_index` (one scalar for all rows: the sampler's layout puts every row's t-th
      generated token at the same slot Lp + t, so the write is a dynamic_update_slice, not a
      scatter), then the queries attend over all Sk slots;
    - shared prefix {"prefix_k", "prefix_v", "k", "v"}: the prompts' KV once per prompt and the
      generated tokens' KV per row in chunks; a one-token decode step writes generated slot
      write_index - Lp and reads only the chunks the cache holds
      (attention.shared_prefix_attention);
    - paged {"k_pages", "v_pages", "page_table"} (the continuous rollout engine's): a page pool
      and a page table per row; a one-token step writes each row at its own logical slot
      write_index [N] and attends over the row's pages up to that slot, the mask's key_valid
      saying which slots it sees, with the implementation cfg.paged_attention selects (plain
      JAX or the Pallas kernel: kernels/paged_attention.py attend_pages).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = make_param(rngs, (D, H, Dh), ("embed", "heads", "head_dim"), cfg)
        self.k_proj = make_param(rngs, (D, K, Dh), ("embed", "kv_heads", "head_dim"), cfg)
        self.v_proj = make_param(rngs, (D, K, Dh), ("embed", "kv_heads", "head_dim"), cfg)
        self.o_proj = make_param(rngs, (H, Dh, D), ("heads", "head_dim", "embed"), cfg)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(Dh, cfg, axes=("head_dim",))
            self.k_norm = RMSNorm(Dh, cfg, axes=("head_dim",))
        if cfg.attention_bias:
            # Zero-initialised (as Hugging Face initialises Linear biases) and created after
            # every random parameter, so turning the flag on leaves the other draws unchanged.
            self.q_bias = make_param(None, (H, Dh), ("heads", "head_dim"), cfg, init="zeros")
            self.k_bias = make_param(None, (K, Dh), ("kv_heads", "head_dim"), cfg, init="zeros")
            self.v_bias = make_param(None, (K, Dh), ("kv_heads", "head_dim"), cfg, init="zeros")

    def __call__(self, x, positions, mask, cache=None, write_index=None, layer=0):
        """x [B,S,D], positions [B,S], mask: attention.SlotMask or [B,S,Sk] bool ->
        (out [B,S,D], the updated cache or None). cache: every layer's, stacked on a leading
        [L] axis (class docstring); this block is layer `layer` of it."""
        cfg = self.cfg
        cdt = cfg.compute_dtype
        q = jnp.einsum("bsd,dhk->bshk", x, self.q_proj[...].astype(cdt))
        k = jnp.einsum("bsd,dhk->bshk", x, self.k_proj[...].astype(cdt))
        v = jnp.einsum("bsd,dhk->bshk", x, self.v_proj[...].astype(cdt))
        if cfg.attention_bias:
            q = q + self.q_bias[...].astype(cdt)
            k = k + self.k_bias[...].astype(cdt)
            v = v + self.v_bias[...].astype(cdt)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, positions, cfg.rope_theta)
        k = apply_rope(k, positions, cfg.rope_theta)
        q = logical_constraint(q, ("batch", "length", "heads", "head_dim"))
        # Heads-major layouts the two attention matmuls consume without a transpose: keys
        # [B, K, Dh, Sk] (contract Dh, keys in the minor dimension), values [B, K, Sk, Dh].
        # On XLA:CPU a decode step with keys as [B, K, Sk, Dh] was slower in the score matmul
        # (docs/benchmarks.md), and a [B, Sk, K, Dh] cache was transposed whole every step.
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
        new_cache = None
        if paged_attention.is_paged(cache):
            new_cache = paged_attention.write_paged(cache, k, v, write_index, layer)
            # The step's own key, at write_index, is the last slot a row sees.
            out = paged_attention.attend_pages(
                q, new_cache, mask.key_valid, layer, write_index + 1, cfg.paged_attention
            )
        elif cache is not None and attention.is_shared_prefix(cache):
            Lp = cache["prefix_k"].shape[-1]
            new_cache = attention.write_generated(cache, k, v, write_index - Lp, layer)
            out = attention.shared_prefix_attention(
                q, attention.layer_cache(new_cache, layer), mask
            )
        else:
            if cache is not None:
                new_cache = attention.write_cache(cache, k, v, write_index, layer)
                own = attention.layer_cache(new_cache, layer)
                k, v = own["k"], own["v"]
            k = logical_constraint(k, ("batch", "kv_heads", "head_dim", "length"))
            v = logical_constraint(v, ("batch", "kv_heads", "length", "head_dim"))
            # A one-token step over a plain cache has a single score row per head: nothing to
            # keep for a backward pass, and the dense softmax is exact and cheapest there.
            impl = "reference" if cache is not None and q.shape[1] == 1 else cfg.attention
            out = attention.attend(q, k, v, mask, implementation=impl, block=cfg.attention_block)
        out = jnp.einsum("bshk,hkd->bsd", out, self.o_proj[...].astype(cdt))
        return out, new_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.hidden_size, cfg.mlp_dim
        self.cfg = cfg
        self.gate_proj = make_param(rngs, (D, F), ("embed", "mlp"), cfg)
        self.up_proj = make_param(rngs, (D, F), ("embed", "mlp"), cfg)
        self.down_proj = make_param(rngs, (F, D), ("mlp", "embed"), cfg)

    def __call__(self, x):
        # einsums, like Attention's: the op LoRA adapters attach to (models/lora.py, qwix)
        cdt = self.cfg.compute_dtype
        gate = jnp.einsum("bsd,df->bsf", x, self.gate_proj[...].astype(cdt))
        up = jnp.einsum("bsd,df->bsf", x, self.up_proj[...].astype(cdt))
        h = logical_constraint(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
        return jnp.einsum("bsf,fd->bsd", h, self.down_proj[...].astype(cdt))


class MoE(nnx.Module):
    """Top-k mixture of SwiGLU experts with Routing Replay.

    Router: softmax over E experts of a float32 linear map; the top-k probabilities are the
    combine weights, renormalised to sum to 1 when cfg.norm_topk_prob (Qwen3-MoE).

    Routing Replay (GSPO paper, sec. 5): given `routes` [B, S, k] from an earlier pass (the old
    policy's rollout), the experts are taken from `routes` instead of the router's top-k, and the
    combine weights are the *current* router's probabilities at the replayed experts (renormalised
    the same way). So gradients still reach the router, while the expert set -- the discrete,
    volatile part -- is frozen to the old policy's choice.

    The experts run as cfg.moe_dispatch says (models/moe_dispatch.py): "sparse" (each token
    through its k experts: grouped matmuls, expert-parallel under a mesh) or "dense" (every token
    through every expert, the reference). Routing, Routing Replay and the aux loss are computed
    here, the same for both.

    Load-balancing loss (Switch Transformer / Qwen3-MoE): aux = E * sum_e f_e * P_e over valid
    tokens, with f_e the fraction of (token, slot) assignments to expert e and P_e the mean router
    probability; 1.0 when perfectly balanced. The trainer scales it by its own coefficient.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, E, Fe = cfg.hidden_size, cfg.num_experts, cfg.moe_mlp_dim
        self.cfg = cfg
        self.router = make_param(rngs, (D, E), ("embed", None), cfg)
        self.gate_proj = make_param(rngs, (E, D, Fe), ("expert", "embed", "expert_mlp"), cfg)
        self.up_proj = make_param(rngs, (E, D, Fe), ("expert", "embed", "expert_mlp"), cfg)
        self.down_proj = make_param(rngs, (E, Fe, D), ("expert", "expert_mlp", "embed"), cfg)

    def __call__(self, x, token_mask=None, routes=None):
        """x [B,S,D], token_mask [B,S] (1 = real token), routes [B,S,k] int32 or None.

        Returns (y [B,S,D], aux_loss scalar f32, routes [B,S,k] int32 actually used).
        """
        cfg = self.cfg
        cdt = cfg.compute_dtype
        E, k = cfg.num_experts, cfg.experts_per_token
        router_logits = jnp.einsum("bsd,de->bse", x.astype(jnp.float32), self.router[...])
        probs = jax.nn.softmax(router_logits, axis=-1)  # [B, S, E] f32
        if routes is None:
            top_w, top_idx = jax.lax.top_k(probs, k)  # [B, S, k]
        else:
            top_idx = routes.astype(jnp.int32)
            top_w = jnp.take_along_axis(probs, top_idx, axis=-1)
        if cfg.norm_topk_prob:
            # p_i / sum_j p_j over the chosen experts is a softmax over their logits; taken from
            # the logits, so that replayed experts whose probabilities underflow to 0 (a router
            # that moved far since the rollout) do not give 0 / 0
            top_w = jax.nn.softmax(jnp.take_along_axis(router_logits, top_idx, axis=-1), axis=-1)
        gate, up, down = (
            p[...].astype(cdt) for p in (self.gate_proj, self.up_proj, self.down_proj)
        )
        if cfg.moe_dispatch == "dense":
            y = moe_dispatch.dense_experts(x, top_idx, top_w, gate, up, down, cdt)
        else:
            y = moe_dispatch.sparse_experts(
                x,
                top_idx,
                top_w,
                gate,
                up,
                down,
                capacity_factor=cfg.moe_capacity_factor,
                kernel=cfg.moe_kernel,
                cdt=cdt,
            )

        m = (
            jnp.ones(x.shape[:2], jnp.float32)
            if token_mask is None
            else token_mask.astype(jnp.float32)
        )
        n = jnp.maximum(jnp.sum(m), 1.0)
        onehot = jax.nn.one_hot(top_idx, E, dtype=jnp.float32)  # [B, S, k, E]
        frac = jnp.einsum("bske,bs->e", onehot, m) / (n * k)  # [E]
        mean_prob = jnp.einsum("bse,bs->e", probs, m) / n  # [E]
        aux = E * jnp.sum(frac * mean_prob)
        return y, aux, top_idx


class DecoderBlock(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp/moe(norm(.))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.input_norm = RMSNorm(cfg.hidden_size, cfg)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg)
        self.mlp = MoE(cfg, rngs=rngs) if cfg.is_moe else MLP(cfg, rngs=rngs)

    def __call__(
        self,
        x,
        positions,
        mask,
        *,
        token_mask=None,
        cache=None,
        write_index=None,
        routes=None,
        layer=0,
    ):
        a, new_cache = self.attn(self.input_norm(x), positions, mask, cache, write_index, layer)
        x = x + a
        if self.cfg.is_moe:
            m, aux, used = self.mlp(self.post_attn_norm(x), token_mask, routes)
        else:
            m, aux, used = self.mlp(self.post_attn_norm(x)), jnp.zeros((), jnp.float32), None
        x = logical_constraint(x + m, ("batch", "length", "act_embed"))
        return x, new_cache, aux, used
