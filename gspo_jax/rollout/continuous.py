"""The continuous-batching engine: a fixed number of decode slots fed from the queue of the
step's B = P·G sequences, over a paged KV cache.

Dimension legend: P prompts, G samples per prompt, B = P * G rows (group-contiguous: row b
belongs to prompt b // G), N = slots, Lp padded prompt length, T = max_new_tokens, V vocab,
ps page size, Pp / Pg / Pt prompt / generated / all page-table entries per slot (rollout/paged.py),
NP pages in the pool, L layers, k experts per token.

Called through rollout.generate(..., engine="continuous", slots=N); returns the static engine's
SampleOutput, and the same tokens: see "Randomness".

Why: the static engine decodes all B rows until the longest ends, so a row that emitted EOS
keeps its slot, computing nothing useful, until the last one finishes; with long-tailed
response lengths most of its slot-steps are wasted. Here a slot whose row ends takes the next
row of the queue at once, so the N slots stay busy until the queue runs dry.

How it works:
- Queue and slots: rows are taken in order 0 .. B - 1. Before each decode step the refill loop
  (a lax.while_loop) gives every free slot the next row. The first row of a group prefills its
  prompt ([1, Lp] forward, run only when one is due): the prompt's KV goes to Pp
  fresh pages and its G rows' first tokens are sampled from the prompt's last logits at once.
  The group's other rows attach to the same pages (reference-counted, rollout/paged.py), so a
  prompt's KV is held once however many of its samples decode, as the static shared-prefix
  decode shares it. A row whose first token is EOS (or with T = 1) never takes a slot.
- Decode step: every slot feeds its row's last token at its own position and logical slot
  (kernels/paged_attention.py: the step's key/value scattered into the row's page, attention over
  the row's pages); a slot that starts a new page takes a free one first. The step lists the
  prompts of its active slots once each (shared_prefixes), so attention reads a prompt's pages
  once for all its rows in slots, as the static engine's shared-prefix decode does. A row ends
  at EOS or at its T-th token: its slot frees, its generated pages go back to the pool and its
  prompt's pages lose one reference. Slots with no row still run (static shapes) and write to the
  scratch page; their outputs are dropped.
- Drain: once the queue is empty, no slot can be refilled, and the last rows (the long tail)
  would keep all N slots decoding for a few rows. So the live rows are compacted into the first
  slots (a row moves by its page-table row; its KV stays in its pages) and each step decodes
  them in one decode of the narrowest width N / 2, N / 4, ... N / 2^shrink that holds them
  (drain_widths), so the drain's slot-steps follow the live rows and a step is one pass over
  the layers whatever its width.
- Randomness per sequence, not per slot: row b draws its t-th token with the uniform
  uniform(fold_in(rng, t), (B,))[b], the static engine's, computed for that row alone
  (sampling.row_uniforms). So the tokens do not depend on the schedule (slots, page size,
  refill strategy) and equal the static engine's from the same logits; log-probs agree to
  float32 summation order (attention over pages sums in another order than the shared-prefix
  decode). In bfloat16 that order shows: a token whose draw falls within rounding of a CDF
  boundary can differ between the engines (as between the static engine's two layouts).
- Refill strategies (refill=): "device" (default) runs the whole rollout as one on-device
  lax.while_loop that refills before every decode step, never returning to the host;
  "chunked" runs `chunk` decode steps per jitted call and refills only between calls (the host
  loops until every row has ended), so a slot freed inside a chunk idles until the chunk ends.
  docs/benchmarks.md has the measured comparison.
- One compile per (graphdef, shapes, G, T, slots, page_size, sampling settings, refill,
  chunk, shrink): the program holds one refill loop, one N-slot decode step and one decode
  step per drain width (shrink of them) whatever T, so compile time does not grow with
  max_new_tokens.
  Parameters, prompts, lengths, rng, eos_id and pad_id are traced.
- Memory: the pool holds paged.pages_needed(slots, Lp, T, ps) pages by default (enough that
  allocation never fails: models.paged_cache_bytes gives its bytes), against the static
  engine's B rows of T generated slots: the cache scales with N, not B.
- Partial rollouts (generate_partial): the queue may hold groups carried from an earlier step
  (PartialRows: each row's tokens so far, their log-probs and policy versions, whether it
  ended), and the loop stops as soon as complete_groups groups are complete. A carried row is
  continued, not restarted: before the loop, one batched forward of the carried rows' prompts
  and tokens (resume_carried) recomputes their KV with the current policy into fresh pages,
  which a row takes with its slot; its group's prompt is prefilled again as usual. Its tokens
  keep their log-probs and versions, and sampling resumes at its first missing token. The rows
  still running or not yet started are handed back for the next step. So a step is not held up
  by its longest rows, and each token records the policy that sampled it.

The plan's unit of cost: decode_step_for_plan (one decode step of N slots, module bottom). The
loop's state and the parts of one trip (refill, decode, the drain) are continuous_step.py's.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from gspo_jax.models import sequence_layout, slot_mask
from gspo_jax.rollout import paged
from gspo_jax.rollout.continuous_step import (  # noqa: F401  (the loop's public names, here too)
    EngineState,
    _Inputs,
    compact,
    decode,
    decode_draining,
    drain_width,
    drain_width_for,
    drain_widths,
    init_state,
    refill,
    shared_prefixes,
)
from gspo_jax.rollout.output import PartialRows, SampleOutput
from gspo_jax.rollout.sampling import static_temperature

REFILL_STRATEGIES = ("device", "chunked")
# KV slots per page, so also the keys of one attention work item (paged_attention reads one
# page per item): 64, the static engine's decode_block, so that an item is the static engine's
# chunk. Smaller pages make more and smaller items, each with its own softmax and fold; larger
# ones read more masked keys past each row's end (docs/benchmarks.md has the sizes measured).
DEFAULT_PAGE_SIZE = 64

_TRACES = {"run": 0}  # incremented at trace time; tests use it to prove "no recompile"


def start(model, inputs: _Inputs, cfg: dict) -> EngineState:
    """init_state, and with partial rollouts the carried rows' KV (resume_carried)."""
    s = init_state(model, inputs, cfg)
    if cfg["complete_groups"] is None:
        return s
    return resume_carried(model, inputs, s, cfg)


