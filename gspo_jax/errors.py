"""The errors a user acts on, each a one-line message naming the problem and the fix, and the
formatter that turns any exception into such a line. A leaf module: every layer raises these,
and main.py prints them as ``error: ...``.

Dimension legend: none.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem found before any step; the message names the problem and the fix."""


class CheckpointError(RuntimeError):
    """A checkpoint problem the user has to act on; the message is one line naming the fix."""


class PeerError(RuntimeError):
    """Another process failed, died, hung or went another way; the message is one line."""


def one_line(e: BaseException, limit: int = 240) -> str:
    """``Type: first line of the message`` of the innermost cause, shortened."""
    while e.__cause__ is not None or (e.__context__ is not None and not str(e).strip()):
        e = e.__cause__ or e.__context__
    text = (str(e).strip().splitlines() or [""])[0]
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
