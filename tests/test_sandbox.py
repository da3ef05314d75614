"""The sandboxed Python tool (gspo_jax/tools): the attack table of docs/tools.md, one test per
hostile program, each checking its status, what it could see, that the trainer (this process) is
unaffected and that nothing it started is left running; then the refusals and the pool.

Needs bubblewrap (.ci/run installs it); without it the tests skip with the install line, unless
GSPO_REQUIRE_SANDBOX=1 (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

from gspo_jax import tools
from gspo_jax.tools import sandbox

try:
    tools.check_available()
    REASON = ""
except tools.SandboxUnavailable as e:
    REASON = str(e)
needs_sandbox = pytest.mark.skipif(
    bool(REASON) and not os.environ.get("GSPO_REQUIRE_SANDBOX"), reason=REASON
)

TIMEOUT_S, MEMORY_MB = 1.0, 128
# in the argv of every process an attack leaves behind (this test process's own: xdist workers
# run the table at the same time)
MARKER = f"gspo-sandbox-leftover-{os.getpid()}"
SECRET = "tok-3b1f9c0e-not-a-real-token"
HERE = os.path.abspath(__file__)
HOME = os.path.expanduser("~")
LINGER = f"import time; time.sleep(60)  # {MARKER}"

# (id, program, expected status, text the output must hold or "", text it must not hold or "")
ATTACKS = [
    ("infinite_loop", "while True:\n    pass", "timeout", "timed out", ""),
    ("sleep", "import time\ntime.sleep(100)", "timeout", "timed out", ""),
    ("memory_bomb_at_once", "x = bytearray(10**10)", "error", "MemoryError", ""),
    (
        "memory_bomb_growing",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
        "error",
        "MemoryError",
        "",
    ),
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", "error", "Resource temporarily", ""),
    ("huge_output", "while True:\n    print('x' * 1000)", "killed", "output limit", ""),
    (
        "huge_stderr",
        "import sys\nwhile True:\n    sys.stderr.write('y' * 1000)",
        "killed",
        "output limit",
        "",
    ),
    ("read_project", f"print(open({HERE!r}).read())", "error", "FileNotFoundError", "ATTACKS"),
    ("list_project", "import os\nprint(os.listdir('/work'))", "error", "FileNotFoundError", ""),
    ("read_home", f"import os\nprint(os.listdir({HOME!r}))", "error", "FileNotFoundError", ""),
    ("read_etc_shadow", "print(open('/etc/shadow').read())", "error", "FileNotFoundError", ""),
    ("read_etc_passwd", "print(open('/etc/passwd').read())", "error", "FileNotFoundError", "root:"),
    ("environment", "import os\nprint(dict(os.environ))", "ok", "/tmp", SECRET),
    ("init_environment", "print(open('/proc/1/environ').read())", "error", "PermissionError", ""),
    ("write_interpreter", "open('/python/evil.py', 'w')", "error", "Read-only file system", ""),
    ("write_root", "open('/evil', 'w')", "error", "Read-only file system", ""),
    ("write_project", f"open({HERE + '.evil'!r}, 'w')", "error", "Error", ""),
    (
        "connect_public",
        "import socket\nsocket.create_connection(('1.1.1.1', 53), 1)",
        "error",
        "",
        "",
    ),
    (
        "resolve_name",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
        "error",
        "gaierror",
        "",
    ),
    (
        "kill_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "error",
        "Permission",
        "",
    ),
    ("kill_init", "import os, signal\nos.kill(1, signal.SIGKILL)", "error", "PermissionError", ""),
    (
        "kill_everything",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
        "error",
        "ProcessLookupError",  # no process it may signal: it is alone with its uid
        "",
    ),
    (
        "kill_trainer_by_pid",
        f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
        "error",
        "Error",
        "",
    ),
    ("become_root", "import os\nos.setuid(0)", "error", "PermissionError", ""),
    ("segfault", "import ctypes\nctypes.string_at(0)", "killed", "SIGSEGV", ""),
    ("abort", "import os\nos.abort()", "killed", "SIGABRT", ""),
    ("exit_like_a_signal", "raise SystemExit(128 + 42)", "killed", "signal 42", ""),
    (
        "leave_child",
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {LINGER!r}])\n"
        "print('bye')",
        "ok",
        "bye",
        "",
    ),
    (
        "double_fork_daemon",
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {LINGER!r}])\n"
        "    os._exit(0)\n"
        "print('detached')",
        "ok",
        "detached",
        "",
    ),
    (
        "setsid_and_linger",
        "import os, sys\nos.setsid()\n"
        f"os.execv(sys.executable, [sys.executable, '-c', {LINGER!r}])",
        "timeout",
        "",
        "",
    ),
    (
        "open_files",
        "fs = [open('/dev/null') for _ in range(100000)]",
        "error",
        "Too many open files",
        "",
    ),
    ("big_file", "open('/tmp/f', 'wb').write(b'x' * (100 << 20))", "error", "File too large", ""),
    (
        "disk_fill",
        "i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (4 << 20))\n    i += 1",
        "error",
        "No space left",
        "",
    ),
    (
        "host_proc",
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        "ok",
        "[1, 2]",
        "",
    ),
    ("host_sys", "import os\nprint(os.listdir('/sys'))", "error", "FileNotFoundError", ""),
    (
        "docker_socket",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/var/run/docker.sock')",
        "error",
        "FileNotFoundError",
        "",
    ),
]


def _stat(pid: str) -> list[str]:
    """A process's /proc stat fields after its name (state, ppid, ...); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _running() -> dict[str, list[str]]:
    """pid -> stat fields of the processes still running (zombies are done: only their parent's
    wait is missing)."""
    stats = {p: _stat(p) for p in os.listdir("/proc") if p.isdigit()}
    return {p: st for p, st in stats.items() if st and st[0] not in ("Z", "X")}


