"""Run trnlab's neuron paths under a line tracer and write the lines that ran as JSON.

``python tests/scripts/neuron_paths.py OUT.json``, with TRNLAB_NEURON_STANDIN=1: the trnlab calls the notebooks make on
a neuron device, on the stand-in. ``python tests/scripts/neuron_paths.py OUT.json --pytest NODEID...``: those tests
(the fake_neuron ones), each traced apart. tests/test_neuron_branches.py runs both. Only frames of files under trnlab/
(not trnlab/standin/, the device itself) are traced. The JSON: ``runs`` ({"standin" or node id: {"lines": {file:
[line, ...]}, "edges": {file: [[from, to], ...]}}}, ``to`` 0 for a return), ``facts`` and pytest's ``exit`` code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE, DEVICE = str(ROOT / "trnlab") + os.sep, str(ROOT / "trnlab" / "standin") + os.sep
runs: dict[str, dict[str, dict]] = {}
current = ["standin"]  # the run that frames starting now belong to
_files: dict[str, str | None] = {}  # co_filename -> its path relative to ROOT, None when not traced


def _trace_calls(frame, event, arg):
    name = frame.f_code.co_filename
    rel = _files.get(name, 0)
    if rel == 0:
        rel = _files[name] = (os.path.relpath(name, ROOT) if name.startswith(PACKAGE) and not name.startswith(DEVICE)
                              else None)
    if rel is None:
        return None  # no line events for torch, Transformers, ...: it stays fast
    run = runs.setdefault(current[0], {"lines": {}, "edges": {}})
    ran, jumps = run["lines"].setdefault(rel, set()), run["edges"].setdefault(rel, set())
    last = [frame.f_lineno]

    def trace_lines(frame, event, arg):
        if event == "line":
            ran.add(frame.f_lineno)
            jumps.add((last[0], frame.f_lineno))
            last[0] = frame.f_lineno
        elif event == "return":
            jumps.add((last[0], 0))
        return trace_lines

    return trace_lines


def notebook_paths(tmp: Path) -> dict:
    """What notebooks 01-06 call in trnlab on a neuron device; returns facts the test checks."""
    import contextlib
    import io
    import warnings

    import torch

    import trnlab
    from trnlab import training
    from trnlab.doctor import run_checks, show_report

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        device = trnlab.setup()                                # 01-06: pick_device, core_holders_notice
    print(said.getvalue(), end="")
    report = show_report()                              # 01: device_report
    facts = {"device": str(device), "setup": said.getvalue(), "report_backend": report.backend,
             "standin": getattr(getattr(torch, "neuron", None), "standin", False),
             "failed_checks": [c.name for c in run_checks(report) if not c.ok]}  # 01: doctor's checks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        facts["device_map_auto"] = trnlab.resolve_device_map("auto")   # 02: claim 3, trnlab's decision
    facts["device_map_warned"] = any("device_map='auto'" in str(w.message) for w in caught)
    facts["device_map"] = trnlab.resolve_device_map(str(device))       # 02
    facts["dtype"] = str(trnlab.resolve_dtype("auto", device))         # 02, 06
    facts["backend"] = trnlab.compile_backend(device, None)            # 03, 04
    facts["compile_config"] = repr(trnlab.generation_compile_config(device, facts["backend"]))  # 03
    facts["memory"] = trnlab.format_accelerator_memory(device)         # 02, 04
    facts["plan"] = str(trnlab.plan_processes(4, device=device))       # 05
    model = trnlab.load_model(None, device=device, dtype="auto")       # 01-06: the bundled model
    tokenizer = trnlab.load_tokenizer(None)
    facts["model_device"] = str(model.device)
    facts["precision"] = training.precision_choice(device, model)[1]   # 04
    args = training._page_arguments(tmp / "args", device, max_steps=1, compile_backend="neuron")  # 04
    facts["args_device"], facts["args_backend"] = str(args.device), args.torch_compile_backend
    inputs = tokenizer(trnlab.EXAMPLE_PROMPT, return_tensors="pt")
    # 02, 06: a static cache; not compiled (no trnlab line runs in dynamo, and tracing it doubles the time):
    # tests/test_standin.py runs the compiled path.
    with trnlab.CompileTracker() as compiled:
        output = model.generate(**inputs, do_sample=False, max_new_tokens=2, cache_implementation="static",
                                disable_compile=True)
    facts["graphs"], facts["output_device"] = compiled.graphs, str(output.device)
    facts["summary"] = trnlab.run_summary()                            # 01-06: the last cell
    return facts


class _EachTest:
    """pytest plugin: the frames of each test (setup, call, teardown) go to its own run, keyed by its node id."""

    def pytest_runtest_logstart(self, nodeid, location):
        current[0] = nodeid.split("[")[0]


def main(out: str, nodeids: list[str]) -> int:
    import tempfile

    facts, code = {}, 0
    sys.settrace(_trace_calls)  # before trnlab is imported: its module-level code is traced too
    try:
        if nodeids:
            import pytest

            code = int(pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *nodeids], plugins=[_EachTest()]))
        else:
            with tempfile.TemporaryDirectory(prefix="trnlab-neuron-paths-") as tmp:
                facts = notebook_paths(Path(tmp))
    finally:
        sys.settrace(None)
    facts["trnlab"] = sys.modules["trnlab"].__file__ if "trnlab" in sys.modules else None
    Path(out).write_text(json.dumps({
        "runs": {key: {"lines": {f: sorted(n) for f, n in run["lines"].items()},
                       "edges": {f: sorted(e) for f, e in run["edges"].items()}} for key, run in runs.items()},
        "facts": facts, "exit": code}))
    return code


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[2:] if args[1:2] == ["--pytest"] else []))