def resume_carried(model, inputs: _Inputs, s: EngineState, cfg: dict) -> EngineState:
    """Partial rollouts, before the loop: the KV of every carried row that already has n >= 2
    tokens, recomputed with the current policy in one batched [R, Lp + T] forward of the rows'
    prompts and tokens (the prompt + response layout of the trainer's response_logprobs, R =
    cfg["slots"]: the rows were in slots when their step stopped, so at most N of them), written
    to fresh generated pages (tokens 0 .. n - 2, the ones fed so far) listed in row_pages. A row
    takes its pages when refill gives it a slot and resumes at token n (token n - 1 is fed next),
    as if it had decoded them. One pass outside the loop: a forward inside the refill loop made
    every decode step of the program slower on XLA:CPU, taken or not (not re-measured: likely
    the hoisting refill's note describes)."""
    P, Lp = inputs.prompts.shape
    G, T, R = cfg["G"], cfg["T"], cfg["slots"]
    B = s.tokens.shape[0]
    Pg = s.row_pages.shape[1]
    ps = cfg["page_size"]
    carried = (s.forced >= 2) & ~s.ended  # [B]
    rows = jnp.nonzero(carried, size=R, fill_value=B)[0].astype(jnp.int32)  # [R]; B: none
    real = rows < B
    r = jnp.minimum(rows, B - 1)
    p = r // G
    n = jnp.where(real, s.forced[r], 0)  # [R]
    pos, valid = sequence_layout(inputs.prompt_lengths[p], Lp, T)  # [R, Lp + T]
    out = model.forward(
        jnp.concatenate([inputs.prompts[p], s.tokens[r]], axis=1).astype(jnp.int32),
        pos,
        slot_mask(valid, jnp.arange(Lp + T, dtype=jnp.int32)),
        token_mask=valid,
        cache=model.init_cache(R, Lp + T),
        write_index=0,
    )
    kv = out["cache"]  # {"k": [L, R, K, Dh, Lp + T], "v": [L, R, K, Lp + T, Dh]}
    need = jnp.arange(Pg, dtype=jnp.int32)[None, :] * ps < (n - 1)[:, None]  # [R, Pg]
    refcount, pages, failed = paged.allocate_rows(s.refcount, need.reshape(-1))
    pages = pages.reshape(R, Pg)  # scratch where not needed
    # every row's generated slots [Lp, Lp + T - 1) as one flat list of pages: [L, R·Pg, ...]
    gen = {
        "k": kv["k"][..., Lp : Lp + T - 1].transpose(0, 2, 3, 1, 4),  # [L, K, Dh, R, T - 1]
        "v": kv["v"][:, :, :, Lp : Lp + T - 1].transpose(0, 2, 1, 3, 4),  # [L, K, R, T - 1, Dh]
    }
    pad = Pg * ps - (T - 1)
    L, K, Dh = gen["k"].shape[0], gen["k"].shape[1], gen["k"].shape[2]
    k = jnp.pad(gen["k"], ((0, 0),) * 4 + ((0, pad),)).reshape(L, K, Dh, R * Pg, ps)
    v = jnp.pad(gen["v"], ((0, 0),) * 3 + ((0, pad), (0, 0))).reshape(L, K, R * Pg, ps, Dh)
    cache = _write_pages(s.cache, k, v, pages.reshape(-1))
    row_pages = s.row_pages.at[jnp.where(real, rows, B)].set(pages, mode="drop")
    failed = failed | (jnp.sum(carried) > R)  # more carried rows than slots: never, see above
    return s.replace(refcount=refcount, cache=cache, row_pages=row_pages, failed=s.failed | failed)


