"""Run a rank script whose rank R, on torchrun's first attempt, stops after logging step K, for a test to kill it.

    PAUSE_AT=R:K torchrun --max-restarts=1 ... tests/scripts/paused_rank.py examples/train.py ARGS...

It prints "rank R (pid P) logged step K" and waits; its peers wait in the next step's collective, so
nothing moves on (no checkpoint is half written) until the test's SIGKILL. Later attempts (restarted by torchrun, or
a requeued Slurm job) run unpaused.
"""
import os
import runpy
import sys
import time

from transformers import Trainer, TrainerCallback

rank, step = map(int, os.environ["PAUSE_AT"].split(":"))


class Pause(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        first_attempt = all(os.environ.get(var, "0") == "0" for var in ("TORCHELASTIC_RESTART_COUNT",
                                                                        "SLURM_RESTART_COUNT"))
        if first_attempt and args.process_index == rank and state.global_step == step and "loss" in logs:
            print(f"rank {rank} (pid {os.getpid()}) logged step {step}\n", end="", flush=True)  # one write
            time.sleep(600)


build = Trainer.__init__
Trainer.__init__ = lambda self, *args, **kwargs: (build(self, *args, **kwargs), self.add_callback(Pause()))[0]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
