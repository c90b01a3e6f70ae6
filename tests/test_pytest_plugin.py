"""trnlab.pytest_plugin: the course's nbval rules, run on notebooks outside the repository.

The notebooks here are written for each test, following nbval's own conventions (its comment
markers, its cell tags, ``--nbval`` and ``--nbval-lax``); each session is a learner's command
line, run by ``pytest.main`` in this process (no new interpreter to start), in a folder outside
this repository, as a learner's CI would.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.metadata
import io
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbclient import NotebookClient

import trnlab
from trnlab.pytest_plugin import (_BUNDLED_MODEL_DIR, _cell_options as cell_options,
                                  _other_model as other_model, _parse_notebook_env as parse_notebook_env,
                                  _run_label as run_label, notebook_problems, sanitize)
from trnlab.run_record import _record as make_record, describe_run, record_run, stored_run
from trnlab.settings import _environment

REPO = Path(__file__).resolve().parent.parent

# Each run prints a new temporary path, a new address, a new timing, a new run id (masked by the
# learner's own --nbval-sanitize-with file) and writes to stderr: all must compare equal. Nothing
# here needs torch, so its kernel does not import it.
CHANGING_CELL = """# NBVAL_CHECK_OUTPUT
import random, sys, tempfile, time
start = time.perf_counter()
print("scratch folder:", tempfile.mkdtemp(prefix="learner-"))
print(f"an object: {object()}, took {time.perf_counter() - start + 0.5:.3f} s")
print("run id", random.randrange(10**6))
print("warning: something noisy", file=sys.stderr, flush=True)
print("stable line", 6 * 7)"""

LEARNER_PATTERNS = "regex: run id \\d+\nreplace: run id <ID>\n"


def _notebook(path: Path, sources: list[str]) -> Path:
    """A notebook of ``sources``, executed in a real kernel and stored with its outputs."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return path


