r"""A corpus of MATH-style answers for the answer scorer (gspo_jax/tasks/math_answers.py): for each
class of answer, gold answers as MATH-500 writes them, rewrites that must score 1 (spacing,
``\left``/``\right``, ``\dfrac``/``\tfrac``/``\frac12``, units, prefixes, order where order does
not matter) and near misses that must score 0 (a changed digit, a flipped sign, a swapped or
missing element, a wrong variable, a reversed interval bracket).

Used by tests/test_math_answers.py (every case scored once) and
experiments/benchmarks/math_scoring_bench.py (verdicts idle vs busy, responses per second); the
figures are in docs/data.md.

    for case in cases():  # Case(cls, kind, gold, response); kind "equal" or "near"
        ...

KNOWN_FALSE_NEGATIVES: rewrites that math-verify does not show equal, each with the reason its
own reading gives (what ``math_verify.parse`` returns for it); a near miss never belongs there.
"""

from __future__ import annotations

import dataclasses

# class -> [(gold, [rewrites that must score 1], [near misses that must score 0])]
CLASSES: dict[str, list[tuple[str, list[str], list[str]]]] = {
    "integer_separators": [
        (
            r"10,\!080",
            ["10080", "10,080", "10{,}080", r"10\,080", "10 080", r"\text{10,080}"],
            ["10,081", "1,080", "-10,080", "10,800", "100,080"],
        ),
        ("1,000,000", ["1000000", r"1{,}000{,}000", r"10^6"], ["100,000", "1,000,001"]),
    ],
    "decimal": [
        ("0.25", [".25", "0.250", r"\frac{1}{4}", r"\frac14"], ["0.26", "2.5", "-0.25", "0.025"]),
        ("3.14", ["3.140", r"\frac{157}{50}"], ["3.15", "3.41", "-3.14", r"\pi"]),
    ],
    "fraction": [
        (
            r"\frac{3}{4}",
            [r"\dfrac{3}{4}", r"\tfrac{3}{4}", r"\frac34", "3/4", r"\frac 34", "0.75"],
            [r"\frac{4}{3}", r"\frac{3}{5}", r"-\frac{3}{4}", r"\frac{3}{8}", "0.7"],
        ),
        (
            r"-\frac{7}{2}",
            [r"\frac{-7}{2}", r"-\dfrac72", "-3.5", "-7/2", r"\left(-\frac{7}{2}\right)"],
            [r"\frac{7}{2}", r"-\frac{2}{7}", r"-\frac{7}{3}"],
        ),
    ],
    "percent": [
        (r"25\%", ["25%", r"25 \%", "25", r"25\text{ percent}"], [r"26\%", r"2.5\%", r"-25\%"]),
    ],
    "degrees": [
        (
            r"30^\circ",
            ["30", r"30^{\circ}", r"30 ^\circ", r"30\text{ degrees}"],
            ["60", "-30", "3"],
        ),
    ],
    "units_text": [
        (
            r"5\text{ cm}",
            ["5", r"5\ \text{cm}", r"5\text{cm}", r"5 \text{ centimeters}"],
            ["6", "50"],
        ),
        (r"\$18.90", ["18.90", "18.9", r"\$18.9", r"18.90\text{ dollars}"], ["18.09", r"\$1.89"]),
        (r"\text{Monday}", ["Monday", r"\text{ Monday}", r"\textbf{Monday}"], [r"\text{Tuesday}"]),
        (r"\text{(C)}", ["C", "(C)", r"\text{C}"], ["D", r"\text{(D)}"]),
    ],
    "x_prefix": [
        ("7", ["x=7", "x = 7", "n = 7", r"k=\frac{14}{2}"], ["x=8", "x=-7", "7x", "x+7"]),
        ("x=4", ["x = 4", "4"], ["x=5", "y=4", "x=-4"]),
    ],
    "complex": [
        (
            "6 - 5i",
            ["6-5i", "-5i+6", "6 - 5 i", r"6-5\cdot i"],
            ["6+5i", "6-9i", "-6-5i", "5i-6", "6", "6-5", "6 + 5i"],
        ),
        ("-2 + 7i", ["-2+7i", "7i-2", "-2 + 7 i"], ["-2 - 7i", "2+7i", "-2+7", "7i"]),
        ("i", ["i", r"\sqrt{-1}"], ["-i", "1", "2i"]),
    ],
    "polynomial": [
        (
            "15x - 80",
            ["15x-80", "-80+15x", "5(3x-16)", "15 x - 80"],
            ["15x+3", "15x+80", "15y-80", "16x-80", "15x", "15", "-15x-80"],
        ),
        ("2x+3", ["2x + 3", "3+2x", "x+x+3"], ["2x+7", "2x-3", "3x+2", "2y+3", "2x", "2"]),
        (
            "x^2+7x+10",
            ["(x+2)(x+5)", "x^2 + 7x + 10", "10+7x+x^2", "x^{2}+7x+10"],
            ["x^2+7x-10", "(x+2)(x-5)", "x^2+7x+11", "x^3+7x+10", "(x+2)(x+4)"],
        ),
        (
            "(a+5)(b+2)",
            ["(a + 5)(b + 2)", "(b+2)(a+5)", r"\left(a+5\right)\left(b+2\right)"],
            ["(a+5)(b-2)", "(a+2)(b+5)", "(a+5)(b+3)", "(a+5)"],
        ),
    ],
    "equation": [
        (
            "y = 2x + 3",
            # the bare right-hand side counts, as "x = 7" does for 7 (math-verify's assignments)
            ["y=2x+3", "y = 3 + 2x", "y=2 x+3", "2x+3"],
            ["y=2x+7", "y=2x-3", "y=3x+2", "x=2y+3", "y=-2x+3", "2x+7"],
        ),
        (
            r"y = -\frac{5}{2}",
            [r"y=-\frac52", "y = -2.5", r"y=-\dfrac{5}{2}"],
            [r"y=\frac{5}{2}", r"x=-\frac{5}{2}", r"y=-\frac{2}{5}"],
        ),
    ],
    "interval": [
        (
            r"(-\infty, 3]",
            [r"(-\infty,3]", r"\left(-\infty, 3\right]", r"( -\infty , 3 ]"],
            [
                r"(-\infty, 3)",
                r"[3, \infty)",
                r"(-\infty, 4]",
                r"(-\infty, -3]",
                r"[-\infty, 3]",  # a closed end at infinity: not read as the open one
                r"\left[-\infty, 3\right]",
            ],
        ),
        (
            "[2, 5)",
            ["[2,5)", r"\left[2, 5\right)", r"\left[ 2 , 5 \right)"],
            ["(2, 5]", "[2, 5]", "(2, 5)", "[2, 6)", "[-2, 5)"],
        ),
        (
            r"\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]",
            [
                r"\left[\frac{\pi^2}{8},\frac{5\pi^2}{4}\right]",
                r"[\frac{\pi^2}{8}, \frac{5\pi^2}{4}]",
                r"\left[ \dfrac{\pi^2}{8}, \dfrac{5 \pi^2}{4} \right]",
            ],
            [
                r"\left( \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]",
                r"\left[ \frac{\pi^2}{8}, \frac{3 \pi^2}{4} \right]",
                r"\left[ \frac{\pi}{8}, \frac{5 \pi}{4} \right]",
            ],
        ),
    ],
    "union": [
        (
            r"(-\infty, -3) \cup (3, \infty)",
            [
                r"(-\infty,-3)\cup(3,\infty)",
                r"\left(-\infty,-3\right)\cup\left(3,\infty\right)",
                r"(3, \infty) \cup (-\infty, -3)",
            ],
            [
                r"(-\infty,-3]\cup(3,\infty)",
                r"(-\infty,3)\cup(3,\infty)",
                r"(-\infty,-3)",
                r"(-\infty,-3)\cup[3,\infty)",
                r"(-\infty,-3)\cup(3,\infty]",
                r"[-\infty,-3)\cup(3,\infty)",
            ],
        ),
    ],
    "tuple": [
        (
            "(2,4)",
            ["(2 , 4)", r"\left(2,4\right)", "( 2, 4 )"],
            ["(4,2)", "(2,5)", "(2,-4)", "(2,4,0)", "2", "(-2,4)"],
        ),
        (
            r"\left( 3, \frac{\pi}{2} \right)",
            [r"(3,\frac{\pi}{2})", r"\left(3, \dfrac{\pi}{2}\right)", r"(3, \pi/2)"],
            [r"\left( \frac{\pi}{2}, 3 \right)", r"(3, \frac{\pi}{3})", r"(-3, \frac{\pi}{2})"],
        ),
        ("(1,-2,3)", ["(1, -2, 3)", r"\left(1,-2,3\right)"], ["(1,2,3)", "(3,-2,1)", "(1,-2)"]),
    ],
    "list_set": [
        ("3, 5, 7", ["3,5,7", "7, 5, 3", r"\{3,5,7\}"], ["3, 5", "3, 5, 8", "3,5,7,9", "3"]),
        ("1,-2", ["1, -2", "-2, 1", "-2,1"], ["1,-3", "1, 2", "-1,-2", "1", "-2"]),
        (r"\{1, 2, 3\}", [r"\{3,2,1\}", r"\{1,2,3\}"], [r"\{1,2\}", r"\{1,2,4\}"]),
    ],
    "matrix_vector": [
        (
            r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}",
            [r"\begin{pmatrix}1\\-2\end{pmatrix}", r"\begin{bmatrix} 1 \\ -2 \end{bmatrix}"],
            [
                r"\begin{pmatrix} -2 \\ 1 \end{pmatrix}",
                r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
                r"\begin{pmatrix} 1 \\ -3 \end{pmatrix}",
            ],
        ),
        (
            r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
            [
                r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
                r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}",
            ],
            [
                r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}",
                r"\begin{pmatrix} 1 & 2 \\ 3 & 5 \end{pmatrix}",
                r"\begin{pmatrix} 1 & -2 \\ 3 & 4 \end{pmatrix}",
            ],
        ),
    ],
    "radical": [
        (
            r"2\sqrt{3}",
            [r"\sqrt{12}", r"2 \sqrt 3", r"2\sqrt3", r"\sqrt{3}\cdot 2", r"2 \cdot 3^{1/2}"],
            [r"3\sqrt{2}", r"2\sqrt{5}", r"-2\sqrt{3}", r"\sqrt{3}", r"2\sqrt{3}+1"],
        ),
        (
            r"\frac{\sqrt{2}}{2}",
            [r"\frac{1}{\sqrt{2}}", r"\tfrac{\sqrt2}{2}", r"\sqrt{2}/2", r"\frac{\sqrt 2}2"],
            [r"\frac{\sqrt{3}}{2}", r"\sqrt{2}", r"-\frac{\sqrt{2}}{2}"],
        ),
        (r"3+\sqrt{5}", [r"\sqrt{5}+3", r"3 + \sqrt 5"], [r"3-\sqrt{5}", r"3+\sqrt{6}", "3"]),
    ],
    "pi": [
        (
            r"\frac{\pi}{2}",
            [r"\pi/2", r"\frac12\pi", r"\dfrac{\pi}{2}", r"\frac{1}{2}\pi"],
            [r"\frac{\pi}{3}", r"2\pi", r"\frac{\pi}{2}+1", r"-\frac{\pi}{2}", "90"],
        ),
        (r"16\pi", [r"16 \pi", r"\pi \cdot 16"], [r"15\pi", r"16", r"32\pi", r"16\pi^2"]),
    ],
    "negative": [
        ("-50", ["- 50", "-50.0", r"\left(-50\right)"], ["50", "-5", "-500", "-51"]),
    ],
}

