"""Final answers of math problems (GSM8K, MATH style): where a response states one, and whether it
equals the reference.

    found = extract_answer(response)       # Extracted(text="\\frac{1}{2}", source="boxed") or None
    is_equivalent("0.5", found.text)       # True: math-verify parses both and compares them
    reference_answer(gsm8k_solution)       # the text after "####"

Extraction, and why in this order: a ``\\boxed{...}`` answer is what a chat model is asked for
(the last complete, non-empty one counts: earlier boxes are drafts); GSM8K's own solutions end in
"#### <number>" (the first number after the last "####" counts); failing both, the last number in
the text (a model that ends "so she pays 18 dollars." is right, but its ``source`` says that it
used no answer marker, which the task's format score reads).

Equivalence is decided by the ``math-verify`` library (``math_verify.parse`` then
``math_verify.verify``), never by eval; what this module decides is how an answer string is handed
to it. Every answer (and every reference) is read whole, as one LaTeX expression: it is wrapped
in ``$\\boxed{...}$`` and parsed by math-verify's LaTeX reader alone, taking only that box. So
``6-5i`` is 6 - 5*i (i a symbol), ``15x-80`` a linear expression, ``1,-3`` a list of two numbers,
``(2,4)`` a pair or interval, ``y=2x+3`` an equation, and spacing, ``\\left``/``\\right``,
``\\dfrac``/``\\tfrac``/``\\frac12``, ``\\text{}`` units, ``^\\circ``, ``\\%`` and ``\\$`` are
normalised by math-verify the way the MATH graders strip them. math-verify's plain expression
reader is never used: it looks for a number anywhere in a string and returns the first it can
read (``6-5i`` read as 6, ``15x-80`` as 15), which paid near misses as right. A string the LaTeX
reader cannot read as a whole is compared as normalised text only (equal text or nothing): where
a reading is ambiguous, the verdict is "not shown equal".

Bounds, and why: a verifier runs on whatever a policy samples, so it must answer 0/1 on any
string, and the same 0/1 on an idle and on a loaded machine. No wall-clock alarm decides a
verdict (math-verify's ``parsing_timeout`` / ``timeout_seconds`` are off): the work is bounded by
the input instead. (1) An answer longer than MAX_ANSWER_CHARS, or with brackets nested deeper
than MAX_NESTING, is no answer: GSM8K and MATH answers are a few dozen characters nested a few
levels, while math-verify's LaTeX parser takes seconds on ten nested braces and minutes on a
hundred. (2) Before comparing, an expression whose value has more than MAX_DIGITS digits
(``9^{9^{9}}``, ``10^{10^{10}}``, ``99999999!``) is rejected: SymPy would spend minutes in
arithmetic. (3) So is one whose expanded form would have more than MAX_EXPANDED_TERMS terms
(``(x+y+z)^{20}``: 231 terms, seconds of ``simplify``): SymPy expands both sides to compare them.
The last line, for whatever (1)-(3) miss, is scoring.py's worker processes: a generous per-answer
limit whose expiry is counted, logged and retried, never silently scored.

Dimension legend: none (one string at a time).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Literal

MAX_ANSWER_CHARS = 256  # longer extracted answers (and references) count as no answer
MAX_NESTING = 6  # deeper bracket nesting counts as no answer (math-verify's LaTeX parser slows)
MAX_DIGITS = 100_000  # expressions whose value may exceed this many digits are never compared
# Expressions whose expansion may exceed this many terms are never compared: SymPy expands both
# sides, and its time grows with the terms ((x+1)^{30}: 31 terms, ~0.1 s; (x+y+z)^{20}: 231
# terms, seconds). MATH answers expand to a few dozen terms at most.
MAX_EXPANDED_TERMS = 64
_LOG10_2 = math.log10(2)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# A number as written in a solution: a sign (only where it cannot be a subtraction: "10-3" ends
# in 3, not -3), thousands separators, decimals, a fraction, a percent. ASCII digits only.
_NUMBER_RE = re.compile(
    r"""(?:(?<![\w)])-)? \d[\d,]* (?:\.\d+)? (?:[ \t]*/[ \t]*\d+(?:\.\d+)?)? [ \t]*%?""",
    re.VERBOSE | re.ASCII,
)
_LATEX_CHARS = frozenset("\\{}^")
# Unicode minus signs that math-verify does not read as "-".
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0d": "-"})

Source = Literal["boxed", "####", "last_number"]


@dataclasses.dataclass(frozen=True)
class Extracted:
    """A response's final answer: its text and which rule found it."""

    text: str
    source: Source


