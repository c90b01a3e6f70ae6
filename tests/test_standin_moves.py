"""Two things Transformers' distributed suite (tests/test_transformers_suite.py) found the STAND-IN neuron device
doing unlike CUDA or TorchNeuron: ``module.to("neuron")`` split tied weights into two Parameters, and pinned host
memory was not pinned (DDP with ``find_unused_parameters=True`` asserts it). One fresh Python checks both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from trnlab.standin import cache_dir

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None
                                    and not (cache_dir() / "ready").exists(),
                                    reason="the stand-in is built with a C++ compiler: apt-get install g++")

SCRIPT = """
    import json, torch
    r = {"standin": getattr(getattr(torch, "neuron", None), "standin", False)}
    m = torch.nn.Module()
    m.embed, m.head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
    m.head.weight = m.embed.weight
    weight = m.embed.weight
    m.to("neuron")
    r["tied"], r["same_parameter"] = m.head.weight is m.embed.weight, m.embed.weight is weight
    r["device"], r["parameters"] = str(weight.device), len(list(m.parameters()))
    m.to("cpu", dtype=torch.bfloat16)
    r["tied_back"], r["back"] = m.head.weight is m.embed.weight, f"{weight.device} {weight.dtype}"
    pinned = torch.ones(4).pin_memory()
    r["pinned"], r["pinned_view"] = pinned.is_pinned(), pinned[1:].is_pinned()
    r["empty_pinned"], r["plain"] = torch.empty(3, pin_memory=True).is_pinned(), torch.ones(4).is_pinned()
    r["to_neuron"] = torch.equal(pinned.to("neuron", non_blocking=True).cpu(), torch.ones(4))
    print(json.dumps(r))
"""


@needs_compiler
def test_module_moves_keep_tied_weights_and_pinned_memory_is_pinned():
    env = {**os.environ, "TRNLAB_NEURON_STANDIN": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r == {"standin": True, "tied": True, "same_parameter": True, "device": "neuron:0", "parameters": 1,
                 "tied_back": True, "back": "cpu torch.bfloat16", "pinned": True, "pinned_view": True,
                 "empty_pinned": True, "plain": False, "to_neuron": True}