def _write_pages(cache: dict, k: jax.Array, v: jax.Array, pages: jax.Array) -> dict:
    """The paged cache with whole pages written: k [L, K, Dh, n, ps], v [L, K, n, ps, Dh] into
    pool pages [n] (scratch-page entries may repeat: nobody reads that page)."""
    kd, vd = cache["k_pages"].dtype, cache["v_pages"].dtype
    return dict(
        cache,
        k_pages=cache["k_pages"].at[:, pages].set(k.transpose(0, 3, 1, 2, 4).astype(kd)),
        v_pages=cache["v_pages"].at[:, pages].set(v.transpose(0, 2, 1, 3, 4).astype(vd)),
    )


def _step(model, inputs, s, cfg):
    """Refill, then one decode step (the loop ends when no slot holds a row and the queue is
    empty, so after a refill there is a row to decode unless the last rows all ended at
    their first token; then the step decodes nothing and counts no step)."""
    s = refill(model, inputs, s, cfg)
    return decode_draining(model, inputs, s, cfg)


def _run(graphdef, params, inputs: _Inputs, s: EngineState | None, *, cfg: tuple):
    """refill="device": the whole rollout from init_state (s is None). "chunked": one refill
    and then up to cfg["chunk"] decode steps from s."""
    _TRACES["run"] += 1
    cfg = dict(cfg)
    model = nnx.merge(graphdef, params)
    if cfg["refill"] == "device":
        return jax.lax.while_loop(
            lambda s: ~s.stopped(cfg),
            lambda s: _step(model, inputs, s, cfg),
            start(model, inputs, cfg),
        )
    s = refill(model, inputs, s, cfg)
    s, _ = jax.lax.while_loop(
        lambda c: jnp.any(c[0].active) & ~c[0].stopped(cfg) & (c[1] < cfg["chunk"]),
        lambda c: (decode_draining(model, inputs, c[0], cfg), c[1] + 1),
        (s, jnp.zeros((), jnp.int32)),
    )
    return s


