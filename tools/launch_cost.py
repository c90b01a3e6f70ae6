"""Where one torchrun launch's CPU-seconds go, per rank: interpreter start, imports, set-up, training, the rest.

    python tools/launch_cost.py [--nproc 4] [--standin] -- SCRIPT ARGS...     # e.g. examples/train.py --model M

Each rank runs SCRIPT under this file (``--rank``) with ``-X importtime``; it reads its own CPU clock when it starts,
after the imports SCRIPT makes (torch, transformers, trnlab), when ``Trainer.train`` starts and ends, and at exit.
Set-up is everything between the imports and ``train()``: the mesh check, ``init_process_group``, the sharded load,
the data and the Trainer. Prints a table per rank and the 10 slowest top-level imports of rank 0.
"""
import argparse
import atexit
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def rank_main(out: Path, script: str, args: list[str]) -> None:
    """In a rank: run ``script`` as ``__main__`` and write its phases' CPU seconds to ``out/rank<R>.json``."""
    marks = {"start": _cpu()}
    import torch  # noqa: F401  (what every rank script imports first)
    import transformers
    import trnlab  # noqa: F401
    marks["imports"] = _cpu()
    train = transformers.Trainer.train

    def timed_train(self, *a, **k):
        marks["setup"] = _cpu()
        try:
            return train(self, *a, **k)
        finally:
            marks["training"] = _cpu()

    transformers.Trainer.train = timed_train

    def write():
        marks["end"] = _cpu()
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(marks))

    from trnlab import distributed

    finish = distributed.finish

    def write_then_finish(code: int = 0) -> None:  # finish() ends the rank with os._exit: no atexit after it
        write()
        finish(code)

    distributed.finish = write_then_finish
    atexit.register(write)  # a script that ends without finish()
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def _imports(stderr: str, top: int = 10) -> list[tuple[str, float]]:
    """The ``top`` slowest top-level packages in ``-X importtime`` output, cumulative seconds."""
    totals: dict[str, float] = defaultdict(float)
    for match in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)$", stderr, re.M):
        if not match.group(2):  # a top-level import: its cumulative time includes what it imported
            totals[match.group(3).split(".")[0]] += int(match.group(1)) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])[:top]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--standin", action="store_true", help="TRNLAB_NEURON_STANDIN=1 in every rank")
    parser.add_argument("command", nargs="+", help="SCRIPT ARGS...")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out, logs = Path(folder) / "marks", Path(folder) / "logs"
        out.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        if options.standin:
            env["TRNLAB_NEURON_STANDIN"] = "1"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={options.nproc}",
                   "--log-dir", str(logs), "--redirects=3", "--no-python", sys.executable, "-X", "importtime",
                   __file__, "--rank", str(out), *options.command]
        started, before = time.monotonic(), os.times()
        subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        after = os.times()
        children = after.children_user + after.children_system - before.children_user - before.children_system
        print(f"{' '.join(options.command)}: {options.nproc} ranks, {time.monotonic() - started:.1f} s wall, "
              f"{children:.1f} CPU-s in all (torchrun included)")
        print("rank  start  imports  set-up  training  rest   (CPU-s)")
        for rank in range(options.nproc):
            m = json.loads((out / f"rank{rank}.json").read_text())
            print(f"{rank:4d}  {m['start']:5.2f}  {m['imports'] - m['start']:7.2f}  {m['setup'] - m['imports']:6.2f}  "
                  f"{m['training'] - m['setup']:8.2f}  {m['end'] - m['training']:4.2f}")
        stderr = next(logs.rglob("attempt_0/0/stderr.log")).read_text()
        print("rank 0's slowest top-level imports (cumulative s):",
              ", ".join(f"{name} {seconds:.2f}" for name, seconds in _imports(stderr)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        sys.exit(main())
