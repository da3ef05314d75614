"""tests/conftest.py's guard for .ci/run: the first session lists the tests that passed (or
skipped) as they are reported, and a second session with GSPO_RERUN_UNPASSED=1 runs only the
others (the crashed test and the ones a crash or a hang left unreached)."""

import os
import types

import conftest
import pytest


def _report(nodeid, when, outcome):
    return types.SimpleNamespace(
        nodeid=nodeid,
        when=when,
        passed=outcome == "passed",
        skipped=outcome == "skipped",
        failed=outcome == "failed",
    )


def test_the_writer_lists_passed_and_skipped_tests_and_a_rerun_runs_only_the_rest(
    tmp_path, monkeypatch
):
    log = tmp_path / "passed"
    monkeypatch.setenv("GSPO_PASSED_LOG", str(log))
    monkeypatch.delenv("GSPO_PASSED_LOG_WRITER", raising=False)
    monkeypatch.delenv("GSPO_RERUN_UNPASSED", raising=False)
    conftest.pytest_configure(None)  # this process is the first session: the writer
    assert os.environ["GSPO_PASSED_LOG_WRITER"] == str(os.getpid())
    for report in (
        _report("t.py::a", "setup", "passed"),  # setup passing is not the test passing
        _report("t.py::a", "call", "passed"),
        _report("t.py::b", "call", "failed"),
        _report("t.py::c", "setup", "skipped"),
        _report("t.py::d[x y]", "call", "passed"),  # a parameter id with a space
    ):
        conftest.pytest_runtest_logreport(report)
    assert log.read_text().splitlines() == ["t.py::a", "t.py::c", "t.py::d[x y]"]

    # a session another process started (a worker, a nested pytest) inherits the writer's pid
    monkeypatch.setenv("GSPO_PASSED_LOG_WRITER", "1")
    conftest.pytest_runtest_logreport(_report("t.py::e", "call", "passed"))
    assert "t.py::e" not in log.read_text()

    deselected = []
    config = types.SimpleNamespace(
        hook=types.SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items))
    )
    items = [types.SimpleNamespace(nodeid=n) for n in ("t.py::a", "t.py::b", "t.py::d[x y]")]
    conftest._deselect_passed(config, items)  # not asked to: every test stays
    assert len(items) == 3 and not deselected
    monkeypatch.setenv("GSPO_RERUN_UNPASSED", "1")
    conftest._deselect_passed(config, items)
    assert [i.nodeid for i in items] == ["t.py::b"]
    assert [i.nodeid for i in deselected] == ["t.py::a", "t.py::d[x y]"]
    monkeypatch.setenv("GSPO_PASSED_LOG", str(tmp_path / "missing"))
    with pytest.raises(pytest.UsageError, match="no log of passed tests"):
        conftest._deselect_passed(config, items)