_run_jit = jax.jit(_run, static_argnames=("graphdef", "cfg"), donate_argnames=("s",))
_init_jit = jax.jit(
    lambda graphdef, params, inputs, cfg: start(nnx.merge(graphdef, params), inputs, dict(cfg)),
    static_argnames=("graphdef", "cfg"),
)


def _output(s: EngineState) -> SampleOutput:
    return SampleOutput(
        tokens=s.tokens,
        mask=s.mask,
        logp=s.logp,
        sample_logp=s.sample_logp,
        lengths=jnp.sum(s.mask, axis=-1).astype(jnp.int32),
        routes=s.routes,
        versions=s.versions,
    )


def _group_rows(groups: jax.Array, G: int) -> jax.Array:
    """[n] group indices -> [n * G] their rows (group-contiguous)."""
    return (groups[:, None] * G + jnp.arange(G, dtype=groups.dtype)[None, :]).reshape(-1)


def split_partial(s: EngineState, G: int, complete_groups: int):
    """A stopped engine's queue of Q groups split into the first complete_groups complete groups
    (queue order) and the Q - complete_groups others, carried to the next step:
    (SampleOutput [complete_groups * G rows], selected [complete_groups] int32 queue indices,
    carried [Q - complete_groups] int32 queue indices, PartialRows of the carried rows).

    The loop stops as soon as complete_groups groups are complete, so there are at least that
    many; a step that completes several groups at once may complete more: the extra complete
    groups are carried (done rows) and come out first in the next step."""
    Q = s.tokens.shape[0] // G
    complete = jnp.all(s.ended.reshape(Q, G), axis=1)  # [Q]
    selected = jnp.nonzero(complete, size=complete_groups, fill_value=0)[0].astype(jnp.int32)
    taken = jnp.zeros((Q,), bool).at[selected].set(True)
    carried = jnp.nonzero(~taken, size=Q - complete_groups, fill_value=0)[0].astype(jnp.int32)
    out = jax.tree.map(lambda x: x[_group_rows(selected, G)], _output(s))
    rows = _group_rows(carried, G)
    carry = PartialRows(
        tokens=s.tokens[rows],
        mask=s.mask[rows],
        logp=s.logp[rows],
        sample_logp=s.sample_logp[rows],
        versions=s.versions[rows],
        done=s.ended[rows],
    )
    return out, selected, carried, carry