def _uid(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        return -1


def _sandbox_processes() -> list[str]:
    """Running processes of this test process's sandboxes (their uids are its own)."""
    uids = sandbox.uid_range()
    return [p for p in _running() if _uid(p) in uids]


def _marked_processes() -> list[str]:
    found = []
    for p in _running():
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if MARKER.encode() in f.read():
                    found.append(p)
        except OSError:
            pass
    return found


def _children(pid: int) -> list[str]:
    return [p for p, st in _running().items() if int(st[1]) == pid]


@pytest.fixture
def contained(monkeypatch):
    """The trainer's side of every attack: a secret in its environment before, and after the
    run: itself alive with the secret intact, no process of the sandbox left (none running as
    a sandbox uid, none with the marker, no new child of this process: children that earlier
    tests in this worker left, such as a data loader's helpers, are not the sandbox's)."""
    monkeypatch.setenv("TOKEN", SECRET)
    before = set(_children(os.getpid()))
    yield
    assert os.environ["TOKEN"] == SECRET
    assert not _marked_processes(), "a process the program started is still running"
    assert not _sandbox_processes(), "a process of the sandbox's uid is still running"
    left = set(_children(os.getpid())) - before
    assert not left, f"a child of the trainer is still running: {sorted(left)}"


def test_the_leftover_checks_find_a_leftover():
    """The checks above can fail: a process of a sandbox uid, with the marker, is found."""
    uid = sandbox.uid_range()[-1]
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"sleep 60; : {MARKER}"],
        user=uid,
        group=uid,
        cwd="/",
        start_new_session=True,
    )
    try:
        assert str(proc.pid) in _sandbox_processes()
        assert str(proc.pid) in _marked_processes()
        assert str(proc.pid) in _children(os.getpid())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and its sleep
        proc.wait()


