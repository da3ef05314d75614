"""The docs' Python code blocks run as written: each page's indented blocks are executed in
order, in one namespace per page (a later block may use an earlier one's names), from the
repository root. A block that needs a long run or a real checkpoint is marked, on the line
before it, with ``<!-- not run: <why> -->`` and is only compiled. Shell blocks (``python -m``,
``pip``, ...) are left out. Pages checked: PAGES."""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("README.md", "docs/getting_started.md")
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
SHELL = ("python ", "pip ", "PYTHONPATH=", "gspo-train", "$ ", "./", ".ci/", "git ")


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, not-run reason) of every indented code block (4-space lines after a blank
    line; blank lines inside it belong to it, as in markdown), Python only: a block whose first
    line is a shell command is left out."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        if not (lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip())):
            i += 1
            continue
        start = i
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            i += 1
        code = "\n".join(ln[4:] for ln in lines[start:i]).strip("\n")
        if code.lstrip().startswith(SHELL):
            continue
        marker = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        m = NOT_RUN.match(marker.strip())
        out.append((start + 1, code, m[1] if m else None))
    return out


def test_block_extraction_finds_python_and_the_markers():
    text = (
        "a\n\n    x = 1\n\n    y = x\nb\n<!-- not run: slow -->\n\n    z()\nc\n\n    python -m m\n"
    )
    assert blocks(text) == [(3, "x = 1\n\ny = x", None), (9, "z()", "slow")]


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_python_blocks_run_as_written(page, monkeypatch):
    monkeypatch.chdir(REPO)
    with open(os.path.join(REPO, page)) as f:
        found = blocks(f.read())
    namespace: dict = {"__name__": "docs"}
    for line, code, not_run in found:
        compiled = compile(code, f"{page}:{line}", "exec")  # every block is valid Python
        if not_run is None:
            exec(compiled, namespace)  # noqa: S102 (the repository's own docs)
    assert page == "README.md" or any(r is None for _, _, r in found), f"{page}: nothing ran"