def engine_config(
    prompts_shape: tuple[int, int],
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    return_routes: bool,
    slots: int | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    num_pages: int | None = None,
    refill: str = "device",
    chunk: int = 16,
    shrink: int = 3,
    complete_groups: int | None = None,
) -> dict:
    """The engine's static configuration, checked (one-line ValueErrors naming the fix).

    slots: decode slots N (default: B, one per row; more than B is clamped to B). page_size: KV
    slots per page. num_pages: the pool (default and minimum: paged.pages_needed, so allocation
    never fails). refill / chunk: REFILL_STRATEGIES (module docstring). shrink: the drain decodes
    N / 2, N / 4, ... N / 2^shrink slots, the narrowest holding the live rows (drain_widths;
    0 = always decode all N slots at once).
    complete_groups (partial rollouts): stop once that many groups are complete (None: when
    every row has ended)."""
    P, Lp = prompts_shape
    B = P * num_samples
    slots = B if slots is None else int(slots)
    if slots < 1:
        raise ValueError(f"slots={slots} must be >= 1 (decode slots; e.g. slots=B/4).")
    if int(page_size) < 1:
        raise ValueError(f"page_size={page_size} must be >= 1 (KV slots per page, e.g. 64).")
    if refill not in REFILL_STRATEGIES:
        raise ValueError(f"refill={refill!r} is not one of {REFILL_STRATEGIES}.")
    if int(shrink) < 0:
        raise ValueError(f"shrink={shrink} must be >= 0 (the drain decodes N / 2^shrink slots).")
    if int(chunk) < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 (decode steps per call, refill='chunked').")
    slots = min(slots, B)
    if complete_groups is not None and not 1 <= int(complete_groups) <= P:
        raise ValueError(
            f"complete_groups={complete_groups} must be in [1, {P}] (the groups in the queue)."
        )
    if complete_groups is not None and return_routes:
        raise ValueError(
            "partial rollouts cannot return routes (a carried row's prompt is prefilled again by "
            "a newer policy, so its recorded routes would mix policies); drop return_routes."
        )
    resumed = 0 if complete_groups is None else slots  # resume_carried's rows, at most N
    needed = paged.pages_needed(slots, Lp, max_new_tokens, int(page_size), resumed)
    num_pages = needed if num_pages is None else int(num_pages)
    if num_pages < needed:
        raise ValueError(
            f"num_pages={num_pages} is too small a cache for slots={slots}, page_size="
            f"{page_size}, prompt {Lp} + {max_new_tokens} tokens: it needs {needed} "
            f"(1 + slots * (prompt pages + generated pages)); raise num_pages or lower slots."
        )
    return dict(
        G=int(num_samples),
        T=int(max_new_tokens),
        # an array temperature (a population member's) is traced: _Inputs.temperature
        temperature=float(temperature) if static_temperature(temperature) else None,
        top_k=int(top_k),
        top_p=float(top_p),
        return_routes=bool(return_routes),
        slots=slots,
        page_size=int(page_size),
        num_pages=num_pages,
        refill=refill,
        chunk=int(chunk),
        shrink=int(shrink),
        complete_groups=None if complete_groups is None else int(complete_groups),
    )


def run(
    model,
    prompts,
    prompt_lengths,
    rng,
    *,
    eos_id,
    pad_id,
    carry: PartialRows | None = None,
    version=0,
    **config,
):
    """The rollout and its final EngineState: (SampleOutput, EngineState). config:
    engine_config's keywords. The state carries the figures the benchmark reports
    (decode_steps, decoded_slots: the slot-steps they ran) and the pool (refcount: all 0 but
    the scratch page at the end, every page returned). carry / version: partial rollouts
    (generate_partial)."""
    chex.assert_rank([prompts, prompt_lengths], [2, 1])
    cfg = engine_config(prompts.shape, **config)
    graphdef, params = nnx.split(model)
    B = prompts.shape[0] * cfg["G"]
    inputs = _Inputs(
        prompts=jnp.asarray(prompts, jnp.int32),
        prompt_lengths=jnp.asarray(prompt_lengths, jnp.int32),
        rng=rng,
        eos_id=jnp.asarray(eos_id, jnp.int32),
        pad_id=jnp.asarray(pad_id, jnp.int32),
        version=jnp.asarray(version, jnp.int32),
        carry=PartialRows.empty(B, cfg["T"], pad_id) if carry is None else carry,
        temperature=None
        if cfg["temperature"] is not None
        else jnp.asarray(config["temperature"], jnp.float32),
    )
    key = tuple(sorted(cfg.items()))
    if cfg["refill"] == "device":
        s = _run_jit(graphdef, params, inputs, None, cfg=key)
    else:
        if isinstance(inputs.prompts, jax.core.Tracer):
            raise ValueError(
                "refill='chunked' loops on the host and cannot run under an outer jit; use "
                "refill='device'."
            )
        s = _init_jit(graphdef, params, inputs, cfg=key)
        while not bool(s.stopped(cfg)):  # one host sync per chunk
            s = _run_jit(graphdef, params, inputs, s, cfg=key)
    return _output(s), s


