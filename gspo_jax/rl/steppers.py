"""The steppers: each advances a run's training state by one RL step, one way. The loop and the
housekeeping around it (restore, writers, signals, the reference, evaluation, the collapse watch,
checkpoints, the summary) are rl/trainer.py's Session, once for every kind of run; a new way to
run is one stepper.

    stepper = steppers.SyncStepper(run)      # the synchronous step (rl/step.py rl_step)
    stepper = steppers.PipelineStepper(run)  # the asynchronous pipeline (rl/pipeline.py)
    stepper = steppers.PopulationStepper(pop)   # many runs as one program (rl/population.py)

The protocol (Stepper): the runs it advances (``members``: one for a single run), its data
stream (``open_data``, checkpointed with the state), what its checkpoint holds
(``saved_abstract_state``, ``restored``), its first state (``load_base``, ``initial_state``),
its programs (``start``), one step (``step``) and each member's policy (``params_of``).

Dimension legend: M members (1 for a single run).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Protocol

import ml_collections
import numpy as np

from gspo_jax.data import iterator as data_iterator
from gspo_jax.rl import adapters, build, population
from gspo_jax.rl import step as ts
from gspo_jax.rl.partial import PartialQueue
from gspo_jax.rl.pipeline import Pipeline, PipelineQueue
from gspo_jax.state import Run, TrainState


@dataclasses.dataclass
class Member:
    """One run a stepper advances: its name ("" for a single run), the folder its files go to
    (config.json, metrics.jsonl, base_eval.json, summary.json), its config, and the fields its
    summary adds (a population member's seed and values)."""

    name: str
    workdir: str
    config: ml_collections.ConfigDict
    summary_fields: dict = dataclasses.field(default_factory=dict)


class Stepper(Protocol):
    """What the Session asks of a way to run (module docstring)."""

    run: Run
    members: list[Member]
    # a population: a member whose update is not finite freezes, and one that collapses stops,
    # alone (a single run raises / stops); the checkpoint keeps the members' counts
    is_population: bool

    def open_data(self) -> Any: ...
    def saved_abstract_state(self) -> TrainState: ...
    def load_base(self, cache_dir: str) -> tuple[Any, list | None, float]: ...
    def initial_state(self, params, own: list | None) -> TrainState: ...
    def restored(self, state: TrainState, meta: dict, base, where: str) -> TrainState: ...
    def start(self, state: TrainState, with_ref: bool) -> None: ...
    def step(
        self, state: TrainState, ref_params, active: np.ndarray
    ) -> tuple[TrainState, list[dict[str, float]], np.ndarray]: ...
    def params_of(self, state: TrainState, i: int) -> Any: ...
    def take_note(self) -> str: ...


class SyncStepper:
    """The synchronous step: rl/step.py's rl_step on the data stream's next batch (with partial
    rollouts, the carried groups travel with the stream: rl/partial.py)."""

    is_population = False

    def __init__(self, run: Run):
        self.run = run
        self.members = [Member("", run.workdir, run.config)]
        self.data_iter = self.phases = None

    def open_data(self):
        spec = self.run.step
        self.data_iter = data_iterator.make_data_iterator(self.run.config, self.run.task)
        if spec.partial_rollout:  # the carried groups travel with the stream (rl/partial.py)
            self.data_iter = PartialQueue(
                self.data_iter,
                carried_batches=spec.partial_rollout,
                group_size=spec.group_size,
                max_new_tokens=spec.response_len,
                pad_id=spec.pad_id,
            )
        return self.data_iter

    def saved_abstract_state(self) -> TrainState:
        return build.saved_abstract_state(self.run)

    def load_base(self, cache_dir: str):
        params, seconds = build.base_params(self.run, cache_dir)
        return params, None, seconds

    def initial_state(self, params, own=None) -> TrainState:
        return build.initial_state(self.run, params)

    def restored(self, state, meta, base, where):
        return adapters.restored(self.run, state, meta, base, where)

    def start(self, state: TrainState, with_ref: bool) -> None:
        self.phases = ts.make_phases(self.run, state, with_ref=with_ref)

    def step(self, state, ref_params, active):
        state, m = ts.rl_step(
            self.run,
            self.phases,
            state,
            next(self.data_iter),
            ref_params=ref_params,
            more_batches=lambda: next(self.data_iter),  # dynamic sampling's extra draws
            partial=self.data_iter if self.run.step.partial_rollout else None,
        )
        return state, [m], np.ones(1, bool)

    def params_of(self, state: TrainState, i: int):
        return state.params

    def take_note(self) -> str:
        return ""


class PipelineStepper(SyncStepper):
    """The asynchronous pipeline (rl/pipeline.py): the batches in flight travel with the data
    stream (PipelineQueue), so a checkpoint holds them."""

    def open_data(self):
        self.data_iter = PipelineQueue(super().open_data())
        return self.data_iter

    def start(self, state: TrainState, with_ref: bool) -> None:
        super().start(state, with_ref)
        self.pipeline = Pipeline(self.run, self.phases, self.data_iter)

    def step(self, state, ref_params, active):
        state, m = self.pipeline.step(state, ref_params=ref_params)
        return state, [m], np.ones(1, bool)

    def take_note(self) -> str:
        note, self.pipeline.note = self.pipeline.note, ""
        return note


class MemberIterators:
    """The members' prompt streams as one checkpointable iterator state {name: state}."""

    def __init__(self, names: list[str], iterators: list):
        self.names, self.iterators = names, iterators

    def __next__(self) -> list[dict]:
        return [next(it) for it in self.iterators]

    def get_state(self) -> dict:
        out = {}
        for name, it in zip(self.names, self.iterators, strict=True):
            s = it.get_state()
            out[name] = {"__bytes__": s.decode()} if isinstance(s, bytes | bytearray) else s
        return out

    def set_state(self, state: dict) -> None:
        for name, it in zip(self.names, self.iterators, strict=True):
            s = state[name]
            is_bytes = isinstance(s, dict) and set(s) == {"__bytes__"}
            it.set_state(s["__bytes__"].encode() if is_bytes else s)


class PopulationStepper:
    """A population as a stepper (rl/steppers.py): its members' runs advanced by one program,
    its checkpoint the whole stacked state; rl/trainer.py's Session does the rest, per member
    (its folder, metrics, evaluation, collapse watch and summary), as for a single run."""

    is_population = True

    def __init__(self, pop: population.Population):
        if (warning := population.cpu_deadlock_warning(pop)) is not None:
            logging.warning(warning)
        self.pop, self.run = pop, pop.run
        self.members = [
            Member(
                m.name,
                population.member_dir(pop.run.workdir, m.name),
                m.config,
                dict(seed=m.seed, values=m.values),
            )
            for m in pop.members
        ]
        self.data_iter = self.phases = None

    def open_data(self) -> MemberIterators:
        pop = self.pop
        self.data_iter = MemberIterators(
            [m.name for m in pop.members],
            [data_iterator.make_data_iterator(m.config, pop.run.task) for m in pop.members],
        )
        return self.data_iter

    def saved_abstract_state(self) -> TrainState:
        return population.saved_abstract_state(self.pop)

    def load_base(self, cache_dir: str):
        return population.initial_params(self.pop, cache_dir)

    def initial_state(self, params, own) -> TrainState:
        return population.initial_state(self.pop, params, own)

    def restored(self, state: TrainState, meta: dict, base, where: str) -> TrainState:
        """With LoRA the saved adapters on every member's base, checked as a single run's."""
        put_back = functools.partial(population.with_base, self.pop)
        return adapters.restored(self.run, state, meta, base, where, put_back)

    def start(self, state: TrainState, with_ref: bool) -> None:
        self.phases = population.make_phases(self.pop, with_ref=with_ref)

    def step(self, state: TrainState, ref_params, active: np.ndarray):
        batches = next(self.data_iter)
        return population.population_step(
            self.pop, self.phases, state, batches, active, ref_params=ref_params
        )

    def params_of(self, state: TrainState, i: int):
        return population.member_params(self.pop, state, i)

    def take_note(self) -> str:
        return ""
