"""experiments/benchmarks/decode_ledger.py: its schedule of the continuous engine is the engine's
(decode steps and slot-steps, drain widths included), and its ledger runs at tiny shapes."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "benchmarks"
    ),
)

import decode_ledger  # noqa: E402

from gspo_jax import models  # noqa: E402
from gspo_jax.rollout import continuous  # noqa: E402


def test_drain_decodes_one_step_of_the_narrowest_width_holding_the_live_rows():
    assert continuous.drain_widths(64, 3) == (32, 16, 8)
    assert continuous.drain_widths(64, 0) == ()
    assert continuous.drain_widths(4, 3) == (2, 1)
    assert [continuous.drain_width_for(64, 3, n) for n in (1, 8, 9, 17, 32, 33)] == [
        8, 8, 16, 32, 32, 64,
    ]  # fmt: skip


def test_the_ledgers_schedule_is_the_continuous_engines():
    """The simulated schedule (decode steps, slot-steps summed over the steps' widths) equals
    what the engine ran for the same row lengths: queue refills, the drain's widths."""
    G, P, Lp, T, N = 4, 4, 8, 40, 8
    cfg = models.get_model_config("tiny", max_seq_len=Lp + T)
    model = models.Transformer(cfg, rngs=nnx.Rngs(0))
    prompts = jax.random.randint(jax.random.key(1), (P, Lp), 1, cfg.vocab_size)
    lengths = jnp.full((P,), Lp, jnp.int32)
    out, state = continuous.run(
        model, prompts, lengths, jax.random.key(0), eos_id=3, pad_id=0, num_samples=G,
        max_new_tokens=T, temperature=1.0, top_k=0, top_p=1.0, return_routes=False, slots=N,
        page_size=4,
    )  # fmt: skip
    ell = np.asarray(out.lengths)
    assert ell.min() < T  # some rows ended early: the queue refilled and the drain narrowed
    steps = decode_ledger.continuous_schedule(ell, N, 4, group=G)
    assert len(steps) == int(state.decode_steps)
    assert sum(s["width"] for s in steps) == int(state.decoded_slots)
    assert any(s["width"] < N for s in steps)


# long: compiles every engine's step at tiny shapes (~45 s); the schedule's test stays quick
@pytest.mark.long
def test_ledger_runs_at_tiny_shapes():
    table = decode_ledger.run(["qwen3_0_6b"], [8], quick=True, log=lambda m: None)
    assert {(r["mix"], r["engine"]) for r in table} == {
        (m, e) for m in decode_ledger.MIXES for e in decode_ledger.ENGINES
    }
    for r in table:
        assert r["steps"] > 0 and r["ideal_bytes"] > 0 and r["compiled_bytes"] > 0
        assert r["ops_per_token"] > 0
    assert "ops/tok" in decode_ledger.format_table(table)


def test_float32_ledger_counts_four_byte_weights_and_kv():
    """--dtype float32: the ideal counts the weights and the KV at 4 bytes, twice bfloat16's."""
    bf16, f32 = (
        decode_ledger.model_sizes(decode_ledger.abstract_model("qwen3_0_6b", 80, True, dt))
        for dt in ("bfloat16", "float32")
    )
    assert (bf16["itemsize"], f32["itemsize"]) == (2, 4)
    assert f32["kv_bytes_per_token"] == 2 * bf16["kv_bytes_per_token"]
    assert f32["read_params"] == bf16["read_params"]