def _pytest(folder: Path, *args: str, mode: str = "--nbval-lax", plugin: bool = True, env=None, rules: bool = True):
    """One pytest session on ``folder`` (a folder or a notebook), run from there: its returncode, stdout, stderr."""
    plugin_args = ["-p", "trnlab.pytest_plugin", *(["--trnlab-rules"] if rules else [])]
    command = [*(plugin_args if plugin else ["--nbval-current-env"]), mode, "-p", "no:cacheprovider", "-q",
               "--nbval-cell-timeout", "300", *args, str(folder),
               "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # nbval and the plugin: imported here already
    paths = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # for kernels and xdist workers
    stdout, stderr = io.StringIO(), io.StringIO()
    cwd = folder if folder.is_dir() else folder.parent
    faulthandler_on = faulthandler.is_enabled()  # a session ended by a usage error leaves it off: put it back
    with _environment(**{**(env or {}), "PYTHONPATH": paths}), contextlib.chdir(cwd), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        returncode = int(pytest.main(command))
    if faulthandler_on and not faulthandler.is_enabled():
        faulthandler.enable(sys.__stderr__)
    return SimpleNamespace(returncode=returncode, stdout=stdout.getvalue(), stderr=stderr.getvalue())


@pytest.fixture(scope="module")
def learner_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner-repo")  # outside this repository, like a learner's
    _notebook(folder / "good.ipynb", [CHANGING_CELL])
    # One line each, stored as a run stores it (like the conventions notebooks below: no kernel needed).
    # flag.ipynb is stored without LEARNER_FLAG: the runs with --notebook-env LEARNER_FLAG=... must differ.
    flag = '# NBVAL_CHECK_OUTPUT\nimport os\nprint("flag:", os.environ.get("LEARNER_FLAG", "unset"))'
    _write(folder / "flag.ipynb", [_cell(flag, 1, [_stdout("flag: unset\n")])])
    run_id = '# NBVAL_CHECK_OUTPUT\nimport random\nprint("run id", random.randrange(10**6))'
    _write(folder / "run_id.ipynb", [_cell(run_id, 1, [_stdout("run id 271828\n")])])
    (folder / "patterns.cfg").write_text(LEARNER_PATTERNS)
    return folder


def test_a_learners_notebook_passes_with_paths_stderr_timings_and_addresses_changing(learner_folder):
    """One session: both notebooks as stored, and in two more runs (--notebook-env twice, a comma in a value)."""
    stored = nbformat.read(learner_folder / "good.ipynb", as_version=4).cells[0].outputs
    assert any(o.get("name") == "stderr" for o in stored), stored
    assert "/learner-" in next(o["text"] for o in stored if o.get("name") == "stdout"), stored
    assert "LEARNER_FLAG" not in os.environ
    done = _pytest(learner_folder / "good.ipynb", "-rA", "--nbval-sanitize-with", "patterns.cfg",
                   "--notebook-env", "LEARNER_FLAG=0,1", "--notebook-env", "LEARNER_FLAG=on OTHER=x",
                   str(learner_folder / "flag.ipynb"))
    out = done.stdout
    assert "PASSED good.ipynb::Cell 0" in out and "PASSED good.ipynb::trnlab rules" in out, out
    assert "PASSED flag.ipynb::Cell 0" in out, out
    # Each variable reached its own run's kernel, the comma inside the value:
    assert "FAILED flag.ipynb[LEARNER_FLAG=0,1]::Cell 0" in out and "flag: 0,1" in out, out
    assert "FAILED flag.ipynb[LEARNER_FLAG=on OTHER=x]::Cell 0" in out and "flag: on" in out, out
    # good.ipynb never names LEARNER_FLAG: its other runs would repeat the first, so they are skipped.
    assert "SKIPPED [1] good.ipynb: good.ipynb never reads LEARNER_FLAG: run once more" in out, out
    assert "SKIPPED [1] good.ipynb: good.ipynb never reads LEARNER_FLAG, OTHER: run once more" in out, out
    assert "2 failed, 4 passed, 2 skipped" in out, out  # rules x2, good, flag as stored; the reruns are not ruled


def test_without_the_learners_patterns_or_the_course_patterns_the_same_notebook_fails(learner_folder):
    no_plugin = _pytest(learner_folder / "good.ipynb", "--nbval-sanitize-with", "patterns.cfg", plugin=False)
    assert no_plugin.returncode == 1 and "1 failed" in no_plugin.stdout, no_plugin.stdout
    # --trnlab-no-sanitize: the course's patterns are off, the learner's own still apply.
    no_course = _pytest(learner_folder / "good.ipynb", "-rA", "--nbval-sanitize-with", "patterns.cfg",
                        "--trnlab-no-sanitize", str(learner_folder / "run_id.ipynb"))
    assert "FAILED good.ipynb::Cell 0" in no_course.stdout and "PASSED run_id.ipynb::Cell 0" in no_course.stdout
    assert no_course.returncode == 1 and "1 failed, 3 passed" in no_course.stdout, no_course.stdout
    no_learner = _pytest(learner_folder / "run_id.ipynb")
    assert no_learner.returncode == 1 and "1 failed, 1 passed" in no_learner.stdout, no_learner.stdout


# --- nbval's conventions ----------------------------------------------------------------------

def _cell(source, count=None, outputs=(), tags=()):
    cell = nbformat.v4.new_code_cell(source, execution_count=count, outputs=list(outputs))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _stdout(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _error(ename, evalue):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _write(path: Path, cells) -> Path:
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)
    return path


def conventions_notebook(path: Path) -> Path:
    """Every nbval convention the plugin must respect, stored as Jupyter would store it.

    Passes plain nbval under --nbval (every cell compared) and --nbval-lax (only the tagged
    cell compared): skipped cells never executed, expected errors stored, an ignored random
    output, an unexecuted cell (nbval's implicit skip of the output check).
    """
    return _write(path, [
        _cell("# NBVAL_SKIP\nraise RuntimeError('skipped cells never run')"),
        _cell("raise RuntimeError('nor do tagged ones')", tags=["nbval-skip"]),
        _cell("answer = 6 * 7\nprint(answer)", 1, [_stdout("42\n")], tags=["nbval-check-output"]),
        _cell("# NBVAL_RAISES_EXCEPTION\n1 / 0", 2, [_error("ZeroDivisionError", "division by zero")]),
        _cell("int('x')", 3, [_error("ValueError", "invalid literal for int() with base 10: 'x'")],
              tags=["raises-exception"]),
        _cell("# NBVAL_IGNORE_OUTPUT\nimport random\nprint(random.random())", 4, [_stdout("0.123\n")]),
        _cell("print('an unexecuted cell is not compared')"),
        _cell("print(answer + 1)", 5, [_stdout("43\n")], tags=["nbval-ignore-output"]),
    ])


def test_cell_options_read_markers_and_tags_as_nbval_does():
    assert cell_options(_cell("# NBVAL_SKIP\nx"))["skip"] and cell_options(_cell("x", tags=["nbval-skip"]))["skip"]
    assert cell_options(_cell("  #  NBVAL_RAISES_EXCEPTION\n1/0"))["check_exception"]
    assert cell_options(_cell("1/0", tags=["raises-exception"]))["check_exception"]
    assert cell_options(_cell("x", tags=["nbval-check-output"]))["check"]
    assert not cell_options(_cell("print('# NBVAL_CHECK_OUTPUT is not a comment here')"))["check"]
    assert cell_options(_cell("x"), strict=True)["check"]  # --nbval compares every cell...
    assert not cell_options(_cell("# NBVAL_IGNORE_OUTPUT\nx"), strict=True)["check"]  # ...but the ignored
    assert not cell_options(_cell("x", tags=["nbval-ignore-output"]), strict=True)["check"]


def test_the_rules_respect_nbvals_conventions_in_both_modes(tmp_path):
    path = conventions_notebook(tmp_path / "conventions.ipynb")
    assert notebook_problems(path) == [] and notebook_problems(path, strict=True) == []
    # Strict mode compares unmarked cells: no marker needed there.
    strict_only = _write(tmp_path / "strict.ipynb", [_cell("print(1)", 1, [_stdout("1\n")])])
    assert notebook_problems(strict_only, strict=True) == []
    assert "no executed cell is marked '# NBVAL_CHECK_OUTPUT'" in notebook_problems(strict_only)[0]
    # The course's own notebooks also ask every cell to be executed.
    assert "1 code cell(s) never executed (the first is Cell 6)" in notebook_problems(path, require_all_executed=True)[0]


def test_broken_notebooks_fail_with_a_message_that_says_which_rule(tmp_path):
    cases = {
        "marked_unexecuted": ([_cell("# NBVAL_CHECK_OUTPUT\nprint(1)")],
                              "1 cell(s) marked for checking never executed (the first is Cell 0)"),
        "tagged_unexecuted": ([_cell("print(2)", 1, [_stdout("2\n")], tags=["nbval-check-output"]),
                               _cell("print(1)", tags=["nbval-check-output"])], "the first is Cell 1"),
        "unchecked": ([_cell("print(1)", 1, [_stdout("1\n")])], "no executed cell is marked '# NBVAL_CHECK_OUTPUT'"),
        "error": ([_cell("# NBVAL_CHECK_OUTPUT\n1/0", 1, [_error("ZeroDivisionError", "x")])],
                  "Cell 0 holds an error output (ZeroDivisionError)"),
        "out_of_order": ([_cell("# NBVAL_CHECK_OUTPUT\nprint(1)", 2, [_stdout("1\n")]),
                          _cell("print(2)", 1, [_stdout("2\n")])], "executed out of order"),
        "all_ignored": ([_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)", 1, [_stdout("1\n")])], "compares nothing"),
    }
    for name, (cells, message) in cases.items():
        problems = notebook_problems(_write(tmp_path / f"{name}.ipynb", cells), strict=name == "all_ignored")
        assert problems and message in problems[0], (name, problems)


@pytest.fixture(scope="module")
def nbval_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nbval-conventions")
    conventions_notebook(folder / "conventions.ipynb")
    # A real break of a rule that nbval does not check: a check that can never fail, cells out of order.
    _write(folder / "broken.ipynb", [_cell("print(2)", 2, [_stdout("2\n")], tags=["nbval-check-output"]),
                                     _cell("print(1)", 1, [_stdout("1\n")]),
                                     _cell("# NBVAL_CHECK_OUTPUT\nprint(3)")])
    return folder


@pytest.mark.parametrize("mode", ["--nbval", "--nbval-lax"])
def test_a_notebook_nbval_accepts_passes_with_the_plugin_and_a_real_break_still_fails(nbval_folder, mode):
    # Plain nbval accepts both: broken.ipynb breaks only the course's own rules (conventions: 6 passed, 2 skipped).
    plain = _pytest(nbval_folder, "-rA", mode=mode, plugin=False)
    assert plain.returncode == 0 and "9 passed, 2 skipped" in plain.stdout, plain.stdout
    assert plain.stdout.count("PASSED conventions.ipynb::Cell") == 6, plain.stdout
    done = _pytest(nbval_folder, "-rA", mode=mode)
    out = done.stdout
    assert "PASSED conventions.ipynb::trnlab rules" in out and "FAILED broken.ipynb::trnlab rules" in out, out
    assert "1 cell(s) marked for checking never executed (the first is Cell 2)" in out, out
    assert "cells were executed out of order" in out, out
    assert "1 failed, 10 passed, 2 skipped" in out, out  # conventions: 6 cells + rules; broken: 3 cells
    assert "FAILED conventions.ipynb::Cell" not in out and "FAILED broken.ipynb::Cell" not in out, out


@pytest.mark.parametrize("mode", ["--nbval", "--nbval-lax"])
def test_without_trnlab_rules_the_plugin_fails_nothing_that_nbval_accepts(nbval_folder, mode):
    # broken.ipynb breaks only the course's own rules: nbval accepts it (the test above), so must the plugin by default:
    # the rules items are opt-in (--trnlab-rules).
    done = _pytest(nbval_folder, "-rA", mode=mode, rules=False)
    assert done.returncode == 0 and "trnlab rules" not in done.stdout, done.stdout
    assert "PASSED broken.ipynb::Cell 0" in done.stdout, done.stdout
    assert "FAILED" not in done.stdout and "9 passed, 2 skipped" in done.stdout, done.stdout

# --- --notebook-env --------------------------------------------------------------------------

def test_notebook_env_grammar():
    assert parse_notebook_env("TRNLAB_DTYPE=bfloat16") == {"TRNLAB_DTYPE": "bfloat16"}
    assert parse_notebook_env("NEURON_RT_VISIBLE_CORES=0,1") == {"NEURON_RT_VISIBLE_CORES": "0,1"}
    assert parse_notebook_env("TRNLAB_DTYPE=bfloat16 NEURON_RT_VISIBLE_CORES=0-1,3 A=") == {
        "TRNLAB_DTYPE": "bfloat16", "NEURON_RT_VISIBLE_CORES": "0-1,3", "A": ""}
    assert parse_notebook_env("A=1,B=2") == {"A": "1", "B": "2"}  # trnlab 0.1's comma form
    assert parse_notebook_env("MSG='a b' X=y=z") == {"MSG": "a b", "X": "y=z"}
    assert run_label({"A": "1", "B": "0,1"}) == "A=1 B=0,1"
    for bad, message in [("bfloat16", "'bfloat16' is not NAME=VALUE"), ("", "names no variable"),
                         ("1A=x", "'1A=x' is not NAME=VALUE"), ("A=1 A=2", "sets A twice"),
                         ("A='x", "No closing quotation"), ("=2", "'=2' is not NAME=VALUE")]:
        with pytest.raises(pytest.UsageError, match=message) as info:
            parse_notebook_env(bad)
        assert "write NAME=VALUE" in str(info.value) or "twice" in message


def test_a_bad_notebook_env_is_a_usage_error_not_a_traceback(learner_folder):
    for args, message in [(["--notebook-env", "bfloat16"], "ERROR: --notebook-env 'bfloat16': 'bfloat16' is not NAME=VALUE"),
                          (["--notebook-env", "A=1", "--notebook-env", "A=1"], "asks for the same run twice")]:
        done = _pytest(learner_folder / "flag.ipynb", *args)
        assert done.returncode == 4, (done.stdout, done.stderr)  # pytest's usage-error exit status
        assert message in done.stderr and "Traceback" not in done.stdout + done.stderr, done.stderr
    done = _pytest(learner_folder / "flag.ipynb", "--notebook-env", "A=1", mode="--co")
    assert done.returncode == 4 and "add --nbval-lax" in done.stderr, done.stderr


# --- sanitizing ------------------------------------------------------------------------------

#: Outputs that differ in one real value: sanitizing must keep them different.
NEAR_MISSES = [
    ("timeout set to 30 s", "timeout set to 300 s"),
    ("every 5 seconds", "every 50 seconds"),
    ("the 1990s", "the 1980s"),
    ("saved /ckpt/run1/epoch_3.pt", "saved /ckpt/run1/epoch_7.pt"),
    ("read tests/data/case_1.json", "read tests/data/case_2.json"),
    ("mounted /dev/sda1", "mounted /dev/sdb1"),
    ("https://huggingface.co/Qwen/Qwen3-0.6B", "https://huggingface.co/Qwen/Qwen3-1.7B"),
    ("crc32 0x3610a686", "crc32 0xdeadbeef"),
    ("flags 0xa", "flags 0xb"),
    ("a 0x7f00 pointer", "a 0x7f01 pointer"),  # not in a repr
    ("loss 7.6819, 42 graphs", "loss 7.6820, 42 graphs"),
    ("vocabulary 761", "vocabulary 768"),
    ("1.5 seconds", "2.5 seconds"),
    ("tp=2 x fsdp=2 on 4 devices", "tp=4 x fsdp=1 on 4 devices"),
    ("devices: ['cpu']", "devices: ['cuda']"),
    ("torch 2 GPUs", "torch 4 GPUs"),
    ("<tmp>/ckpt/epoch_3.pt", "<tmp>/ckpt/epoch_7.pt"),
    (f"{tempfile.gettempdir()}/checkpoint_3", f"{tempfile.gettempdir()}/checkpoint_7"),
    (f"{REPO}/notebooks/01.ipynb", f"{REPO}/notebooks/02.ipynb"),
    ("<function f at 0x7f3a>", "<function g at 0x7f3a>"),
    # Trainer's output: its speed metrics differ too, but the loss, the flops, the learning rate differ as well
    ("{'train_runtime': '1.282', 'train_samples_per_second': '12.4', 'train_loss': '2.345', 'epoch': '1'}",
     "{'train_runtime': '3.907', 'train_samples_per_second': '4.09', 'train_loss': '2.346', 'epoch': '1'}"),
    ("TrainOutput(global_step=2, training_loss=8.493422508239746, metrics={'train_runtime': 0.2143, "
     "'train_steps_per_second': 9.334, 'total_flos': 1247330304.0})",
     "TrainOutput(global_step=2, training_loss=8.493422508239747, metrics={'train_runtime': 0.0905, "
     "'train_steps_per_second': 22.1, 'total_flos': 1247330304.0})"),
    ("'train_runtime': 0.2, 'total_flos': 1247330304.0", "'train_runtime': 0.3, 'total_flos': 2494660608.0"),
    ("{'loss': '8.899', 'grad_norm': '61.61', 'learning_rate': '5e-05'}",
     "{'loss': '8.899', 'grad_norm': '61.61', 'learning_rate': '5e-04'}"),
    ("  train_loss               =     8.4934\n  train_runtime            = 0:00:00.21",
     "  train_loss               =     8.4935\n  train_runtime            = 0:00:01.07"),
    ("{'max_runtime': 30.0, 'samples_per_second': 4.0}", "{'max_runtime': 300.0, 'samples_per_second': 40.0}"),
    ("'train_runtime_limit': '30'", "'train_runtime_limit': '300'"),
    # trnlab.run_summary(): the graph count is compared; other words with whole seconds are too
    ("this notebook compiled 14 graph(s) in 28 s on cpu", "this notebook compiled 15 graph(s) in 31 s on cpu"),
    ("the job compiled 2 graph(s) in 30 s on cpu", "the job compiled 2 graph(s) in 300 s on cpu"),
]

#: Outputs that differ only by machine, run or backend: they must compare equal.
SAME = [
    ("<object object at 0x7f3a9c0b1e40>", "<object object at 0x55d0c2a1b3f0>"),
    ("<torch.utils.data.dataloader.DataLoader object at 0x7f3a>", "<torch.utils.data.dataloader.DataLoader object at 0x1b>"),
    # notebook 03's timing table, as the course prints it
    ("plain                  first call   0.31 s (compiling  0.00 s), then 0.288 s per call =  138.8 tokens/s",
     "plain                  first call   3.40 s (compiling  2.42 s), then 0.205 s per call =  195.4 tokens/s"),
    ("8 graph(s) compiled, 16.51 s compiling; first call 4.055 s, steady state 0.056 s (median of 7)",
     "8 graph(s) compiled, 1.20 s compiling; first call 0.981 s, steady state 0.011 s (median of 7)"),
    ("the run finished (exit status 0) in 26.8 s", "the run finished (exit status 0) in 112.3 s"),
    ("took 120.0 µs, then 3.5 ms", "took 95.0 µs, then 2.9 ms"),
    ("35 tokens/s", "350 tokens/s"),
    # notebook 04's table and the device reports
    ("device:                cpu", "device:                neuron:0"),
    ("device: cpu", "device: cuda:1"),
    ("pipeline(device='cpu')", "pipeline(device='neuron')"),
    ("tensor([1], device='cuda:0')", "tensor([1], device='neuron:0')"),
    ("device(type='cpu')", "device(type='neuron', index=0)"),
    ("torch 2.13.0+cpu, transformers 5.24.0", "torch 2.14.1, transformers 5.30.0.dev0"),
    ("python 3.11.5, torch-neuronx 2.9.0.2.11", "python 3.12.1, torch-neuronx 2.10.0.2.12"),
    ("transformers==5.24.0", "transformers==5.25.1"),
    # notebook 05's stored paths (tools/normalize_notebooks.py) against a fresh run's
    ("Writing <tmp>/trnlab-05-3_ljaqh4/train_sharded.py", f"Writing {tempfile.gettempdir()}/trnlab-05-ab1_x9zz/train_sharded.py"),
    ("scratch <tmp>/tmpk3j_x9a2", f"scratch {tempfile.gettempdir()}/tmp0a1b2c3d"),
    ("model trnlab/assets/tiny-qwen3", f"model {REPO}/trnlab/assets/tiny-qwen3"),
    ("cache ~/.cache/huggingface", f"cache {os.path.expanduser('~')}/.cache/huggingface"),
    ("(<site-packages>/transformers/utils/deprecation.py:121)",
     f"({REPO}/.venv/lib/python3.11/site-packages/transformers/utils/deprecation.py:121)"),
    # Trainer's speed metrics as transformers 5.24 prints them: PrinterCallback, TrainOutput, evaluate(), log_metrics
    ("{'train_runtime': '0.2143', 'train_samples_per_second': '37.34', 'train_steps_per_second': '9.334', "
     "'train_loss': '8.493', 'epoch': '1'}",
     "{'train_runtime': '1.282e+04', 'train_samples_per_second': '0.0006', 'train_steps_per_second': '3.1', "
     "'train_loss': '8.493', 'epoch': '1'}"),
    ("TrainOutput(global_step=2, training_loss=8.49, metrics={'train_runtime': 0.2143, 'train_samples_per_second': "
     "37.337, 'train_steps_per_second': 9.334, 'total_flos': 1247330304.0, 'train_loss': 8.49, 'epoch': 1.0})",
     "TrainOutput(global_step=2, training_loss=8.49, metrics={'train_runtime': 12.5, 'train_samples_per_second': "
     "0.64, 'train_steps_per_second': 0.16, 'total_flos': 1247330304.0, 'train_loss': 8.49, 'epoch': 1.0})"),
    ("{'eval_loss': 8.1,\n 'eval_runtime': 0.0512,\n 'eval_samples_per_second': 156.25,\n 'eval_wiki_steps_per_second': 39.06}",
     "{'eval_loss': 8.1,\n 'eval_runtime': 3.1,\n 'eval_samples_per_second': 2.581,\n 'eval_wiki_steps_per_second': 1e-05}"),
    ('{"train_runtime": 1.28, "train_tokens_per_second": 1234.5}', '{"train_runtime": 9.0, "train_tokens_per_second": 98.1}'),
    ("  train_loss               =     8.4934\n  train_runtime            = 0:00:00.21\n"
     "  train_samples_per_second =     37.337",
     "  train_loss               =     8.4934\n  train_runtime            = 1 day, 0:00:04.07\n"
     "  train_samples_per_second =      0.001"),
    # trnlab.run_summary()'s whole seconds
    ("this notebook compiled 14 graph(s) in 9 s on cpu", "this notebook compiled 14 graph(s) in 312 s on cpu"),
]


@pytest.mark.parametrize("stored, fresh", NEAR_MISSES)
def test_sanitizing_keeps_a_real_difference(stored, fresh):
    assert sanitize(stored, REPO) != sanitize(fresh, REPO)


@pytest.mark.parametrize("stored, fresh", SAME)
def test_sanitizing_equates_what_the_readme_lists(stored, fresh):
    assert sanitize(stored, REPO) == sanitize(fresh, REPO)


def test_sanitize_masks_each_value_in_its_context():
    assert sanitize("device: neuron:0") == sanitize("device: cpu") == "device: <DEVICE>"
    assert sanitize("torch 2.13.0+cpu, transformers 5.24.0") == "torch <VERSION>, transformers <VERSION>"
    assert sanitize("<Foo at 0x7f3a> took 12.5 s, 3.0 tok/s") == "<Foo at <ADDR>> took <TIME>, <RATE>"
    assert sanitize("timeout 30 s, crc 0x7f3a, /home/me/x/y") == "timeout 30 s, crc 0x7f3a, /home/me/x/y"
    assert sanitize("{'train_runtime': '1.282', 'train_steps_per_second': '3.1', 'train_loss': '2.345'}") == \
        "{'train_runtime': <TIME>, 'train_steps_per_second': <RATE>, 'train_loss': '2.345'}"


def test_run_summarys_own_seconds_are_masked_and_its_graph_count_is_not(monkeypatch):
    from trnlab import device
    from trnlab._compat import dynamo_unique_graphs as graphs_compiled

    summaries, now = {}, time.perf_counter()
    monkeypatch.setattr(time, "perf_counter", lambda: now)  # the clock run_summary() reads
    for graphs, seconds in [(0, 9.4), (0, 312.2), (3, 9.4)]:
        monkeypatch.setattr(device, "_run", {"start": now - seconds, "device": "cpu",
                                             "graphs": graphs_compiled() - graphs, "neffs": 0})
        summaries[graphs, seconds] = device.run_summary()
    assert summaries[0, 9.4].startswith("this notebook compiled 0 graph(s) in 9 s on cpu\n"), summaries
    assert summaries[0, 312.2].startswith("this notebook compiled 0 graph(s) in 312 s on cpu\n"), summaries
    assert sanitize(summaries[0, 9.4]) == sanitize(summaries[0, 312.2])
    assert sanitize(summaries[3, 9.4]) != sanitize(summaries[0, 9.4])


#: A learner's notebook that fine-tunes with Trainer (two steps of the bundled model on CPU), for
#: strict --nbval: disable_tqdm=True prints Trainer's logs; its default in Jupyter, an HTML progress
#: bar, cannot pass strict nbval (nbval compares the bar's first frame with the stored last one).
TRAINER_CELLS = [
    """import torch
import trnlab
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

device = trnlab.setup("cpu")
model = AutoModelForCausalLM.from_pretrained(trnlab.model_name())
rows = [{"input_ids": torch.arange(1 + i, 17 + i), "labels": torch.arange(1 + i, 17 + i)} for i in range(8)]""",
    """args = TrainingArguments(output_dir="out", max_steps=2, per_device_train_batch_size=4, logging_steps=1,
                         use_cpu=True, disable_tqdm=True, save_strategy="no", report_to="none", seed=0)
trainer = Trainer(model=model, args=args, train_dataset=rows)
trainer.train()""",
    "trainer.log_metrics('train', trainer.state.log_history[-1])\ntrainer.state.log_history",
    "print(trnlab.run_summary())",
]


def test_strict_nbval_passes_on_a_trainer_notebook_because_of_the_course_patterns(tmp_path):
    """A real Trainer run stored executed, then run under --nbval (every cell compared)."""
    path = _notebook(tmp_path / "trainer.ipynb", TRAINER_CELLS)
    nb = nbformat.read(path, as_version=4)
    logs, result = nb.cells[1].outputs[0]["text"], nb.cells[1].outputs[-1]["data"]["text/plain"]
    assert "'train_runtime': '" in logs and "'train_loss': '" in logs, logs  # PrinterCallback's quoted numbers
    assert result.startswith("TrainOutput(global_step=2, ") and "metrics={'train_runtime': " in result, result
    assert "  train_runtime            = 0:00:0" in nb.cells[2].outputs[0]["text"], nb.cells[2].outputs
    assert "'total_flos': " in nb.cells[2].outputs[-1]["data"]["text/plain"]  # deterministic: compared
    run = stored_run(path)  # trnlab.setup() recorded it with its outputs (a line that nbval, strict, never compares)
    assert (run["device"], run["standin"], run["dtype"]) == ("cpu", False, "float32"), run
    # Stored by a slower machine: run_summary's whole seconds must not match by chance.
    summary = nb.cells[3].outputs[0]
    summary["text"] = re.sub(r" in (\d+) s on ", lambda m: f" in {int(m[1]) + 60} s on ", summary["text"], count=1)
    nbformat.write(nb, path)
    # A real difference, in the same printout as the speed metrics: a cell prints this run's Trainer log, stored with
    # another loss (no second Trainer run: trainer.ipynb's fresh run is the one whose speed metrics must be masked).
    changed_logs = re.sub(r"'train_loss': '[\d.]+'", "'train_loss': '9.999'", logs)
    assert changed_logs != logs, logs
    _write(tmp_path / "changed_loss.ipynb", [_cell(f"print({logs!r}, end='')", 1, [_stdout(changed_logs)])])

    done = _pytest(tmp_path, "-rA", mode="--nbval")
    out = done.stdout
    assert all(f"PASSED trainer.ipynb::Cell {n}" in out for n in range(4)), out
    assert "FAILED changed_loss.ipynb::Cell 0" in out and "'9.999'" in out, out  # in nbval's diff
    assert "1 failed, 6 passed" in out, out  # trainer: 4 cells and the rules; changed_loss: the rules; one cell fails
    # Without the course's patterns it fails. The notebook writes nothing to stderr (the one thing the plugin skips
    # besides), so plain nbval (no plugin) compares exactly what this run compares: its run would repeat this one.
    assert not any(o.get("name") == "stderr" for cell in nb.cells for o in cell.outputs), \
        "trainer.ipynb writes to stderr now: add the plain nbval run back (_pytest(path, mode='--nbval', plugin=False))"
    no_course = _pytest(path, "-rA", "--trnlab-no-sanitize", mode="--nbval")
    assert "PASSED trainer.ipynb::Cell 0" in no_course.stdout, no_course.stdout
    assert all(f"FAILED trainer.ipynb::Cell {n}" in no_course.stdout for n in (1, 2, 3)), no_course.stdout
    assert no_course.returncode == 1 and "3 failed, 2 passed" in no_course.stdout, no_course.stdout  # and the rules


# --- bundled-model cells ---------------------------------------------------------------------

def test_other_model_reads_the_runs_model_as_the_kernel_would(tmp_path, monkeypatch):
    notebook = SimpleNamespace(path=tmp_path / "nb.ipynb", env={})
    monkeypatch.delenv("TRNLAB_MODEL", raising=False)
    assert other_model(notebook) is None and Path(trnlab.model_name()) == _BUNDLED_MODEL_DIR  # trnlab's own default
    monkeypatch.setenv("TRNLAB_MODEL", "Qwen/Qwen3-0.6B")
    assert other_model(notebook) == "Qwen/Qwen3-0.6B"
    notebook.env = {"TRNLAB_MODEL": str(_BUNDLED_MODEL_DIR)}  # the run's own setting wins
    assert other_model(notebook) is None
    notebook.env = {"TRNLAB_MODEL": os.path.relpath(_BUNDLED_MODEL_DIR, tmp_path)}  # from the notebook's folder
    assert other_model(notebook) is None
    notebook.env = {"TRNLAB_MODEL": ""}
    assert other_model(notebook) is None


#: (source, tags, stdout of the bundled model's run, as stored)
BUNDLE_CELLS = [
    ("import os\nMODEL = os.environ.get('TRNLAB_MODEL')", [], None),
    ("# NBVAL_CHECK_OUTPUT\nprint('greedy text of', 'another model' if MODEL else 'the bundled model')", ["bundled-model"],
     "greedy text of the bundled model\n"),
    ("print('vocabulary', 761 if not MODEL else 1000)", ["bundled-model", "nbval-check-output"], "vocabulary 761\n"),
    ("# NBVAL_CHECK_OUTPUT\nprint('model setting:', MODEL)", [], "model setting: None\n"),
    ("# NBVAL_CHECK_OUTPUT\nprint('bucketed == unbucketed:', True)", [], "bucketed == unbucketed: True\n"),
]


def test_bundled_model_cells_run_unchecked_with_another_model_and_the_report_says_so(tmp_path):
    """Under pytest-xdist too: the terminal summary counts from the workers' reports."""
    path = _write(tmp_path / "bundle.ipynb", [_cell(source, n, [_stdout(text)] if text else [], tags)
                                              for n, (source, tags, text) in enumerate(BUNDLE_CELLS, 1)])
    # This session's model is another one; its --notebook-env run names the bundled folder.
    done = _pytest(path, "-rA", "-n", "1", "--notebook-env", f"TRNLAB_MODEL={_BUNDLED_MODEL_DIR}",
                   env={"TRNLAB_MODEL": "/models/other-qwen3"})
    out = done.stdout
    bundled = f"bundle.ipynb[TRNLAB_MODEL={_BUNDLED_MODEL_DIR}]"
    # Another model: the two bundled-model cells run unchecked; the others are still compared.
    assert "PASSED bundle.ipynb::Cell 1" in out and "PASSED bundle.ipynb::Cell 2" in out, out
    assert "FAILED bundle.ipynb::Cell 3" in out and "PASSED bundle.ipynb::Cell 4" in out, out
    # The bundled model, named by its folder: every checked cell is compared.
    assert f"FAILED {bundled}::Cell 1" in out and f"FAILED {bundled}::Cell 2" in out, out
    assert f"FAILED {bundled}::Cell 3" in out and f"PASSED {bundled}::Cell 4" in out, out
    assert "trnlab: checked cells run unchecked" in out, out
    assert ("bundle.ipynb: 2 checked cell(s) tagged 'bundled-model' ran unchecked (TRNLAB_MODEL=/models/other-qwen3 "
            "is not the bundled model; their stored output is the bundled model's)") in out, out
    assert f"{bundled}: " not in out.split("checked cells run unchecked")[1], out
    assert "4 failed, 7 passed" in out, out



# --- device-dependent and dtype-dependent cells ----------------------------------------------

def _record_output(device, dtype, standin=False):
    """record_run's line as a kernel stores it (test_record_run_in_a_kernel checks the real one)."""
    record = {"device": device, "dtype": dtype, "standin": standin}
    return nbformat.v4.new_output("display_data", data={"text/plain": f"run record for nbval: {describe_run(record)}"},
                                  metadata={"trnlab": {"run": record}})


def test_record_run_outside_a_kernel_prints_its_line_and_names_the_stand_in(monkeypatch, capsys):
    import torch

    record = make_record("neuron:0", "torch.bfloat16", model="Qwen/Qwen3-0.6B")
    assert {k: record[k] for k in ("device", "dtype", "standin", "model")} == {
        "device": "neuron", "dtype": "bfloat16", "standin": False, "model": "Qwen/Qwen3-0.6B"}
    assert record["torch"] == importlib.metadata.version("torch") and "torch-neuronx" not in record
    assert record["trnlab"] == trnlab.__version__ and "transformers" in record
    assert record_run("neuron:0", "torch.bfloat16") is None  # a notebook's last line: nothing more to display
    monkeypatch.setattr(torch, "neuron", SimpleNamespace(standin=True), raising=False)
    assert make_record("neuron", torch.bfloat16)["standin"] is True
    assert make_record(torch.device("cpu"), torch.float32)["standin"] is False  # the stand-in is a neuron device
    record_run("neuron", torch.bfloat16)
    record_run(torch.device("cpu"), torch.float32)
    assert capsys.readouterr().out.splitlines() == ["run record for nbval: neuron, bfloat16",
                                                    "run record for nbval: neuron (STAND-IN), bfloat16",
                                                    "run record for nbval: cpu, float32"]


def test_setup_records_its_device_and_the_dtype_setting(monkeypatch, capsys):
    monkeypatch.setenv("TRNLAB_DTYPE", "bfloat16")
    monkeypatch.delenv("TRNLAB_MODEL", raising=False)
    trnlab.setup("cpu")
    monkeypatch.setenv("TRNLAB_DTYPE", "auto")
    trnlab.setup("cpu")
    trnlab.setup("cpu", dtype="float32")  # a notebook that computes in one dtype whatever the setting says
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("run record")] == [
        "run record for nbval: cpu, bfloat16", "run record for nbval: cpu, float32",
        "run record for nbval: cpu, float32"]
    assert lines[lines.index("device: cpu") + 1] == "run record for nbval: cpu, bfloat16"


def test_stored_run_reads_the_first_recorded_output_then_the_notebooks_metadata():
    declared = {"trnlab": {"run": {"device": "neuron:0", "dtype": "torch.bfloat16"}}}
    plain = nbformat.v4.new_notebook(cells=[_cell("x", 1, [_stdout("x\n")])])
    assert stored_run(plain) is None
    plain.metadata.update(declared)  # written by hand
    assert stored_run(plain) == {"device": "neuron", "dtype": "bfloat16", "standin": False}
    recorded = nbformat.v4.new_notebook(cells=[_cell("setup", 1, [_stdout("a\n"), _record_output("cpu", "float32")]),
                                               _cell("again", 2, [_record_output("cuda", "float32")])],
                                        metadata=declared)
    assert stored_run(recorded) == {"device": "cpu", "dtype": "float32", "standin": False}  # produced with the outputs
    assert stored_run(nbformat.v4.new_notebook(metadata={"trnlab": {"run": {"device": "cpu"}}})) is None  # no dtype


#: A notebook whose run reads its device and dtype from RUN_DEVICE and RUN_DTYPE (no torch: a quick kernel), stored
#: from cpu in float32; cells 3 and 4 are then stored with a near miss (what a real difference looks like).
DEPENDENT_CELLS = [
    ("import os\nfrom trnlab.run_record import record_run\n"
     "RUN = {'device': os.environ.get('RUN_DEVICE', 'cpu'), 'dtype': os.environ.get('RUN_DTYPE', 'float32')}\n"
     "record_run(RUN['device'], RUN['dtype'])", []),
    ("# NBVAL_CHECK_OUTPUT\nprint('loss', {'float32': 2.3456}.get(RUN['dtype'], 2.3438))", ["dtype-dependent"]),
    ("print('kernel', 'fused' if RUN['device'] == 'neuron' else 'plain')", ["device-dependent", "nbval-check-output"]),
    ("# NBVAL_CHECK_OUTPUT\nprint('vocabulary', 768)", []),  # stored: 761
    ("# NBVAL_CHECK_OUTPUT\nprint('loss 7.6820')", ["device-dependent"]),  # stored: 7.6819
    ("# NBVAL_CHECK_OUTPUT\nprint(RUN['device'], RUN['dtype'])", ["device-dependent", "dtype-dependent"]),
]


def test_dependent_cells_are_compared_only_in_a_run_that_matches_and_near_misses_fail(tmp_path):
    path = tmp_path / "dependent.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell(source, tags=tags) for source, tags in DEPENDENT_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    with _environment(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))):
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert [o["output_type"] for o in nb.cells[0].outputs] == ["display_data"], nb.cells[0].outputs  # record_run's line
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "run record for nbval: cpu, float32"
    nb.cells[3].outputs[0]["text"] = "vocabulary 761\n"
    nb.cells[4].outputs[0]["text"] = "loss 7.6819\n"
    nbformat.write(nb, path)
    stored = stored_run(path)
    assert {k: stored[k] for k in ("device", "dtype", "standin")} == {"device": "cpu", "dtype": "float32",
                                                                     "standin": False}
    assert stored["trnlab"] == trnlab.__version__ and "transformers" in stored, stored

    bf16, neuron = "dependent.ipynb[RUN_DTYPE=bfloat16]", "dependent.ipynb[RUN_DEVICE=neuron]"
    done = _pytest(path, "-rA", "--notebook-env", "RUN_DTYPE=bfloat16", "--notebook-env", "RUN_DEVICE=neuron",
                   rules=False)
    out = done.stdout
    outcome = {run: ["PASSED" if f"PASSED {run}::Cell {n}" in out else "FAILED" if f"FAILED {run}::Cell {n}" in out
                     else "?" for n in range(6)] for run in ("dependent.ipynb", bf16, neuron)}
    # The stored run (cpu, float32): everything compared; both near misses fail, in the untagged and the tagged cell.
    assert outcome["dependent.ipynb"] == ["PASSED", "PASSED", "PASSED", "FAILED", "FAILED", "PASSED"], out
    # bfloat16 on cpu: the dtype-dependent cells 1 and 5 run unchecked (both print another value); the device-dependent
    # cells 2 and 4 are still compared (cell 4's near miss fails), and the untagged near miss fails everywhere.
    assert outcome[bf16] == ["PASSED", "PASSED", "PASSED", "FAILED", "FAILED", "PASSED"], out
    # neuron in float32: the device-dependent cells 2, 4 and 5 run unchecked; the dtype-dependent cell 1 is compared.
    assert outcome[neuron] == ["PASSED", "PASSED", "PASSED", "FAILED", "PASSED", "PASSED"], out
    assert "5 failed, 13 passed" in out, out
    summary = out.split("trnlab: checked cells run unchecked")[1]
    assert (f"{bf16}: 2 checked cell(s) tagged 'dtype-dependent' ran unchecked (this run is cpu, bfloat16; "
            "the stored outputs come from cpu, float32)") in summary, out
    assert (f"{neuron}: 3 checked cell(s) tagged 'device-dependent' ran unchecked (this run is neuron, float32; "
            "the stored outputs come from cpu, float32)") in summary, out
    assert "dependent.ipynb: " not in summary, out  # the matching run ran nothing unchecked


def test_a_stand_in_run_differs_from_a_real_trn2_and_a_missing_record_is_never_a_match(tmp_path):
    """Stored records written by hand in the notebook's metadata; one notebook records nothing, one run neither."""
    standin = _write(tmp_path / "standin.ipynb", [
        _cell("from trnlab.run_record import record_run\nrecord_run('neuron', 'bfloat16')", 1),  # no torch: a trn2
        _cell("# NBVAL_CHECK_OUTPUT\nprint('matmul on a NeuronCore')", 2, [_stdout("matmul on the host\n")],
              tags=["device-dependent"]),
        _cell("# NBVAL_CHECK_OUTPUT\nprint('loss 7.6820')", 3, [_stdout("loss 7.6819\n")], tags=["dtype-dependent"]),
    ])
    nb = nbformat.read(standin, as_version=4)
    nb.metadata["trnlab"] = {"run": {"device": "neuron", "standin": True, "dtype": "bfloat16"}}
    nbformat.write(nb, standin)
    _write(tmp_path / "unrecorded.ipynb", [_cell("print('x')", 1, [_stdout("x\n")],
                                                 tags=["dtype-dependent", "nbval-check-output"])])
    norun = _write(tmp_path / "norun.ipynb", [_cell("# NBVAL_CHECK_OUTPUT\nprint(2)", 1, [_stdout("1\n")],
                                                    tags=["device-dependent"])])
    nb = nbformat.read(norun, as_version=4)
    nb.metadata["trnlab"] = {"run": {"device": "cpu", "dtype": "float32"}}
    nbformat.write(nb, norun)

    done = _pytest(tmp_path, "-rA", rules=False)
    out = done.stdout
    assert "PASSED standin.ipynb::Cell 0" in out and "PASSED standin.ipynb::Cell 1" in out, out
    assert "FAILED standin.ipynb::Cell 2" in out, out  # bfloat16 both: compared, and the near miss fails
    assert "FAILED unrecorded.ipynb::Cell 0" in out and "PASSED norun.ipynb::Cell 0" in out, out
    assert ("Cell 0 is tagged 'dtype-dependent', but unrecorded.ipynb records no device or dtype for its stored "
            "outputs: re-execute it with trnlab.setup()") in out, out
    assert "2 failed, 3 passed" in out, out
    summary = out.split("trnlab: checked cells run unchecked")[1]
    assert ("standin.ipynb: 1 checked cell(s) tagged 'device-dependent' ran unchecked (this run is neuron, bfloat16; "
            "the stored outputs come from neuron (STAND-IN), bfloat16)") in summary, out
    assert ("norun.ipynb: 1 checked cell(s) tagged 'device-dependent' ran unchecked (this run recorded no device or "
            "dtype before them: call trnlab.setup() or trnlab.record_run(device, dtype) in an earlier cell)") in summary
    assert "unrecorded.ipynb: " not in summary, out


def test_strict_nbval_never_compares_the_record_line_and_still_fails_a_difference_beside_it(tmp_path):
    record = "from trnlab.run_record import record_run\nrecord_run('cpu', 'float32')"
    path = _write(tmp_path / "strict.ipynb", [
        _cell(record, 1, [_record_output("neuron", "bfloat16", standin=True)]),  # stored on the stand-in
        _cell(record + "\nprint('steps', 6)", 2, [_record_output("neuron", "bfloat16", True), _stdout("steps 7\n")]),
        _cell(record, 3),  # stored before trnlab recorded runs: no record line
        _cell("print('ok')", 4, [_stdout("ok\n")]),
    ])
    done = _pytest(path, "-rA", mode="--nbval", rules=False)
    out = done.stdout
    assert all(f"PASSED strict.ipynb::Cell {n}" in out for n in (0, 2, 3)), out
    assert "FAILED strict.ipynb::Cell 1" in out and "steps 7" in out and "1 failed, 3 passed" in out, out
