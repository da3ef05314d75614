"""The Qwen3-style decoder (dense or MoE) and the prompt+response sequence layout.

Dimension legend: B rows, Lp padded prompt length, T padded response length, S = Lp + T slots,
Sk key slots, D hidden, V vocab, L layers, K kv heads, Dh head dim, k experts per token.

Sequence layout (shared by response_logprobs and the sampler, so both see the same attention):
the right-padded prompt occupies slots [0, Lp) and the response slots [Lp, Lp + T). A row with
prompt length n has valid prompt slots [0, n) at positions 0..n-1 and its t-th response token at
slot Lp + t, position n + t; the padding slots [n, Lp) are masked out as keys. Every row's t-th
response token sits at the same slot, so the sampler's KV-cache write is one dynamic_update_slice.
The masks of this layout are built here only (sequence_layout, slot_mask, attention_mask,
decode_mask): the teacher-forced pass, the sampler's prefill and its decode steps all call these
functions. slot_mask is the unmaterialised form the attention kernels take (models/attention.py).

create_model is the one constructor of a model (unsharded, or created already sharded on a mesh);
rl/build.py, rl/warmstart.py, models/hf.py and the tests build models through it.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from gspo_jax.models import attention
from gspo_jax.models.attention import SlotMask
from gspo_jax.models.config import REMAT_POLICIES, ModelConfig
from gspo_jax.models.layers import DecoderBlock, RMSNorm, make_param
from gspo_jax.sharding import logical_constraint, state_shardings


def sequence_layout(prompt_lengths: jax.Array, prompt_len: int, response_len: int):
    """Positions [B, S] and key validity [B, S] (bool) of the prompt+response layout above."""
    slot = jnp.arange(prompt_len + response_len, dtype=jnp.int32)[None, :]  # [1, S]
    n = prompt_lengths.astype(jnp.int32)[:, None]  # [B, 1]
    positions = jnp.where(slot < prompt_len, slot, n + slot - prompt_len)  # [B, S]
    key_valid = (slot < n) | (slot >= prompt_len)  # [B, S]
    return positions, key_valid


def slot_mask(key_valid: jax.Array, query_slots: jax.Array) -> SlotMask:
    """The layout's mask, unmaterialised: key j visible from query slot q iff key_valid[:, j]
    and j <= q (causal by slot). key_valid [B, Sk] bool, query_slots [Sq] int. What
    model.forward should get: the attention kernels build each key block's mask from it."""
    return SlotMask(key_valid.astype(bool), jnp.asarray(query_slots, jnp.int32).reshape(-1))


def attention_mask(key_valid: jax.Array, query_slots: jax.Array) -> jax.Array:
    """[B, Sq, Sk] bool: slot_mask materialised."""
    return slot_mask(key_valid, query_slots).dense()


def decode_mask(
    prompt_lengths: jax.Array, prompt_len: int, response_len: int, query_slot: jax.Array
) -> jax.Array:
    """[B, 1, S] bool mask of one cached decode step in the layout above.

    The token fed at `query_slot` (a scalar >= prompt_len, traced in the sampler's loop) sees
    its row's valid prompt slots and the response slots up to and including itself: the same
    row of attention_mask that the teacher-forced pass uses, so decoding and response_logprobs
    attend alike.
    """
    _, key_valid = sequence_layout(prompt_lengths, prompt_len, response_len)  # [B, S]
    return attention_mask(key_valid, jnp.reshape(query_slot, (1,)).astype(jnp.int32))


def unembed(hidden: jax.Array, w_out: jax.Array, dtype) -> jax.Array:
    """Logits [..., V] in float32 from hidden [..., D] and the output matrix [D, V].

    The single logits function used by the model, response_logprobs and the sampler: the matmul
    runs in the compute dtype and accumulates in float32.
    """
    return jnp.einsum(
        "...d,dv->...v",
        hidden.astype(dtype),
        w_out.astype(dtype),
        preferred_element_type=jnp.float32,
    )


