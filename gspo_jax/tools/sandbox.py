"""The sandboxed Python tool: code the policy writes runs in a throw-away bubblewrap container.

    result = run_python("print(2**100)", timeout_s=5, memory_mb=256)
    result.status   # "ok" | "error" | "timeout" | "killed"
    result.output   # stdout and stderr, interleaved as written, at most max_output_bytes

What confines the code (docs/tools.md has the attack table and what each part relies on):

- bubblewrap (``bwrap``, Debian package bubblewrap) builds a new mount, pid, network, IPC, UTS
  and cgroup namespace. The file tree is a fresh one: the interpreter's prefix read-only at
  /python (its site-packages hidden: the standard library only), the system's shared libraries
  read-only (/usr/lib, /usr/lib64), a private /proc of the new pid namespace, a minimal /dev, and
  a size-limited tmpfs at /tmp holding the program (the only writable place; it vanishes with the
  container). No /etc, no /work, no home folder. The network namespace has only its own loopback.
- The environment is empty but for three variables the interpreter needs (no trainer variable).
- A launcher inside sets rlimits (CPU seconds, address space, processes, file size, open files,
  no core files) and drops to a uid of this sandbox slot's own, then executes the program: without
  root's capabilities, the rlimits hold, the process limit counts only this sandbox's processes,
  and no signal reaches the container's init or the trainer.
- A wall-clock deadline: past it the container's init is killed, which makes the kernel kill every
  process of the pid namespace (daemons and setsid children included); ``--die-with-parent`` does
  the same if bwrap itself dies. run_python returns only once the namespace is gone.

Where bwrap is missing or cannot create its namespaces, or the trainer is not root (the per-slot
uid that makes the process limit hold needs it), run_python raises SandboxUnavailable naming what
to do; it never runs code unconfined.

Status: "ok" (exit code 0), "error" (any other exit code: an exception, sys.exit(n), MemoryError
under the address-space limit), "timeout" (the wall-clock deadline passed), "killed" (a signal
ended it: a crash, the CPU or file-size limit, or the output limit, past which it is stopped).

Dimension legend: none (one program at a time; pool.py runs many).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time

OK, ERROR, TIMEOUT, KILLED = "ok", "error", "timeout", "killed"
STATUSES = (OK, ERROR, TIMEOUT, KILLED)
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
INSTALL_HINT = "apt-get install -y bubblewrap (Debian/Ubuntu; dnf install bubblewrap on Fedora)"
_PYTHON_IN_BOX = "/python"  # where the interpreter's prefix is mounted inside
_PROGRAM = "/tmp/main.py"
_UID_BASE, _UID_SLOTS = 200_000, 256  # sandbox uids: base + (trainer pid % 10_000) * slots + slot
_GONE_WAIT_S = 5.0  # how long to wait for a killed namespace to disappear

# Runs inside the container as root of nothing (bwrap kept only CAP_SETUID/SETGID): sets the
# limits, drops to the slot's uid (which clears every capability) and becomes the program.
_LAUNCHER = """\
import os, resource, sys
cpu, mem, nproc, fsize, nofile, uid = map(int, sys.argv[1:7])
R = resource
for r, v in ((R.RLIMIT_CPU, cpu), (R.RLIMIT_AS, mem), (R.RLIMIT_NPROC, nproc),
             (R.RLIMIT_FSIZE, fsize), (R.RLIMIT_NOFILE, nofile), (R.RLIMIT_CORE, 0)):
    R.setrlimit(r, (v, v + 1) if r == R.RLIMIT_CPU else (v, v))
