"""Run several rank scripts one after the other in the same torchrun ranks (tests only).

    torchrun --nproc-per-node=4 tests/rank_scripts.py SCRIPT ARGS... --then SCRIPT ARGS...

A rank's start-up (importing torch and Transformers) costs more than the tiny model's whole
run on a 2-core machine, so tests/test_distributed.py pays it once for the training run of
notebook 05's script and the memory measurement that tests/test_planning.py used to launch
on its own. The scripts share one process group: a second init_process_group in the same
torchrun ranks hangs (torchrun's agent store), so a script's closing trnlab.distributed.finish()
(which destroys the process group and ends the rank) is held back until the last script has run.
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
from trnlab import distributed as td  # noqa: E402

finish = td.finish
for number, (script, *args) in enumerate(runs, 1):
    td.finish = finish if number == len(runs) else (lambda code=0: None)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
