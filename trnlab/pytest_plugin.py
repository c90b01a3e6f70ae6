"""The course's notebook rules for nbval, as a pytest plugin you can use in your own CI.

Run your notebooks as tests the way the course runs its own::

    pytest -p trnlab.pytest_plugin --nbval-lax notebooks/

With this plugin:

* **outputs are sanitized** before nbval compares them (:data:`SANITIZE_PATTERNS`): paths,
  versions of torch/transformers/accelerate/trnlab/torch-neuronx/python, timings
  (``1.2 s``, ``35 tokens/s``...), memory addresses, and device names after ``device:``,
  ``device=`` or in ``device(type='...')`` (so ``device: neuron:0`` and ``device: cpu``
  compare equal). Your own ``--nbval-sanitize-with`` file still applies; its patterns run first.
* **stderr is not compared**: warnings and progress bars go there and differ by machine.
* **each notebook is checked as committed** by one more test item, ``<notebook>::trnlab
  rules``, which fails with a message naming the problem when the notebook has a code cell
  never executed, cells executed out of order, an error output, or no cell marked
  ``# NBVAL_CHECK_OUTPUT`` (under ``--nbval-lax`` nbval would then compare nothing).
* the notebooks run in pytest's own Python environment (``--nbval-current-env``) unless you
  pass ``--nbval-kernel-name``.
* ``--notebook-env NAME=VALUE[,NAME=VALUE]`` runs every notebook **once more** in the same
  session, its kernel started with those variables set: ``--notebook-env TRNLAB_DTYPE=bfloat16``
  is the course's bfloat16 pass. A notebook whose code never names any of the variables is
  not run again (one skipped item says so). Each such run is its own test file,
  ``notebooks/02_inference.ipynb[TRNLAB_DTYPE=bfloat16]``, so ``pytest-xdist -n 2 --dist
  loadfile`` runs it beside the others. Repeat the option for more runs.

The course's ``make test`` uses this same plugin.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from unittest import mock

import pytest
from nbval.plugin import IPyNbFile

#: ``(regex, replacement)`` applied to every compared output, in order.
SANITIZE_PATTERNS = {
    # Paths of two or more components: /home/me/x, /tmp/abc/def, C:-less POSIX paths.
    r"(?<![\w.])(/[\w.+-]+){2,}/?": "<PATH>",
    # Paths as the course stores them (tools/normalize_notebooks.py): repo-relative, <tmp>/..., ~/...
    r"(?:<(?:tmp|site-packages|venv)>|~|(?<![\w./<>~-])(?:\.venv|trnlab|notebooks|tests|tools))"
    r"(?:/[\w.+-]+|<PATH>)+/?": "<PATH>",
    r"\b(torch|transformers|accelerate|trnlab|torch-neuronx|python)\s+\d+\.\d+[\w.+-]*": r"\1 <VERSION>",
    r"\d+(\.\d+)?\s?(s|ms|µs|us|sec|seconds|tok/s|tokens/s)\b": "<TIME>",
    r"0x[0-9a-fA-F]+": "<ADDR>",
    r"(device\s*[:=]\s*'?)(cpu|cuda|neuron|xla|mps)(:\d+)?": r"\1<DEVICE>",
    r"device\(type='(cpu|cuda|neuron|xla|mps)'(, index=\d+)?\)": "device(<DEVICE>)",
}

#: The marker that makes nbval compare a cell's output under ``--nbval-lax``.
CHECK_MARKER = "NBVAL_CHECK_OUTPUT"


def notebook_problems(path: str | Path) -> list[str]:
    """What is wrong with the committed notebook at ``path`` (empty list: nothing).

    The checks of the ``trnlab rules`` item: every non-empty code cell executed, in order
    from the top, no error output, and at least one cell marked ``# NBVAL_CHECK_OUTPUT``.
    """
    path = Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"cannot be read as a notebook ({exc})"]
    cells = [c for c in notebook.get("cells", [])
             if c.get("cell_type") == "code" and "".join(c.get("source", "")).strip()]
    problems = []
    unexecuted = [i for i, c in enumerate(cells) if c.get("execution_count") is None]
    if unexecuted:
        problems.append(f"{len(unexecuted)} code cell(s) never executed (the first is code cell "
                        f"{unexecuted[0] + 1}): restart the kernel, run all cells, save")
    counts = [c["execution_count"] for c in cells if c.get("execution_count") is not None]
    if counts != sorted(counts) or len(set(counts)) != len(counts):
        problems.append("cells were executed out of order: restart the kernel, run all cells, save")
    errors = [(i, o.get("ename", "error")) for i, c in enumerate(cells)
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    if errors:
        problems.append(f"code cell {errors[0][0] + 1} holds an error output ({errors[0][1]}): fix it, "
                        "re-run the notebook, save")
    if cells and not any(CHECK_MARKER in "".join(c.get("source", "")) for c in cells):
        problems.append(f"no cell is marked '# {CHECK_MARKER}', so nbval --nbval-lax compares nothing in "
                        "it: mark the cells whose output is deterministic")
    return problems


class NotebookRulesItem(pytest.Item):
    """One test per notebook: the course's rules for a committed notebook (:func:`notebook_problems`)."""

    def runtest(self):
        problems = notebook_problems(self.path)
        if problems:
            raise NotebookRulesError(problems)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, NotebookRulesError):
            return f"{self.path.name}:\n" + "\n".join(f"  - {p}" for p in excinfo.value.problems)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}::trnlab rules"


