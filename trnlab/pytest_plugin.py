"""The course's notebook rules for nbval, as a pytest plugin: ``pytest -p trnlab.pytest_plugin --nbval-lax notebooks/``.
Adds the course's sanitizing (:func:`course_patterns`), ignores stderr, and has ``--trnlab-rules`` (a rules item per
notebook), ``--notebook-env`` (one more run per option) and unchecked ``bundled-model`` cells under another model."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
import warnings
from collections import defaultdict
from pathlib import Path

import pytest
from nbval.plugin import IPyNbFile, find_comment_markers, find_metadata_tags

from trnlab.settings import MODEL_ENV_VAR, environment

__all__ = ["BUNDLED_MODEL_TAG", "SANITIZE_PATTERNS", "NotebookRulesError", "cell_options", "course_patterns",
           "machine_path_patterns", "notebook_problems", "other_model", "parse_notebook_env", "sanitize"]

#: The course's bundled model (``trnlab/assets/tiny-qwen3``), found without importing torch.
BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-qwen3"
#: The cell tag of checked cells whose output belongs to the bundled model.
BUNDLED_MODEL_TAG = "bundled-model"

#: ``(regex, replacement)`` applied to every compared output, in order; each is tied to a context.
SANITIZE_PATTERNS = {
    # Memory addresses inside a repr: <function f at 0x7f...>, <Foo object at 0x...>.
    r"(<[^<>\n]* at )0x[0-9a-fA-F]+>": r"\1<ADDR>>",
    # Timings as the course prints them: a decimal number, a space, a time unit.
    r"(?<![\w.])\d+\.\d+ (?:s|ms|µs|us|min)(?!\w)": "<TIME>",
    # Throughputs: any number before a per-second rate unit.
    r"(?<![\w.])\d+(?:\.\d+)? ?(?:tokens/s|tok/s|samples/s|steps/s|it/s)(?!\w)": "<RATE>",
    # Trainer's speed metrics: the keys Transformers calls speed metrics (ending in _runtime or
    # _per_second) under Trainer's prefixes (train_, eval_[name_], test_), as a metrics dict prints
    # them ('train_runtime': 1.2823; PrinterCallback quotes them: '1.282') and as log_metrics does.
    r"""(['"](?:train|eval|test)\w*_runtime['"]: )(['"]?)\d+(?:\.\d+)?(?:e[-+]\d+)?\2(?![\w.])""": r"\1<TIME>",
    r"""(['"](?:train|eval|test)\w*_per_second['"]: )(['"]?)\d+(?:\.\d+)?(?:e[-+]\d+)?\2(?![\w.])""":
        r"\1<RATE>",
    r"(?m)^( +(?:train|eval|test)\w*_runtime +=) +(?:\d+ days?, )?\d+:\d\d:\d\d\.\d\d$": r"\1 <TIME>",
    r"(?m)^( +(?:train|eval|test)\w*_per_second +=) +\d+(?:\.\d+)?(?:e[-+]\d+)?$": r"\1 <RATE>",
    # trnlab.run_summary()'s whole seconds, in its own words (the graph count is still compared).
    r"(this notebook compiled \d+ graph\(s\) in )\d+ s( on )": r"\1<TIME>\2",
    # Device names after device: / device= (a device index included).
    r"(?<![A-Za-z0-9])(device\s*[:=]\s*['\"]?)(?:cpu|cuda|neuron|xla|mps|xpu|hpu|npu)(?::\d+)?(?![\w])": r"\1<DEVICE>",
    r"device\(type=['\"](?:cpu|cuda|neuron|xla|mps|xpu|hpu|npu)['\"](?:, index=\d+)?\)": "device(<DEVICE>)",
    # Versions right after a package name: torch 2.13.0+cpu, transformers==5.24.0, python: 3.11.5.
    r"(?<![\w.-])(python|Python|pytorch|torch|torchvision|torch-neuronx|torch_neuronx|neuronx-cc|"
    r"transformers|accelerate|tokenizers|safetensors|datasets|numpy|nbval|trnlab)"
    r"(\s*==\s*|\s*:\s*|\s+v?)\d+(?:\.\d+)+[\w.+-]*": r"\1\2<VERSION>",
}

#: The characters ``tempfile.mkdtemp`` draws its 8 random name characters from.
_MKDTEMP_RANDOM = r"[a-z0-9_]{8}"


def machine_path_patterns(rootdir: str | os.PathLike | None = None) -> dict[str, str]:
    """This machine's paths -> the way the course stores them (``<tmp>``, ``~``, repo-relative...).
    Literal prefixes at a path boundary, longest first: distinct paths never compare equal (bar a ``mkdtemp`` suffix)."""
    start, end = r"(?<![\w.+~-])", r"(?![\w.+-])"
    prefixes: list[tuple[str, str]] = []
    root = str(Path(rootdir).resolve()) if rootdir is not None else None
    if root:
        prefixes += [(root + "/", ""), (root, ".")]
    in_root = root and (sys.prefix + "/").startswith(root + "/")
    if sys.prefix != sys.base_prefix and not in_root:  # a virtual environment elsewhere
        prefixes.append((sys.prefix, "<venv>"))
    for tmp in {tempfile.gettempdir(), str(Path(tempfile.gettempdir()).resolve())}:
        prefixes.append((tmp, "<tmp>"))
    home = os.path.expanduser("~")
    if home not in ("~", "/"):
        prefixes.append((home, "~"))
    patterns = {start + r"(?:/[\w.+~-]+)+/(?:site|dist)-packages" + end: "<site-packages>"}
    for prefix, replacement in sorted(set(prefixes), key=lambda p: -len(p[0])):
        patterns[start + re.escape(prefix) + ("" if prefix.endswith("/") else end)] = replacement
    # tempfile.mkdtemp(prefix="run-") -> <tmp>/run-k3j_x9a2: 8 random characters after "tmp" (the
    # default prefix) or after a prefix that ends in "-", "_" or ".".
    patterns[r"(<tmp>/(?:tmp|[\w.+-]*[-_.]))" + _MKDTEMP_RANDOM + end] = r"\1<random>"
    return patterns


def course_patterns(rootdir: str | os.PathLike | None = None) -> dict[str, str]:
    """Every pattern the plugin adds: :data:`SANITIZE_PATTERNS` after :func:`machine_path_patterns`."""
    return {**machine_path_patterns(rootdir), **SANITIZE_PATTERNS}


def sanitize(text: str, rootdir: str | os.PathLike | None = None) -> str:
    """``text`` as nbval compares it with the course's patterns (for tests and debugging)."""
    for regex, replacement in course_patterns(rootdir).items():
        text = re.sub(regex, replacement, text)
    return text