def generate_continuous(
    model,
    prompts,
    prompt_lengths,
    rng,
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    eos_id: int,
    pad_id: int,
    return_routes: bool,
    slots: int | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    num_pages: int | None = None,
    refill: str = "device",
    chunk: int = 16,
    shrink: int = 3,
) -> SampleOutput:
    """The continuous engine behind rollout.generate (which checks the arguments first).
    slots: decode slots (default B); page_size: KV slots per page; num_pages: the pool (default
    the minimum that never runs out); refill: "device" (one on-device loop) or "chunked"
    (`chunk` decode steps per jitted call, refilled between calls); shrink: the last rows
    drain in steps of slots / 2, / 4, ... / 2^shrink (0: always all slots at once). Module
    docstring."""
    out, _ = run(
        model,
        prompts,
        prompt_lengths,
        rng,
        eos_id=eos_id,
        pad_id=pad_id,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        return_routes=return_routes,
        slots=slots,
        page_size=page_size,
        num_pages=num_pages,
        refill=refill,
        chunk=chunk,
        shrink=shrink,
    )
    return out


def generate_partial(
    model,
    prompts,
    prompt_lengths,
    rng,
    carry: PartialRows,
    *,
    version,
    complete_groups: int,
    num_samples: int,
    eos_id: int,
    pad_id: int,
    **config,
):
    """A partial rollout: the continuous engine over a queue of Q groups (prompts [Q, Lp], the
    carried ones first), stopped as soon as complete_groups of them are complete.

    carry: PartialRows [Q * G, T], the queue's rows as far as earlier steps generated them
    (PartialRows.empty for new groups); version: the policy version sampling now (scalar int,
    e.g. the trainer's step), recorded per token. Returns split_partial's (SampleOutput of the
    complete_groups selected groups with .versions, selected [n] and carried [Q - n] queue
    indices, PartialRows of the carried rows). config: engine_config's other keywords
    (max_new_tokens, temperature, top_k, top_p, slots, page_size, ...; no return_routes).

    A carried row's KV is recomputed by the current policy (one batched forward of the carried
    rows' prompts and tokens before the loop: resume_carried); its tokens keep their log-probs
    and versions, and sampling resumes after them with the current step's key."""
    _, s = run(
        model,
        prompts,
        prompt_lengths,
        rng,
        eos_id=eos_id,
        pad_id=pad_id,
        carry=carry,
        version=version,
        num_samples=num_samples,
        complete_groups=complete_groups,
        return_routes=False,
        **config,
    )
    return split_partial(s, num_samples, complete_groups)


def decode_step_for_plan(model, *, num_prompts: int, prompt_len: int, **config):
    """(jitted function, its arguments): one N-slot decode step of the engine at these shapes
    (the unit the rollout repeats), for the memory plan to lower and cost:
    fn.lower(*args).compile() (memory_analysis, cost_analysis). config: engine_config's
    keywords (num_samples, max_new_tokens, temperature, top_k, top_p, return_routes, slots,
    page_size, ...). The engine state argument is abstract (jax.ShapeDtypeStruct leaves): the
    page pool, tables and output buffers a step of the real loop carries; nothing is allocated.
    A refill's prefill is a [1, Lp] forward, once per prompt (not per step)."""
    cfg = engine_config((num_prompts, prompt_len), **config)
    graphdef, params = nnx.split(model)
    inputs = _Inputs(
        prompts=jnp.ones((num_prompts, prompt_len), jnp.int32),
        prompt_lengths=jnp.full((num_prompts,), prompt_len, jnp.int32),
        rng=jax.random.key(0),
        eos_id=jnp.asarray(-1, jnp.int32),
        pad_id=jnp.asarray(0, jnp.int32),
        version=jnp.zeros((), jnp.int32),
        carry=PartialRows.empty(num_prompts * cfg["G"], cfg["T"], 0),
    )
    state = jax.eval_shape(lambda: init_state(model, inputs, cfg))

    def one_step(params, inputs, state):
        return decode(nnx.merge(graphdef, params), inputs, state, cfg)

    return jax.jit(one_step, donate_argnums=2), (params, inputs, state)
