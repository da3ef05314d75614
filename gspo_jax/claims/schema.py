"""A claims-registry entry as data: the claim, its design and ONE primary criterion, fixed before
the runs that test it (issue 20), and the canonical form its files hold and its hash is taken of.

An entry is one JSON file, gspo_jax/claims/entries/<key>/v<version>.json (registry.py reads it):
its fields are Claim's, the nested primary criterion and preconditions are objects, and a field
at its default value is left out (so a field added later with a default leaves every older entry,
and its hash, as it was). ``entry_hash`` is the SHA-256 of that canonical form: a run records the
hash of the entry it was made for, and the reporting refuses a run whose entry has changed since.

Outcomes, decided by the primary criterion alone (the secondary checks are printed beside it and
never change it):

    inconclusive: <precondition> absent   the mechanism the claim is about did not occur (routes
                                          did not move, nothing clipped, ...) or fewer paired
                                          seeds than the criterion needs ("5 paired seeds absent")
    reproduced                            the criterion holds
    not reproduced                        it does not

A criterion on two arms tests the paired difference ``arms[0] - arms[1]`` over the seeds both
arms have (same seed: same prompts, same base, same sampling keys while the parameters agree), a
criterion on one arm (or on a pair's own per-seed statistic, such as "pair(gspo,
gspo_token_tokadv)") its values. Tests (stats.py computes them):

    every_seed   the value (or paired difference) is on the threshold's side in every seed (a
                 sign test: with 5 seeds it holds by chance with probability 1/32)
    bootstrap    the percentile bootstrap interval of the mean over seeds (``confidence``,
                 ``resamples``, fixed generator seed 0) lies entirely on the threshold's side
    sign_flip    the exact one-sided sign-flip permutation test of the mean of (value -
                 threshold); it holds when p < ``alpha`` and the mean is on the claimed side
    wilcoxon     the exact one-sided Wilcoxon signed-rank test of value - threshold (zeros
                 ranked but counted on neither side: Pratt); it holds when p < ``alpha``

Diverged runs: a criterion with ``diverged`` set (the claims about stability) counts a seed whose
value is not finite (the run diverged) as that value, the worst the statistic can be, instead of
dropping it; a seed with no value at all is still missing.

Round 2 (issue 33): entries whose ``seeds`` are set were registered for fresh seeds (never used by
an earlier version of their claim; the earlier entries ran seeds 0-4), at least MIN_SEEDS_ROUND2
paired, tested exactly. An entry with ``check`` set is decided by that deterministic check, not by
runs.

Round 3 (issue 52): the unit is the warm-start draw. An entry with ``draws`` set runs every arm on
each of those draws (init.warmstart.seed), at least MIN_DRAWS; seeds nested in a draw are paired
by seed and averaged within the draw, and the criterion's test runs over draws (``min_seeds``
then counts draws). Beside the mechanism preconditions it may register

    harm     the harm the claim is about avoiding, on the arm that should suffer it, in at least
             ``share`` of the draws (a non-finite value, a diverged run, counts as the harm);
             absent: "inconclusive: harm absent", never "not reproduced"
    tost     (a test) equivalence, for "matches" claims: both one-sided sign-flip tests of the
             mean within +-``margin``; direction "="
    power    the design's power, computed at registration (stats.sign_flip_power / tost_power)
    family   Holm's correction over the entries of that family (decide.evaluate_family): the
             verdict uses the adjusted p, and the outcome line prints raw and adjusted p

A draft (``status`` "draft", the file entries/<key>/draft.json) is a design not yet registered:
it decides nothing until it is moved to v<N>.json without its status (registry.drafts reads it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

OUTCOMES = ("reproduced", "not reproduced", "inconclusive")
TESTS = ("every_seed", "bootstrap", "sign_flip", "wilcoxon", "tost")
DIRECTIONS = (">", "<")
EQUIVALENT = "="  # the direction of a tost criterion: within +-margin of the threshold
MIN_SEEDS_DIFFERENCE = 5  # issue 20: at least 5 seeds where the criterion compares two arms
MIN_SEEDS_LEVEL = 3
EARLIER_SEEDS = tuple(range(5))  # the seeds every entry before round 2 ran (its sweeps' 0-4)
ROUND2_SEEDS = tuple(range(100, 112))  # fresh seeds for round 2 (issue 33): 12, 4 per warm start
MIN_SEEDS_ROUND2 = 10  # issue 33: at least 10 paired fresh seeds
MIN_DRAWS = 8  # issue 52: at least 8 warm-start draws (the smallest one-sided p is then 1/256)
STATUSES = (
    "",
    "draft",
)  # "": registered (entries/<key>/v<N>.json); "draft": entries/<key>/draft.json


@dataclasses.dataclass(frozen=True)
class Criterion:
    """A statistic per seed, a direction and a threshold, and the test over seeds."""

    statistic: str  # what one seed's number is (computed by the notebook from the run's records)
    arms: tuple[str, ...]  # (arm,): its values; (a, b): the paired difference a - b per seed
    direction: str  # ">" or "<": the side of ``threshold`` the claim predicts
    threshold: float
    test: str  # one of TESTS
    min_seeds: int
    confidence: float = 0.95  # bootstrap only
    resamples: int = 10_000  # bootstrap only
    alpha: float = 0.05  # sign_flip / wilcoxon: the one-sided p-value below which it holds
    # the value a diverged (non-finite) seed takes, the worst the statistic can be: set where the
    # claim is about stability; None: a non-finite seed is dropped as missing
    diverged: float | None = None
    margin: float = 0.0  # tost only: equivalent when the mean is within +-margin of threshold

    def __post_init__(self):
        equivalence = self.test == "tost"
        if (
            self.direction not in ((EQUIVALENT,) if equivalence else DIRECTIONS)
            or self.test not in TESTS
            or len(self.arms) not in (1, 2)
            or (self.diverged is not None and not math.isfinite(self.diverged))
            or (equivalence and not self.margin > 0)
        ):
            raise ValueError(
                f"criterion {self.statistic!r}: direction in {DIRECTIONS} (tost: "
                f"{EQUIVALENT!r} with a margin > 0), test in {TESTS}, one or two arms and a finite "
                f"diverged value, got {self.direction!r}, {self.test!r}, margin {self.margin!r}, "
                f"{self.arms}, {self.diverged!r}"
            )


@dataclasses.dataclass(frozen=True)
class Precondition:
    """The mechanism the claim is about, measured: absent, the verdict is inconclusive."""

    name: str  # printed as "inconclusive: <name> absent"
    statistic: str
    arm: str
    direction: str
    threshold: float
    over: str = "mean"  # "mean": the mean over seeds; "every_seed": each seed's value


@dataclasses.dataclass(frozen=True)
class Harm:
    """The harm a claim is about avoiding, measured per draw on the arm that should suffer it
    (e.g. GRPO diverges or loses >= 0.05 accuracy): absent, the verdict is "inconclusive: harm
    absent" (the comparison could not have shown that the other arm avoids it)."""

    name: str
    statistic: str  # per draw; a non-finite value (a diverged run) counts as the harm
    arm: str
    direction: str
    threshold: float  # the registered amount
    share: float = 0.5  # the harm must show in at least this share of the draws

    def __post_init__(self):
        if self.direction not in DIRECTIONS or not 0 < self.share <= 1:
            raise ValueError(
                f"harm {self.name!r}: direction in {DIRECTIONS} and 0 < share <= 1, got "
                f"{self.direction!r}, {self.share!r}"
            )


