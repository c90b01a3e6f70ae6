"""trnlab's own minimal ``distributed_testing_utils`` for Transformers' ``test_fsdp_mixin.py`` and
``test_tensor_parallel_mixin.py`` (the sdist imports it but does not ship it). Written for trnlab, no Transformers
code. It spawns one process per rank with ``torch.multiprocessing`` as the mixins expect: each child inherits the
test process's environment and sets its own ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` after it has imported torch
(the FSDP mixin's ``_fsdp_global_wrapper`` does so; ``_run_rank`` below does the same for the tensor-parallel one),
then its process group gives it its device. Each device's backend comes from Transformers' own map."""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trnlab.distributed import finish

#: Seconds a launch may take before its ranks are stopped (a rank left waiting on a collective hangs otherwise).
RANK_TIMEOUT = float(os.environ.get("TRNLAB_SUITE_RANK_TIMEOUT", "900"))
_GRACE = 30.0  # seconds the other ranks get to finish once one rank has failed


def _get_distributed_device_type() -> str:
    device_type = torch._C._get_accelerator().type
    return "cpu" if device_type == "mps" else device_type


def _get_distributed_backend() -> str:
    from transformers.distributed.utils import get_distributed_backend

    return get_distributed_backend(_get_distributed_device_type())


def _get_rank_device(rank: int) -> torch.device:
    device_type = _get_distributed_device_type()
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, rank)


def _set_rank_device(rank: int) -> None:
    if _get_distributed_device_type() != "cpu":
        torch.accelerator.set_device_index(rank)


def _start_rank_processes(fn, args=(), nprocs: int = 2) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes and wait for them; raise if one fails or hangs."""
    context = mp.get_context("spawn")
    processes = []
    try:
        for rank in range(nprocs):
            process = context.Process(target=fn, args=(rank, *args), name=f"rank{rank}")
            process.start()
            processes.append(process)
        deadline, failed_at = time.monotonic() + RANK_TIMEOUT, None
        while any(p.is_alive() for p in processes):
            now = time.monotonic()
            if failed_at is None and any(p.exitcode not in (None, 0) for p in processes):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + _GRACE):
                break
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join(10)
    codes = {p.name: p.exitcode for p in processes}
    if any(code != 0 for code in codes.values()):
        raise RuntimeError(f"rank processes did not all exit 0: {codes} (a negative code is a signal; "
                           f"-15: stopped after {RANK_TIMEOUT:.0f} s or after another rank failed)")


def _run_rank(rank, func, func_args, func_kwargs, world_size, store_host, store_port, results_dir):
    error = None
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=store_host,
                      MASTER_PORT=str(store_port))
    try:
        _set_rank_device(rank)
        store = dist.TCPStore(store_host, store_port, world_size=None, is_master=False)
        dist.init_process_group(backend=_get_distributed_backend(), store=store, rank=rank, world_size=world_size)
        func(rank, *func_args, **func_kwargs)
    except BaseException as e:  # noqa: BLE001 (reported to the parent)
        error = f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    with open(os.path.join(results_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"error": error}, f)
    finish()  # destroys the process group and ends the rank before interpreter teardown (pytorch/pytorch#190489)


def run_distributed(world_size: int = 2):
    """``run_distributed(world_size=2)(impl)(*args)`` runs ``impl(rank, *args)`` on every rank, each with the
    process group of its device's backend; the first rank's error fails the caller."""

    def decorator(func):
        def wrapper(*args, **kwargs):
            store = dist.TCPStore("localhost", 0, world_size=None, is_master=True, wait_for_workers=False)
            with tempfile.TemporaryDirectory() as results_dir:
                _start_rank_processes(_run_rank, args=(func, args, kwargs, world_size, store.host, store.port,
                                                       results_dir), nprocs=world_size)
                errors = []
                for rank in range(world_size):
                    with open(os.path.join(results_dir, f"rank{rank}.json"), encoding="utf-8") as f:
                        if (error := json.load(f)["error"]) is not None:
                            errors.append(error)
            del store
            if errors:
                raise AssertionError("\n".join(errors))

        return wrapper

    return decorator
