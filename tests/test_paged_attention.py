"""Tests for attention over the continuous engine's paged KV cache (kernels/paged_attention.py)
and its Pallas kernels (kernels/paged_kernel.py for TPU, kernels/paged_kernel_gpu.py for GPU):
the ragged plain-JAX pages and the kernels in interpret mode against the dense reference, on
the engine's layout (rows at different lengths, a shared prompt page set, the prompt's
right-padding hole, scratch table entries).

Dimension legend: N rows, H query heads, K kv heads, Dh head dim, ps page size, Pp prompt / Pt
all table entries per row, NP pages in the pool, L layers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_continuous_engine as tce
from flax import nnx

from gspo_jax import models, rollout
from gspo_jax.kernels import paged_attention
from gspo_jax.models import attention
from gspo_jax.rollout import paged

N, H, K, Dh, ps, Pp, Pt, L = 4, 4, 2, 8, 4, 2, 6, 2
NP = 1 + N * Pt


def _ragged_case(seed=0, scratch=np.nan):
    """(q [N, 1, H, Dh], cache, key_valid [N, Pt * ps], kv_end [N]) as the engine lays it out:
    rows 0 and 1 share their prompt's pages; prompt lengths 8 (no hole), 3, 5 and 1 of Pp * ps
    = 8 slots (holes); rows feed generated tokens 0, 5, 15 (the table's last slot) and 2, so
    they see 1, 2, 4 and 1 generated pages. Entries past a row's last page point at the
    scratch page, filled with `scratch`: NaN shows any read of it in the output (a masked key
    weighs 0, but 0 * NaN is NaN)."""
    rng = np.random.default_rng(seed)
    n = np.array([8, 3, 5, 1])
    fed = np.array([0, 5, 15, 2])
    free = iter(rng.permutation(np.arange(1, NP)))
    table = np.zeros((N, Pt), np.int32)  # SCRATCH_PAGE everywhere unowned
    prompt = [next(free) for _ in range(Pp)]
    for r in range(N):
        table[r, :Pp] = prompt if r < 2 else [next(free) for _ in range(Pp)]
        for e in range(Pp, Pp + fed[r] // ps + 1):
            table[r, e] = next(free)
    k_pages = rng.normal(size=(L, NP, K, Dh, ps)).astype(np.float32)
    v_pages = rng.normal(size=(L, NP, K, ps, Dh)).astype(np.float32)
    k_pages[:, paged_attention.SCRATCH_PAGE] = scratch
    v_pages[:, paged_attention.SCRATCH_PAGE] = scratch
    cache = {
        "k_pages": jnp.asarray(k_pages),
        "v_pages": jnp.asarray(v_pages),
        "page_table": jnp.asarray(table),
    }
    q = jnp.asarray(rng.normal(size=(N, 1, H, Dh)), jnp.float32)
    valid = paged.key_valid(jnp.asarray(n), jnp.asarray(fed), Pp, Pt, ps)
    kv_end = jnp.asarray(Pp * ps + fed + 1, jnp.int32)  # the fed token's own slot, plus one
    return q, cache, valid, kv_end


def _dense_reference(q, cache, valid, layer):
    """reference_attention over each row's table laid out contiguously, the scratch page's
    NaN replaced by zeros (the reference reads every slot; masked ones must weigh nothing)."""
    table = cache["page_table"]
    kp = jnp.nan_to_num(cache["k_pages"][layer, table])  # [N, Pt, K, Dh, ps]
    vp = jnp.nan_to_num(cache["v_pages"][layer, table])
    kT = kp.transpose(0, 2, 3, 1, 4).reshape(N, K, Dh, Pt * ps)
    v = vp.transpose(0, 2, 1, 3, 4).reshape(N, K, Pt * ps, Dh)
    return attention.reference_attention(q, kT, v, valid[:, None, :])


@pytest.mark.parametrize(
    "block_pages, chunk", [(1, None), (1, 1), (1, 3), (1, 7), (2, None), (4, 3)]
)
def test_ragged_paged_attention_reads_only_visible_pages(block_pages, chunk):
    """paged_attention over rows at different lengths (work items of block_pages pages,
    processed `chunk` at a time, chunks crossing rows) == the dense reference, at both layers.
    The case's 16 one-page items run as trips of every width (trip_widths): chunk 1 four 4 C
    trips, chunk 3 one 4 C and one 2 C, chunk 7 one 2 C and one C.
    With one page per item it never reads a page past a row's kv_end (the scratch page's NaN
    does not reach the output); larger items read up to block_pages - 1 pages past it, masked
    (finite scratch)."""
    q, cache, valid, kv_end = _ragged_case(scratch=np.nan if block_pages == 1 else 7.0)
    for layer in range(L):
        got = paged_attention.paged_attention(
            q, cache, valid, layer, kv_end, block_pages=block_pages, chunk=chunk
        )
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, _dense_reference(q, cache, valid, layer), atol=1e-5)


def test_trip_widths_cover_the_items_in_the_fewest_trips_padding_under_one_chunk():
    """trip_widths(items, C) = (4 C trips, 2 C trips, C trips): by hand at C = 8, and for every
    item count up to 40 C: they cover the items, pad fewer than C, and no covering with pads
    under C takes fewer trips (at most items // 4 C + 2)."""
    by_hand = {
        0: (0, 0, 0),
        1: (0, 0, 1),
        8: (0, 0, 1),
        9: (0, 1, 0),
        17: (0, 1, 1),
        24: (0, 1, 1),
        25: (1, 0, 0),
        32: (1, 0, 0),
        33: (1, 0, 1),
        80: (2, 1, 0),
        90: (3, 0, 0),
    }
    for items, trips in by_hand.items():
        assert paged_attention.trip_widths(items, 8) == trips, items
    for C in (1, 3, 8):
        for items in range(40 * C + 1):
            wide, mid, narrow = paged_attention.trip_widths(items, C)
            covered = (4 * wide + 2 * mid + narrow) * C
            assert items <= covered < items + C
            fewest = min(  # by search over every covering that pads under C
                a + b + c
                for a in range(items // (4 * C) + 2)
                for b in range(3)
                for c in range(3)
                if items <= (4 * a + 2 * b + c) * C < items + C
            )
            assert wide + mid + narrow == fewest, (items, C)
    traced = paged_attention.trip_widths(jnp.int32(33), 8)  # a traced count, as in the loop
    assert [int(t) for t in traced] == [1, 0, 1]


@pytest.mark.parametrize("chunk", [1, None])
def test_ragged_items_fully_masked_first_item_weighs_nothing(chunk):
    """Each ragged item runs its own softmax (max m_i) and is folded into its row's by
    e^(m_i - m): an item whose keys are all masked (m_i = NEG_INF; here every row's first page,
    before its visible pages, and rows that see keys in one later page only) must weigh
    nothing, in the same trip as the row's other items or (chunk 1) in an earlier one."""
    q, cache, valid, kv_end = _ragged_case(seed=3, scratch=7.0)
    valid = np.asarray(valid).copy()
    valid[:, :ps] = False  # every row's first page masked
    valid[1, 2 * ps :] = False  # row 1 sees page 1 only (prompt slots 4 .. its length)
    valid[1, ps : 2 * ps] = True
    valid = jnp.asarray(valid)
    for layer in range(L):
        got = paged_attention.paged_attention(
            q, cache, valid, layer, kv_end, block_pages=1, chunk=chunk
        )
        np.testing.assert_allclose(got, _dense_reference(q, cache, valid, layer), atol=1e-5)


@pytest.mark.parametrize("block_pages", [1, 2])
def test_shared_prefixes_read_once_equal_the_reference(block_pages):
    """With the engine's shared prefixes in the cache (continuous.shared_prefixes: each active
    slot's prompt listed once, its pages read once for all its rows), paged_attention ==
    the dense reference for every active row, at both layers. Rows 0 and 1 are members 0
    and 1 of prompt 0 (shared pages, different prompt lengths), row 2 member 0 of prompt 1;
    slot 3 is inactive (its prompt is not listed; its output is dropped by the engine)."""
    from gspo_jax.rollout import continuous

    q, cache, valid, kv_end = _ragged_case(seed=2, scratch=np.nan if block_pages == 1 else 7.0)
    table = np.asarray(cache["page_table"])
    G = 2
    prompt_pages = jnp.asarray(np.stack([table[0, :Pp], table[2, :Pp], table[3, :Pp]]))
    rows = jnp.asarray([0, 1, 2, 5], jnp.int32)  # prompts 0, 0, 1, 2
    act = jnp.asarray([True, True, True, False])
    prefix_table, prefix_rows = continuous.shared_prefixes(prompt_pages, rows, act, G)
    assert prefix_table.shape == (3, Pp) and prefix_rows.shape == (3, G)
    np.testing.assert_array_equal(prefix_rows, [[0, 1], [2, N], [N, N]])
    shared = dict(cache, prefix_table=prefix_table, prefix_rows=prefix_rows)
    for layer in range(L):
        got = paged_attention.paged_attention(
            q, shared, valid, layer, kv_end, block_pages=block_pages
        )
        assert np.isfinite(np.asarray(got)[:3]).all()
        want = _dense_reference(q, cache, valid, layer)
        np.testing.assert_allclose(got[:3], want[:3], atol=1e-5)


@pytest.mark.parametrize("kernel", ["interpret", "interpret_gpu"])
def test_paged_kernel_in_interpret_mode_equals_the_plain_pages(kernel):
    """Each Pallas kernel (the TPU one and the GPU one, interpret mode, on this CPU) == the
    plain-JAX pages on the ragged layout, at both layers (the layer index a scalar the kernel
    reads), and skips pages past a row's kv_end (no NaN from the scratch page)."""
    q, cache, valid, kv_end = _ragged_case(seed=1)
    for layer in range(L):
        got = paged_attention.attend_pages(q, cache, valid, layer, kv_end, kernel)
        want = paged_attention.paged_attention(q, cache, valid, layer, kv_end, block_pages=1)
        assert np.isfinite(np.asarray(got)).all()
        np.testing.assert_allclose(got, want, atol=1e-5)


def _gpu_case(dtype, seed=0, N=6, H=4, K=2, Dh=128, ps=16, Pp=2, Pt=6, L=2):
    """A ragged case at a shape the compiled GPU kernel takes (pages of 16 slots, head dim
    128, Gq 2): rows of prompt lengths up to Pp * ps with holes, fed 0 .. (Pt - Pp) * ps - 1
    generated tokens, every row its own pages, unowned entries at the scratch page (zeros)."""
    rng = np.random.default_rng(seed)
    NP = 1 + N * Pt
    n = rng.integers(1, Pp * ps + 1, N)
    fed = rng.integers(0, (Pt - Pp) * ps, N)
    table = np.zeros((N, Pt), np.int32)
    pages = iter(rng.permutation(np.arange(1, NP)))
    for r in range(N):
        for e in range(Pp + fed[r] // ps + 1):
            table[r, e] = next(pages)
    cache = {
        "k_pages": jnp.asarray(rng.normal(size=(L, NP, K, Dh, ps)), dtype),
        "v_pages": jnp.asarray(rng.normal(size=(L, NP, K, ps, Dh)), dtype),
        "page_table": jnp.asarray(table),
    }
    cache["k_pages"] = cache["k_pages"].at[:, paged_attention.SCRATCH_PAGE].set(0)
    cache["v_pages"] = cache["v_pages"].at[:, paged_attention.SCRATCH_PAGE].set(0)
    q = jnp.asarray(rng.normal(size=(N, 1, H, Dh)), dtype)
    valid = paged.key_valid(jnp.asarray(n), jnp.asarray(fed), Pp, Pt, ps)
    return q, cache, valid, jnp.asarray(Pp * ps + fed + 1, jnp.int32)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the GPU kernel compiles on a GPU")
@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_gpu_kernel_compiled_equals_the_plain_pages(dtype, atol):
    """On a GPU, "pallas" compiles kernels/paged_kernel_gpu.py through Triton: at a real head
    size it equals the plain pages at both layers, float32 at full precision (both sides) to
    1e-5 and bfloat16 to its rounding."""
    q, cache, valid, kv_end = _gpu_case(dtype)
    with jax.default_matmul_precision("highest"):
        for layer in range(2):
            got = paged_attention.attend_pages(q, cache, valid, layer, kv_end, "pallas")
            want = paged_attention.paged_attention(q, cache, valid, layer, kv_end, block_pages=1)
            assert np.isfinite(np.asarray(got, np.float32)).all()
            np.testing.assert_allclose(
                np.asarray(got, np.float32), np.asarray(want, np.float32), atol=atol
            )


def test_gpu_kernel_case_runs_in_interpret_mode():
    """The compiled GPU test's case (head dim 128, pages of 16) in interpret mode on this CPU:
    the same comparison, so the case itself is checked wherever the suite runs."""
    q, cache, valid, kv_end = _gpu_case(jnp.float32)
    got = paged_attention.attend_pages(q, cache, valid, 1, kv_end, "interpret_gpu")
    want = paged_attention.paged_attention(q, cache, valid, 1, kv_end, block_pages=1)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a kernel compiles here")
def test_pallas_where_it_cannot_run_is_a_one_line_error():
    """On a CPU: "pallas" says it needs a TPU or a GPU, "auto" is the plain pages, and a value
    that names no implementation is refused with the valid ones."""
    q, cache, valid, kv_end = _ragged_case(scratch=7.0)
    np.testing.assert_array_equal(
        paged_attention.attend_pages(q, cache, valid, 0, kv_end, "auto"),
        paged_attention.paged_attention(q, cache, valid, 0, kv_end),
    )
    with pytest.raises(ValueError, match="model.paged_attention='pallas' needs a TPU or a GPU"):
        paged_attention.attend_pages(q, cache, valid, 0, kv_end, "pallas")
    with pytest.raises(ValueError, match="paged_attention='triton' is not one of"):
        models.get_model_config("tiny", paged_attention="triton")


@pytest.mark.long
@pytest.mark.parametrize("kernel", ["interpret", "interpret_gpu"])
def test_continuous_engine_with_the_kernel_in_interpret_mode_equals_static(kernel):
    """The continuous engine with model.paged_attention="interpret" (the TPU kernel) or
    "interpret_gpu" (the GPU kernel), inside the engine's loops and the layer scan, the layer
    index traced, samples the static engine's tokens, log-probs to 1e-5, and returns every page
    (about a minute of interpret mode each)."""
    plain = tce._peaked("tiny")
    prompts, lengths = tce._prompts(plain.cfg.vocab_size)
    static = rollout.generate(plain, prompts, lengths, rng=jax.random.key(0), **tce._kw())
    cfg = models.get_model_config("tiny", tie_embeddings=False, paged_attention=kernel)
    model = models.Transformer(cfg, rngs=nnx.Rngs(0))
    model.lm_head.value = model.lm_head[...] * 15.0  # tce._peaked's model, with the kernel
    out, state = tce._run(model, prompts, lengths, slots=5, page_size=4)
    tce._assert_same_rollout(out, static)
    tce._assert_pages_returned(state)