@dataclasses.dataclass(frozen=True)
class Power:
    """The design's power, fixed at registration: the chance that the primary test over the
    entry's draws decides "reproduced" when each draw's value (or paired difference) is
    Normal(effect, sd) (stats.sign_flip_power; tost: stats.tost_power)."""

    effect: float  # the true mean assumed (tost: the true difference, usually 0)
    sd: float  # the draw-to-draw standard deviation assumed (the pilot's, once it is measured)
    power: float  # the computed chance, at the criterion's alpha (Holm-adjusted where a family)
    alpha: float  # the level it was computed at: the criterion's alpha / the family's size
    simulations: int = 2000


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str  # the claim's name; with ``version`` it names the entry
    version: int  # 1, 2, ...: independent of dates and commits
    claim: str
    paper: str
    notebook: str  # notebooks/<notebook>.ipynb prints the entry ("planned" ones do not exist yet)
    sweeps: tuple[str, ...]  # experiments/claims.py SWEEPS
    arms: tuple[str, ...]  # "<arm>: what it is" (the design)
    primary: Criterion
    preconditions: tuple[Precondition, ...] = ()
    secondary: tuple[str, ...] = ()  # printed, never change the outcome
    doses: str = ""  # the variable of the dose-response and its values ("" = no dose-response)
    negative_control: str = ""
    confounds: str = ""
    supersedes: int | None = None  # the version this entry replaces
    reason: str = ""  # why (required with supersedes)
    # the seeds its runs use (round 2: fresh, ROUND2_SEEDS); () = its sweeps' 0..n-1 (EARLIER_SEEDS)
    seeds: tuple[int, ...] = ()
    # a deterministic check that decides the entry without runs (a repository path), "" = runs
    check: str = ""
    # what must be built before its runs can be made ("" = nothing: its sweeps make them)
    needs: str = ""
    # round 3 (issue 52): the warm-start draws every arm runs on (init.warmstart.seed); the unit
    draws: tuple[int, ...] = ()
    harm: Harm | None = None
    power: Power | None = None
    family: str = ""  # Holm's correction over the entries with this family ("" = none)
    status: str = ""  # one of STATUSES

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"{self.key} v{self.version}: status {self.status!r}, not {STATUSES}")
        # round 3's launcher runs the arms an entry names (experiments/claims.py): one run name
        # an arm, or an arm would silently never run
        odd = [a for a in self.arms if not re.fullmatch(r"[\w.\-]+", a.split(":", 1)[0].strip())]
        if self.draws and odd:
            raise ValueError(
                f"{self.key} v{self.version}: arms {odd} do not start with one run name: write "
                "each arm as '<arm>: what it is', one arm an item"
            )

    @property
    def arm_names(self) -> tuple[str, ...]:
        """The run names of the arms (``arms``' "<arm>: what it is")."""
        return tuple(a.split(":", 1)[0].strip() for a in self.arms)

    @property
    def name(self) -> str:
        return f"{self.key} v{self.version}"