# What nbval does with each cell

def _source(cell) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def cell_options(cell, strict: bool = False) -> dict[str, bool]:
    """nbval's options for one code cell, read as nbval reads them: tags first, then comment markers, which win.
    ``check`` defaults to ``strict`` (``--nbval`` compares every cell, ``--nbval-lax`` only the marked ones)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbval warns about conflicting markers itself
        options = defaultdict(bool, find_metadata_tags(cell.get("metadata", {})))
        options.update(dict(find_comment_markers(_source(cell))))
    options.setdefault("check", strict)
    return options


def notebook_problems(path: str | Path, strict: bool = False, require_all_executed: bool = False) -> list[str]:
    """What is wrong with the committed notebook at ``path`` (empty list: nothing), for the ``trnlab rules`` item.
    Cells executed in order, once; errors only in ``raises-exception`` cells; no checked cell unexecuted; at least one
    compared cell; with ``require_all_executed`` no unexecuted cell at all. Skipped cells are left out."""
    path = Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"cannot be read as a notebook ({exc})"]
    cells = []  # (number among code cells, as nbval counts them, cell, options)
    for number, cell in enumerate(c for c in notebook.get("cells", []) if c.get("cell_type") == "code"):
        options = cell_options(cell, strict)
        if _source(cell).strip() and not options["skip"]:
            cells.append((number, cell, options))
    executed = [(n, c, o) for n, c, o in cells if c.get("execution_count") is not None]
    problems = []
    unexecuted = [n for n, c, o in cells if c.get("execution_count") is None
                  and (require_all_executed or cell_options(c)["check"])]
    if unexecuted:
        what = "code cell(s)" if require_all_executed else "cell(s) marked for checking"
        problems.append(f"{len(unexecuted)} {what} never executed (the first is Cell {unexecuted[0]}): "
                        "restart the kernel, run all cells, save")
    counts = [c["execution_count"] for n, c, o in executed]
    if counts != sorted(counts) or len(set(counts)) != len(counts):
        problems.append("cells were executed out of order: restart the kernel, run all cells, save")
    errors = [(n, out.get("ename", "error")) for n, c, o in cells if not o["check_exception"]
              for out in c.get("outputs", []) if out.get("output_type") == "error"]
    if errors:
        problems.append(f"Cell {errors[0][0]} holds an error output ({errors[0][1]}): fix it, re-run the "
                        "notebook, save (or mark the cell '# NBVAL_RAISES_EXCEPTION' if the error is the point)")
    if cells and not any(o["check"] for n, c, o in executed):
        if strict:
            problems.append("every executed cell is marked '# NBVAL_IGNORE_OUTPUT' (or skipped), so nbval "
                            "--nbval compares nothing in it: unmark the cells whose output is deterministic")
        else:
            problems.append("no executed cell is marked '# NBVAL_CHECK_OUTPUT' (or tagged 'nbval-check-output'), "
                            "so nbval --nbval-lax compares nothing in it: mark the cells whose output is "
                            "deterministic")
    return problems


def _strict(config) -> bool:
    """Whether nbval compares every cell (``--nbval``; ``--nbval-lax`` wins, as in nbval)."""
    return bool(getattr(config.option, "nbval", False)) and not getattr(config.option, "nbval_lax", False)


class NotebookRulesItem(pytest.Item):
    """One test per notebook: the course's rules for a committed notebook (:func:`notebook_problems`)."""

    def runtest(self):
        problems = notebook_problems(self.path, strict=_strict(self.config))
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