class Transformer(nnx.Module):
    """Qwen3-style decoder: embed -> L x DecoderBlock -> RMSNorm -> (tied) output projection.

    `__call__(tokens)` gives float32 logits [B, S, V] for plain causal use (SFT, tests);
    `forward` is the general entry with explicit positions/mask, a KV cache, Routing Replay and
    the MoE aux loss; `response_logprobs` (models/logprobs.py) is what RL code should call.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), cfg)
        # The L blocks as one DecoderBlock whose parameters carry a leading [L] "layers" axis:
        # forward scans over it, so the compiled program holds one layer's code, not L copies.
        # The blocks are drawn one by one, as unstacked blocks would be, then stacked.
        self.layers = stack_layers([DecoderBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg)
        if not cfg.tie_embeddings:
            self.lm_head = make_param(
                rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), cfg
            )

    def layer(self, i: int) -> DecoderBlock:
        """Block i as a module of its own (its slice of the stacked parameters; a copy)."""
        graphdef, state = nnx.split(self.layers)
        return nnx.merge(graphdef, jax.tree.map(lambda a: a[i], state))

    def output_matrix(self) -> jax.Array:
        """[D, V] float32 output projection (the embedding transposed when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] (final-normed) -> float32 logits [..., V]."""
        return unembed(hidden, self.output_matrix(), self.cfg.compute_dtype)

    def init_cache(self, batch: int, length: int) -> dict:
        """Zeroed KV cache in the compute dtype, every layer's stacked on a leading [L] axis:
        {"k": [L, batch, K, Dh, length], "v": [L, batch, K, length, Dh]} (layouts chosen for the
        attention matmuls, see layers.Attention). forward's scan carries the stack; layer i
        writes and reads its part."""
        cfg = self.cfg
        return attention.init_cache(
            cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim, cfg.compute_dtype
        )

    def forward(
        self,
        tokens,
        positions,
        mask,
        *,
        token_mask=None,
        cache=None,
        write_index=None,
        routes=None,
        return_routes=False,
    ):
        """General forward pass.

        tokens [B, S] int32, positions [B, S] int32, mask: slot_mask(...) of the layout or an
        explicit [B, S, Sk] bool (Sk = S without a cache, the cache length with one),
        token_mask [B, S] (MoE aux loss counts only these tokens), cache: init_cache's pytree,
        the sampler's shared-prefix cache (layers.Attention; every leaf stacked on a leading [L]
        axis), written at slot `write_index`, or a paged cache (kernels/paged_attention.py: one
        token per row, written at each row's logical slot write_index [B]; mask a SlotMask
        whose key_valid [B, Sk] alone decides what each row sees),
        routes [L, B, S, k] int32 (MoE Routing Replay) or None.

        Returns dict(hidden [B, S, D] final-normed, aux_loss scalar f32 (mean over layers; 0 for
        dense), cache (stacked like the input, or None), routes [L, B, S, k] int32 if
        return_routes and MoE).
        """
        cfg = self.cfg
        chex.assert_rank([tokens, positions], 2)
        chex.assert_equal_shape([tokens, positions])
        if routes is not None:
            if not cfg.is_moe:
                raise ValueError(
                    "routes were given to a dense model; Routing Replay needs MoE "
                    "(num_experts > 0). Pass routes=None."
                )
            chex.assert_shape(routes, (cfg.num_layers, *tokens.shape, cfg.experts_per_token))
        x = jnp.take(self.embed[...], tokens, axis=0).astype(cfg.compute_dtype)  # [B, S, D]
        x = logical_constraint(x, ("batch", "length", "act_embed"))
        layers_graphdef, layers_state = nnx.split(self.layers)

        def body(carry, per_layer):  # one decoder layer; per_layer = its slice of the stacks
            x, cache = carry
            state, layer_routes, i = per_layer
            layer = nnx.merge(layers_graphdef, state)
            x, cache, a, r = layer(
                x,
                positions,
                mask,
                token_mask=token_mask,
                cache=cache,
                write_index=write_index,
                routes=layer_routes,
                layer=i,
            )
            return (x, cache), (a, r)

        # scan over the stacked [L, ...] parameters and routes (None is an empty pytree). The
        # stacked cache rides in the carry and layer i writes its part of it in place
        # (attention.write_layer): as scanned input and output, the scan would build a second
        # [L, ...] cache every decode step, and slicing a layer out and back copies it.
        layer_ids = jnp.arange(cfg.num_layers, dtype=jnp.int32)
        (x, new_cache), (aux, used_routes) = jax.lax.scan(
            remat(body, cfg.remat), (x, cache), (layers_state, routes, layer_ids)
        )
        out = {
            "hidden": self.final_norm(x),
            "aux_loss": jnp.mean(aux),  # aux [L]
            "cache": new_cache,
        }
        if return_routes:
            if not cfg.is_moe:
                raise ValueError("return_routes=True needs an MoE model (num_experts > 0).")
            out["routes"] = used_routes  # [L, B, S, k]
        return out

    def __call__(self, tokens, positions=None, key_valid=None):
        """Causal logits [B, S, V] float32 for left-aligned tokens [B, S].

        positions default to 0..S-1 and key_valid (padding keys to ignore) to all True.
        """
        B, S = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
        if key_valid is None:
            key_valid = jnp.ones((B, S), bool)
        mask = slot_mask(key_valid, jnp.arange(S, dtype=jnp.int32))
        return self.logits(self.forward(tokens, positions, mask, token_mask=key_valid)["hidden"])


def stack_layers(blocks: list[nnx.Module]) -> nnx.Module:
    """One module of blocks' structure whose every variable holds the blocks' values stacked on a
    leading axis, with the logical axis name "layers" prepended (sharding.RULES: replicated)."""
    graphdef, _ = nnx.split(blocks[0])

    def stack(*vs: nnx.Variable) -> nnx.Variable:
        axes = vs[0].get_metadata().get("out_sharding")
        value = jnp.stack([v.get_value() for v in vs])
        if axes is None:
            return vs[0].replace(value)
        return vs[0].replace(value, out_sharding=("layers", *axes))

    states = [nnx.state(b) for b in blocks]
    return nnx.merge(
        graphdef, jax.tree.map(stack, *states, is_leaf=lambda v: isinstance(v, nnx.Variable))
    )


def remat(fn, policy: str):
    """fn under jax.checkpoint as ModelConfig.remat says: "none" (fn itself), "full" (save only
    the inputs) or the named jax.checkpoint_policies policy (what else the backward may keep).

    prevent_cse=False: scan already keeps the recomputation apart from the forward pass (the
    jax.checkpoint docs' advice for checkpointed scan bodies); the extra barriers only cost.
    """
    if policy not in REMAT_POLICIES:
        raise ValueError(f"remat={policy!r} is not a remat policy; valid: {REMAT_POLICIES}.")
    if policy == "none":
        return fn
    named = None if policy == "full" else getattr(jax.checkpoint_policies, policy)
    return jax.checkpoint(fn, policy=named, prevent_cse=False)


def create_model(
    cfg: ModelConfig, *, seed: int = 0, mesh: jax.sharding.Mesh | None = None
) -> Transformer:
    """Transformer(cfg, rngs=nnx.Rngs(seed)); with a mesh, every parameter is created already
    sharded (docs/design.md convention 5).

    The sharded path is eval_shape -> shardings from the parameters' logical axes
    (gspo_jax/sharding.py) -> jit(init, out_shardings), so no device ever holds a
    parameter it does not own. The values equal the unsharded model's with the same seed
    (threefry is partitionable), so the two compute the same function. Under nnx.eval_shape this
    gives the abstract model (shapes, dtypes, logical axes) without allocating.
    """

    def build() -> Transformer:
        return Transformer(cfg, rngs=nnx.Rngs(seed))

    if mesh is None:
        return build()
    graphdef, abs_state = nnx.split(nnx.eval_shape(build))
    shardings = state_shardings(abs_state, mesh)
    with jax.set_mesh(mesh):
        state = jax.jit(lambda: nnx.state(build()), out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def param_count(model: nnx.Module, active: bool = False) -> int:
    """Number of parameters (works on abstract models from nnx.eval_shape).

    active=True counts, for MoE, only the k of E experts one token uses (the "A3B" of
    Qwen3-30B-A3B); the router and everything outside the experts count in full.
    """
    cfg = model.cfg
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        n = math.prod(leaf.shape)
        names = {str(getattr(p, "key", p)) for p in path}
        if (
            active
            and cfg.is_moe
            and "mlp" in names
            and names & {"gate_proj", "up_proj", "down_proj"}
        ):
            n = n * cfg.experts_per_token // cfg.num_experts
        total += n
    return total
