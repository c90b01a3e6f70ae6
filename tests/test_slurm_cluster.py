"""tests/slurm_cluster.py itself: it says what to install, and it stops exactly the daemons it started."""

from __future__ import annotations

from pathlib import Path

from tests import slurm_cluster


def _processes_of(folder: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if any(str(folder).encode() in word for word in words):
            found.append(words[0].decode())
    return found


def test_missing_slurm_names_the_apt_line(monkeypatch):
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(slurm_cluster, "Path", lambda *parts: Path("/nonexistent", *parts[1:]))
    reason = slurm_cluster.missing()
    assert reason.startswith("Slurm is not installed (munged, mungekey, slurmctld, slurmd, sbatch, sinfo, sacct, "
                             "scontrol missing): apt-get install --no-install-recommends slurmctld slurmd munge")


def test_the_cluster_has_two_idle_nodes_and_stops_exactly_its_daemons(tmp_path):
    slurm_cluster.require()
    folder = tmp_path / "cluster"
    with slurm_cluster.cluster(folder) as running:
        assert sorted(_processes_of(folder)) == ["munged", "slurmctld", "slurmd", "slurmd"]
        nodes = running.run("sinfo", "-h", "-N", "-o", "%N %t %P").stdout.split("\n")
        # "*": the default partition
        assert [line for line in nodes if line] == ["trnlab-node0 idle trnlab*", "trnlab-node1 idle trnlab*"]
    assert _processes_of(folder) == []
    assert slurm_cluster.hosts_line(folder) not in slurm_cluster.HOSTS.read_text()