class NotebookRulesError(AssertionError):
    """A notebook breaks the course's rules; ``problems`` lists each problem and its fix."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _is_notebook_collector(node) -> bool:
    return isinstance(node, IPyNbFile) and hasattr(node, "skip_compare")


def parse_notebook_env(spec: str) -> dict[str, str]:
    """``"A=1,B=x"`` -> ``{"A": "1", "B": "x"}``: the variables of one ``--notebook-env`` run."""
    env = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise pytest.UsageError(f"--notebook-env {spec!r}: write NAME=VALUE, several joined by commas, "
                                    "e.g. --notebook-env TRNLAB_DTYPE=bfloat16")
        env[name] = value
    return env


def names_in_code(path: str | Path, names) -> set[str]:
    """Which of ``names`` (environment variables) a notebook's code cells mention."""
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    code = "\n".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
    return {name for name in names if re.search(rf"\b{re.escape(name)}\b", code)}


class NotRunAgain(pytest.Item):
    """Stands for a ``--notebook-env`` run that would repeat the plain one; it is skipped, saying why."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_marker(pytest.mark.skip(
            reason=f"{self.parent.path.name} never reads {', '.join(sorted(self.parent.env))}: "
                   "run once more with it, it would repeat its plain run exactly"))

    def runtest(self):  # never called: the item is marked skip
        pass

    def reportinfo(self):
        return self.path, 0, self.nodeid  # a skip report needs a line number


class NotebookWithEnv(IPyNbFile):
    """A notebook run once more, its kernel started with :attr:`env` set (``--notebook-env``).

    A notebook whose code never names any of the variables is not run again (the course's
    notebooks read every setting in their parameter cell): one skipped item says so.
    """

    def __init__(self, *args, env: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.env = env
        self.reads_env = bool(names_in_code(self.path, env))

    def collect(self):
        if self.reads_env:
            yield from super().collect()
        else:
            yield NotRunAgain.from_parent(self, name="not run again")

    def setup(self):
        if not self.reads_env:
            return
        # The kernel is a child process: it takes a copy of os.environ when it starts.
        with mock.patch.dict(os.environ, self.env):
            super().setup()


def pytest_addoption(parser):
    parser.getgroup("trnlab").addoption(
        "--notebook-env", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
        help="run every notebook once more with these variables in its kernel's environment, e.g. "
             "TRNLAB_DTYPE=bfloat16 (repeat for more runs)")


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    outcome = yield
    specs = parent.config.getoption("notebook_env", default=[])
    notebooks = [node for node in outcome.get_result() if _is_notebook_collector(node)]
    if not specs or not notebooks:
        return
    runs = []
    for spec in specs:
        env = parse_notebook_env(spec)
        label = ",".join(f"{name}={value}" for name, value in env.items())
        runs.append(NotebookWithEnv.from_parent(parent, path=file_path, name=f"{file_path.name}[{label}]",
                                                nodeid=f"{notebooks[0].nodeid}[{label}]", env=env))
    outcome.force_result(outcome.get_result() + runs)


def pytest_configure(config):
    option = config.option
    if (getattr(option, "nbval", False) or getattr(option, "nbval_lax", False)) \
            and not getattr(option, "nbval_kernel_name", None) and not getattr(option, "current_env", False):
        option.nbval_current_env = True


def pytest_collection_modifyitems(session, config, items):
    notebooks = []
    for item in items:
        notebook = item.parent
        if _is_notebook_collector(notebook) and notebook not in notebooks:
            notebooks.append(notebook)
            if "stderr" not in notebook.skip_compare:
                notebook.skip_compare = notebook.skip_compare + ("stderr",)
    for notebook in notebooks:
        if isinstance(notebook, NotebookWithEnv):
            continue  # the committed file is checked once, by its plain run
        first = next(i for i, item in enumerate(items) if item.parent is notebook)
        items.insert(first, NotebookRulesItem.from_parent(notebook, name="trnlab rules"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield
    notebook = item.parent
    if _is_notebook_collector(notebook) and getattr(notebook, "sanitize_patterns", None) is not None \
            and not getattr(notebook, "_trnlab_sanitized", False):
        for regex, replacement in SANITIZE_PATTERNS.items():
            notebook.sanitize_patterns.setdefault(regex, replacement)
        notebook._trnlab_sanitized = True


def sanitize(text: str) -> str:
    """``text`` with :data:`SANITIZE_PATTERNS` applied, as nbval compares it (for tests and debugging)."""
    for regex, replacement in SANITIZE_PATTERNS.items():
        text = re.sub(regex, replacement, text)
    return text
