"""The docs' Python code blocks run as written. Pages checked: PAGES (the README, every page of
docs/ and experiments/README.md).

The convention a page's code blocks follow (this test enforces it):

- A Python block is an indented block (4-space lines after a blank line, the pages' style) or a
  fenced block opened with ```python. Each page's Python blocks run in order, in one namespace
  per page (a later block may use an earlier one's names), from the repository root, at tiny
  sizes (the whole test stays under a minute).
- ``<!-- not run: <why> -->`` on the line before a Python block: it needs a long run, a real
  checkpoint or a released file; it is only compiled, so it still has to be valid Python.
- ``<!-- not python: <what> -->`` on the line before an indented block: it is not code at all
  (equations, pseudo-code, printed output, a diagram, a prompt); it is neither compiled nor run.
- Shell blocks are left out: an indented block whose first line is a command (SHELL, or an
  environment assignment ``NAME=value``), and fenced blocks in any language but python.

An indented block that is none of these and does not compile fails the test: mark it. A page
whose blocks run the sandboxed tool (NEEDS_SANDBOX) skips without bubblewrap, as
tests/test_sandbox.py does (unless GSPO_REQUIRE_SANDBOX=1).
"""

import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (
    "README.md",
    *sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))),
    "experiments/README.md",
)
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
NOT_PYTHON = re.compile(r"^<!-- not python: (.+) -->$")
SHELL = ("python ", "pip ", "PYTHONPATH=", "gspo-train", "$ ", "./", ".ci/", "git ", "gcloud ")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S* ")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
NEEDS_SANDBOX = ("docs/tools.md",)


def _marker(lines: list[str], start: int) -> str:
    """The last non-blank line before line index ``start``, stripped."""
    return next((ln for ln in reversed(lines[:start]) if ln.strip()), "").strip()


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, not-run reason) of every Python block of a page (module docstring): indented
    blocks (blank lines inside one belong to it, as in markdown) and ```python fenced blocks;
    shell blocks and those marked not python are left out."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:  # a fenced block: Python when its language is python, skipped whole either way
            start = i + 1
            i = start
            while i < len(lines) and not FENCE.match(lines[i]):
                i += 1
            if fence[1] == "python":
                m = NOT_RUN.match(_marker(lines, start - 1))
                code = "\n".join(lines[start:i]).strip("\n")
                out.append((start + 1, code, m[1] if m else None))
            i += 1
            continue
        if not (lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip())):
            i += 1
            continue
        start = i
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            i += 1
        code = "\n".join(ln[4:] for ln in lines[start:i]).strip("\n")
        first = code.lstrip()
        if first.startswith(SHELL) or ENV_ASSIGNMENT.match(first):
            continue
        marker = _marker(lines, start)
        if NOT_PYTHON.match(marker):
            continue
        m = NOT_RUN.match(marker)
        out.append((start + 1, code, m[1] if m else None))
    return out


def test_block_extraction_finds_python_and_the_markers():
    text = (
        "a\n\n    x = 1\n\n    y = x\nb\n<!-- not run: slow -->\n\n    z()\nc\n\n    python -m m\n"
        "d\n<!-- not python: an equation -->\n\n    y = x·W\n\n    A=1 python -m m\n"
        "e\n\n```python\nw = 2\n```\n\n<!-- not run: slow -->\n```python\nv()\n```\n"
        "\n```text\n    u = 3\n```\n"
    )
    assert blocks(text) == [
        (3, "x = 1\n\ny = x", None),
        (9, "z()", "slow"),
        (22, "w = 2", None),
        (27, "v()", "slow"),
    ]


def test_every_page_is_checked():
    """A new page of docs/ is checked without being listed by hand."""
    assert "docs/getting_started.md" in PAGES and "docs/tools.md" in PAGES
    assert len(PAGES) == 2 + len(glob.glob(os.path.join(REPO, "docs", "*.md")))


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_python_blocks_run_as_written(page, monkeypatch):
    if page in NEEDS_SANDBOX and not os.environ.get("GSPO_REQUIRE_SANDBOX"):
        from gspo_jax import tools

        try:
            tools.check_available()
        except tools.SandboxUnavailable as e:
            pytest.skip(str(e))
    monkeypatch.chdir(REPO)
    with open(os.path.join(REPO, page)) as f:
        found = blocks(f.read())
    namespace: dict = {"__name__": "docs"}
    for line, code, not_run in found:
        compiled = compile(code, f"{page}:{line}", "exec")  # every block is valid Python
        if not_run is None:
            exec(compiled, namespace)  # noqa: S102 (the repository's own docs)
