"""Attention kernels: the dense reference, a blockwise (flash) attention that never keeps the
score matrix, platform kernels behind capability checks, and the shared-prefix decode step.

Dimension legend: B rows, Sq query slots, Sk key slots, H query heads, K kv heads, Gq = H // K
query heads per kv head, M = Gq * Sq grouped query rows (row = g * Sq + s), Dh head dim,
bk keys per block, P prompts, G samples per prompt (B = P * G, group-contiguous), Lp prompt
slots, n chunks of C generated-cache slots (the decode's chunks).

Layouts (the KV cache's, chosen for the attention matmuls on XLA:CPU, see layers.Attention):
queries q [B, Sq, H, Dh], keys kT [B, K, Dh, Sk] (keys in the minor dimension), values
v [B, K, Sk, Dh]; every kernel returns [B, Sq, H, Dh] in the dtype of q.

Masks. The prompt+response layout (models/transformer.py) needs only two facts: which key slots
hold a real token (key_valid [B, Sk]) and the slot of each query (query_slots [Sq]); key j is
visible from query slot q iff key_valid[b, j] and j <= q. SlotMask carries exactly that, so a
kernel builds each key block's mask from [B, bk] validity and slot indices instead of reading a
materialised [B, Sq, Sk] mask. DenseMask wraps an explicit [B, Sq, Sk] bool mask (any pattern).

Masked scores are a finite -1e30, as in the reference, so a row with every key masked averages
all values uniformly instead of producing NaN; every kernel here reproduces that.

Blockwise attention (Dao et al., FlashAttention, 2022; Rabe & Staats, 2021): a lax.scan over key
blocks keeps the running row max m, normaliser l (`den` in the code) and unnormalised output o,

    m' = max(m, rowmax s_j),  l' = l e^(m - m') + rowsum e^(s_j - m'),
    o' = o e^(m - m') + e^(s_j - m') v_j,   out = o / l,

and a custom VJP saves only (out, m, l) and recomputes each block's probabilities
p_j = e^(s_j - m) / l in the backward scan: with D = rowsum(dout * out),

    dv_j = p_j^T dout,  ds_j = p_j * (dout v_j^T - D),  dq = sum_j ds_j k_j,  dk_j = ds_j^T q

(times the 1/sqrt(Dh) scale). Activation memory is O(Sq * Dh) per head instead of O(Sq * Sk).

ModelConfig.attention selects the kernel: "reference" (dense softmax, the definition),
"blockwise" (the plain-JAX flash above, every platform), or "auto": the Pallas splash kernel on
TPU and cuDNN flash attention (jax.nn.dot_product_attention) on GPU where their capability checks
pass, else blockwise when the keys span more than one block and the dense softmax when they fit
in one. A new kernel is one function here plus one branch in `attend`.
"""

from __future__ import annotations

import functools
import math

import chex
import flax.struct
import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite: a row with every key masked can never produce NaN
IMPLEMENTATIONS = ("auto", "blockwise", "reference")


# ----------------------------------------------------------------------------------- masks


@flax.struct.dataclass
class SlotMask:
    """Causal by slot over valid keys: key j visible from query i iff key_valid[b, j] and
    j <= query_slots[i]. key_valid [B, Sk] bool, query_slots [Sq] int32."""

    key_valid: jax.Array
    query_slots: jax.Array

    def dense(self) -> jax.Array:
        """[B, Sq, Sk] bool."""
        k_slot = jnp.arange(self.key_valid.shape[-1], dtype=jnp.int32)
        causal = k_slot[None, :] <= self.query_slots.astype(jnp.int32)[:, None]  # [Sq, Sk]
        return self.key_valid[:, None, :] & causal[None]

    def key_blocks(self, nb: int, bk: int):
        """Per-block inputs for blocked kernels: (key_valid [nb, B, bk], key slots [nb, bk])."""
        valid = _pad_last(self.key_valid, nb * bk, False)  # [B, nb * bk]
        valid = valid.reshape(valid.shape[0], nb, bk).transpose(1, 0, 2)
        return valid, jnp.arange(nb * bk, dtype=jnp.int32).reshape(nb, bk)

    def block(self, blk) -> jax.Array:
        """The [B, Sq, bk] mask of one key block from key_blocks."""
        valid, k_slot = blk
        causal = k_slot[None, :] <= self.query_slots.astype(jnp.int32)[:, None]  # [Sq, bk]
        return valid[:, None, :] & causal[None]


