"""Benchmark: the MATH answer scorer (gspo_jax/tasks/math_answers.py through scoring.py) on the
answer corpus (tests/math_answer_corpus.py) and on a step of model-like responses: its false
positives and negatives, responses scored per second serial vs pooled, and whether any verdict
changes when the machine is busy.

    python experiments/benchmarks/math_scoring_bench.py [--prompts 64 --group 8] [--out PATH]

What it does, in order:
1. Builds --steps steps of P·G model-like responses (P golds of the corpus, cycled, G responses
   each: up to a few hundred characters of reasoning with numbers and LaTeX, then a boxed
   rewrite or near miss, sometimes after a draft box), seeded, and the corpus.
2. Scores them serial (workers=0, one after another, in a new Python process: as cold as a new
   pool's workers) and pooled (a new pool of --workers processes, started and its libraries
   imported before the clock starts): seconds per step, responses per second on the first
   (cold caches) and on the later steps (warm: references and frequent answers read before).
3. Does it again with --burners processes spinning (``while 1: pass``: every core busy), and
   compares all verdicts exactly: serial vs pooled, idle vs busy.
4. Reports the corpus's false positives (near misses scoring 1) and false negatives (rewrites
   scoring 0), each with math-verify's reading of both sides.
5. Sweeps mechanical mutations of the corpus's golds and SWEEP_GOLDS (a digit changed, a sign
   flipped, a bracket or variable swapped, an element dropped or swapped) and lists those that
   score 1: each must be a rewrite that is in fact equal, checked by reading the list.

The machine's other load is not controlled; its 1-minute load average at the start of each
phase is reported beside the figures.

Dimension legend: P prompts per step, G responses per prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from machine import describe  # this folder is on sys.path: the script runs from it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]  # this checkout's gspo_jax; the corpus

import math_answer_corpus as corpus  # noqa: E402

from gspo_jax.tasks import math_answers, scoring  # noqa: E402

REASONING = (
    "Let $n$ be the number of terms. We have $a_1 = 3$ and $d = 4$, so "
    "$a_n = 3 + 4(n-1) = 4n - 1$. Setting $4n - 1 = 99$ gives $n = 25$, and the sum is "
    "$\\frac{25(3 + 99)}{2} = 1275$. Next, $x^2 - 5x + 6 = (x-2)(x-3)$, so $x = 2$ or $x = 3$; "
    "checking $2^3 = 8 < 10$ and $\\sqrt{16} = 4$, the remaining case is $k \\ge 7$. "
)


# Golds for the mutation sweep beside the corpus's own: other MATH answer shapes.
SWEEP_GOLDS = (
    *("(0,1)", "(-1,5)", "(3,-4)", "(1,2)", "(5,5,-2)", r"\left(\frac{1}{2}, \frac{3}{4}\right)"),
    *(r"(2,\frac{5\pi}{3})", "1,2,3", "-2,3", "[1,4]", "(-2,7]", r"\frac{5}{7}", "x^3-2x+1"),
    *(r"-\sqrt{3}", "3^{10}", "2^{-3}", r"\$1.23", r"45^\circ", "0.001", r"1.5\%", r"7\pi/3"),
    *(r"\sqrt[3]{2}", r"\log_2 5", "e^2", r"\binom{5}{2}", "5!", r"\frac{1+\sqrt{5}}{2}"),
    *("p^2+q^2", "a=3,b=4", r"x\in(1,3)", "x>2", r"x \le -1", r"\text{even}", "4, -4"),
    *(r"\begin{pmatrix} 3 \\ 5 \\ 7 \end{pmatrix}", "6-5i", "15x-80", "2x+3", "-2+7i"),
)
# Mechanical near misses: (old, new) replaced once.
_SWAPS = (("(", "["), ("[", "("), (")", "]"), ("]", ")"), ("x", "y"), ("<", "\\le"), (">", "\\ge"))


def mutations(gold: str) -> list[str]:
    """Mechanical rewrites of ``gold`` that are near misses unless they happen to be equal: each
    digit changed, each sign flipped, one bracket or variable swapped, the sign of the whole,
    and for a comma list its first or last element dropped and its first two swapped."""
    out = set()
    for m in re.finditer(r"\d", gold):
        i = m.start()
        out.add(gold[:i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :])
    for m in re.finditer(r"[+-]", gold):
        i = m.start()
        out.add(gold[:i] + ("-" if gold[i] == "+" else "+") + gold[i + 1 :])
    for old, new in _SWAPS:
        if old in gold:
            out.add(gold.replace(old, new, 1))
    out.add(gold[1:] if gold.startswith("-") else "-" + gold)
    parts = re.split(r",\s*", gold)
    if len(parts) > 1:
        out.update([", ".join(parts[1:]), ", ".join(parts[:-1])])
        out.add(", ".join([parts[1], parts[0], *parts[2:]]))
    out.discard(gold)
    return sorted(out)


def _pairs(responses: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(gold, response) -> (gold, extracted answer text), as a word-problem task's score does."""
    out = []
    for gold, response in responses:
        found = math_answers.extract_answer(response)
        out.append((gold, found.text if found is not None else ""))
    return out


