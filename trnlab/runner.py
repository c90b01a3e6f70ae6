"""Start torchrun launchers, stream every rank's lines live, stop them all: the process supervision.
:func:`run_commands` runs the launcher's commands as child processes and returns a :class:`LaunchResult`; a launch id
in each one's environment (:data:`LAUNCH_ID_VAR`) lets a failure or timeout stop every process of the run."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trnlab.device import format_core_holders, neuron_core_holders, neuron_ls_output
from trnlab.rank_cores import LaunchConfigError

__all__ = ["LAUNCH_ID_VAR", "RANK_PREFIX_TEMPLATE", "LaunchError", "LaunchResult", "check_timeouts",
           "child_environment", "core_holders_notice", "free_port", "run_commands"]

#: torchrun prefixes every line a worker prints with this (``${rank}`` is the global rank).
RANK_PREFIX_TEMPLATE = "[rank${rank}]: "
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_TRACEBACK_START = "Traceback (most recent"

#: Environment variable that marks every process of one launch, so none can be left behind.
LAUNCH_ID_VAR = "TRNLAB_LAUNCH_ID"


@dataclass
class LaunchResult:
    """What one :func:`launch` produced: exit status, every line by rank, the failure if any."""

    commands: list[list[str]]  # one torchrun command per launcher (node)
    returncode: int | None
    seconds: float
    rank_lines: dict[int, list[str]] = field(default_factory=dict)
    launcher_lines: list[str] = field(default_factory=list)
    timed_out: bool = False
    failed_rank: int | None = None
    traceback: str = ""
    strays_killed: int = 0

    @property
    def command(self) -> list[str]:
        return self.commands[0]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def lines(self, rank: int) -> list[str]:
        """The lines rank ``rank`` printed, in order, without the prefix."""
        return self.rank_lines.get(rank, [])

    def summary(self) -> dict:
        """The run's figures as a dict: ok, exit status, seconds, timed out, failed rank, strays stopped."""
        return {
            "ok": self.ok, "returncode": self.returncode, "seconds": self.seconds, "timed_out": self.timed_out,
            "failed_rank": self.failed_rank, "launchers": len(self.commands), "ranks": len(self.rank_lines),
            "strays_killed": self.strays_killed}

    def describe(self) -> str:
        """One line: finished, failed (which rank) or timed out, and how long it ran."""
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s; every process of the run was stopped"
        if self.ok:
            return f"the run finished (exit status 0) in {self.seconds:.1f} s"
        who = f"rank {self.failed_rank}" if self.failed_rank is not None else "a rank"
        return f"{who} failed (exit status {self.returncode}); torchrun stopped the other ranks"


class LaunchError(RuntimeError):
    """A launched run failed or timed out (raised by :func:`launch` only with ``check=True``)."""

    def __init__(self, message: str, result: LaunchResult):
        super().__init__(message)
        self.result = result


# Before the start

def check_timeouts(timeout, grace) -> None:
    """Refuse a timeout or grace that is not a number of seconds > 0 (``timeout=None``: no limit)."""
    for name, value, optional in (("timeout", timeout, True), ("grace", grace, False)):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
            raise LaunchConfigError(f"{name}={value!r}: give a number of seconds > 0"
                                    + (" (or timeout=None for no limit)" if optional else ""))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for a loopback rendezvous)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def core_holders_notice() -> str | None:
    """What to do about processes ``neuron-ls`` lists as holding Neuron devices; ``None`` if none do."""
    holders = neuron_core_holders(neuron_ls_output())
    if not holders:
        return None
    return (f"[trnlab] neuron-ls lists processes that hold Neuron devices: {format_core_holders(holders)}. "
            "A process keeps every NeuronCore it saw until it exits: if a rank cannot initialize the "
            "runtime, shut that one down (a notebook kernel: Kernel > Shut Down Kernel), or pass "
            "neuron_cores= cores it does not hold.")


def child_environment(env: dict[str, str], launch_id: str) -> dict[str, str]:
    """The launchers' environment: ours, plus ``env``, the launch id, unbuffered rank-prefixed output."""
    child_env = {**os.environ, **env, LAUNCH_ID_VAR: launch_id, "PYTHONUNBUFFERED": "1",
                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX_TEMPLATE}
    child_env.setdefault("OMP_NUM_THREADS", "1")  # torchrun would set it too, with a banner
    # The ranks import the same trnlab as this process, installed or not.
    package_root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    return child_env


# Start and stream

def _start(commands: list[list[str]], child_env: dict[str, str]) -> list[subprocess.Popen]:
    """Every launcher at once, each in its own session (so its process group can be signalled)."""
    return [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             bufsize=1, env=child_env, start_new_session=True) for cmd in commands]


def _read_lines(procs: list[subprocess.Popen]) -> tuple[queue.Queue, list[threading.Thread]]:
    """One thread per launcher puts ``(node, line)`` on a queue, then ``(node, None)`` at its end."""
    lines: queue.Queue = queue.Queue()

    def read(node: int, proc: subprocess.Popen):
        for line in proc.stdout:
            lines.put((node, line.rstrip("\n")))
        lines.put((node, None))

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for reader in readers:
        reader.start()
    return lines, readers


