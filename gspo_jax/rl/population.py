"""A population: many runs of one experiment as one program (config.population).

    summary = trainer.train(config, workdir)   # population.seeds set: steppers.PopulationStepper
    population.refusal(config)                 # why it cannot run as one (a line), or None

The members differ in their seed and in the numeric fields of config.population.vary
(config/population.py: the members and their checks). They share the shapes and the program's
structure, so one Run is built (from the first member's config) and every part of the state gains
a leading member axis M: the parameters, the optimizer state, the base keys and the step count.
The step's phases are rl/step.py's, under jax.vmap over M (one jitted program per phase for all
members; on a CPU the rollout is instead the single run's program called once per member,
make_member_rollout, since the vmapped decode loop copies the members' KV cache), and the
update takes the varied fields as traced [M] values: the objective's through
Objective.with_values, the learning rate as a per-member factor on the optimizer's updates (a
single run with that learning rate scales the same AdamW step by the schedule; the factor is
exactly 1 for a member with the config's learning rate).

Each member is a run: WORKDIR/members/<name>/ holds what a single run writes (config.json,
metrics.jsonl, TensorBoard events, base_eval.json, summary.json), so the sweep, the analysis and
the notebooks read members unchanged. Member i sees exactly what a single run with its config sees:
its own prompt stream (data.seed = its seed), its own step keys (fold_in of key(its seed)), and the
shared warm start (keyed by init.warmstart.seed, not the run's seed). The checkpoint
(WORKDIR/checkpoints) holds the whole stacked state, every member's iterator position and which
members are frozen, so a resume is exact. With LoRA each member's adapters are drawn from its own
seed (initial_params), its reference is read from its own parameters (adapters.reference_view),
and the checkpoint holds the adapters alone with the base's identity, as a single LoRA run's (the
base loads again).
A member whose loss, gradient norm or new parameters are not finite keeps its last finite
parameters and optimizer state from then on (frozen, marked
``train/frozen`` in its metrics and ``frozen_at_step`` in its summary); the others go on. Each
member's collapse (rl.collapse_patience steps in a row without a learning signal) is watched as
a single run's is: warned, and with rl.stop_on_collapse that member stops there
(``collapsed_at_step``), the others go on; the counts are in the checkpoint. That housekeeping
is rl/trainer.py's Session, the single run's, over the members: this module builds the
population and takes its step (population_step: rl/step.py's learn_on_batch over the members'
phases); it holds no loop.

Not bit-identical to the single runs: vmapped matmuls and reductions may sum in another order, and
traced hyperparameters are float32 arithmetic where a single run folds Python floats; the first
step agrees to float32 rounding (tests/test_population.py).

Dimension legend: M members, P prompts per step, G samples per prompt, B = P*G rows, Lp prompt
slots, T response slots.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from gspo_jax import config as config_lib
from gspo_jax import objectives, sharding
from gspo_jax.config import ConfigError
from gspo_jax.config import population as population_cfg
from gspo_jax.rl import adapters, build
from gspo_jax.rl import step as ts
from gspo_jax.rl.update import make_update_fn
from gspo_jax.state import Run, TrainState, step_keys

LR_SCALE = "lr_scale"  # the hyperparameter pytree's key of the learning-rate factor
TEMPERATURE = "temperature"  # its key of the sampling (and log-prob) temperature

# ------------------------------------------------------------------------------------ building


@dataclasses.dataclass
class Population:
    """The Run the members share (built from the first member's config), the members, and their
    varied values as [M] arrays: the objective's TRACEABLE_FIELDS by name, LR_SCALE and
    TEMPERATURE."""

    run: Run
    members: list[population_cfg.Member]
    hparams: dict[str, jax.Array]  # name -> [M] float32

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def axis(self) -> str | None:
        """The mesh axis the members spread over (config.mesh.population > 1), or None."""
        names = self.run.mesh.axis_names
        return sharding.POPULATION_AXIS if sharding.POPULATION_AXIS in names else None

    def on_members(self, spec: tuple = ()) -> jax.sharding.NamedSharding:
        """The sharding of an [M, ...] array: members over the population axis, then ``spec``."""
        return jax.sharding.NamedSharding(
            self.run.mesh, jax.sharding.PartitionSpec(self.axis, *spec)
        )


def build_population(config: ml_collections.ConfigDict, workdir: str | None = None) -> Population:
    """Checks every member's concrete config (its objective's values included) as a single run
    would, then builds the one shared Run; ConfigError names the member's field and the fix."""
    members = population_cfg.members(config)
    if not members:
        raise ConfigError("config.population.seeds is empty: this is a single run (trainer.train)")
    objs = []
    for m in members:
        try:
            config_lib.validate(m.config)
            objs.append(build.make_objective(m.config))
        except ConfigError as e:
            raise ConfigError(f"population member {m.name}: {e}") from None
    # The shared Run: the population's config (its mesh has the member axis) with the first
    # member's seed and values, so member 0's program is a single run's.
    run_config = copy.deepcopy(config)
    with run_config.unlocked():
        run_config.seed = members[0].seed
        for field, v in members[0].values.items():
            config_lib.set_field(run_config, field, float(v))
    run = build.build_run(run_config, workdir)
    hparams = {}
    varied = {f for m in members for f in m.values}
    for field in sorted(varied):
        section, name = field.split(".", 1)
        if section == "objective":
            hparams[name] = jnp.asarray([getattr(o, name) for o in objs], jnp.float32)
        elif field == "optimizer.learning_rate":
            lr0 = float(members[0].config.optimizer.learning_rate)
            lrs = [float(m.config.optimizer.learning_rate) for m in members]
            hparams[LR_SCALE] = jnp.asarray([lr / lr0 for lr in lrs], jnp.float32)
        elif field == "rl.temperature":
            temps = [float(m.config.rl.temperature) for m in members]
            hparams[TEMPERATURE] = jnp.asarray(temps, jnp.float32)
    pop = Population(run, members, {})
    pop.hparams = jax.device_put(hparams, pop.on_members())
    return pop