# --notebook-env

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
NOTEBOOK_ENV_HELP = (
    "run every notebook once more, its kernel started with these variables set: "
    "'NAME=VALUE', several separated by spaces (quote the whole value), e.g. "
    "--notebook-env TRNLAB_DTYPE=bfloat16 or --notebook-env 'TRNLAB_DTYPE=bfloat16 "
    "NEURON_RT_VISIBLE_CORES=0,1'; repeat the option for more runs")


def parse_notebook_env(spec: str) -> dict[str, str]:
    """The variables of one ``--notebook-env`` run: ``"A=1 B=0,1"`` -> ``{"A": "1", "B": "0,1"}``.
    Split on spaces (shell quoting keeps one in a value); a comma splits only before another ``NAME=`` (``A=1,B=2``).
    Raises :class:`pytest.UsageError`."""
    usage = ("write NAME=VALUE, several separated by spaces, e.g. --notebook-env TRNLAB_DTYPE=bfloat16 or "
             "--notebook-env 'TRNLAB_DTYPE=bfloat16 NEURON_RT_VISIBLE_CORES=0,1'; repeat the option for "
             "another run")
    try:
        words = shlex.split(spec)
    except ValueError as exc:
        raise pytest.UsageError(f"--notebook-env {spec!r}: {exc}: {usage}") from None
    if not words:
        raise pytest.UsageError(f"--notebook-env {spec!r} names no variable: {usage}")
    env: dict[str, str] = {}
    for word in words:
        for part in re.split(rf",(?={_NAME}=)", word):
            name, sep, value = part.partition("=")
            if not sep or not re.fullmatch(_NAME, name):
                raise pytest.UsageError(f"--notebook-env {spec!r}: {part!r} is not NAME=VALUE: {usage}")
            if name in env:
                raise pytest.UsageError(f"--notebook-env {spec!r} sets {name} twice: keep one, or repeat "
                                        "--notebook-env for another run")
            env[name] = value
    return env


def notebook_env_runs(specs: list[str]) -> list[dict[str, str]]:
    """The extra runs asked for by each ``--notebook-env`` (:func:`parse_notebook_env`); no run twice."""
    runs = []
    for spec in specs:
        env = parse_notebook_env(spec)
        if env in runs:
            raise pytest.UsageError(f"--notebook-env {spec!r} asks for the same run twice: give it once")
        runs.append(env)
    return runs


def run_label(env: dict[str, str]) -> str:
    """``{"A": "1", "B": "2"}`` -> ``"A=1 B=2"``: the bracketed part of a run's test file name."""
    return " ".join(f"{name}={value}" for name, value in env.items())


