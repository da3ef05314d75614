"""README.md's claims table is current: each row shows its claim's newest outcome, the one its
notebook printed for the newest registry entry ("reproduced", "not reproduced",
"inconclusive"), "retired" where the newest entry was retired (<key>/retired.json), or
"undecided" where no verdict on the newest entry has been printed; superseded outcomes belong in
docs/results.md, not in the table."""

import json
import os
import re

from trainer_runs import REPO

from gspo_jax import claims

ROW = re.compile(r"^\| (?P<claim>.+?) \| (?P<outcome>[^|]+?) \| .* \| \[(?P<key>\w+)\]\(notebooks/")
ENTRY = re.compile(r"^registry entry (?P<key>\w+) v(?P<version>\d+)\b")


def printed_verdicts(key: str) -> dict[tuple[str, int], str]:
    """{(key, version): outcome} of the VERDICT lines notebooks/<key>.ipynb's outputs hold, each
    after the "registry entry" line that names its entry."""
    path = os.path.join(REPO, "notebooks", f"{key}.ipynb")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        cells = json.load(f)["cells"]
    out, entry = {}, None
    for cell in cells:
        for o in cell.get("outputs", []):
            for line in "".join(o.get("text", "")).splitlines():
                m = ENTRY.match(line)
                if m:
                    entry = (m["key"], int(m["version"]))
                elif line.startswith("VERDICT: ") and entry:
                    out[entry] = line[len("VERDICT: ") :].split(":")[0]
    return out


def newest_outcome(key: str) -> str:
    e = claims.current(key)
    if claims.retired(key):
        return "retired"
    outcome = printed_verdicts(e.notebook).get((e.key, e.version))
    return outcome if outcome else "undecided"


def table_rows() -> dict[str, str]:
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    section = text.split("## The papers' claims", 1)[1].split("\n## ", 1)[0]
    return {m["key"]: m["outcome"] for m in map(ROW.match, section.splitlines()) if m}


def test_the_readme_table_shows_each_claims_newest_outcome():
    rows = table_rows()
    assert len(rows) >= 20
    for key, shown in rows.items():
        assert shown == newest_outcome(key), (key, shown, newest_outcome(key))
    # every claim with a notebook of its own has a row
    own = {e.key for e in claims.load() if claims.current(e.key).notebook == e.key}
    assert own <= set(rows), own - set(rows)


def test_printed_verdicts_are_read_per_entry():
    verdicts = printed_verdicts("std_normalisation")
    assert verdicts[("std_normalisation", 3)] == "reproduced"
    assert verdicts[("std_normalisation_negative_control", 1)] == "not reproduced"
    assert "inconclusive" == printed_verdicts("drgrpo_length_bias")[("drgrpo_length_bias", 1)]