def _plain(obj: Any) -> dict[str, Any]:
    """A dataclass as a dict of its fields that differ from their defaults (tuples as lists,
    nested dataclasses as dicts), in field order."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        if default is not dataclasses.MISSING and value == default:
            continue
        if dataclasses.is_dataclass(value):
            value = _plain(value)
        elif isinstance(value, tuple):
            value = [_plain(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out


def to_dict(claim: Any) -> dict[str, Any]:
    """The canonical form of an entry (a Claim, or any object with Claim's fields, such as an
    entry of an older Python registry read back from git)."""
    return _plain(claim)


def from_dict(data: Mapping[str, Any]) -> Claim:
    """The entry a canonical dict describes; ValueError naming an unknown field."""
    known = {f.name for f in dataclasses.fields(Claim)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown registry fields {sorted(unknown)}; known: {sorted(known)}")
    d = dict(data)
    d["primary"] = Criterion(**{**d["primary"], "arms": tuple(d["primary"]["arms"])})
    d["preconditions"] = tuple(Precondition(**p) for p in d.get("preconditions", ()))
    if d.get("harm") is not None:
        d["harm"] = Harm(**d["harm"])
    if d.get("power") is not None:
        d["power"] = Power(**d["power"])
    for name in ("sweeps", "arms", "secondary", "seeds", "draws"):
        if name in d:
            d[name] = tuple(d[name])
    return Claim(**d)


def canonical_json(data: Mapping[str, Any]) -> str:
    """The text an entry's file holds: its canonical dict, keys in field order, 2-space indent."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# Fields the hash leaves out: bookkeeping that changes as the work proceeds (where the entry is
# printed, "planned: <name>" until its notebook exists; what must be built before its runs), not
# the claim, its design or its criterion.
BOOKKEEPING = ("notebook", "needs")


def entry_hash(claim: Any) -> str:
    """SHA-256 (hex) of the entry's canonical form with sorted keys, bookkeeping left out: what a
    run records of the entry it was made for, equal for the same content wherever it is read."""
    content = {k: v for k, v in to_dict(claim).items() if k not in BOOKKEEPING}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