def refusal(config: ml_collections.ConfigDict) -> str | None:
    """Why ``config`` (population.seeds set) cannot run as a population, in build_population's
    one line, or None when it can. It is build_population itself (the population's fields, every
    member's config and objective, the shared Run's checks: config/combinations.py's table of
    what a population runs with), so nothing is listed twice; it builds no parameters and touches
    no workdir. experiments/sweep.py asks it (in a CPU-only process) before it merges runs."""
    try:
        build_population(config)
    except ConfigError as e:
        return str(e)
    return None


def stack(trees: list) -> object:
    """[M, ...] leaves from M pytrees of the same structure."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def member(tree, i: int):
    """Member i's slice of a stacked pytree."""
    return jax.tree.map(lambda x: x[i], tree)


def member_params(pop: Population, state: TrainState, i: int):
    """Member i's parameters placed as a single run's (evaluation, comparisons)."""
    return jax.device_put(member(state.params, i), pop.run.state_shardings)


def initial_state(pop: Population, params, member_params: list | None = None) -> TrainState:
    """Step 0 of every member: the shared base parameters (``member_params``: each member's own,
    with LoRA its adapters drawn from its seed) and fresh optimizer state, stacked, and each
    member's base key (key(its seed), as build.initial_state gives its single run)."""
    single = build.initial_state(pop.run, params)
    M = pop.size
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (M, *x.shape)).copy(), single)
    if member_params is not None:  # Adam's moments start at 0 whatever the parameters
        state = state.replace(params=stack(member_params))
    rngs = [jax.random.key_data(jax.random.key(m.seed)) for m in pop.members]
    state = state.replace(rng=jnp.stack(rngs))
    return jax.device_put(state, jax.tree.map(lambda a: a.sharding, abstract_state(pop)))


def stacked_abstract(pop: Population, tree):
    """A single run's tree of ShapeDtypeStructs (with shardings) with a leading M axis over the
    population axis, the rest sharded as in the single run."""

    def stacked(a):
        spec = tuple(a.sharding.spec) + (None,) * (len(a.shape) - len(a.sharding.spec))
        return jax.ShapeDtypeStruct((pop.size, *a.shape), a.dtype, sharding=pop.on_members(spec))

    return jax.tree.map(stacked, tree)


def abstract_state(pop: Population) -> TrainState:
    """The stacked TrainState's shapes and shardings: each leaf with a leading M axis over the
    population axis, the rest as in a single run."""
    return stacked_abstract(pop, build.abstract_state(pop.run, pop.run.abs_params))


