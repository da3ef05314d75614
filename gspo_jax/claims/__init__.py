"""The claims registry and the statistics that decide its verdicts.

    from gspo_jax import claims
    claims.current("gmpo_entropy")                 # the newest entry of a claim (registry.py)
    claims.evaluate(entry, {arm: {seed: value}})   # its outcome on per-seed numbers (decide.py)
    claims.describe(entry)                         # the lines a notebook prints above its verdict
    claims.entry_hash(entry)                       # what a run records of its entry (schema.py)
    claims.evaluate_family("testbed_round3", {key: (values, preconditions, draw_of)})  # Holm
    claims.drafts(); claims.retired("r2_key")      # designs not yet registered; retirements
    claims.stats.sign_flip_p(d, ">")               # the tests (stats.py, through scipy.stats)

The entries are data (gspo_jax/claims/entries/<key>/v<version>.json, registry.registry_dir);
the research reporting (notebooks/reporting/) and the checks (experiments/checks/) read them
through this package. No array dimensions here: numbers per seed or per draw.
"""

from gspo_jax.claims import stats
from gspo_jax.claims.decide import (
    HARM_ABSENT,
    Result,
    describe,
    diverged_seeds,
    evaluate,
    evaluate_family,
    family_designs,
    family_entries,
    harm_present,
    holds,
    p_value,
    paired_values,
    precondition_holds,
)
from gspo_jax.claims.registry import (
    Retirement,
    current,
    drafts,
    entries,
    load,
    registry_dir,
    retired,
)
from gspo_jax.claims.schema import (
    DIRECTIONS,
    EARLIER_SEEDS,
    EQUIVALENT,
    MIN_DRAWS,
    MIN_SEEDS_DIFFERENCE,
    MIN_SEEDS_LEVEL,
    MIN_SEEDS_ROUND2,
    OUTCOMES,
    ROUND2_SEEDS,
    TESTS,
    Claim,
    Criterion,
    Harm,
    Power,
    Precondition,
    entry_hash,
)
from gspo_jax.claims.stats import bootstrap_interval, on_side, sign_flip_p, signed_ranks, wilcoxon_p


def check() -> None:
    """The registry's own consistency (registry.check), raising ValueError naming the entry."""
    load()


def __getattr__(name: str):
    if name == "ENTRIES":  # every entry, read when first asked for (the files may be absent)
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DIRECTIONS",
    "EARLIER_SEEDS",
    "EQUIVALENT",
    "HARM_ABSENT",
    "MIN_DRAWS",
    "MIN_SEEDS_DIFFERENCE",
    "MIN_SEEDS_LEVEL",
    "MIN_SEEDS_ROUND2",
    "OUTCOMES",
    "ROUND2_SEEDS",
    "TESTS",
    "Claim",
    "Criterion",
    "Harm",
    "Power",
    "Precondition",
    "Result",
    "Retirement",
    "bootstrap_interval",
    "check",
    "current",
    "describe",
    "diverged_seeds",
    "drafts",
    "entries",
    "entry_hash",
    "evaluate",
    "evaluate_family",
    "family_designs",
    "family_entries",
    "harm_present",
    "holds",
    "load",
    "on_side",
    "p_value",
    "paired_values",
    "precondition_holds",
    "registry_dir",
    "retired",
    "sign_flip_p",
    "signed_ranks",
    "stats",
    "wilcoxon_p",
]
