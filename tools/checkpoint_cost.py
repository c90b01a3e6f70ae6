"""What checkpoints and a restart cost: examples/train.py on 4 ranks (tp 2 x fsdp 2), float32, 4 steps, checkpoints
at 2 and 4, once clean and once with rank 1 SIGKILLed after step 3 (torchrun restarts it, it resumes from checkpoint-2).

    python tools/checkpoint_cost.py OUT [--standin]      # OUT: a new folder; it pads the bundled model there

Prints both runs' wall seconds, each rank's checkpoint bytes and save seconds (from checkpoint-2's manifest).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from trnlab import distributed as td  # noqa: E402
from trnlab.models import _BUNDLED_MODEL_DIR  # noqa: E402


def run(args: list[str], env: dict, kill: str | None = None, **extra) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "trnlab", "launch", *args], cwd=ROOT, env={**env, **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if kill and (found := re.search(kill, line)):
            os.kill(int(found.group(1)), signal.SIGKILL)
    if proc.wait() != 0:
        sys.exit("".join(lines)[-4000:])
    return time.monotonic() - start, "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--standin", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("TRNLAB_MODEL", None)
    env.pop("TRNLAB_NEURON_STANDIN", None)
    if args.standin:
        env["TRNLAB_NEURON_STANDIN"] = "1"
    model = td.pad_vocabulary(str(_BUNDLED_MODEL_DIR), args.out / "padded-model")
    train = ["--nproc-per-node", "4", "examples/train.py", "--dtype", "float32", "--steps", "4", "--save-steps", "2",
             "--model", str(model)]
    clean, _ = run([*train, "--out", str(args.out / "clean")], env)
    killed, text = run(["--max-restarts", "1", *train[:2], "tests/scripts/paused_rank.py", *train[2:], "--out",
                        str(args.out / "killed")], env, kill=r"rank 1 \(pid (\d+)\) logged step 3", PAUSE_AT="1:3")
    print(f"clean run {clean:.1f} s wall; rank 1 killed after step 3 and the run restarted: {killed:.1f} s wall")
    print(*[line for line in text.splitlines() if "the run finished" in line])
    manifest = json.loads((args.out / "clean" / "checkpoint-2" / td.MANIFEST).read_text())
    for rank, seconds in enumerate(manifest["save_seconds"]):
        own = sum(size for name, (size, _) in manifest["files"].items() if f"__{rank}_" in name
                  or f"rng_state_{rank}." in name)
        print(f"rank {rank}: {own:,} bytes of shards and RNG, saved (with sha256) in {seconds:.3f} s")
    shared = sum(size for name, (size, _) in manifest["files"].items() if "__" not in name and "rng_state" not in name)
    print(f"rank 0 also: {shared:,} bytes (model.safetensors, Trainer's state, scheduler, .metadata)")


if __name__ == "__main__":
    main()