def saved_abstract_state(pop: Population) -> TrainState:
    """What a checkpoint holds, stacked (the restore target): the whole state, or with LoRA the
    adapters' parameters and optimizer state (adapters.saved_state, as a single run's)."""
    return stacked_abstract(pop, build.saved_abstract_state(pop.run))


def initial_params(pop: Population, cache_dir: str | None = None) -> tuple:
    """(member 0's initial parameters, each member's (None without LoRA: all start from the
    first), seconds): the base loaded once; with LoRA each member's adapters drawn from its own
    seed, as its single run draws them."""
    t0 = time.time()
    model = build.base_model(pop.run, cache_dir)
    params = build.policy_params(pop.run, model, pop.members[0].seed)
    own = None
    if adapters.draws_own_adapters(pop.run):
        own = [params] + [build.policy_params(pop.run, model, m.seed) for m in pop.members[1:]]
    return params, own, time.time() - t0


def with_base(pop: Population, restored: TrainState, base) -> TrainState:
    """A restored stacked state (saved_abstract_state) with the base's frozen weights put back in
    every member (adapters.with_base for each member; adapters.restored calls it with LoRA)."""
    shardings = jax.tree.map(lambda a: a.sharding, abstract_state(pop).params)
    stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (pop.size, *x.shape)), base)
    return adapters.with_base(pop.run, restored, jax.device_put(stacked, shardings))


# ------------------------------------------------------------------------------------ the step


def scaled_updates(tx: optax.GradientTransformation, factor) -> optax.GradientTransformation:
    """``tx`` with its updates multiplied by ``factor`` (a traced scalar): a member's learning rate
    relative to the config's, with the same optimizer state as ``tx`` (a checkpoint of one member
    is a single run's)."""

    def update(grads, opt_state, params=None):
        updates, opt_state = tx.update(grads, opt_state, params)
        return jax.tree.map(lambda u: u * factor.astype(u.dtype), updates), opt_state

    return optax.GradientTransformation(tx.init, update)


def _all_finite(tree, M: int) -> jax.Array:
    """[M] bool: every leaf of each member's slice is finite."""
    leaves = [jnp.isfinite(x.reshape(M, -1)).all(1) for x in jax.tree.leaves(tree)]
    return jnp.stack(leaves).all(0)


