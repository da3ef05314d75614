"""The power of round 3's designs (issue 52): the chance that the exact sign-flip test over n
warm-start draws decides "reproduced" at an effect of k draw-to-draw standard deviations, at
alpha 0.05 alone and at the level Holm's correction asks of the first of m entries (0.05 / m);
and the chance TOST shows equivalence within a margin of k standard deviations when the true
difference is 0. Prints a markdown table (docs/results.md "Round 3's designs") and the fewest
draws each target power needs.

    PYTHONPATH=. python experiments/claims_power.py --simulations 1000 --family 10
"""

from __future__ import annotations

import argparse

from gspo_jax.claims import stats


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", default="8,10,12,16")
    p.add_argument("--effects", default="0.5,1.0,1.5", help="in draw-to-draw sds")
    p.add_argument("--family", type=int, default=10, help="entries under Holm's correction")
    p.add_argument("--simulations", type=int, default=1000)
    args = p.parse_args(argv)
    draws = [int(x) for x in args.draws.split(",")]
    effects = [float(x) for x in args.effects.split(",")]
    holm_alpha = 0.05 / args.family
    print(f"simulations per cell: {args.simulations}; generator seed 0")
    print(
        "| test | effect or margin (sd) | alpha | " + " | ".join(f"n = {n}" for n in draws) + " |"
    )
    print("|---|---|---|" + "---|" * len(draws))
    for alpha in (0.05, holm_alpha):
        for k in effects:
            row = [
                stats.sign_flip_power(n, k, alpha=alpha, simulations=args.simulations)
                for n in draws
            ]
            print(
                f"| sign flip | {k:g} | {alpha:.3g} | " + " | ".join(f"{x:.2f}" for x in row) + " |"
            )
    for k in effects:
        row = [stats.tost_power(n, k, alpha=0.05, simulations=args.simulations) for n in draws]
        print(
            f"| TOST (true difference 0) | {k:g} | 0.05 | "
            + " | ".join(f"{x:.2f}" for x in row)
            + " |"
        )


if __name__ == "__main__":
    main()