# Several boxes in one response: the last complete, non-empty box is the answer.
MULTI_BOX: list[tuple[str, list[str], list[str]]] = [
    (
        "12",
        [
            r"First \boxed{10}, but that ignores the remainder, so \boxed{12}.",
            r"\boxed{13} is wrong. Recounting gives $\boxed{12}$.",
            r"So $\boxed{12}$. Check: \boxed{",  # an unclosed box after it is no answer
        ],
        [
            r"\boxed{12} at first; redoing it, \boxed{13}.",
            r"Either \boxed{12} or \boxed{14}; I pick \boxed{14}.",
            r"\boxed{12, 13}",
        ],
    ),
    (
        r"\frac{3}{4}",
        [r"Draft: \boxed{\frac{2}{3}}. Final: \boxed{\dfrac{3}{4}}"],
        [r"Final: \boxed{\frac{3}{4}}. No wait: \boxed{\frac{4}{3}}"],
    ),
]

# Response templates a model writes around its final answer ({} is the answer).
TEMPLATES = (
    "Therefore, the final answer is $\\boxed{{{}}}$.",
    "We simplify step by step.\n\nThe answer is \\boxed{{ {} }}",
)

# (gold, rewrite) -> math-verify's reason: rewrites it does not show equal (false negatives).
KNOWN_FALSE_NEGATIVES: dict[tuple[str, str], str] = {
    (r"10,\!080", r"\text{10,080}"): (
        "math-verify reads the text of \\text{} as a name: the symbol '10,080', not a number"
    ),
    ("i", r"\sqrt{-1}"): (
        "math-verify reads i as a symbol named i, not as the imaginary unit, and leaves "
        "sqrt(-1) unevaluated: two different expressions"
    ),
}


@dataclasses.dataclass(frozen=True)
class Case:
    cls: str
    kind: str  # "equal": must score 1 (unless a known false negative); "near": must score 0
    gold: str
    response: str
    answer: str  # the answer the response states (the response itself for multi_box)


def cases() -> list[Case]:
    """Every case of the corpus: each gold against itself, each rewrite and each near miss in
    every template, and the multi-box responses."""
    out = []
    for cls, entries in CLASSES.items():
        for gold, equal, near in entries:
            for kind, answers in (("equal", [gold, *equal]), ("near", near)):
                for answer in answers:
                    for template in TEMPLATES:
                        out.append(Case(cls, kind, gold, template.format(answer), answer))
    for gold, equal, near in MULTI_BOX:
        for kind, responses in (("equal", equal), ("near", near)):
            out += [Case("multi_box", kind, gold, r, r) for r in responses]
    return out