def over_members(f, M: int, axis: str | None, groups: int, batching: str):
    """f over the leading member axis of every argument: ``jax.vmap`` (one batched program: what
    an accelerator wants), or "map": the members of each device group one after another
    (``lax.map``, the single run's program per member), the groups under vmap over the population
    axis (a vmapped decode loop runs until every member's responses end and selects every
    member's KV cache at each step; "map" avoids that, at the cost of batching)."""
    if batching == "vmap":
        return jax.vmap(f, spmd_axis_name=axis)

    def grouped(*args):  # [M, ...] -> [groups, M / groups, ...]: a device group's members
        split = jax.tree.map(lambda x: x.reshape(groups, M // groups, *x.shape[1:]), args)
        out = jax.vmap(lambda *a: jax.lax.map(lambda b: f(*b), a), spmd_axis_name=axis)(*split)
        return jax.tree.map(lambda x: x.reshape(M, *x.shape[2:]), out)

    return grouped


def resolve_batching(batching: str) -> str:
    """config.population.batching: "auto" is "vmap" (on this 2-core CPU "map" was not faster:
    docs/population.md); on a CPU its rollout runs per member (make_member_rollout)."""
    return "vmap" if batching == "auto" else batching


def rollouts_per_member(batching: str) -> bool:
    """Whether the population's step samples each member with the single run's rollout program
    (make_member_rollout) instead of its batched one: with batching "auto" on a CPU, where
    jax.vmap of the decode loop costs ~2.5x the members' single rollouts (its layer scan copies
    the stacked KV cache at each step: docs/population.md) and batching gains nothing."""
    return batching == "auto" and jax.default_backend() == "cpu"


def make_member_rollout(pop: Population, single_rollout=None):
    """(params [M], prompts [M, P, Lp], lengths [M, P], keys [M, 2][, temperatures [M]]) ->
    SampleOutput [M, ...] sharded over the members: each member sampled by the single run's
    jitted rollout (rl/step.py make_rollout_fn) on its device group, so its tokens are the single
    run's bit for bit. The calls are dispatched before any result is read, so the device groups
    (mesh.population) sample at once; the outputs come back through the host (a few [B, T]
    arrays per member) and are placed as the batched rollout's would be."""
    run, M = pop.run, pop.size
    if pop.axis:  # one submesh per device group: the population axis comes first
        names = run.mesh.axis_names[1:]
        meshes = [jax.sharding.Mesh(d, names) for d in run.mesh.devices]
    else:
        meshes = [run.mesh]
    per_group = M // len(meshes)
    if pop.axis:
        fns = [ts.make_rollout_fn(run, mesh=m) for m in meshes]
    else:
        fns = [single_rollout or ts.make_rollout_fn(run)]
    params_on = [
        jax.tree.map(lambda a, m=m: jax.sharding.NamedSharding(m, a.spec), run.state_shardings)
        for m in meshes
    ]
    rows = sharding.row_spec(run.mesh)

    def rollout(params, prompts, lengths, keys, *temps):
        prompts, lengths, keys = jax.device_get((prompts, lengths, keys))
        temps = jax.device_get(temps)
        outs = []
        for i in range(M):
            g = i // per_group
            p_i = jax.device_put(member(params, i), params_on[g])
            with sharding.use_mesh(meshes[g]):
                t_i = tuple(jnp.asarray(t[i], jnp.float32) for t in temps)
                outs.append(fns[g](p_i, prompts[i], lengths[i], keys[i], *t_i))
        host = jax.device_get(outs)
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *host)
        on = lambda x: pop.on_members((rows, *(None,) * (x.ndim - 2)))  # noqa: E731
        return jax.tree.map(lambda x: jax.device_put(x, on(x)), stacked)

    return rollout


def make_population_update(
    run: Run,
    M: int,
    axis: str | None = None,
    state_shardings=None,
    groups: int = 1,
    batching: str = "vmap",
):
    """(state [M], batch [M, B, ...], shuffle keys [M, 2], hparams {name: [M]}, active [M] bool)
    -> (state, metrics {name: [M]}, kept [M] bool): every member's update (rl/update.py's, with
    its traced hyperparameters), then a member that is frozen (not ``active``) or whose update is
    not finite keeps its parameters and optimizer state; ``kept`` says which did not. ``axis``:
    the mesh axis the member axis is sharded over (None: not sharded). ``state_shardings``: the
    stacked state's (abstract_state), kept by the output so the next step does not recompile."""
    spec = run.step

    def one(state: TrainState, batch, shuffle_key, hp: dict):
        obj_values = {k: v for k, v in hp.items() if k in objectives.TRACEABLE_FIELDS}
        objective = run.objective.with_values(**obj_values) if obj_values else run.objective
        tx = scaled_updates(run.tx, hp[LR_SCALE]) if LR_SCALE in hp else run.tx
        update = make_update_fn(
            run.graphdef,
            run.rest,
            objective,
            tx,
            temperature=hp.get(TEMPERATURE, spec.temperature),
            num_epochs=spec.num_epochs,
            num_minibatches=spec.num_minibatches,
            num_microbatches=spec.num_microbatches,
            shuffle=spec.shuffle_minibatches,
            aux_loss_coef=spec.aux_loss_coef,
            mesh=run.mesh,
            trained=adapters.trained_filter(spec),
        )
        return update(state, batch, shuffle_key)

    def fn(state: TrainState, batch, shuffle_keys, hparams, active):
        members = over_members(one, M, axis, groups, batching)
        new, metrics = members(state, batch, shuffle_keys, hparams)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm_max"])
        kept = active & finite & _all_finite(new.params, M)  # [M]

        def keep(n, o):  # member axis first: [M, ...]
            return jnp.where(kept.reshape((M,) + (1,) * (n.ndim - 1)), n, o)

        params = jax.tree.map(keep, new.params, state.params)
        opt_state = jax.tree.map(keep, new.opt_state, state.opt_state)
        return new.replace(params=params, opt_state=opt_state), metrics, kept

    return jax.jit(fn, donate_argnums=(0,), out_shardings=(state_shardings, None, None))


@dataclasses.dataclass
class PopulationPhases:
    """rl/step.py's phases under jax.vmap over the member axis (one jitted program each), and
    the per-member rollout the step samples with instead of ``rollout`` when it is set."""

    keys: object
    rollout: object  # the batched program (config.population.batching; the dry run plans it)
    member_rollout: object  # None, or what the step samples with (rollouts_per_member)
    shape: object
    means: object
    prepare: object
    logprob: object  # None unless config.rl.recompute_old_logp
    recompute_metrics: object
    ref: object  # None without a reference pass; the reference parameters are shared (in_axes
    # None), with LoRA each member's own (in_axes 0; adapters.reference_params)
    kl_reward: object
    update: object
    routes: object  # None unless config.rl.log_route_change: the updated members' routes

    def learning(self, hparams: dict, active: jax.Array) -> MemberLearning:
        """The phases learn_on_batch calls, for one step of the members: ``hparams`` {name: [M]}
        (the varied values; a varied temperature enters the log-prob passes) and ``active`` [M]
        bool (a frozen or stopped member's update is not kept)."""
        return MemberLearning(self, hparams, active)


class MemberLearning:
    """rl/step.py's Phases as learn_on_batch reads them (prepare, logprob, ref, kl_reward,
    update, routes, recompute_metrics), over the member axis: the varied temperature passed to
    the log-prob passes, the update given the members' values and which are active, and which
    members' updates were kept left in ``kept`` [M] bool."""

    def __init__(self, phases: PopulationPhases, hparams: dict, active: jax.Array):
        temps = (hparams[TEMPERATURE],) if TEMPERATURE in hparams else ()
        self.prepare, self.kl_reward = phases.prepare, phases.kl_reward
        self.recompute_metrics, self.routes = phases.recompute_metrics, phases.routes
        self.logprob = self.ref = None
        if phases.logprob is not None:
            self.logprob = lambda params, batch: phases.logprob(params, batch, *temps)
        if phases.ref is not None:
            self.ref = lambda params, batch: phases.ref(params, batch, *temps)
        self.kept = None

        def update(state, batch, shuffle_keys):
            state, metrics, self.kept = phases.update(state, batch, shuffle_keys, hparams, active)
            return state, metrics

        self.update = update


def make_phases(pop: Population, with_ref: bool) -> PopulationPhases:
    run = pop.run
    single = ts.make_phases(run, build.abstract_state(run, run.abs_params), with_ref=with_ref)

    def vm(f, in_axes=0):  # the phase's shardings gain the member axis first (spmd_axis_name)
        return None if f is None else jax.jit(jax.vmap(f, in_axes, spmd_axis_name=pop.axis))

    batching = resolve_batching(run.config.population.batching)
    groups = run.mesh.shape[pop.axis] if pop.axis else 1
    ref_axis = 0 if adapters.reference_in_policy(run.step) else None
    return PopulationPhases(
        keys=vm(step_keys),
        # the heavy phases: the rollout and the update (config.population.batching)
        rollout=jax.jit(over_members(single.rollout, pop.size, pop.axis, groups, batching)),
        member_rollout=make_member_rollout(pop, single.rollout)
        if rollouts_per_member(run.config.population.batching)
        else None,
        shape=vm(single.shape),
        means=vm(single.means),
        prepare=vm(single.prepare),
        logprob=vm(single.logprob),
        recompute_metrics=vm(single.recompute_metrics),
        # the reference parameters are shared (with LoRA: each member's own base, its adapters
        # off, inside its parameters); a varied temperature is the members'
        ref=vm(
            single.ref, in_axes=(ref_axis, 0, 0) if TEMPERATURE in pop.hparams else (ref_axis, 0)
        ),
        kl_reward=vm(single.kl_reward),
        routes=vm(single.routes),
        update=make_population_update(
            run,
            pop.size,
            pop.axis,
            jax.tree.map(lambda a: a.sharding, abstract_state(pop)),
            groups,
            batching,
        ),
    )


def _concat_batches(batches: list[dict]) -> dict:
    """The M members' prompt batches as one host batch of M*P prompts (scoring reads all rows)."""
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def population_step(
    pop: Population,
    phases: PopulationPhases,
    state: TrainState,
    batches: list[dict],
    active: np.ndarray,
    *,
    ref_params=None,
) -> tuple[TrainState, list[dict[str, float]], np.ndarray]:
    """One RL step of every member on its own prompts ``batches[i]``: (state, each member's host
    metrics as a single run logs them, kept [M] bool). rl_step's phases, vmapped; the verifier
    scores every member's rows in one call."""
    run, spec, M = pop.run, pop.run.step, pop.size
    # the members' temperatures [M] when they vary (traced), else the constant of every phase
    temps = (pop.hparams[TEMPERATURE],) if TEMPERATURE in pop.hparams else ()
    t_start = time.time()
    steps = np.asarray(jax.device_get(state.step))  # [M]
    rows = sharding.row_spec(run.mesh)  # a member's rows split over its data-parallel devices
    prompts = np.stack([b["prompt"] for b in batches]).astype(np.int32)  # [M, P, Lp]
    lengths = np.stack([b["prompt_length"] for b in batches]).astype(np.int32)  # [M, P]
    prompts = jax.device_put(prompts, pop.on_members((rows, None)))
    lengths = jax.device_put(lengths, pop.on_members((rows,)))
    with sharding.use_mesh(run.mesh):
        keys = phases.keys(state.rng, state.step)  # {name: [M, 2]}
        rollout = phases.member_rollout or phases.rollout
        sample = rollout(state.params, prompts, lengths, keys["rollout"], *temps)
        jax.block_until_ready(sample.tokens)
    t1 = time.time()
    tokens, mask = jax.device_get((sample.tokens, sample.mask))  # [M, B, T]
    B, T = tokens.shape[1:]
    scores = run.task.score(
        _concat_batches(batches), tokens.reshape(M * B, T), mask.reshape(M * B, T), spec.group_size
    )
    parts = {k: np.asarray(v, np.float32).reshape(M, B) for k, v in scores.items()}
    parts["length"] = mask.sum(-1).astype(np.float32)  # [M, B] tokens
    parts = jax.device_put(parts, pop.on_members((rows,)))
    with sharding.use_mesh(run.mesh):
        shaped, shaping, truncated, _ = phases.shape(sample, parts["reward"])
        pass_m = phases.means([parts], shaping if spec.overlong_penalty > 0 else None, None)
    t2 = time.time()
    got = ts.Collected(
        sample, shaped, shaping, truncated, prompts, lengths, pass_m, t1 - t_start, t2 - t1
    )
    # the single run's learn_on_batch (old/ref log-probs, KL in the reward, the update, the
    # route-change pass) over the members' phases, with their varied values and which are active
    learn = phases.learning(pop.hparams, jax.device_put(active, pop.on_members()))
    state, train_m, roll_m, pass_m, times = ts.learn_on_batch(
        run, learn, state, got, keys, ref_params
    )
    train_m, roll_m, pass_m, kept = jax.device_get((train_m, roll_m, pass_m, learn.kept))
    times = {
        "time/rollout_s": got.rollout_s,
        "time/reward_s": got.reward_s,
        **times,
        "time/step_s": time.time() - t_start,
    }
    lr_scale = np.asarray(pop.hparams.get(LR_SCALE, np.ones(M)), np.float64)
    out = []
    with jax.transfer_guard("allow"):
        for i in range(M):
            lr = float(run.schedule(int(steps[i]) * run.updates_per_step)) * lr_scale[i]
            out.append(
                ts.host_metrics(
                    member(train_m, i), member(roll_m, i), member(pass_m, i), lr=lr, times=times
                )
            )
    return state, out, np.asarray(kept)


# ------------------------------------------------------------------------------ the stepper


def member_dir(workdir: str, name: str) -> str:
    return os.path.join(workdir, "members", name)


def cpu_deadlock_warning(pop: Population) -> str | None:
    """The warning for members spread over CPU host devices (mesh.population > 1), else None.

    XLA:CPU runs every host device's programs from one launch pool; under load a member group's
    launch can wait on it while another group waits in their shared collective, for good
    (docs/population.md "Sharding"). Warned, not refused: small runs finish, and the tests spread
    members over simulated devices."""
    if pop.axis is None or pop.run.mesh.devices.flat[0].platform != "cpu":
        return None
    return (
        f"config.mesh.population={pop.run.mesh.shape[pop.axis]} spreads members over CPU host "
        "devices, which can deadlock XLA:CPU's collectives on a loaded host: on a CPU use "
        "--config.mesh.population=1"
    )
