"""Transformers' own device-agnostic distributed suite, ``tests/test_fsdp_mixin.py`` and
``tests/test_tensor_parallel_mixin.py`` from the sdist of the installed Transformers, for a tiny Qwen3: once on the
STAND-IN neuron device (``TRANSFORMERS_TEST_DEVICE=neuron`` and a device spec file), once on CPU gloo, with the same
process counts; it prints passed/failed/skipped for each and fails if a test passes on CPU but not on the stand-in.

Opt-in, ``TRNLAB_TRANSFORMERS_SUITE=1``: about 8 minutes on 2 cores. Also a script: ``python
tests/test_transformers_suite.py``. No Transformers code is committed here: the sdist is fetched with ``pip download``
into ``~/.cache/trnlab/transformers-suite/<version>/`` (the test skips, saying why, when it cannot be), and the
helpers it lacks (``distributed_testing_utils``, a Qwen3 tester) are trnlab's own, in ``tests/transformers_suite/``.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SUITE_ENV = "TRNLAB_TRANSFORMERS_SUITE"
REPO = Path(__file__).resolve().parents[1]
OWN = Path(__file__).with_name("transformers_suite")
MIXINS = ("test_fsdp_mixin.py", "test_tensor_parallel_mixin.py")
RUN_TIMEOUT = 3600  # seconds per device

pytestmark = pytest.mark.skipif(os.environ.get(SUITE_ENV) != "1",
                                reason=f"Transformers' distributed suite takes minutes: {SUITE_ENV}=1 runs it")


class Unavailable(Exception):
    """The suite cannot be set up here; the message says why."""


def _pip(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise Unavailable(f"pip {args[0]} took over {timeout:.0f} s (no package index here?)") from error


def _check_standin() -> None:
    """The stand-in starts in a fresh Python (built on first use), or the suite cannot run on it."""
    env = {**os.environ, "TRNLAB_NEURON_STANDIN": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    probe = subprocess.run([sys.executable, "-c", "import torch; assert torch.neuron.standin"], env=env,
                           capture_output=True, text=True, timeout=900)
    if probe.returncode:
        raise Unavailable(f"the STAND-IN neuron device does not start here: {probe.stderr.strip()[-500:]}")


def prepare(base: Path | None = None) -> Path:
    """The folder the suite runs in: the sdist's two mixins beside trnlab's helpers, as a package ``hfsuite``."""
    import transformers

    version = transformers.__version__
    base = base or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trnlab" / "transformers-suite"
    cache = base / version
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"transformers-{version}.tar.gz"
    if not sdist.exists():
        got = _pip("download", "--no-deps", "--no-binary", ":all:", f"transformers=={version}", "-d", str(cache))
        if got.returncode or not sdist.exists():
            raise Unavailable(f"pip download of the transformers {version} sdist failed (no package index here?): "
                              f"{(got.stderr or got.stdout).strip().splitlines()[-1:]}")
    site = cache / "site"
    if importlib.util.find_spec("parameterized") is None and not (site / "parameterized").exists():
        got = _pip("install", "--quiet", "--target", str(site), "parameterized")
        if got.returncode:
            raise Unavailable(f"the mixins import parameterized, and pip could not install it: {got.stderr.strip()}")
    run_dir = cache / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    package = run_dir / "hfsuite"
    package.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        for name in MIXINS:
            try:
                member = archive.extractfile(f"transformers-{version}/tests/{name}")
            except KeyError:
                member = None
            if member is None:
                raise Unavailable(f"the transformers {version} sdist has no tests/{name}")
            (package / name).write_bytes(member.read())
    (package / "__init__.py").write_text("")
    shutil.copy(OWN / "distributed_testing_utils.py", package)
    shutil.copy(OWN / "qwen3_suite.py", package / "test_qwen3_suite.py")
    shutil.copy(OWN / "neuron_device_spec.py", run_dir)
    (run_dir / "pytest.ini").write_text("[pytest]\nmarkers =\n    is_fsdp_test\n    is_tensor_parallel_test\n")
    return run_dir


def run_suite(run_dir: Path, device: str, device_count: int) -> dict:
    """Run the suite on ``device`` (``neuron``: the stand-in; ``cpu``: gloo); each test's outcome and the seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRANSFORMERS_TEST_"))}
    site = run_dir.parent / "site"
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(site), env.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", TRNLAB_SUITE_DEVICE_COUNT=str(device_count), TRANSFORMERS_TEST_DEVICE=device)
    if device == "neuron":
        env.update(TRNLAB_NEURON_STANDIN="1", TRANSFORMERS_TEST_DEVICE_SPEC="neuron_device_spec.py")
    else:
        env["TRNLAB_NEURON_STANDIN"] = "0"
    report = run_dir / f"{device}.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={report}",
               "hfsuite/test_qwen3_suite.py"]
    start = time.monotonic()
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    seconds = time.monotonic() - start
    (run_dir / f"{device}.log").write_text(done.stdout + done.stderr)
    if not report.exists():
        raise AssertionError(f"the {device} run wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}"
                             f"{done.stderr[-3000:]}")
    outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        name = case.get("name")
        kind = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if kind is None:
            outcomes[name] = ("passed", "")
        else:
            message = (kind.get("message") or "").strip().splitlines()
            outcomes[name] = ("skipped" if kind.tag == "skipped" else "failed", message[0][:160] if message else "")
    return {"outcomes": outcomes, "seconds": seconds, "log": run_dir / f"{device}.log"}