class _LineRouter:
    """Sorts the launchers' merged lines into a :class:`LaunchResult`: by rank, or torchrun's own."""

    def __init__(self, result: LaunchResult, nodes: int):
        self.result = result
        self.many = nodes > 1
        self.in_traceback = [False] * nodes
        self.first_traceback_rank: int | None = None  # the first rank to print a traceback: the root cause

    def route(self, node: int, line: str) -> str | None:
        """Record ``line`` from launcher ``node``; return what to show of it (``None``: nothing)."""
        match = _RANK_LINE.match(line)
        if match:
            rank = int(match.group(1))
            # torch prefixes a rank's own log records and tracebacks with "[rankN]:" too.
            text = re.sub(rf"^\[rank{rank}\]: ?", "", match.group(2))
            self.result.rank_lines.setdefault(rank, []).append(text)
            if self.first_traceback_rank is None and text.startswith(_TRACEBACK_START):
                self.first_traceback_rank = rank
            return line
        self.result.launcher_lines.append(line)
        # torchrun ends a failed run with its own Python traceback (ChildFailedError):
        # keep it in the result, show the rank's own traceback instead.
        self.in_traceback[node] = self.in_traceback[node] or line.startswith(_TRACEBACK_START)
        label = f"[torchrun node{node}]" if self.many else "[torchrun]"
        return None if self.in_traceback[node] or not line.strip() else f"{label} {line}"


def _stream(procs, lines: queue.Queue, router: _LineRouter, deadline: float | None, timeout, echo: bool,
            stop_all) -> None:
    """Show each line as it comes until every launcher's output ends; stop all on timeout or failure."""
    open_streams = len(procs)
    while open_streams:
        remaining = None if deadline is None else max(0.01, deadline - time.monotonic())
        try:
            node, line = lines.get(timeout=remaining)
        except queue.Empty:
            router.result.timed_out = True
            if echo:
                print(f"[trnlab] TIMEOUT: the run did not end within {timeout:g} s (a hung "
                      f"collective? a rank waiting for one that died?); stopping every process "
                      f"of the run.", flush=True)
            stop_all()
            return
        if line is None:
            open_streams -= 1
            # One launcher failed: in a multi-node run the others would wait for it forever.
            if router.many and procs[node].wait() != 0:
                stop_all()
            continue
        shown = router.route(node, line)
        if echo and shown is not None:
            print(shown, flush=True)


# Stop

def _marked_processes(launch_id: str) -> list:
    """Live processes whose environment carries this launch's id (psutil: Linux, macOS, Windows)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(LAUNCH_ID_VAR) == launch_id:
                found.append(proc)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
    return found


def _kill_marked(launch_id: str) -> int:
    import psutil

    killed = 0
    for proc in _marked_processes(launch_id):
        try:
            proc.kill()
            killed += 1
        except psutil.Error:
            pass
    return killed


def _stop(proc: subprocess.Popen, launch_id: str, grace: float) -> int:
    """SIGTERM torchrun's process group (it forwards it to the workers), then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    # Workers run in their own sessions; anything still carrying our id is a stray.
    killed = _kill_marked(launch_id)
    deadline = time.monotonic() + 5
    while _marked_processes(launch_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def _reap(procs, readers, launch_id: str, grace: float, result: LaunchResult, stop_all) -> None:
    """Wait for the launchers (stopping any that linger), kill stragglers, end the reader threads."""
    for proc in procs:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            stop_all()
    result.strays_killed += _kill_marked(launch_id)
    for reader in readers:
        reader.join(timeout=5)


# The run

def _extract_traceback(lines: list[str]) -> str:
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    return "\n".join(lines[starts[-1]:]) if starts else "\n".join(lines[-20:])


def _conclude(result: LaunchResult, procs, first_traceback_rank: int | None, echo: bool) -> None:
    """Exit status, and for a failure the rank that raised first and its traceback; say so."""
    codes = [p.returncode for p in procs]
    result.returncode = next((c for c in codes if c != 0), 0)
    if not result.ok and not result.timed_out:
        # The rank that raised first: the others are stopped by torchrun after it, without one.
        result.failed_rank = first_traceback_rank
        if result.failed_rank is not None:
            result.traceback = _extract_traceback(result.lines(result.failed_rank))
    if echo:
        print(f"[trnlab] {result.describe()}", flush=True)
        if result.traceback:
            print(f"[trnlab] traceback of rank {result.failed_rank}:\n{result.traceback}", flush=True)


def run_commands(commands: list[list[str]], env: dict[str, str], timeout: float | None, grace: float,
                 echo: bool) -> LaunchResult:
    """Start every torchrun command at once, stream their merged lines, stop all on trouble.
    ``env`` is added for every launcher; ``timeout`` (seconds, ``None``: no limit) ends the run, SIGTERM then SIGKILL
    after ``grace`` s; ``echo`` prints each line. However the run ends, no process of it is left."""
    launch_id = uuid.uuid4().hex
    start = time.monotonic()
    procs = _start(commands, child_environment(env, launch_id))
    lines, readers = _read_lines(procs)
    result = LaunchResult(commands=commands, returncode=None, seconds=0.0)
    router = _LineRouter(result, len(procs))

    def stop_all():
        result.strays_killed += sum(_stop(p, launch_id, grace) for p in procs)

    try:
        _stream(procs, lines, router, None if timeout is None else start + timeout, timeout, echo, stop_all)
    except BaseException:  # KeyboardInterrupt (the notebook's stop button) included
        stop_all()
        raise
    finally:
        _reap(procs, readers, launch_id, grace, result, stop_all)
    result.seconds = time.monotonic() - start
    _conclude(result, procs, router.first_traceback_rank, echo)
    return result