os.setgroups([]); os.setgid(uid); os.setuid(uid)
os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-u", "-X", "utf8", sys.argv[7]])
"""


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built on this machine; the message names what to install or do."""


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One program's run. ``exit_code``: the program's exit status, 128 + n when signal n ended
    it (bwrap's convention), None when the sandbox stopped it (timeout, output limit)."""

    status: str
    output: str
    exit_code: int | None
    seconds: float
    truncated: bool = False


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one program may use besides its wall-clock and memory budget (run_python's knobs)."""

    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_processes: int = 16  # RLIMIT_NPROC of the slot's uid: the program and its children
    max_file_mb: int = 8  # RLIMIT_FSIZE: the largest file it may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmp_mb: int = 16  # size of its /tmp (every file together)

    def check(self) -> None:
        for name in ("max_output_bytes", "max_processes", "max_file_mb", "max_open_files"):
            if getattr(self, name) < 1:
                raise ValueError(f"sandbox limit {name} must be >= 1, got {getattr(self, name)}.")
        if self.tmp_mb < 1:
            raise ValueError(f"sandbox limit tmp_mb must be >= 1, got {self.tmp_mb}.")


# ---- the machine's side: bwrap, the interpreter, the uids ----------------------------------------
@functools.cache
def _interpreter() -> tuple[str, str]:
    """(host prefix, interpreter path inside) of the trainer's own base interpreter."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not exe.startswith(prefix + os.sep):
        raise SandboxUnavailable(
            f"the interpreter {exe} lies outside its prefix {prefix}; run the trainer with a "
            "standard Python installation (its bin/ and lib/ under one prefix)."
        )
    return prefix, _PYTHON_IN_BOX + exe[len(prefix) :]


def _library_mounts() -> list[str]:
    """The system's shared libraries, read-only; /lib and /lib64 as the host has them (symlinks
    into /usr on merged-/usr systems, directories elsewhere)."""
    args = ["--perms", "0755", "--dir", "/usr"]
    for path in ("/usr/lib", "/usr/lib64", "/lib", "/lib64"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_command(limits: Limits, *, program_fd: int, status_fd: int) -> list[str]:
    """The bwrap arguments up to the launcher (the container, without the program's limits)."""
    prefix, _ = _interpreter()
    stdlib = os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    hide = []
    if os.path.isdir(os.path.join(stdlib, "site-packages")):
        hide = ["--tmpfs", _PYTHON_IN_BOX + stdlib[len(prefix) :] + "/site-packages"]
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
        "--clearenv",
        "--setenv", "LD_LIBRARY_PATH", _PYTHON_IN_BOX + "/lib",
        "--setenv", "PATH", _PYTHON_IN_BOX + "/bin",
        "--setenv", "HOME", "/tmp",
        "--ro-bind", prefix, _PYTHON_IN_BOX, *hide,
        *_library_mounts(),
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        "--perms", "0444", "--file", str(program_fd), _PROGRAM,
        "--remount-ro", "/",
        "--chdir", "/tmp",
        "--json-status-fd", str(status_fd),
    ]  # fmt: skip


@functools.cache
def check_available() -> None:
    """Raise SandboxUnavailable (one line: what to install or do) unless bwrap runs here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            f"run_python needs bubblewrap to isolate the code and will not run it unconfined: "
            f"{INSTALL_HINT}."
        )
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "run_python needs root (as in a container) to give each sandbox a uid of its own, "
            "without which the process limit does not hold; run the trainer as root."
        )
    _interpreter()
    r = subprocess.run(
        ["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"],
        capture_output=True, text=True, env={}, timeout=30,
    )  # fmt: skip
    if r.returncode != 0:
        reason = (r.stderr.strip().splitlines() or ["no message"])[0]
        raise SandboxUnavailable(
            f"bubblewrap cannot create its namespaces here ({reason}); allow pid and network "
            "namespaces (e.g. docker run --privileged) or run on a host that has them."
        )


def uid_range() -> range:
    """The uids this trainer process's sandboxes run as (any process of them is a sandbox's)."""
    start = _UID_BASE + (os.getpid() % 10_000) * _UID_SLOTS
    return range(start, start + _UID_SLOTS)


class _UidSlots:
    """A uid per running sandbox, from a range of this trainer process's own: RLIMIT_NPROC
    counts a uid's processes machine-wide, so two sandboxes sharing one would share the limit."""

    def __init__(self):
        self._cond = threading.Condition()
        self._free = list(range(_UID_SLOTS))

    def take(self) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            slot = self._free.pop()
        return uid_range()[slot]

    def give(self, uid: int) -> None:
        with self._cond:
            self._free.append((uid - _UID_BASE) % _UID_SLOTS)
            self._cond.notify()


_UIDS = _UidSlots()


