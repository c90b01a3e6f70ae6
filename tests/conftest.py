"""Shared fixtures: a fake Neuron device for the neuron branch, no accelerator, one torch thread, CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fake_neuron import FakeNeuronModule, fake_neuron as faked
from trnlab._compat import clear_detection_caches, privateuse1_backend_name
from trnlab.settings import _NEURON_STANDIN_ENV_VAR


@pytest.fixture(scope="module", autouse=True)
def _bundled_model_by_default():
    """Each test module runs without ``TRNLAB_MODEL`` (before its own module fixtures): ``make test`` sets it for the
    notebooks' laptop run only."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TRNLAB_MODEL", raising=False)
        yield


@pytest.fixture
def fake_neuron():
    """A fake ``torch.neuron`` with 4 devices, a ``torch_neuronx``, CUDA hidden (tests/fake_neuron.py); set ``.cores``.

    Not built on ``monkeypatch``: a test's own monkeypatch is then undone before the fake's restore.
    """
    with faked(cores=4, bf16=True) as module:
        yield module


@pytest.fixture
def no_accelerator(monkeypatch):
    """Hide CUDA and Neuron, so the CPU path is taken even on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import fails like when absent
    saved = torch.__dict__.get("neuron")
    if privateuse1_backend_name() == "neuron":  # renamed by a fake earlier: PyTorch needs a module
        torch.neuron = FakeNeuronModule(cores=0)
    elif saved is not None:
        del torch.neuron
    clear_detection_caches()  # torch.accelerator caches the torch.neuron it saw last
    yield
    if saved is not None:
        torch.neuron = saved
    else:
        torch.__dict__.pop("neuron", None)
    clear_detection_caches()


@pytest.fixture
def one_torch_thread():
    """Run the test with one intra-op thread: on a shared 2-core machine a second thread makes
    tiny-model training steps many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: ``python -m trnlab ARGS`` for each ``[args, env]`` read from stdin, each in a child forked after ``import torch``
#: (the slow import, done once); every run imports trnlab afresh, under its own env.
_CLI_RUNS = r"""
import json, os, runpy, sys, tempfile, traceback
import torch  # noqa: F401
for name in [name for name in sys.modules if name.partition(".")[0] == "trnlab"]:
    del sys.modules[name]  # import torch ran trnlab's entry point: each run imports trnlab afresh
results = []
for args, env in json.load(sys.stdin):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child ends as `python -m trnlab ARGS` does: SystemExit's code, or a traceback and 1
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.environ.clear()
            os.environ.update(env)
            sys.argv, code = ["-m", *args], 1
            try:
                runpy.run_module("trnlab", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as stop:
                if stop.code is None or isinstance(stop.code, int):
                    code = stop.code or 0
                else:
                    print(stop.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0)
        err.seek(0)
        results.append([code, out.read().decode(), err.read().decode()])
print(json.dumps(results))
"""


@pytest.fixture(scope="session")
def trnlab_cli():
    """``trnlab_cli((args, env), ...)``: a ``CompletedProcess`` per ``python -m trnlab *args`` run, with no TRNLAB_
    variable but ``env``'s; one Python imports torch for all of them (seconds each saved)."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("TRNLAB_")}

    def run(*cases: tuple[list[str], dict[str, str]]) -> list[subprocess.CompletedProcess]:
        # Only TRNLAB_ settings are read after the fork; the stand-in's starts at import torch, before it.
        late = {name for _, env in cases for name in env if not name.startswith("TRNLAB_")} | {
            name for _, env in cases for name in env if name == _NEURON_STANDIN_ENV_VAR}
        assert not late, f"{sorted(late)}: read before the fork, so such a run needs its own Python"
        done = subprocess.run([sys.executable, "-c", _CLI_RUNS], env=clean, capture_output=True, text=True,
                              timeout=300, input=json.dumps([[list(args), {**clean, **env}] for args, env in cases]))
        assert done.returncode == 0, done.stderr[-4000:]
        return [subprocess.CompletedProcess(["python", "-m", "trnlab", *args], code, out, err)
                for (args, _), (code, out, err) in zip(cases, json.loads(done.stdout))]

    return run
