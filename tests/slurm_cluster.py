"""A real two-node Slurm cluster on this machine, for the tests: Debian's munge, slurmctld and two slurmd.

Every daemon runs in the foreground (``-F``/``-D``) as a child of the fixture, on loopback ports picked free, with its
config, state, spool and logs in one temporary folder; on exit the fixture stops exactly those processes. The two
nodes are ``trnlab-node0`` and ``trnlab-node1``: torchrun's rendezvous must resolve the head node's name, so the
fixture adds its own line for them (127.0.0.1) to /etc/hosts while the cluster runs, and removes that line after, as
a cluster's own /etc/hosts or DNS would name its nodes. Jobs complete into ``jobcomp.txt``, which ``sacct -c`` reads
(no slurmdbd needed). Needs root (slurmd starts job steps as the job's user). Missing Slurm skips the tests and says
what to install; under CI=true it fails them.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

NODES = ("trnlab-node0", "trnlab-node1")
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "sacct", "scontrol")
INSTALL = "apt-get install --no-install-recommends slurmctld slurmd munge (Debian's Slurm)"
HOSTS = Path("/etc/hosts")
# A requeued job waits out the credential lifetime before it starts again (slurm.conf(5), AuthInfo cred_expire:
# default 120 s), so that the first start's revoked credentials cannot kill the second; then the main scheduling
# loop starts it (sched_interval, default 60 s). Shorter here, so that a requeue test waits seconds, not minutes.
CRED_EXPIRE, SCHED_INTERVAL = 10, 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(folder: Path, ports: list[int]) -> str:
    nodes = "\n".join(f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={os.cpu_count()} State=UNKNOWN"
                      for name, port in zip(NODES, ports[1:]))
    return f"""ClusterName=trnlab
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket,cred_expire={CRED_EXPIRE}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
SchedulerType=sched/builtin
SchedulerParameters=sched_interval={SCHED_INTERVAL}
SelectType=select/linear
MpiDefault=none
ReturnToService=2
{nodes}
PartitionName=trnlab Nodes={NODES[0][:-1]}[0-1] Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [name for name in PROGRAMS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): {INSTALL}"
    if os.geteuid() != 0:
        return "the Slurm tests start slurmd, which must run as root"
    return None


def hosts_line(folder: Path) -> str:
    """The /etc/hosts line of the cluster in ``folder``: each cluster its own, so two (two test workers) never
    remove each other's."""
    return f"127.0.0.1 {' '.join(NODES)}  # trnlab tests: the two Slurm nodes of {folder}"


def _edit_hosts(change) -> None:
    """Apply ``change`` (lines -> lines) to /etc/hosts under a lock: another cluster may be editing it too."""
    with HOSTS.open("r+") as hosts:
        fcntl.flock(hosts, fcntl.LOCK_EX)
        lines = change(hosts.read().splitlines())
        hosts.seek(0)
        hosts.write("".join(f"{line}\n" for line in lines))
        hosts.truncate()


@contextmanager
def _node_names(folder: Path):
    """The nodes' names resolve to 127.0.0.1 while the cluster runs: its own line in /etc/hosts, removed after."""
    line = hosts_line(folder)
    _edit_hosts(lambda lines: [*lines, line])
    try:
        yield
    finally:
        _edit_hosts(lambda lines: [other for other in lines if other != line])


def _wait(condition, what: str, logs: list[Path], timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs if log.exists())
            raise TimeoutError(f"the Slurm cluster did not get {what} within {timeout:.0f} s:\n{tails}")
        time.sleep(0.2)


class Cluster:
    """A running cluster: ``env`` has SLURM_CONF; ``run`` runs a Slurm command; ``wait_for_job`` polls the job."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}

    def run(self, *command: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=kwargs.pop("env", self.env), capture_output=True, text=True, timeout=60,
                              **kwargs)

    def job(self, job_id: str) -> dict[str, str]:
        """``sacct -c`` (the job completion log) of a job's last end; {} before its first. A requeued job ends twice:
        first as PENDING (back in the queue), then as it finally ended."""
        fields = "JobID,JobName,State,ExitCode,NNodes,NodeList%40"
        out = self.run("sacct", "-c", "--file", str(self.folder / "jobcomp.txt"), "-j", job_id, "-n", "-P", "-o",
                       fields).stdout
        rows = [dict(zip(fields.replace("%40", "").split(","), line.split("|"))) for line in out.splitlines()]
        return ([row for row in rows if row["JobID"] == job_id] or [{}])[-1]

    def queued(self, job_id: str) -> str:
        """The job's state and reason in the queue ("PENDING BeginTime", "RUNNING None"); "" once it has left it."""
        return self.run("squeue", "-h", "-j", job_id, "-o", "%T %r").stdout.strip()

    def wait_for_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Wait until the job has left the queue for good; its last end."""
        _wait(lambda: self.job(job_id).get("State", "PENDING") != "PENDING" and not self.queued(job_id),
              f"job {job_id} finished", [self.folder / "slurmctld.log"], timeout)
        return self.job(job_id)


@contextmanager
def cluster(folder: Path):
    """munged, slurmctld and two slurmd on free loopback ports; both nodes idle before it yields."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # munged's socket folder must be searchable by all
    (folder / "state").mkdir()
    ports = [_free_port() for _ in range(1 + len(NODES))]
    (folder / "slurm.conf").write_text(_config(folder, ports))
    subprocess.run(["mungekey", "--create", f"--keyfile={folder / 'munge.key'}"], check=True)
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    started: list[subprocess.Popen] = []

    def start(name: str, *command: str):
        log = (folder / f"{name}.out").open("w")
        started.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))

    with _node_names(folder):
        try:
            start("munged", "munged", "-F", "--force", f"--socket={folder}/munge.socket",
                  f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
                  f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed")
            _wait(lambda: (folder / "munge.socket").exists(), "munged's socket", [folder / "munged.out"])
            start("slurmctld", "slurmctld", "-D", "-f", str(folder / "slurm.conf"))
            for node in NODES:
                start(f"slurmd-{node}", "slurmd", "-D", "-f", str(folder / "slurm.conf"), "-N", node)
            cluster = Cluster(folder)

            def idle() -> bool:
                states = cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
                return sorted(line.split()[1] for line in states if line.strip()) == ["idle"] * len(NODES)

            logs = [folder / "slurmctld.log", *(folder / f"slurmd-{node}.log" for node in NODES)]
            _wait(idle, "both nodes idle", logs)
            yield cluster
        finally:
            for proc in reversed(started):  # exactly the daemons started here, controller and nodes before munged
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


def require() -> None:
    """Skip the calling test, saying what to install, when a cluster cannot start here; under CI=true fail it."""
    reason = missing()
    if reason:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running two-node cluster (module docstring); skipped with what to install, failed under CI=true."""
    require()
    with cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def job_id(sbatch_output: str) -> str:
    match = re.search(r"Submitted batch job (\d+)", sbatch_output)
    assert match, sbatch_output
    return match.group(1)
