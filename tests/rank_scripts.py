"""Run several rank scripts one after the other in the same torchrun ranks (tests only).

    torchrun --nproc-per-node=4 tests/rank_scripts.py SCRIPT ARGS... --then SCRIPT ARGS...

A rank's start-up (importing torch and Transformers) costs more than the tiny model's whole
run on a 2-core machine, so tests/test_distributed.py pays it once for the training run of
notebook 05's script and the memory measurement that tests/test_planning.py used to launch
on its own. The scripts share one process group: a second init_process_group in the same
torchrun ranks hangs (torchrun's agent store), so a script's destroy_process_group() is held
back until the last script has run.
"""
import runpy
import sys

runs, current = [], []
for arg in sys.argv[1:]:
    if arg == "--then":
        runs.append(current)
        current = []
    else:
        current.append(arg)
runs.append(current)
import torch.distributed as dist  # noqa: E402

destroy = dist.destroy_process_group
for number, (script, *args) in enumerate(runs, 1):
    dist.destroy_process_group = destroy if number == len(runs) else (lambda *a, **k: None)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