def _box_content(text: str, start: int) -> str | None:
    """The braced argument of the box command whose name ends at ``start``, or None when it is
    not braced, not closed, or longer than MAX_ANSWER_CHARS (so every box costs O(MAX) at most)."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j, stop = 0, i, min(len(text), i + MAX_ANSWER_CHARS + 2)
    while j < stop:
        c = text[j]
        if c == "\\":  # an escaped brace (\{ \}) does not open or close a group
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete, non-empty ``\\boxed{...}`` (or ``\\fbox{...}``) of
    ``text``, stripped; nested braces are matched."""
    end = len(text)
    while end > 0:
        hits = [(text.rfind(cmd, 0, end), cmd) for cmd in _BOX_COMMANDS]
        pos, cmd = max(hits)
        if pos < 0:
            return None
        content = _box_content(text, pos + len(cmd))
        if content is not None and content.strip():
            return content.strip()
        end = pos
    return None


def _clean_number(match: str) -> str | None:
    """A number token without trailing separators, or None if it is too long to be an answer."""
    number = match.strip().rstrip(",")
    return number if 0 < len(number) <= MAX_ANSWER_CHARS else None


def extract_answer(text: str) -> Extracted | None:
    """The final answer of a response (see the module docstring for the order), or None.

    Linear in len(text); never raises on a str.
    """
    text = text.translate(_MINUS)
    boxed = last_boxed(text)
    if boxed is not None:
        return Extracted(boxed, "boxed") if len(boxed) <= MAX_ANSWER_CHARS else None
    marker = text.rfind("####")
    if marker >= 0:
        match = _NUMBER_RE.search(text, marker + 4)
        if match is not None:
            number = _clean_number(match.group())
            return Extracted(number, "####") if number is not None else None
    last = None
    for last in _NUMBER_RE.finditer(text):  # noqa: B007 - the loop keeps the last match
        pass
    if last is None:
        return None
    number = _clean_number(last.group())
    return Extracted(number, "last_number") if number is not None else None


def reference_answer(solution: str) -> str:
    """The reference answer of a worked solution: the text after its last "####" (GSM8K), else
    its last ``\\boxed{}`` (MATH), else the whole text; stripped."""
    if "####" in solution:
        return solution[solution.rfind("####") + 4 :].strip()
    boxed = last_boxed(solution)
    return (boxed if boxed is not None else solution).strip()


def _nesting_depth(text: str) -> int:
    """The deepest nesting of (), [] and {} in ``text``, unclosed ones included."""
    depth = deepest = 0
    for c in text:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth = max(0, depth - 1)
    return deepest


def _log10_bound(expr: Any) -> float:
    """An upper bound on log10 of the magnitude of ``expr``'s value and of the numbers SymPy may
    compute on the way to it (so roughly their digit count); inf when it may be astronomically
    large. Symbols count as small: only numbers written into the answer can blow up."""
    import sympy
    from sympy.functions.combinatorial.factorials import CombinatorialFunction

    def power_of_ten(log10: float) -> float:
        return 10.0**log10 if log10 < 300 else math.inf

    if isinstance(expr, sympy.Rational):  # Integer too: numerator and denominator digits
        return _LOG10_2 * max(abs(expr.p).bit_length(), expr.q.bit_length(), 1)
    if isinstance(expr, sympy.Float):
        _, _, exponent, bits = expr._mpf_  # value = mantissa * 2**exponent, mantissa < 2**bits
        return max(1.0, _LOG10_2 * (exponent + bits))
    if isinstance(expr, sympy.Pow):
        return max(1.0, _log10_bound(expr.base)) * power_of_ten(_log10_bound(expr.exp))
    if isinstance(expr, sympy.exp):
        return power_of_ten(_log10_bound(expr.args[0]))
    if isinstance(expr, CombinatorialFunction):  # n! has about n log10 n digits
        n = max((power_of_ten(_log10_bound(a)) for a in expr.args), default=1.0)
        return n * max(1.0, math.log10(n)) if math.isfinite(n) else math.inf
    if isinstance(expr, sympy.MatrixBase):
        return sum(_log10_bound(e) for e in expr) + 1.0
    if isinstance(expr, sympy.Basic):
        return sum(_log10_bound(a) for a in expr.args) + 1.0
    return 1.0


