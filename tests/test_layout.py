"""The library's layout: each layer imports only the layers below it, no module imports itself
back through others (an import cycle), and no library module reads the research folders.

Read from the source with ast (nothing is imported): every ``import`` / ``from ... import`` of a
gspo_jax module, at module level or inside a function (a lazy import still ties two modules),
except under ``if TYPE_CHECKING:`` (annotations only). The layers are docs/design.md's table.
"""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(REPO, "gspo_jax")

# layer -> the layers it may import (besides itself); docs/design.md "Layout" shows the same.
LAYERS = {
    "errors": set(),
    "state": set(),
    "sharding": set(),  # the logical-axis rule table: models name axes, runtime places arrays
    "filelock": set(),  # the caches' lock: data/ (datasets) and rl/ (warm starts) take it
    "kernels": set(),  # attention over the rollout engine's pages (the model's paged decode)
    "objectives": set(),
    "advantages": set(),
    "eval_figures": set(),  # the figures papers report (pass@k, avg@n, intervals): numpy only
    "models": {"sharding", "kernels"},
    "tasks": set(),
    "tools": set(),  # the sandboxed tools the policy calls (run by environments)
    "envs": {"tasks", "tools"},  # environments: episodes over turns, tasks as one-turn ones
    "claims": set(),  # the claims registry's entries and the statistics that decide them
    "config": {"objectives", "advantages", "errors"},
    "runtime": {"config", "errors", "sharding"},
    "rollout": {"models", "sharding", "errors"},
    "sampler": {"rollout"},
    "data": {"tasks", "errors", "sharding", "filelock"},
    "rl": {
        "sharding",
        "errors",
        "state",
        "objectives",
        "advantages",
        "models",
        "tasks",
        "config",
        "runtime",
        "rollout",
        "data",
        "eval_figures",
        "filelock",
        "envs",  # multi-turn rows: config.env's environment (rl/episodes.py)
        "tools",
    },
    "planning": {
        "sharding",
        "errors",
        "state",
        "objectives",
        "advantages",
        "models",
        "tasks",
        "config",
        "runtime",
        "rollout",
        "data",
        "rl",
    },
    "main": {"config", "errors", "runtime", "data", "rl", "planning"},
    # the evaluation command (python -m gspo_jax.evaluate) and its parts
    "evaluate": {
        "config",
        "errors",
        "eval_figures",
        "sharding",
        "models",
        "tasks",
        "runtime",
        "data",
        "rl",
    },
}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, REPO)[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _library_files():
    for root, _, files in os.walk(LIB):
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.join(root, f)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The gspo_jax modules a file imports (a package's name when the module is the package)."""
    found = set()

    def visit(node):
        if isinstance(node, ast.If) and _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gspo_jax"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gspo_jax"):
            for a in node.names:  # `from gspo_jax.pkg import mod` imports gspo_jax.pkg.mod
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@pytest.fixture(scope="module")
def graph():
    files = list(_library_files())
    modules = {_module_name(f) for f in files}
    out = {}
    for f in files:
        with open(f) as fh:
            out[_module_name(f)] = _imports(ast.parse(fh.read()), modules) & modules
    return out


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_module_is_in_a_layer(graph):
    layers = {_layer(m) for m in graph} - {"__init__", "gspo_jax"}
    assert layers <= set(LAYERS), f"modules outside the layer table: {layers - set(LAYERS)}"


def test_each_layer_imports_only_the_layers_below(graph):
    bad = []
    for module, imported in graph.items():
        here = _layer(module)
        for other in imported:
            there = _layer(other)
            if there != here and there not in LAYERS.get(here, set()):
                bad.append(f"{module} -> {other}")
    assert not bad, "imports against the layer table (docs/design.md):\n" + "\n".join(bad)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of ``graph`` (module -> imported modules), module by module, or None:
    depth-first search for a back edge."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if n == m or n not in graph:
                continue
            if state.get(n) == "open":
                return stack[stack.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_check_finds_a_cycle():
    """The check above can fail: two modules importing each other are reported."""
    a, b = ast.parse("from gspo_jax.x import b"), ast.parse("import gspo_jax.x.a")
    mods = {"gspo_jax.x.a", "gspo_jax.x.b"}
    g = {"gspo_jax.x.a": _imports(a, mods), "gspo_jax.x.b": _imports(b, mods)}
    assert g == {"gspo_jax.x.a": {"gspo_jax.x.b"}, "gspo_jax.x.b": {"gspo_jax.x.a"}}
    assert find_cycle(g) == ["gspo_jax.x.a", "gspo_jax.x.b", "gspo_jax.x.a"]


RESEARCH_FOLDERS = ("experiments", "notebooks")


def _research_paths(source: str) -> list[str]:
    """The strings of ``source`` (docstrings aside) that name experiments/ or notebooks/ as a
    path: the folder alone (an os.path.join part) or a path starting in it."""
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docstrings
        and any(n.value == d or n.value.startswith(d + "/") for d in RESEARCH_FOLDERS)
    ]


def test_no_library_module_reads_the_research_folders():
    """experiments/ and notebooks/ use the library, never the other way round."""
    bad = []
    for f in _library_files():
        with open(f) as fh:
            bad += [f"{os.path.relpath(f, REPO)}: {v!r}" for v in _research_paths(fh.read())]
    assert not bad, bad


def test_research_path_check_finds_the_registry_read_by_path():
    """The check above can fail: the old verdicts.py's registry path is found."""
    old = 'P = os.path.join(REPO, "experiments", "claims_registry.py")\n'
    assert _research_paths(old) == ["experiments"]
    assert _research_paths('"""Reads experiments/claims.py."""\n') == []


def test_public_import_paths_of_the_api_keep_working():
    """Users' scripts and notebooks import these; the layout may move code, not these names."""
    from gspo_jax import advantages, models, objectives, sampler, tasks

    assert callable(objectives.get_objective) and objectives.PRESET_NAMES
    assert callable(sampler.generate) and sampler.SampleOutput
    assert callable(models.create_model) and callable(advantages.group_advantages)
    assert tasks.TASKS