def names_in_code(path: str | Path, names) -> set[str]:
    """Which of ``names`` (environment variables) a notebook's code cells mention."""
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    code = "\n".join(_source(c) for c in cells if c.get("cell_type") == "code")
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
    A notebook whose code never names any of the variables is not run again: one skipped item says so."""

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
        with environment(**self.env):  # the kernel starts with these; this process keeps its own
            super().setup()


# Bundled-model cells

def other_model(notebook) -> str | None:
    """The model a notebook run uses when it is not the bundled one (``None``: the bundled one).
    ``TRNLAB_MODEL`` from the run's ``--notebook-env``, else this environment; a relative folder is the notebook's."""
    env = getattr(notebook, "env", {})
    value = env[MODEL_ENV_VAR] if MODEL_ENV_VAR in env else os.environ.get(MODEL_ENV_VAR)
    if not value:
        return None
    folder = Path(value).expanduser()
    if not folder.is_absolute():
        folder = Path(notebook.path).parent / folder
    return None if folder.resolve() == BUNDLED_MODEL_DIR.resolve() else value


UNCHECKED_KEY = "trnlab_unchecked"


def _uncheck_bundled_model_cells(items) -> None:
    """Run the ``bundled-model`` cells of runs with another model unchecked, and mark them so."""
    models = {}
    for item in items:
        notebook = item.parent
        options = getattr(item, "options", None)
        if not _is_notebook_collector(notebook) or options is None or not options.get("check"):
            continue
        if BUNDLED_MODEL_TAG not in (item.cell.get("metadata", {}).get("tags") or []):
            continue
        if notebook not in models:
            models[notebook] = other_model(notebook)
        if models[notebook] is not None:
            options["check"] = False
            item.user_properties.append((UNCHECKED_KEY, f"{MODEL_ENV_VAR}={models[notebook]} is not the bundled model"))


class UncheckedCellsReport:
    """Counts, from the test reports (so also under pytest-xdist), the cells run unchecked."""

    def __init__(self):
        self.unchecked: dict[str, list[str]] = {}  # run (test file) -> reasons, one per cell

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for key, reason in getattr(report, "user_properties", ()):
            if key == UNCHECKED_KEY:
                self.unchecked.setdefault(report.nodeid.split("::")[0], []).append(reason)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.unchecked:
            return
        terminalreporter.section("trnlab: checked cells run unchecked")
        for run, reasons in self.unchecked.items():
            terminalreporter.write_line(f"{run}: {len(reasons)} checked cell(s) tagged '{BUNDLED_MODEL_TAG}' ran "
                                        f"unchecked ({reasons[0]}; their stored output is the bundled model's)")


# Hooks

def _nbval_active(config) -> bool:
    return bool(getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False))


def pytest_addoption(parser):
    group = parser.getgroup("trnlab")
    group.addoption("--notebook-env", action="append", default=[], metavar="'NAME=VALUE [NAME=VALUE ...]'",
                    help=NOTEBOOK_ENV_HELP)
    group.addoption("--trnlab-no-sanitize", action="store_true", default=False,
                    help="compare outputs without the course's sanitizing patterns (your own "
                         "--nbval-sanitize-with patterns still apply)")
    group.addoption("--trnlab-rules", action="store_true", default=False,
                    help="add a '<notebook>::trnlab rules' item per notebook, failing on cells run out of "
                         "order, stored errors, marked cells never executed, or nothing compared: stricter "
                         "than nbval, so off by default (the course's make test turns it on)")


def pytest_configure(config):
    option = config.option
    specs = getattr(option, "notebook_env", None) or []
    if specs and not _nbval_active(config):
        raise pytest.UsageError("--notebook-env runs notebooks once more under nbval: add --nbval-lax (or --nbval)")
    config._trnlab_runs = notebook_env_runs(specs)  # a usage error here, before collection
    if _nbval_active(config):
        config.pluginmanager.register(UncheckedCellsReport(), "trnlab-unchecked-cells")
        if not getattr(option, "nbval_kernel_name", None) and not getattr(option, "current_env", False):
            option.nbval_current_env = True


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    outcome = yield
    runs = getattr(parent.config, "_trnlab_runs", [])
    notebooks = [node for node in outcome.get_result() if _is_notebook_collector(node)]
    if not runs or not notebooks:
        return
    extra = []
    for env in runs:
        label = run_label(env)
        extra.append(NotebookWithEnv.from_parent(parent, path=file_path, name=f"{file_path.name}[{label}]",
                                                 nodeid=f"{notebooks[0].nodeid}[{label}]", env=env))
    outcome.force_result(outcome.get_result() + extra)


def pytest_collection_modifyitems(session, config, items):
    notebooks = []
    for item in items:
        notebook = item.parent
        if _is_notebook_collector(notebook) and notebook not in notebooks:
            notebooks.append(notebook)
            if "stderr" not in notebook.skip_compare:
                notebook.skip_compare = notebook.skip_compare + ("stderr",)
    _uncheck_bundled_model_cells(items)
    if not config.getoption("trnlab_rules", default=False):
        return  # opt-in: the rules are stricter than nbval, which accepts such notebooks
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
        if not item.config.getoption("trnlab_no_sanitize", default=False):
            # After the user's own --nbval-sanitize-with patterns (nbval loaded them in setup).
            for regex, replacement in course_patterns(item.config.rootpath).items():
                notebook.sanitize_patterns.setdefault(regex, replacement)
        notebook._trnlab_sanitized = True