def _expanded_terms(expr: Any) -> float:
    """An upper bound on the number of terms of ``expr`` expanded (a sum of products of powers):
    a sum adds its parts' terms, a product multiplies them, a power n of a k-term sum has
    C(n + k - 1, k - 1) terms; anything else (a symbol, a number, a function) counts as one."""
    import sympy

    if isinstance(expr, sympy.Add):
        return sum(_expanded_terms(a) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        return math.prod(_expanded_terms(a) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        base = _expanded_terms(expr.base)
        exponent = expr.exp
        if base > 1 and isinstance(exponent, sympy.Integer) and exponent > 1:
            if exponent > MAX_EXPANDED_TERMS or base > MAX_EXPANDED_TERMS:
                return math.inf
            return float(math.comb(int(exponent) + int(base) - 1, int(exponent)))
        return base
    if isinstance(expr, sympy.Basic) and expr.args:  # sets, tuples, relations, matrices' parts
        return max(_expanded_terms(a) for a in expr.args)
    if isinstance(expr, sympy.MatrixBase):
        return max((_expanded_terms(e) for e in expr), default=1.0)
    return 1.0


def _affordable(value: Any) -> bool:
    """Whether a parsed value (SymPy object, or the raw string math-verify keeps beside it) is
    small enough to compare: its numbers (see _log10_bound) and its expansion (_expanded_terms)."""
    if isinstance(value, str):
        return True
    try:
        return _log10_bound(value) <= MAX_DIGITS and _expanded_terms(value) <= MAX_EXPANDED_TERMS
    except (RecursionError, ValueError, TypeError, AttributeError, ArithmeticError, OverflowError):
        return False


@functools.lru_cache(maxsize=1)
def _latex_reader() -> tuple[Any, ...]:
    """math-verify's extraction config for a whole answer: its LaTeX reader alone, the box first.
    (Its time limits are off, see the module docstring; its one-time warning saying so is
    silenced, as each scoring worker would print it.)"""
    from math_verify import LatexExtractionConfig, grader, parser

    parser.TIMEOUT_WARNING_SHOWN = grader.TIMEOUT_WARNING_SHOWN = True
    return (LatexExtractionConfig(boxed_match_priority=0),)


# An unescaped dollar (inline-math delimiter): dropped before the answer is wrapped in $...$.
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
# Digits grouped by thousands with a LaTeX space or a blank ("10\,080", "10\!080", "10 080",
# "10{,}080"): math-verify's LaTeX reader reads "10\,080" as 90, so the groups are joined first.
_GROUP_SEPARATOR = r"(?:\\[,!;: ]|~|\{,\}|,\\!|[ \t])"
_GROUPED_RE = re.compile(rf"(?<![\d.])\d{{1,3}}(?:{_GROUP_SEPARATOR}\d{{3}})+(?![\d.])")
_SEPARATOR_RE = re.compile(_GROUP_SEPARATOR)
# A blank or \cdot between a coefficient and i ("5 i", "5\cdot i"): a free-standing "i" makes
# math-verify read the answer with complex symbols, "5i" with real ones, and the two i are then
# different symbols ("6 - 5 i" would not equal "6 - 5i"); joined, both read i the same way.
_SPACED_I_RE = re.compile(r"(?<=\d)\s*(?:\\cdot\s*)?(?=i\b)")


# A square bracket at an infinite end of an interval ("[-\infty, 3]", "(2, \infty\right]"): not an
# interval MATH writes, and math-verify would read it as the open end, paying a reversed
# bracket; such an answer is not shown equal to anything.
_CLOSED_INFINITY_RE = re.compile(r"\[\s*[-+]?\s*\\infty|\\infty\s*(?:\\right\s*)?\]")


def _balanced(text: str) -> bool:
    """Whether the unescaped braces of ``text`` balance (else wrapping it in a box would let it
    close the box early and be read in pieces)."""
    depth, i = 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
        i += 1
    return depth == 0


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Any, ...]:
    """math-verify's reading of one whole answer string (see the module docstring): (SymPy
    value, normalised string) when it parses, the normalised string alone when only that was
    matched, () when nothing was. Cached: a reference is read once per group and short answers
    repeat (parsed values are immutable; the reading does not depend on time)."""
    import math_verify

    text = _DOLLAR_RE.sub(" ", text).strip()
    text = _GROUPED_RE.sub(lambda m: _SEPARATOR_RE.sub("", m.group()), text)
    text = _SPACED_I_RE.sub("", text)
    if not text or not _balanced(text):
        return ()
    parsed = math_verify.parse(
        "$\\boxed{" + text + "}$",
        extraction_config=_latex_reader(),
        extraction_mode="first_match",  # the box or nothing: never a piece of the answer
        parsing_timeout=None,
    )
    return tuple(parsed)


def is_equivalent(reference: str, answer: str) -> bool:
    """Whether ``answer`` (an extracted final answer) equals ``reference``, per math-verify.

    False for empty or overlong strings, for anything that fails to parse or compare, and for
    values too large to compute (see the module docstring); never raises on str inputs. The
    verdict depends on the two strings only (no time limit inside).
    """
    reference, answer = reference.strip(), answer.strip().translate(_MINUS)
    if not reference or not answer:
        return False
    for text in (reference, answer):
        if len(text) > MAX_ANSWER_CHARS or _nesting_depth(text) > MAX_NESTING:
            return False
        if _CLOSED_INFINITY_RE.search(text):
            return False
    import math_verify

    try:
        gold = [g for g in _parse(reference) if _affordable(g)]
        pred = [p for p in _parse(answer) if _affordable(p)]
        if not gold or not pred:
            return False
        return bool(math_verify.verify(gold, pred, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a verifier's contract: any failure means "not shown equal"
        return False


def score_response(reference: str, response: str) -> tuple[float, Extracted | None]:
    """(1.0 if the response's final answer equals ``reference`` else 0.0, the extracted answer)."""
    found = extract_answer(response)
    if found is None:
        return 0.0, None
    return float(is_equivalent(reference, found.text)), found
