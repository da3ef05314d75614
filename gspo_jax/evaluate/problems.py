"""Per-problem results of one policy: sampled batch by batch through the rollout seam
(rl/evaluation.sample_batch, the trainer's in-run evaluation's), kept in a side file rewritten
atomically after every batch, so a stopped evaluation resumes without redoing a problem.

Dimension legend: P problems, n samples per problem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from typing import Any

from gspo_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that decides which problems are evaluated and which samples are drawn: a side
    file is resumed only under the same settings."""

    task: str
    task_config: dict
    split: str
    num_problems: int
    samples: int
    temperature: float
    max_new_tokens: int
    batch_size: int
    seed: int
    engine: str


def side_file(out: str, label: str) -> str:
    """The per-problem results of one checkpoint next to --out (FILE.<label>.problems.json)."""
    stem = out[: -len(".json")] if out.endswith(".json") else out
    return f"{stem}.{label.replace(' ', '')}.problems.json"


def _header(settings: Settings, policy: str) -> dict[str, Any]:
    """What a side file's results were drawn under: the settings and the policy's identity."""
    return json.loads(json.dumps({"policy": policy, "settings": dataclasses.asdict(settings)}))


def read_side_file(path: str, settings: Settings, policy: str = "") -> dict[str, Any]:
    """The batches done so far ({} for a new file), or ConfigError if the file holds another
    policy's results or results under other settings."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        saved = json.load(f)
    header = _header(settings, policy)
    if {k: saved.get(k) for k in header} != header:
        raise ConfigError(
            f"{path} holds results of another checkpoint or under other settings than this "
            "command's; pass another --out or delete that file to start over"
        )
    return saved["batches"]


def write_side_file(
    path: str, settings: Settings, batches: dict[str, Any], policy: str = ""
) -> None:
    """Rewrites the side file atomically (a stop mid-write leaves the previous one)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**_header(settings, policy), "batches": batches}, f)
    os.replace(tmp, path)


def sample_problems(
    model,
    task,
    settings: Settings,
    *,
    mesh=None,
    data_dir: str | None = None,
    side: str | None = None,
    label: str = "",
    policy: str = "",
    on_batch=None,
) -> dict[str, Any]:
    """Per-problem results of ``settings``' problems: greedy_correct [P], greedy_length [P],
    sample_correct [P, n], sample_length [P, n], level [P]. With ``side`` (a side file) the
    batches it holds are not sampled again and each new one is added to it as it finishes;
    ``policy`` names the checkpoint in it (a side file of another one is an error).
    on_batch(i) runs after batch i is stored (tests stop an evaluation there)."""
    import numpy as np
    from tqdm import tqdm

    from gspo_jax import data, sharding
    from gspo_jax.rl import evaluation

    done = read_side_file(side, settings, policy) if side else {}
    batches = data.make_eval_batches(
        task,
        settings.split,
        batch_size=settings.batch_size,
        num_problems=settings.num_problems or None,
        data_dir=data_dir,
    )
    total = sum(n for _, n in batches)
    source = data.load_source(task, settings.split, data_dir)
    n = settings.samples
    bar = tqdm(
        total=total,
        initial=sum(len(b["greedy_correct"]) for b in done.values()),
        desc=f"evaluating {label}".strip(),
        unit=" problems",
        file=sys.stderr,
    )
    with sharding.use_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        for i, (batch, count) in enumerate(batches):
            if str(i) in done:
                continue
            out = evaluation.sample_batch(
                model,
                task,
                batch,
                count,
                i,
                pass_k=n,
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                seed=settings.seed,
                engine=settings.engine,
                mesh=mesh,
            )
            g, s = out["greedy"], out["samples"]
            first = i * settings.batch_size
            done[str(i)] = dict(
                greedy_correct=g["correct"].tolist(),
                greedy_length=g["length"].tolist(),
                sample_correct=s["correct"].reshape(count, n).tolist(),
                sample_length=s["length"].reshape(count, n).tolist(),
                level=[task.difficulty(source[first + p]) for p in range(count)],
            )
            if side:
                write_side_file(side, settings, done, policy)
            bar.update(count)
            if on_batch is not None:
                on_batch(i)
    bar.close()
    order = sorted(done, key=int)
    return {
        k: np.concatenate([np.asarray(done[i][k]) for i in order])
        for k in ("greedy_correct", "greedy_length", "sample_correct", "sample_length", "level")
    }
