"""Claim 10 on the STAND-IN `neuron` device: its process group against gloo, ranks' devices, learners' own scripts
(DDP, FSDP2, DTensor, written as the Neuron distributed guide writes them), and mistakes that must fail clearly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_standin import needs_compiler

SCRIPTS = Path(__file__).parent / "scripts"
STANDIN_ENV = {"TRNLAB_NEURON_STANDIN": "1", "OMP_NUM_THREADS": "1"}


def _torchrun(script, *args, nproc=4, env=None, timeout=240):
    environment = {k: v for k, v in os.environ.items() if k != "NEURON_RT_VISIBLE_CORES"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(SCRIPTS / script), *map(str, args)]
    return subprocess.run(command, env={**environment, **STANDIN_ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives") / "out.json"
    run = _torchrun("neuron_collectives.py", out)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


EXPECTED = {f"all_reduce {op}" for op in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor",
                                           "premul_sum")} | {
    "async_all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_tensor_premul_sum", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send_recv",
    "bfloat16_all_reduce", "barrier", "objects"}


@needs_compiler
def test_every_collective_on_neuron_equals_gloo_on_cpu(collectives):
    results = collectives["collectives"]
    assert set(results) == EXPECTED
    assert {name: r for name, r in results.items() if not r["equal"] or r["errors"]} == {}


@needs_compiler
def test_each_rank_has_one_device_its_local_rank_as_torchneuron_gives_it(collectives):
    for rank, seen in enumerate(collectives["ranks"]):
        assert (seen["rank"], seen["current_device"], seen["device_count"]) == (rank, rank, 4)
        assert seen["default_device"] == seen["generator"] == seen["stream_device"] == f"neuron:{rank}"
        assert seen["visible"] == str(rank)  # NEURON_RT_VISIBLE_CORES=LOCAL_RANK, set by the process group
        assert seen["drawn_like_cpu"] and seen["event_done"]
        assert seen["refusals"]["other_core"] == (f"STAND-IN neuron:{(rank + 1) % 4} is not this process's device: a "
                                                  f"torchrun rank has one NeuronCore, neuron:{rank} (its LOCAL_RANK), "
                                                  "as TorchNeuron gives it")
        assert seen["refusals"]["cpu_tensor"] == "No backend type associated with device type cpu"


@pytest.mark.own_launch("a learner's own script, read by this test alone")
@needs_compiler
@pytest.mark.parametrize("style, holds", [("ddp", "on neuron:{rank}: DDP"),
                                          ("fsdp2", "holds (8, 16) of (32, 16) on neuron:{rank}; FSDP2"),
                                          ("tp", "holds (8, 16) of (32, 16) on neuron:{rank}; tensor parallel")])
def test_a_learners_own_script_runs_unmodified(style, holds):
    script = SCRIPTS / f"guide_{style}.py"
    assert "torchrun --nproc-per-node=4 " + script.name in script.read_text()  # the command its docstring prints
    assert "trnlab" not in script.read_text().replace("(no trnlab)", "")
    run = _torchrun(script.name)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}" in run.stdout and holds.format(rank=rank) in run.stdout
    assert run.stdout.count("as one process, largest difference") == 4


@pytest.mark.own_launch("ranks made to share a core: the refusal")
@needs_compiler
@pytest.mark.parametrize("visible, message", [
    ("0", "NeuronCore 0 of node 0 is claimed by 2 ranks"),
    ("0-1", "NEURON_RT_VISIBLE_CORES=0-1 gives rank {rank} 2 NeuronCores, and the neuron process group takes one"),
])
def test_ranks_sharing_a_core_fail_with_the_fix(visible, message):
    run = _torchrun("neuron_misuse.py", "ok", nproc=2, env={"NEURON_RT_VISIBLE_CORES": visible}, timeout=120)
    assert run.returncode != 0
    assert any(message.format(rank=rank) in run.stderr for rank in (0, 1)), run.stderr[-3000:]
    assert "--neuron-cores" in run.stderr


@needs_compiler
def test_ranks_spawned_by_torch_multiprocessing_each_claim_their_local_rank_as_torchneuron_does(tmp_path):
    """Transformers' FSDP and tensor-parallel test mixins spawn their ranks, which set LOCAL_RANK after importing
    torch: the process group gives each neuron:<LOCAL_RANK> and NEURON_RT_VISIBLE_CORES=LOCAL_RANK, as TorchNeuron's
    does when the variable is unset. One the ranks inherit from their parent is theirs: all on core 0, refused. A
    LOCAL_RANK past the cores is refused by name."""
    environment = {k: v for k, v in os.environ.items() if k not in ("NEURON_RT_VISIBLE_CORES", "LOCAL_RANK")}
    seen = {}
    for case in ("own", "inherit", "beyond"):
        out = tmp_path / f"{case}.json"
        run = subprocess.run([sys.executable, str(SCRIPTS / "spawned_ranks.py"), str(out), case],
                             env={**environment, **STANDIN_ENV}, capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        seen[case] = json.loads(out.read_text())
    assert seen["own"] == [{"current_device": rank, "visible": str(rank), "device": f"neuron:{rank}",
                            "sum": [3.0, 3.0]} for rank in range(2)]
    errors = [rank.get("error", "") for rank in seen["inherit"]]
    assert any("NeuronCore 0 of node 0 is claimed by 2 ranks" in e and "NEURON_RT_VISIBLE_CORES=0" in e
               for e in errors), errors
    said = {rank: seen["beyond"][rank]["error"] for rank in (0, 1)}
    told = {r: e for r, e in said.items() if e != "stopped"}  # "stopped": the other rank failed first
    assert told and all(e == f"LOCAL_RANK='{r + 4}': give this rank's index on its node, 0 to 3 (the STAND-IN has "
                        "4 NeuronCores)" for r, e in told.items()), said


@pytest.mark.own_launch("a rank made to start the runtime early: the refusal")
@needs_compiler
def test_a_tensor_on_neuron_before_init_process_group_fails_as_on_trainium():
    run = _torchrun("neuron_misuse.py", "early-tensor", nproc=2, timeout=120)
    assert run.returncode != 0
    assert "a tensor was put on neuron before init_process_group" in run.stderr


@pytest.mark.own_launch("a rank made to die: what the launcher does then")
@needs_compiler
def test_a_rank_that_dies_mid_collective_stops_the_run_named():
    command = [sys.executable, "-m", "trnlab", "launch", "--nproc-per-node", "2", "--timeout", "120",
               str(SCRIPTS / "neuron_misuse.py"), "dies"]
    run = subprocess.run(command, env={**os.environ, **STANDIN_ENV}, capture_output=True, text=True, timeout=150)
    assert run.returncode != 0
    assert "2 process(es) on neuron, backend neuron" in run.stdout  # the stand-in's plan: no CPU fallback
    assert "rank 1 failed (exit status 3); torchrun stopped the other ranks" in run.stdout  # the one that died
    assert "(rank 1 printed no traceback; rank 0's:)" in run.stdout  # and what its peer saw
    assert "Check the logs of the remote worker" in run.stdout  # gloo: its peer is gone
    assert "TIMEOUT" not in run.stdout + run.stderr  # stopped by torchrun, not by the timeout