@needs_sandbox
@pytest.mark.parametrize(
    "program,status,holds,lacks", [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
def test_attack_is_contained(contained, program, status, holds, lacks):
    r = tools.run_python(program, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)
    assert r.status == status, r.output[-2000:]
    assert holds in r.output, r.output[-2000:]
    assert not lacks or lacks not in r.output
    assert len(r.output.encode()) <= tools.Limits().max_output_bytes + 200


def test_the_table_is_big_enough():
    assert len(ATTACKS) >= 25 and len({a[0] for a in ATTACKS}) == len(ATTACKS)


@needs_sandbox
def test_connect_to_the_trainers_loopback_is_refused(contained):
    """A server of the trainer on 127.0.0.1: the sandbox's loopback is another one."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)"
        r = tools.run_python(code, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)
        assert r.status == "error" and "ConnectionRefusedError" in r.output
        with pytest.raises(TimeoutError):
            server.accept()


@needs_sandbox
def test_a_program_runs_and_is_answered():
    r = tools.run_python(
        "import math\nprint(math.factorial(30))\nprint('warn', file=__import__('sys').stderr)",
        timeout_s=5,
        memory_mb=MEMORY_MB,
    )
    assert (r.status, r.exit_code) == ("ok", 0)
    assert r.output == f"{265252859812191058636308480000000}\nwarn\n"
    r = tools.run_python("raise ValueError('bad')", timeout_s=5, memory_mb=MEMORY_MB)
    assert r.status == "error" and r.exit_code == 1 and "ValueError: bad" in r.output


@needs_sandbox
def test_the_output_cap_is_configurable():
    limits = tools.Limits(max_output_bytes=100)
    r = tools.run_python("print('a' * 50)", timeout_s=5, memory_mb=MEMORY_MB, limits=limits)
    assert r.status == "ok" and not r.truncated
    r = tools.run_python("print('a' * 5000)", timeout_s=5, memory_mb=MEMORY_MB, limits=limits)
    assert r.status == "killed" and r.truncated and r.output.startswith("a" * 100 + "\n[")


@needs_sandbox
def test_the_program_sees_only_the_standard_library():
    code = "import sys\nprint(sys.flags.isolated, sys.flags.no_site)\nimport numpy"
    r = tools.run_python(code, timeout_s=5, memory_mb=MEMORY_MB)
    assert (
        r.status == "error" and r.output.startswith("1 1\n") and "ModuleNotFoundError" in r.output
    )


@needs_sandbox
def test_the_pool_runs_many_programs_in_order(contained):
    codes = [f"print({i} * {i})" for i in range(12)] + ["while True: pass"]
    with tools.ToolPool(max_workers=4) as pool:
        results = pool.map(codes, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)
    assert [r.output for r in results[:-1]] == [f"{i * i}\n" for i in range(12)]
    assert results[-1].status == "timeout"


def test_no_bubblewrap_is_refused_in_one_line(monkeypatch):
    sandbox.check_available.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(tools.SandboxUnavailable, match="apt-get install -y bubblewrap") as e:
            tools.run_python("print(1)", timeout_s=1, memory_mb=MEMORY_MB)
        assert "\n" not in str(e.value) and "unconfined" in str(e.value)
        with pytest.raises(tools.SandboxUnavailable):
            tools.ToolPool(2)
    finally:
        sandbox.check_available.cache_clear()


def test_a_trainer_without_root_is_refused(monkeypatch):
    sandbox.check_available.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    try:
        with pytest.raises(tools.SandboxUnavailable, match="needs root"):
            tools.run_python("print(1)", timeout_s=1, memory_mb=MEMORY_MB)
    finally:
        sandbox.check_available.cache_clear()


def test_bad_arguments_fail_before_running():
    with pytest.raises(ValueError, match="timeout_s"):
        tools.run_python("print(1)", timeout_s=0, memory_mb=MEMORY_MB)
    with pytest.raises(ValueError, match="str of Python"):
        tools.run_python(b"print(1)", timeout_s=1, memory_mb=MEMORY_MB)
    with pytest.raises(ValueError, match="max_processes"):
        tools.run_python(
            "1", timeout_s=1, memory_mb=MEMORY_MB, limits=tools.Limits(max_processes=0)
        )
    with pytest.raises(ValueError, match="max_workers"):
        tools.ToolPool(0)
