"""docs/design.md's layout table is the one experiments/checks/design_table.py generates from the
code (tests/test_layout.py's layers, the modules on disk and their line counts): it cannot drift."""

from trainer_runs import load_repo_module

table = load_repo_module("experiments/checks/design_table.py")


def test_design_md_holds_the_generated_layout_table():
    with open(table.DESIGN) as f:
        text = f.read()
    assert table.replaced(text, table.table()) == text, (
        "docs/design.md's layout table is stale: run "
        "`PYTHONPATH=. python experiments/checks/design_table.py --write`"
    )


def test_the_table_counts_every_module_and_its_lines():
    rows = {r.split(" | ")[0].lstrip("| "): r for r in table.table().splitlines()[2:]}
    assert set(rows) >= {"errors.py", "config/", "claims/", "rl/", "main.py"}
    with open(f"{table.LIB}/config/features.py") as f:
        assert f" features.py {f.read().count(chr(10))}," in rows["config/"]
    assert rows["errors.py"].endswith("| nothing of the library |")
    stale = table.replaced(
        f"a\n{table.BEGIN}\n| old |\n{table.END}\nb", table.table()
    )  # the block between the markers is replaced, the rest kept
    assert stale.startswith(f"a\n{table.BEGIN}\n| layer |") and stale.endswith(f"{table.END}\nb")