# ---- one run --------------------------------------------------------------------------------
def run_python(
    code: str,
    *,
    timeout_s: float,
    memory_mb: int,
    limits: Limits = Limits(),
) -> ToolResult:
    """Run ``code`` (Python source) in a fresh sandbox and return its status and output.

    ``timeout_s`` is the wall-clock budget (the CPU-seconds limit is one more, rounded up);
    ``memory_mb`` the address-space limit of each process; ``limits`` the rest. Raises
    SandboxUnavailable where the sandbox cannot be built (never runs the code unconfined) and
    ValueError on bad arguments; whatever the code does, it returns a ToolResult.
    """
    if not isinstance(code, str):
        raise ValueError(f"code must be a str of Python source, got {type(code).__name__}.")
    if not timeout_s > 0 or memory_mb < 16:
        raise ValueError(f"need timeout_s > 0 and memory_mb >= 16, got {timeout_s}, {memory_mb}.")
    limits.check()
    check_available()
    start = time.monotonic()
    uid = _UIDS.take()
    program = os.memfd_create("program", 0)
    status_r, status_w = os.pipe()
    try:
        os.write(program, code.encode("utf-8", errors="replace"))
        os.lseek(program, 0, os.SEEK_SET)
        _, exe = _interpreter()
        args = [
            str(math.ceil(timeout_s) + 1),  # CPU seconds: past the wall clock for one thread
            str(memory_mb << 20),
            str(limits.max_processes),
            str(limits.max_file_mb << 20),
            str(limits.max_open_files),
            str(uid),
            _PROGRAM,
        ]
        cmd = bwrap_command(limits, program_fd=program, status_fd=status_w)
        cmd += [exe, "-I", "-S", "-c", _LAUNCHER, *args]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={},
            start_new_session=True,
            pass_fds=(program, status_w),
        )
        os.close(status_w)
        status_w = -1
        init = None  # the container's init (its pid here), once bwrap has reported it
        try:
            out, stopped = _read_output(proc, start + timeout_s, limits.max_output_bytes)
            init = _container_init(status_r)
            if stopped:
                _stop(proc, init)
        finally:
            if proc.poll() is None:  # an exception on the way (KeyboardInterrupt): stop it too
                _stop(proc, init)
        rc = proc.wait()
        proc.stdout.close()
        if init is not None:  # bwrap may exit while its init still kills the namespace
            _wait_gone(init)
    finally:
        os.close(program)
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
        _UIDS.give(uid)
    seconds = time.monotonic() - start
    text = out[: limits.max_output_bytes].decode("utf-8", errors="replace")
    if stopped == "output":
        note = f"\n[output limit of {limits.max_output_bytes} bytes reached; program stopped]"
        return ToolResult(KILLED, text + note, None, seconds, truncated=True)
    if stopped == "timeout":
        return ToolResult(TIMEOUT, text + f"\n[timed out after {timeout_s:g} s]", None, seconds)
    if rc == 0:
        return ToolResult(OK, text, rc, seconds)
    if rc > 128 and rc - 128 in signal.valid_signals():  # (a program's own exit(128 + n) too)
        return ToolResult(KILLED, text + f"\n[killed by {_signal_name(rc - 128)}]", rc, seconds)
    return ToolResult(ERROR, text, rc, seconds)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:  # real-time signals have no name of their own
        return f"signal {n}"


def _read_output(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, str]:
    """Read the merged stdout/stderr until EOF; stop at the deadline ("timeout") or past ``cap``
    bytes ("output"). Returns (the bytes read, why it stopped or "")."""
    fd = proc.stdout.fileno()
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"".join(chunks), "timeout"
            if not sel.select(left):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                proc.stdout.close()
                left = deadline - time.monotonic()
                try:
                    proc.wait(max(left, 0))
                except subprocess.TimeoutExpired:
                    return b"".join(chunks), "timeout"
                return b"".join(chunks), ""
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                return b"".join(chunks), "output"


def _stop(proc: subprocess.Popen, init: int | None) -> None:
    """Kill the container: its init, which makes the kernel kill every process of its pid
    namespace, after which bwrap exits by itself; bwrap too if it does not (or if its report of
    the init never came)."""
    if init is not None:
        try:
            os.kill(init, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(_GONE_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _container_init(status_r: int) -> int | None:
    """The pid (here) of the container's init, from bwrap's --json-status-fd report."""
    os.set_blocking(status_r, False)
    try:
        data = os.read(status_r, 1 << 16).decode(errors="replace")
    except BlockingIOError:
        return None
    for line in data.splitlines():
        try:
            pid = json.loads(line).get("child-pid")
        except (ValueError, AttributeError):
            continue
        if isinstance(pid, int):
            return pid
    return None


def _wait_gone(pid: int) -> None:
    """Wait until ``pid`` no longer runs (gone, or a zombie nobody has reaped yet)."""
    end = time.monotonic() + _GONE_WAIT_S
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)