def counts(outcomes: dict) -> dict:
    return dict(collections.Counter(state for state, _ in outcomes.values()))


def summary(results: dict) -> str:
    lines = [f"{device}: {counts(result['outcomes'])} in {result['seconds']:.0f} s (log: {result['log']})"
             for device, result in results.items()]
    lines.append(f"  {'test':70} {' '.join(f'{device:8}' for device in results)}")
    names = sorted(set().union(*(r["outcomes"] for r in results.values())))
    for name in names:
        row = [results[d]["outcomes"].get(name, ("-", ""))[0] for d in results]
        reasons = {results[d]["outcomes"].get(name, ("", ""))[1] for d in results} - {""}
        lines.append(f"  {name:70} {' '.join(f'{s:8}' for s in row)} {' | '.join(sorted(reasons))[:200]}")
    return "\n".join(lines)


def run_both() -> dict:
    _check_standin()
    run_dir = prepare()
    # The CPU run can start os.cpu_count() ranks (the mixins' own rule), the stand-in 4 (a trn2.3xlarge): both get
    # the smaller, so that the same tests start the same number of processes on each. TRNLAB_SUITE_DEVICE_COUNT=4
    # lets the stand-in run the 4-rank tests on a 2-core machine (CPU gloo then skips them).
    device_count = int(os.environ.get("TRNLAB_SUITE_DEVICE_COUNT") or min(4, os.cpu_count() or 1))
    return {device: run_suite(run_dir, device, device_count) for device in ("neuron", "cpu")}


def test_transformers_distributed_suite_on_the_standin_as_on_cpu():
    try:
        results = run_both()
    except Unavailable as error:
        pytest.skip(str(error))
    print(summary(results))
    neuron, cpu = (results[d]["outcomes"] for d in ("neuron", "cpu"))
    worse = {name: neuron.get(name) for name, (state, _) in cpu.items() if state == "passed"
             and neuron.get(name, ("missing",))[0] != "passed"}
    assert not worse, f"passed on CPU gloo, not on the STAND-IN neuron device: {worse}\n{summary(results)}"
    assert set(neuron) == set(cpu)


if __name__ == "__main__":
    try:
        print(summary(run_both()))
    except Unavailable as error:
        sys.exit(f"skipped: {error}")