def model_like_step(prompts: int, group: int, seed: int) -> list[tuple[str, str]]:
    """P·G (gold, response) pairs, group-contiguous: P golds of the corpus (cycled), each with G
    responses mixing rewrites (about a third), near misses and a draft box before the last."""
    rng = np.random.default_rng(seed)
    entries = [e for entries in corpus.CLASSES.values() for e in entries]
    out = []
    for p in range(prompts):
        gold, equal, near = entries[p % len(entries)]
        for _ in range(group):
            pick = rng.random()
            if pick < 0.35:
                answer = equal[rng.integers(len(equal))]
            else:
                answer = near[rng.integers(len(near))]
            draft = near[rng.integers(len(near))]
            reasoning = REASONING[: int(rng.integers(80, len(REASONING)))]
            if rng.random() < 0.3:  # a draft box, then the final one
                text = f"{reasoning}So $\\boxed{{{draft}}}$? Checking again, $\\boxed{{{answer}}}$."
            else:
                text = f"{reasoning}Therefore the answer is $\\boxed{{{answer}}}$."
            out.append((gold, text))
    return out


def _serial_in_fresh_process(steps: list[list[tuple[str, str]]]) -> tuple[list, list, list]:
    """Each step scored one answer after another (workers=0) in a new Python process, as cold as
    a fresh pool's workers: (verdicts per step, seconds per step, its CPU seconds per step: what
    one core does when it is not shared, whatever the machine's load)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(steps, f)
    try:
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--serial-child", f.name],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(f.name)
    child = json.loads(out)
    return child["verdicts"], child["seconds"], child["cpu_seconds"]


def _serial_child(path: str) -> None:
    with open(path) as f:
        steps = json.load(f)
    import math_verify  # noqa: F401 - imported before the clock, as a pool's worker does

    verdicts, seconds, cpu_seconds = [], [], []
    for pairs in steps:
        t, c = time.perf_counter(), time.process_time()
        verdicts.append([r.correct for r in scoring.score_batch(pairs, workers=0)])
        seconds.append(time.perf_counter() - t)
        cpu_seconds.append(time.process_time() - c)
    print(json.dumps({"verdicts": verdicts, "seconds": seconds, "cpu_seconds": cpu_seconds}))


def _pooled(steps: list[list[tuple[str, str]]], workers: int) -> tuple[list, list[float], int]:
    """Each step scored by a fresh pool (started and its libraries imported before the clock):
    (verdicts per step, seconds per step, expiries)."""
    scoring.shutdown()
    warm = [(str(n), str(n + (n % 2))) for n in range(4 * workers)]
    scoring.score_batch(warm, workers=workers, min_pooled=1)
    verdicts, seconds, timeouts = [], [], 0
    for pairs in steps:
        t = time.perf_counter()
        results = scoring.score_batch(pairs, workers=workers, min_pooled=1)
        seconds.append(time.perf_counter() - t)
        verdicts.append([r.correct for r in results])
        timeouts += sum(r.timeouts for r in results)
    scoring.shutdown()
    return verdicts, seconds, timeouts


def _verdicts(results) -> list[float]:
    return [r.correct for r in results]


def corpus_report(cases, verdicts) -> dict:
    fp = [c for c, v in zip(cases, verdicts, strict=True) if c.kind == "near" and v == 1.0]
    fn, seen = [], set()
    for c, v in zip(cases, verdicts, strict=True):
        if c.kind == "equal" and v == 0.0 and (c.gold, c.answer) not in seen:
            seen.add((c.gold, c.answer))
            fn.append(
                {
                    "class": c.cls,
                    "gold": c.gold,
                    "answer": c.answer,
                    "math_verify_reads_gold": [repr(x) for x in math_answers._parse(c.gold)],
                    "math_verify_reads_answer": [repr(x) for x in math_answers._parse(c.answer)],
                    "reason": corpus.KNOWN_FALSE_NEGATIVES.get((c.gold, c.answer), "(not listed)"),
                }
            )
    return {
        "cases": len(cases),
        "equal_cases": sum(c.kind == "equal" for c in cases),
        "near_miss_cases": sum(c.kind == "near" for c in cases),
        "classes": len({c.cls for c in cases}),
        "false_positives": [(c.cls, c.gold, c.response) for c in fp],
        "false_negatives": fn,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="P (the MATH recipe's prompts)")
    parser.add_argument("--group", type=int, default=8, help="G (the MATH recipe's group)")
    parser.add_argument("--workers", type=int, default=scoring.default_workers())
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--steps", type=int, default=4, help="steps of P·G responses (>= 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=str, default=None, help="write the JSON result here")
    parser.add_argument("--serial-child", type=str, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serial_child:
        _serial_child(args.serial_child)
        return
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is cold, the later ones warm)")

    cases = corpus.cases()
    corpus_pairs = _pairs([(c.gold, c.response) for c in cases])
    # K steps of P·G model-like responses (distinct seeds), then the corpus
    steps = [
        _pairs(model_like_step(args.prompts, args.group, args.seed + k)) for k in range(args.steps)
    ]
    batches = [*steps, corpus_pairs]

    runs = {}
    for load in ("idle", "busy"):
        burners = []
        if load == "busy":
            burners = [
                subprocess.Popen([sys.executable, "-c", "while 1: pass"])
                for _ in range(args.burners)
            ]
            time.sleep(1.0)
        try:
            loadavg = os.getloadavg()[0]
            serial, t_serial, cpu_serial = _serial_in_fresh_process(batches)
            pooled, t_pooled, timeouts = _pooled(batches, args.workers)
        finally:
            for b in burners:
                b.kill()
                b.wait()
        n = len(steps[0])
        runs[load] = {
            "loadavg_1min_at_start": loadavg,
            "serial_s_per_step": [round(t, 3) for t in t_serial[: args.steps]],
            "pooled_s_per_step": [round(t, 3) for t in t_pooled[: args.steps]],
            "serial_responses_per_s_first_step": round(n / t_serial[0], 1),
            "pooled_responses_per_s_first_step": round(n / t_pooled[0], 1),
            "serial_responses_per_cpu_s_first_step": round(n / cpu_serial[0], 1),
            "serial_responses_per_cpu_s_later_steps": round(
                n * (args.steps - 1) / sum(cpu_serial[1 : args.steps]), 1
            ),
            "serial_responses_per_s_later_steps": round(
                n * (args.steps - 1) / sum(t_serial[1 : args.steps]), 1
            ),
            "pooled_responses_per_s_later_steps": round(
                n * (args.steps - 1) / sum(t_pooled[1 : args.steps]), 1
            ),
            "serial": serial,
            "pooled": pooled,
            "timeouts": timeouts,
        }

    golds = list(
        dict.fromkeys([*(g for e in corpus.CLASSES.values() for g, _, _ in e), *SWEEP_GOLDS])
    )
    swept = [(g, m) for g in golds for m in mutations(g)]
    swept_verdicts = scoring.score_batch(swept, workers=0)
    sweep = {
        "golds": len(golds),
        "mutations": len(swept),
        "scoring_1": [p for p, r in zip(swept, swept_verdicts, strict=True) if r.correct],
    }

    idle, busy = runs["idle"], runs["busy"]
    same = {
        "idle_serial_vs_pooled": idle["serial"] == idle["pooled"],
        "busy_serial_vs_pooled": busy["serial"] == busy["pooled"],
        "idle_vs_busy_serial": idle["serial"] == busy["serial"],
        "idle_vs_busy_pooled": idle["pooled"] == busy["pooled"],
    }
    corpus_verdicts = idle["serial"][-1]
    result = {
        "machine": describe(
            prompts=args.prompts, group=args.group, workers=args.workers, burners=args.burners
        ),
        "corpus": corpus_report(cases, corpus_verdicts),
        "mutation_sweep": sweep,
        "verdicts_compared": sum(map(len, batches)),
        "step_responses": len(steps[0]),
        "steps_correct_fraction": float(np.mean(np.concatenate(idle["serial"][: args.steps]))),
        "same_verdicts": same,
        "throughput": {
            load: {k: v for k, v in r.items() if k not in ("serial", "pooled")}
            for load, r in runs.items()
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