@flax.struct.dataclass
class DenseMask:
    """An explicit mask: mask [B, Sq, Sk] bool (True = visible)."""

    mask: jax.Array

    def dense(self) -> jax.Array:
        return self.mask

    def key_blocks(self, nb: int, bk: int):
        m = _pad_last(self.mask, nb * bk, False)  # [B, Sq, nb * bk]
        return m.reshape(*m.shape[:2], nb, bk).transpose(2, 0, 1, 3)  # [nb, B, Sq, bk]

    def block(self, blk) -> jax.Array:
        return blk


Mask = SlotMask | DenseMask


def as_mask(mask) -> Mask:
    """A SlotMask / DenseMask as is; a [B, Sq, Sk] bool array as a DenseMask."""
    if isinstance(mask, SlotMask | DenseMask):
        return mask
    chex.assert_rank(mask, 3)
    return DenseMask(jnp.asarray(mask, bool))


def _pad_last(x, length, value):
    pad = length - x.shape[-1]
    if pad == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=value)


# ------------------------------------------------------------------------------- reference


def _group_queries(q: jax.Array, K: int) -> jax.Array:
    """q [B, Sq, H, Dh] -> [B, K, M, Dh] with row g * Sq + s (queries grouped by kv head)."""
    B, Sq, H, Dh = q.shape
    return q.reshape(B, Sq, K, H // K, Dh).transpose(0, 2, 3, 1, 4).reshape(B, K, -1, Dh)


def _ungroup(out: jax.Array, Sq: int) -> jax.Array:
    """[B, K, M, Dh] -> [B, Sq, H, Dh] (inverse of _group_queries)."""
    B, K, M, Dh = out.shape
    Gq = M // Sq
    return out.reshape(B, K, Gq, Sq, Dh).transpose(0, 3, 1, 2, 4).reshape(B, Sq, K * Gq, Dh)


def reference_attention(q, kT, v, mask) -> jax.Array:
    """softmax(q k^T / sqrt(Dh), masked) v with the [B, K, Gq, Sq, Sk] float32 scores in memory:
    the definition every other kernel is tested against."""
    mask = as_mask(mask)
    B, Sq, H, Dh = q.shape
    K = kT.shape[1]
    cdt = q.dtype
    qg = _group_queries(q, K)
    scores = jnp.einsum("bkqd,bkdt->bkqt", qg, kT.astype(cdt), preferred_element_type=jnp.float32)
    scores = scores.reshape(B, K, H // K, Sq, -1) * (Dh**-0.5)
    scores = jnp.where(mask.dense()[:, None, None, :, :], scores, NEG_INF)  # [B, K, Gq, Sq, Sk]
    probs = jax.nn.softmax(scores, axis=-1).astype(cdt).reshape(B, K, H // K * Sq, -1)
    out = jnp.einsum("bkqt,bktd->bkqd", probs, v.astype(cdt))
    return _ungroup(out, Sq)


# ------------------------------------------------------------------------------- blockwise


def _block_scores(qg, kT_j, blk, mask: Mask, in_range, Gq):
    """Masked float32 scores of one key block: [B, K, M, bk]. Keys past Sk (padding of the last
    block) get -inf so they carry no weight even in a row whose real keys are all masked."""
    B, K, M, Dh = qg.shape
    s = jnp.einsum("bkqd,bkdc->bkqc", qg, kT_j, preferred_element_type=jnp.float32)
    s = s.reshape(B, K, Gq, M // Gq, -1) * (Dh**-0.5)
    visible = mask.block(blk)[:, None, None]  # [B, 1, 1, Sq, bk]
    s = jnp.where(visible, s, NEG_INF)
    s = jnp.where(in_range, s, -jnp.inf)
    return s.reshape(B, K, M, -1), visible


def _blocked_kv(kT, v, mask: Mask, bk: int):
    """Scan inputs: kT [nb, B, K, Dh, bk], v [nb, B, K, bk, Dh], mask blocks, in_range [nb, bk]."""
    B, K, Dh, Sk = kT.shape
    nb = math.ceil(Sk / bk)
    kT = _pad_last(kT, nb * bk, 0).reshape(B, K, Dh, nb, bk).transpose(3, 0, 1, 2, 4)
    v = jnp.swapaxes(_pad_last(jnp.swapaxes(v, -1, -2), nb * bk, 0), -1, -2)
    v = v.reshape(B, K, nb, bk, Dh).transpose(2, 0, 1, 3, 4)
    in_range = (jnp.arange(nb * bk) < Sk).reshape(nb, bk)
    return kT, v, mask.key_blocks(nb, bk), in_range


def _unroll(nb: int) -> int:
    # A few blocks run unrolled: no loop overhead (a whole while loop on XLA:CPU) when the
    # sequence fits in one or two blocks, as in the unit tests and CPU experiments.
    return nb if nb <= 4 else 1


def _flash_forward(q, kT, v, mask: Mask, bk: int):
    """(out [B, K, M, Dh] float32 normalised, row max m [B, K, M], normaliser l [B, K, M]).

    m and l are kept apart rather than as lse = m + log l: in a row whose keys are all masked,
    m = -1e30 swallows log l in float32, and the backward pass would lose the uniform weights.
    """
    B, Sq, H, Dh = q.shape
    K = kT.shape[1]
    Gq, cdt = H // K, q.dtype
    qg = _group_queries(q, K)  # [B, K, M, Dh]
    M = qg.shape[2]

    def step(carry, xs):
        o, m, den = carry
        kT_j, v_j, blk, in_range = xs
        s, _ = _block_scores(qg, kT_j.astype(cdt), blk, mask, in_range, Gq)  # [B, K, M, bk]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum(
            "bkqc,bkcd->bkqd", p.astype(cdt), v_j.astype(cdt), preferred_element_type=jnp.float32
        )
        return (o * corr[..., None] + pv, m_new, den * corr + jnp.sum(p, axis=-1)), None

    init = (
        jnp.zeros((B, K, M, Dh), jnp.float32),
        jnp.full((B, K, M), -jnp.inf, jnp.float32),
        jnp.zeros((B, K, M), jnp.float32),
    )
    xs = _blocked_kv(kT, v, mask, bk)
    (o, m, den), _ = jax.lax.scan(step, init, xs, unroll=_unroll(xs[-1].shape[0]))
    return o / den[..., None], m, den


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def blockwise_attention(q, kT, v, mask: Mask, block: int) -> jax.Array:
    """Flash attention in plain JAX (module docstring): the reference's values and gradients
    without ever holding more than one [B, K, M, block] score block."""
    out, _, _ = _flash_forward(q, kT, v, mask, block)
    return _ungroup(out, q.shape[1]).astype(q.dtype)


def _blockwise_fwd(q, kT, v, mask, block):
    out, m, den = _flash_forward(q, kT, v, mask, block)
    return _ungroup(out, q.shape[1]).astype(q.dtype), (q, kT, v, mask, out, m, den)


def _blockwise_bwd(block, res, dout):
    q, kT, v, mask, out, m, den = res
    B, Sq, H, Dh = q.shape
    K, Sk = kT.shape[1], kT.shape[3]
    Gq, cdt = H // K, q.dtype
    qg = _group_queries(q, K)
    do = _group_queries(dout, K).astype(jnp.float32)  # [B, K, M, Dh]
    D = jnp.sum(do * out, axis=-1)  # [B, K, M]
    scale = Dh**-0.5

    def step(dq, xs):
        kT_j, v_j, blk, in_range = xs
        s, visible = _block_scores(qg, kT_j.astype(cdt), blk, mask, in_range, Gq)
        p = jnp.exp(s - m[..., None]) / den[..., None]  # [B, K, M, bk]
        dv_j = jnp.einsum("bkqc,bkqd->bkcd", p, do)
        dp = jnp.einsum("bkqd,bkcd->bkqc", do, v_j.astype(jnp.float32))
        # The reference's where() passes no gradient to masked scores (this matters only in a
        # row whose keys are all masked, where p is uniform instead of zero there).
        vis = jnp.broadcast_to(visible, (B, K, Gq, Sq, visible.shape[-1])).reshape(p.shape)
        ds = jnp.where(vis, p * (dp - D[..., None]), 0.0) * scale
        dq = dq + jnp.einsum("bkqc,bkdc->bkqd", ds, kT_j.astype(jnp.float32))
        dkT_j = jnp.einsum("bkqc,bkqd->bkdc", ds, qg.astype(jnp.float32))
        return dq, (dkT_j, dv_j)

    xs = _blocked_kv(kT, v, mask, block)
    dq0 = jnp.zeros(qg.shape, jnp.float32)
    dq, (dkT, dv) = jax.lax.scan(step, dq0, xs, unroll=_unroll(xs[-1].shape[0]))
    nb = dkT.shape[0]
    dkT = dkT.transpose(1, 2, 3, 0, 4).reshape(B, K, Dh, nb * block)[..., :Sk]
    dv = dv.transpose(1, 2, 0, 3, 4).reshape(B, K, nb * block, Dh)[:, :, :Sk]
    return _ungroup(dq, Sq).astype(q.dtype), dkT.astype(kT.dtype), dv.astype(v.dtype), None


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


# ------------------------------------------------------------------------ platform kernels


def cudnn_attention(q, kT, v, mask, implementation: str = "cudnn") -> jax.Array:
    """jax.nn.dot_product_attention (cuDNN flash attention on GPU: scores never stored).

    The mask goes in as [B, 1, Sq, Sk] bool (one byte per pair, shared by the heads; no float
    scores are kept). implementation="xla" runs the same call on any platform (tests).
    """
    mask = as_mask(mask)
    k, vv = kT.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3)  # [B, Sk, K, Dh]
    out = jax.nn.dot_product_attention(
        q,
        k.astype(q.dtype),
        vv.astype(q.dtype),
        mask=mask.dense()[:, None],
        implementation=implementation,
    )
    return out.astype(q.dtype)


def cudnn_supported(q, kT) -> bool:
    """cuDNN flash attention: a GPU, half-precision inputs, head_dim a multiple of 8 up to 128."""
    Dh = q.shape[-1]
    return (
        jax.default_backend() == "gpu"
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and Dh % 8 == 0
        and Dh <= 128
    )


def splash_supported(q, kT, mask) -> bool:
    """Pallas splash attention: a TPU, self-attention over the layout (SlotMask with Sq == Sk),
    sequence and head_dim multiples of 128."""
    Sq, Dh, Sk = q.shape[1], q.shape[-1], kT.shape[-1]
    return (
        jax.default_backend() == "tpu"
        and isinstance(mask, SlotMask)
        and Sq == Sk
        and Sq % 128 == 0
        and Dh % 128 == 0
    )


def splash_attention(q, kT, v, mask: SlotMask, interpret: bool = False) -> jax.Array:
    """Pallas splash attention (TPU) for the layout's mask, with GQA as one MQA kernel per kv head.

    Causal by slot is the kernel's static CausalMask; key validity becomes segment ids (valid
    keys segment 1, padding 0), which agrees with SlotMask at every query on a valid slot (those
    are the only hidden states the layout ever reads); a padding query attends to the padding
    keys up to itself instead, and its output is never used.
    Needs mask.query_slots == arange(Sq) (self-attention from slot 0).
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    B, S, H, Dh = q.shape
    K = kT.shape[1]
    Gq = H // K
    kernel = sk.make_splash_mqa(
        sm.MultiHeadMask([sm.CausalMask((S, S)) for _ in range(Gq)]),
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )
    seg = mask.key_valid.astype(jnp.int32)  # [B, S]
    qh = q.reshape(B, S, K, Gq, Dh).transpose(0, 2, 3, 1, 4) * (Dh**-0.5)  # [B, K, Gq, S, Dh]
    k = jnp.swapaxes(kT, -1, -2).astype(q.dtype)  # [B, K, S, Dh]

    def one(qh_bk, k_bk, v_bk, seg_b):  # [Gq, S, Dh], [S, Dh], [S, Dh], [S]
        return kernel(qh_bk, k_bk, v_bk, segment_ids=sk.SegmentIds(q=seg_b, kv=seg_b))

    per_head = jax.vmap(one, in_axes=(0, 0, 0, None))  # over kv heads
    out = jax.vmap(per_head)(qh, k, v.astype(q.dtype), seg)  # [B, K, Gq, S, Dh]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, S, H, Dh).astype(q.dtype)


# -------------------------------------------------------------------------------- dispatch


def attend(q, kT, v, mask, *, implementation: str = "auto", block: int = 512) -> jax.Array:
    """q [B, Sq, H, Dh], kT [B, K, Dh, Sk], v [B, K, Sk, Dh], mask (SlotMask, DenseMask or a
    [B, Sq, Sk] bool array) -> [B, Sq, H, Dh] with the selected kernel (module docstring)."""
    mask = as_mask(mask)
    B, Sq, H, Dh = q.shape
    chex.assert_shape(kT, (B, None, Dh, None))
    chex.assert_shape(v, (B, kT.shape[1], kT.shape[3], Dh))
    if implementation == "reference":
        return reference_attention(q, kT, v, mask)
    if implementation == "auto":
        if splash_supported(q, kT, mask):
            return splash_attention(q, kT, v, mask)
        if cudnn_supported(q, kT):
            return cudnn_attention(q, kT, v, mask)
        if kT.shape[-1] <= block:
            # The keys fit one block: the blockwise loop would be this softmax with extra
            # bookkeeping and another summation order, and the one [Sq, Sk] block it saves
            # memory on is small.
            return reference_attention(q, kT, v, mask)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention={implementation!r} is not one of {IMPLEMENTATIONS}; 'auto' picks the "
            "platform's kernel, 'blockwise' the plain-JAX flash attention, 'reference' the dense "
            "softmax."
        )
    return blockwise_attention(q, kT, v, mask, min(block, kT.shape[-1]))


# ------------------------------------------------------------------ shared-prefix decode


def init_cache(
    num_layers: int, batch: int, length: int, num_kv_heads: int, head_dim: int, dtype
) -> dict:
    """A zeroed KV cache of `length` slots for every layer, stacked on a leading [L] axis:
    {"k": [L, batch, K, Dh, length], "v": [L, batch, K, length, Dh]}. The layer scan carries it
    whole; layer i writes its part with write_cache and reads layer_cache(cache, i)."""
    return {
        "k": jnp.zeros((num_layers, batch, num_kv_heads, head_dim, length), dtype),
        "v": jnp.zeros((num_layers, batch, num_kv_heads, length, head_dim), dtype),
    }


def shared_prefix_cache(prefix: dict, num_samples: int, chunk: int) -> dict:
    """The decode cache of G samples per prompt from the prompts' prefill cache.

    prefix {"k": [L, P, K, Dh, Lp], "v": [L, P, K, Lp, Dh]} (init_cache's, stacked on layers) ->
    {"prefix_k", "prefix_v": the prompts' KV, once per prompt; "k": ([L, P * G, K, Dh, C],),
    "v": ([L, P * G, K, C, Dh],): one zeroed chunk of C = `chunk` generated slots}.

    Every leaf keeps the leading [L] axis, so the whole cache rides in the layer scan's carry
    like the plain one (layer i writes its slot of the last chunk in place and reads its slices).
    The generated KV is a tuple of chunks, and it holds only the chunks decoding has reached:
    the sampler appends one (add_chunk) each time the generated tokens fill the last, and then
    runs the next phase of its loop. So a decode step attends over exactly the chunks in the
    cache, with no dynamic slicing along the slots: each chunk is its own buffer (dynamic slices
    out of one [B, K, Dh, n * C] buffer were copied every step, and a loop with a dynamic trip
    count cost more per key than the dense reference on XLA:CPU).
    """
    kp, vp = prefix["k"], prefix["v"]
    L, P, K, Dh, _ = kp.shape
    B = P * num_samples
    return {
        "prefix_k": kp,
        "prefix_v": vp,
        "k": (jnp.zeros((L, B, K, Dh, chunk), kp.dtype),),
        "v": (jnp.zeros((L, B, K, chunk, Dh), vp.dtype),),
    }


def add_chunk(cache: dict) -> dict:
    """A shared-prefix cache with one more zeroed chunk of generated slots."""
    out = dict(cache)
    out["k"] = (*cache["k"], jnp.zeros_like(cache["k"][-1]))
    out["v"] = (*cache["v"], jnp.zeros_like(cache["v"][-1]))
    return out


def is_shared_prefix(cache: dict) -> bool:
    return "prefix_k" in cache


def write_layer(stack: jax.Array, layer, value: jax.Array, index) -> jax.Array:
    """stack [L, ...] with value written into layer `layer` at per-layer offsets `index`.

    One dynamic_update_slice of the whole stack: XLA updates it in place, where writing into a
    sliced-out layer and putting the layer back would copy the layer twice per call.
    """
    return jax.lax.dynamic_update_slice(stack, value[None].astype(stack.dtype), (layer, *index))


def layer_cache(cache: dict, layer) -> dict:
    """Layer `layer`'s part of a stacked cache (plain or shared-prefix): every leaf's [layer]."""
    return jax.tree.map(lambda a: a[layer], cache)


def write_cache(cache: dict, kT, v, index, layer) -> dict:
    """The stacked plain cache with layer `layer`'s kT [B, K, Dh, S] / v [B, K, S, Dh] written
    at slot `index` (a scalar: the layout puts every row's t-th token at the same slot, so this
    is a dynamic_update_slice, in place)."""
    out = dict(cache)
    out["k"] = write_layer(cache["k"], layer, kT, (0, 0, 0, index))
    out["v"] = write_layer(cache["v"], layer, v, (0, 0, index, 0))
    return out


def write_generated(cache: dict, kT, v, t, layer) -> dict:
    """The stacked shared-prefix cache with layer `layer`'s one-token kT [B, K, Dh, 1] /
    v [B, K, 1, Dh] written at generated slot t (a scalar, the same for every row), which lies
    in the last chunk."""
    chunks = len(cache["k"])
    i = t - (chunks - 1) * cache["k"][-1].shape[-1]  # offset in the last chunk
    last = write_cache({"k": cache["k"][-1], "v": cache["v"][-1]}, kT, v, i, layer)
    out = dict(cache)
    out["k"] = (*cache["k"][:-1], last["k"])
    out["v"] = (*cache["v"][:-1], last["v"])
    return out


def shared_prefix_attention(q, cache: dict, mask: SlotMask) -> jax.Array:
    """One decode step over a shared-prefix cache, reading only what it needs.

    q [B, 1, H, Dh]; cache: one layer's part (layer_cache) of a shared_prefix_cache / add_chunk
    cache with this step's key already written (write_generated); mask: SlotMask over the
    layout's slots (key_valid [B, Lp + T], query_slots [1], the slot q of the fed token, >= Lp).
    One softmax over two key sets, combined by log-sum-exp (m = max(m_p, m_g),
    l = l_p e^(m_p - m) + l_g e^(m_g - m)):
    - prompt keys: the G samples of a prompt are G * Gq query rows of one [P, K, G * Gq, Lp]
      matmul over the prompt's KV, read once per prompt;
    - generated keys: the n chunks the cache holds (slots 0 .. n * C - 1; those after q - Lp
      are masked), one matmul per chunk.
    """
    kp, vp, kg, vg = cache["prefix_k"], cache["prefix_v"], cache["k"], cache["v"]
    B, _, H, Dh = q.shape
    P, K, _, Lp = kp.shape
    G, Gq, cdt = B // P, H // K, q.dtype
    chex.assert_shape(q, (P * G, 1, H, Dh))
    scale = Dh**-0.5

    # Prompt piece: [P, K, G, Gq] query rows against the prompt's Lp keys.
    qp = q.reshape(P, G, K, Gq, Dh).transpose(0, 2, 1, 3, 4).reshape(P, K, G * Gq, Dh)
    s = jnp.einsum("pkqd,pkdl->pkql", qp, kp.astype(cdt), preferred_element_type=jnp.float32)
    s = s.reshape(P, K, G, Gq, Lp) * scale
    valid_p = mask.key_valid[:, :Lp].reshape(P, G, Lp)[:, None, :, None, :]
    s = jnp.where(valid_p, s, NEG_INF)
    m_p = jnp.max(s, axis=-1)  # [P, K, G, Gq]
    e = jnp.exp(s - m_p[..., None])
    l_p = jnp.sum(e, axis=-1)
    o_p = jnp.einsum(
        "pkql,pkld->pkqd",
        e.reshape(P, K, G * Gq, Lp).astype(cdt),
        vp.astype(cdt),
        preferred_element_type=jnp.float32,
    ).reshape(P, K, G, Gq, Dh)
    to_rows = lambda x: jnp.swapaxes(x, 1, 2).reshape(B, K, Gq, *x.shape[4:])  # noqa: E731
    m_p, l_p, o_p = to_rows(m_p), to_rows(l_p), to_rows(o_p)  # [B, K, Gq(, Dh)]

    # Generated piece: the cache's n chunks, scores [B, K, Gq, n * C].
    qg = q.reshape(B, K, Gq, Dh)
    s = jnp.concatenate(
        [
            jnp.einsum("bkgd,bkdc->bkgc", qg, kc.astype(cdt), preferred_element_type=jnp.float32)
            for kc in kg
        ],
        axis=-1,
    )
    n_slots = s.shape[-1]
    t = mask.query_slots.reshape(()).astype(jnp.int32) - Lp  # this token's generated slot
    valid_g = _pad_last(mask.key_valid[:, Lp : Lp + n_slots], n_slots, False)  # [B, n * C]
    valid_g = valid_g & (jnp.arange(n_slots) <= t)[None]
    s = jnp.where(valid_g[:, None, None, :], s * scale, -jnp.inf)  # unfilled: no weight
    m = jnp.maximum(m_p, jnp.max(s, axis=-1))
    e = jnp.exp(s - m[..., None])
    corr = jnp.exp(m_p - m)
    den = l_p * corr + jnp.sum(e, axis=-1)
    C = kg[0].shape[-1]
    o = o_p * corr[..., None]
    for c, vc in enumerate(vg):
        e_c = e[..., c * C : (c + 1) * C].astype(cdt)
        o = o + jnp.einsum(
            "bkgc,bkcd->bkgd", e_c, vc.astype(cdt), preferred_element_type=jnp.float32
        )
    out = (o / den[..., None]).astype(cdt)  # [B, K, Gq, Dh]
    return out.reshape(B, 1, H, Dh)


__all__ = [
    "IMPLEMENTATIONS",
    "DenseMask",
    "SlotMask",
    "as_mask",
    "attend",
    "blockwise_attention",
    "cudnn_attention",
    "init_cache",
    "layer_cache",
    "reference_attention",
    "shared_prefix_attention",
    "shared_prefix_cache",
    "splash_attention",
    "write_cache",
    "write_generated",
    "write_layer",
    "add_chunk",
]
