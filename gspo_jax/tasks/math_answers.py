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
``math_verify.verify``), never by eval: it reads LaTeX (``\\frac``, ``\\dfrac``, ``\\sqrt``,
``\\text{}``, units, ``\\$``, ``\\%``) and plain expressions (``1/2``, ``1,000``, ``50%``) into
SymPy and compares them numerically and symbolically. A string goes to its LaTeX reader when it
holds LaTeX (a backslash, brace or caret), else to its plain reader, and to the other one when
the first finds nothing.

Bounds, and why: a verifier runs on whatever a policy samples, so it must answer 0/1 quickly on
any string. (1) An answer longer than MAX_ANSWER_CHARS, or with brackets nested deeper than
MAX_NESTING, is no answer: GSM8K and MATH answers are a few dozen characters nested a few
levels, while math-verify's LaTeX parser takes seconds on ten nested braces and minutes on a
hundred. (2) Before comparing, an expression whose value has more than MAX_DIGITS digits
(``9^{9^{9}}``, ``10^{10^{10}}``, ``99999999!``) is rejected: SymPy would spend minutes in
arithmetic that a signal cannot always interrupt. (3) math-verify's time limits
(``parsing_timeout`` of ``parse``, ``timeout_seconds`` of ``verify``, whole seconds) use
signal.alarm, which only the main thread may set: there they are on (``timeout_s`` per parse and
per comparison, so a check takes at most a few multiples of it); in any other thread they are off
(math-verify would raise) and (1) and (2) stand alone. The limits are a second line, not the
first: an alarm that fires inside a garbage-collector callback or a finaliser is swallowed there
and the work runs on.

Dimension legend: none (one string at a time).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import threading
from typing import Any, Literal

MAX_ANSWER_CHARS = 256  # longer extracted answers (and references) count as no answer
MAX_NESTING = 6  # deeper bracket nesting counts as no answer (math-verify's LaTeX parser slows)
MAX_DIGITS = 100_000  # expressions whose value may exceed this many digits are never compared
_LOG10_2 = math.log10(2)
DEFAULT_TIMEOUT_S = 1  # math-verify's per-parse / per-comparison limit in the main thread

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


def _timeout(timeout_s: float) -> int | None:
    """math-verify's timeout argument: whole seconds (signal.alarm) in the main thread of a POSIX
    process, None (off) anywhere else, where its signals would raise or spawn processes."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return None
    return max(1, math.ceil(timeout_s))


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


def _affordable(value: Any) -> bool:
    """Whether a parsed value (SymPy object, or the raw string math-verify keeps beside it) is
    small enough to compare (see _log10_bound)."""
    if isinstance(value, str):
        return True
    try:
        return _log10_bound(value) <= MAX_DIGITS
    except (RecursionError, ValueError, TypeError, AttributeError, ArithmeticError):
        return False


class _NothingParsed(Exception):
    """Raised out of the cached reader so that lru_cache keeps no empty result (a parse that hit
    its time limit under load would otherwise stay unreadable for the rest of the run)."""


@functools.lru_cache(maxsize=4096)
def _parse_found(text: str, timeout: int | None) -> tuple[Any, ...]:
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    latex = (LatexExtractionConfig(),)
    plain = (ExprExtractionConfig(), LatexExtractionConfig())
    attempts = [("$\\boxed{" + text + "}$", latex), (text, plain)]
    if not _LATEX_CHARS.intersection(text):
        attempts.reverse()
    fallback: list[Any] = []
    for candidate, config in attempts:
        parsed = math_verify.parse(candidate, extraction_config=config, parsing_timeout=timeout)
        if any(not isinstance(p, str) for p in parsed):
            return tuple(parsed)
        fallback = fallback or parsed
    if not fallback:
        raise _NothingParsed
    return tuple(fallback)


def _parse(text: str, timeout: int | None) -> tuple[Any, ...]:
    """math-verify's reading of one answer string: (SymPy value, string) when it parses, the raw
    string alone when only that was matched, () when nothing was; the LaTeX reader first when the
    string holds LaTeX, else the plain one. Cached: a reference is read once per group and short
    answers repeat (parsed values are immutable)."""
    try:
        return _parse_found(text, timeout)
    except _NothingParsed:
        return ()


def is_equivalent(reference: str, answer: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether ``answer`` (an extracted final answer) equals ``reference``, per math-verify.

    False for empty or overlong strings, for anything that fails to parse or compare, and for
    values too large to compute (see the module docstring); never raises on str inputs.
    """
    reference, answer = reference.strip(), answer.strip().translate(_MINUS)
    if not reference or not answer:
        return False
    for text in (reference, answer):
        if len(text) > MAX_ANSWER_CHARS or _nesting_depth(text) > MAX_NESTING:
            return False
    timeout = _timeout(timeout_s)
    import math_verify

    try:
        gold = [g for g in _parse(reference, timeout) if _affordable(g)]
        pred = [p for p in _parse(answer, timeout) if _affordable(p)]
        if not gold or not pred:
            return False
        return bool(math_verify.verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a verifier's contract: any failure means "not shown equal"
        return False


def score_response(
    reference: str, response: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[float, Extracted | None]:
    """(1.0 if the response's final answer equals ``reference`` else 0.0, the extracted answer)."""
    found = extract_answer(response)
    if found is None:
        return 0.0, None
    return float(is_equivalent(reference, found.text, timeout_s=timeout_s)), found
