"""The course's notebook rules for nbval, as a pytest plugin: ``pytest -p trnlab.pytest_plugin --nbval-lax notebooks/``.
Sanitizes what changes run to run, ignores stderr; ``--trnlab-rules``, ``--notebook-env``, ``--trnlab-no-sanitize``;
compares cells tagged ``device-dependent`` or ``dtype-dependent`` only in a run that matches the stored one."""

from __future__ import annotations

import functools
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

from trnlab.run_record import _output_record, describe_run, stored_run
from trnlab.settings import _MODEL_ENV_VAR, _environment

__all__ = ["notebook_problems", "sanitize"]

#: The course's bundled model (``trnlab/assets/tiny-qwen3``), found without importing torch.
_BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-qwen3"
#: The cell tag of checked cells whose output belongs to the bundled model.
_BUNDLED_MODEL_TAG = "bundled-model"
#: The cell tags of checked cells whose output belongs to the device (type, and whether it is the STAND-IN) or to the
#: dtype that produced the stored outputs (:func:`trnlab.run_record.stored_run`): compared only in a run that matches.
_DEVICE_TAG, _DTYPE_TAG = "device-dependent", "dtype-dependent"
#: The user property that marks a checked cell run unchecked, its value the report's words for why.
_UNCHECKED_KEY = "trnlab_unchecked"

#: ``(regex, replacement)`` applied to every compared output, in order; each is tied to a context.
_SANITIZE_PATTERNS = {
    # Memory addresses inside a repr: <function f at 0x7f...>, <Foo object at 0x...>.
    r"(<[^<>\n]* at )0x[0-9a-fA-F]+>": r"\1<ADDR>>",
    # Timings as the course prints them: a decimal number, a space, a time unit.
    r"(?<![\w.])\d+\.\d+ (?:s|ms|µs|us|min)(?!\w)": "<TIME>",
    # Throughputs: any number before a per-second rate unit.
    r"(?<![\w.])\d+(?:\.\d+)? ?(?:tokens/s|tok/s|samples/s|steps/s|it/s)(?!\w)": "<RATE>",
    # Trainer's speed metrics (*_runtime, *_per_second under train_/eval_/test_), as a metrics dict prints them
    # ('train_runtime': 1.2823; PrinterCallback quotes them: '1.282') and as log_metrics does.
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


def _machine_path_patterns(rootdir: str | os.PathLike | None = None) -> dict[str, str]:
    """This machine's paths -> the way the course stores them (``<tmp>``, ``~``, repo-relative...).
    Literal prefixes at a path boundary, longest first: distinct paths never compare equal (bar mkdtemp suffixes)."""
    start, end = r"(?<![\w.+~-])", r"(?![\w.+-])"
    root = str(Path(rootdir).resolve()) if rootdir is not None else None
    prefixes = [(root + "/", ""), (root, ".")] if root else []
    in_root = root and (sys.prefix + "/").startswith(root + "/")
    if sys.prefix != sys.base_prefix and not in_root:  # a virtual environment elsewhere
        prefixes.append((sys.prefix, "<venv>"))
    prefixes += [(tmp, "<tmp>") for tmp in {tempfile.gettempdir(), str(Path(tempfile.gettempdir()).resolve())}]
    home = os.path.expanduser("~")
    if home not in ("~", "/"):
        prefixes.append((home, "~"))
    patterns = {start + r"(?:/[\w.+~-]+)+/(?:site|dist)-packages" + end: "<site-packages>"}
    for prefix, replacement in sorted(set(prefixes), key=lambda p: -len(p[0])):
        patterns[start + re.escape(prefix) + ("" if prefix.endswith("/") else end)] = replacement
    # mkdtemp(prefix="run-") -> <tmp>/run-k3j_x9a2: 8 random characters after "tmp" or a prefix ending in -, _ or .
    patterns[r"(<tmp>/(?:tmp|[\w.+-]*[-_.]))[a-z0-9_]{8}" + end] = r"\1<random>"
    return patterns


def _course_patterns(rootdir: str | os.PathLike | None = None) -> dict[str, str]:
    return {**_machine_path_patterns(rootdir), **_SANITIZE_PATTERNS}


def sanitize(text: str, rootdir: str | os.PathLike | None = None) -> str:
    """``text`` as nbval compares it with the course's patterns (to debug a difference)."""
    for regex, replacement in _course_patterns(rootdir).items():
        text = re.sub(regex, replacement, text)
    return text


def _source(cell) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def _cell_options(cell, strict: bool = False) -> dict[str, bool]:
    """nbval's options for one code cell, read as nbval reads them: tags first, then comment markers, which win.
    ``check`` defaults to ``strict`` (``--nbval`` compares every cell, ``--nbval-lax`` only the marked ones)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbval warns about conflicting markers itself
        options = defaultdict(bool, find_metadata_tags(cell.get("metadata", {})))
        options.update(dict(find_comment_markers(_source(cell))))
    options.setdefault("check", strict)
    return options


def notebook_problems(path: str | Path, strict: bool = False, require_all_executed: bool = False) -> list[str]:
    """What is wrong with the committed notebook at ``path``, each with its fix (empty: nothing); the rules item.
    Cells run in order, once; errors only in ``raises-exception`` cells; no checked cell unrun; something compared."""
    path = Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"cannot be read as a notebook ({exc})"]
    cells = []  # (number among code cells, as nbval counts them, cell, options)
    for number, cell in enumerate(c for c in notebook.get("cells", []) if c.get("cell_type") == "code"):
        options = _cell_options(cell, strict)
        if _source(cell).strip() and not options["skip"]:
            cells.append((number, cell, options))
    executed = [(n, c, o) for n, c, o in cells if c.get("execution_count") is not None]
    problems = []
    unexecuted = [n for n, c, o in cells if c.get("execution_count") is None
                  and (require_all_executed or _cell_options(c)["check"])]
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
        problems.append("every executed cell is marked '# NBVAL_IGNORE_OUTPUT' (or skipped), so nbval --nbval compares "
                        "nothing in it: unmark the cells whose output is deterministic" if strict else
                        "no executed cell is marked '# NBVAL_CHECK_OUTPUT' (or tagged 'nbval-check-output'), so nbval "
                        "--nbval-lax compares nothing in it: mark the cells whose output is deterministic")
    return problems


class _RulesItem(pytest.Item):
    """One test per notebook: the course's rules for a committed notebook (:func:`notebook_problems`)."""

    def runtest(self):
        strict = getattr(self.config.option, "nbval", False) and not getattr(self.config.option, "nbval_lax", False)
        if problems := notebook_problems(self.path, strict=bool(strict)):
            pytest.fail(f"{self.path.name}:\n" + "\n".join(f"  - {p}" for p in problems), pytrace=False)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}::trnlab rules"


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ENV_USAGE = ("write NAME=VALUE, several separated by spaces (quote the whole value), e.g. --notebook-env "
              "TRNLAB_DTYPE=bfloat16 or --notebook-env 'TRNLAB_DTYPE=bfloat16 NEURON_RT_VISIBLE_CORES=0,1'; "
              "repeat the option for another run")


def _parse_notebook_env(spec: str) -> dict[str, str]:
    """The variables of one ``--notebook-env`` run: ``"A=1 B=0,1"`` -> ``{"A": "1", "B": "0,1"}``, or a UsageError.
    Split on spaces (shell quoting keeps one in a value); a comma splits only before another ``NAME=`` (``A=1,B=2``)."""
    try:
        words = shlex.split(spec)
    except ValueError as exc:
        raise pytest.UsageError(f"--notebook-env {spec!r}: {exc}: {_ENV_USAGE}") from None
    if not words:
        raise pytest.UsageError(f"--notebook-env {spec!r} names no variable: {_ENV_USAGE}")
    env: dict[str, str] = {}
    for word in words:
        for part in re.split(rf",(?={_NAME}=)", word):
            name, sep, value = part.partition("=")
            if not sep or not re.fullmatch(_NAME, name):
                raise pytest.UsageError(f"--notebook-env {spec!r}: {part!r} is not NAME=VALUE: {_ENV_USAGE}")
            if name in env:
                raise pytest.UsageError(f"--notebook-env {spec!r} sets {name} twice: keep one, or repeat "
                                        "--notebook-env for another run")
            env[name] = value
    return env


def _run_label(env: dict[str, str]) -> str:
    """``{"A": "1", "B": "2"}`` -> ``"A=1 B=2"``: the bracketed part of a run's test file name."""
    return " ".join(f"{name}={value}" for name, value in env.items())


class _NotRunAgain(pytest.Item):
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


class _NotebookWithEnv(IPyNbFile):
    """A notebook run again with ``--notebook-env``'s variables in its kernel; a skipped item if it never reads them."""

    def __init__(self, *args, env: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.env = env
        cells = json.loads(Path(self.path).read_text(encoding="utf-8")).get("cells", [])
        code = "\n".join(_source(c) for c in cells if c.get("cell_type") == "code")
        self.reads_env = any(re.search(rf"\b{re.escape(name)}\b", code) for name in env)

    def collect(self):
        if self.reads_env:
            yield from super().collect()
        else:
            yield _NotRunAgain.from_parent(self, name="not run again")

    def setup(self):
        if self.reads_env:
            with _environment(**self.env):  # the kernel, a child process, starts with these; this process keeps its own
                super().setup()


def _other_model(notebook) -> str | None:
    """The model a notebook run uses when it is not the bundled one (``None``: the bundled one).
    ``TRNLAB_MODEL`` from the run's ``--notebook-env``, else this environment; a relative folder is the notebook's."""
    env = getattr(notebook, "env", {})
    value = env[_MODEL_ENV_VAR] if _MODEL_ENV_VAR in env else os.environ.get(_MODEL_ENV_VAR)
    if not value:
        return None
    folder = Path(notebook.path).parent / Path(value).expanduser()  # an absolute path replaces the notebook's folder
    return None if folder.resolve() == _BUNDLED_MODEL_DIR.resolve() else value


def pytest_addoption(parser):
    group = parser.getgroup("trnlab")
    group.addoption("--notebook-env", action="append", default=[], metavar="'NAME=VALUE [NAME=VALUE ...]'",
                    help="run every notebook once more, its kernel started with these variables set: " + _ENV_USAGE)
    group.addoption("--trnlab-no-sanitize", action="store_true", default=False,
                    help="compare outputs without the course's patterns (--nbval-sanitize-with ones still apply)")
    group.addoption("--trnlab-rules", action="store_true", default=False,
                    help="add a '<notebook>::trnlab rules' item per notebook, failing on cells run out of order, "
                         "stored errors, marked cells never run or nothing compared (stricter than nbval, so opt-in)")


def pytest_configure(config):
    option = config.option
    specs = getattr(option, "notebook_env", None) or []
    nbval = getattr(option, "nbval", False) or getattr(option, "nbval_lax", False)
    if specs and not nbval:
        raise pytest.UsageError("--notebook-env runs notebooks once more under nbval: add --nbval-lax (or --nbval)")
    config._trnlab_runs = []  # a usage error here, before collection
    for spec in specs:
        if (env := _parse_notebook_env(spec)) in config._trnlab_runs:
            raise pytest.UsageError(f"--notebook-env {spec!r} asks for the same run twice: give it once")
        config._trnlab_runs.append(env)
    if nbval and not getattr(option, "nbval_kernel_name", None) and not getattr(option, "current_env", False):
        option.nbval_current_env = True


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    outcome = yield
    runs = getattr(parent.config, "_trnlab_runs", [])
    notebooks = [node for node in outcome.get_result() if isinstance(node, IPyNbFile)]
    if runs and notebooks:
        outcome.force_result(outcome.get_result() + [
            _NotebookWithEnv.from_parent(parent, path=file_path, name=f"{file_path.name}[{_run_label(env)}]",
                                         nodeid=f"{notebooks[0].nodeid}[{_run_label(env)}]", env=env)
            for env in runs])


def pytest_collection_modifyitems(session, config, items):
    models = {}  # notebook -> the other model its run uses (None: the bundled one)
    for item in items:
        notebook, options = item.parent, getattr(item, "options", None)
        if not isinstance(notebook, IPyNbFile):
            continue
        if notebook not in models:
            models[notebook] = _other_model(notebook)
            if "stderr" not in notebook.skip_compare:
                notebook.skip_compare = notebook.skip_compare + ("stderr",)
        if options is not None:  # an nbval cell: record_run's line is the plugin's to read (below), never compared
            item.compare_outputs = functools.partial(_compare_without_record, item.compare_outputs)
        tags = item.cell.get("metadata", {}).get("tags") or [] if options else []
        if models[notebook] and _BUNDLED_MODEL_TAG in tags and options.get("check"):  # run unchecked, and say so
            options["check"] = False
            item.user_properties.append((_UNCHECKED_KEY, f"tagged '{_BUNDLED_MODEL_TAG}' ran unchecked ("
                                         f"{_MODEL_ENV_VAR}={models[notebook]} is not the bundled model; their "
                                         "stored output is the bundled model's)"))
    if not config.getoption("trnlab_rules", default=False):
        return  # opt-in: the rules are stricter than nbval, which accepts such notebooks
    for notebook in models:
        if not isinstance(notebook, _NotebookWithEnv):  # the committed file is checked once, by its plain run
            first = next(i for i, item in enumerate(items) if item.parent is notebook)
            items.insert(first, _RulesItem.from_parent(notebook, name="trnlab rules"))


def _compare_without_record(compare, test, ref, skip_compare=None):
    """nbval's comparison of a cell's outputs without :func:`trnlab.run_record.record_run`'s line (either side)."""
    return compare(*([o for o in outputs if _output_record(o) is None] for outputs in (test, ref)), skip_compare)


def _quoted(tags) -> str:
    return " and ".join(f"'{tag}'" for tag in tags)


def _against_the_stored_run(item, tags: list[str]) -> str | None:
    """Run a checked cell tagged ``device-dependent``/``dtype-dependent`` unchecked unless this run matches the stored
    one (saying why in a user property); the failure to raise after it ran if the notebook records no stored run."""
    notebook, options = item.parent, item.options
    if not hasattr(notebook, "_trnlab_stored"):
        notebook._trnlab_stored = stored_run(notebook.nb)
    stored, run = notebook._trnlab_stored, getattr(notebook, "_trnlab_run", None)
    if stored is None:
        options["check"] = False  # it still runs: the cells after it need its state
        return (f"{item.name} is tagged {_quoted(tags)}, but {Path(notebook.path).name} records no device or dtype "
                "for its stored outputs: re-execute it with trnlab.setup() (or trnlab.record_run(device, dtype)) in "
                "an earlier cell, or declare them in the notebook's metadata, e.g. "
                '"trnlab": {"run": {"device": "neuron", "dtype": "bfloat16"}}')
    if run is None:
        why = ("this run recorded no device or dtype before them: call trnlab.setup() or "
               "trnlab.record_run(device, dtype) in an earlier cell")
    else:
        differs = {_DEVICE_TAG: (stored["device"], bool(stored.get("standin"))) !=
                   (run["device"], bool(run.get("standin"))), _DTYPE_TAG: stored["dtype"] != run["dtype"]}
        tags = [tag for tag in tags if differs[tag]]
        if not tags:
            return None  # a matching run: compared as every checked cell is
        why = f"this run is {describe_run(run)}; the stored outputs come from {describe_run(stored)}"
    options["check"] = False
    item.user_properties.append((_UNCHECKED_KEY, f"tagged {_quoted(tags)} ran unchecked ({why})"))
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    options, failure = getattr(item, "options", None), None
    if isinstance(item.parent, IPyNbFile) and options is not None:
        tags = [tag for tag in (_DEVICE_TAG, _DTYPE_TAG) if tag in (item.cell.get("metadata", {}).get("tags") or [])]
        if tags and options["check"] and not options["skip"] and item.cell.get("execution_count") is not None:
            failure = _against_the_stored_run(item, tags)
    try:
        result = yield
    finally:  # this run's record, from record_run's line in this cell's fresh outputs, for the cells after it
        record = next(filter(None, map(_output_record, getattr(item, "test_outputs", None) or [])), None)
        if record is not None:
            item.parent._trnlab_run = record
    if failure:
        pytest.fail(failure, pytrace=False)
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield
    notebook = item.parent
    if isinstance(notebook, IPyNbFile) and not getattr(notebook, "_trnlab_sanitized", False):
        if not item.config.getoption("trnlab_no_sanitize", default=False):
            # After the user's own --nbval-sanitize-with patterns (nbval loaded them in setup).
            for regex, replacement in _course_patterns(item.config.rootpath).items():
                notebook.sanitize_patterns.setdefault(regex, replacement)
        notebook._trnlab_sanitized = True


def pytest_terminal_summary(terminalreporter):
    unchecked: dict[str, dict[str, int]] = {}  # run (test file) -> what and why -> cells, from the reports (xdist's)
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, reason in getattr(report, "user_properties", ()):
                if key == _UNCHECKED_KEY and getattr(report, "when", None) == "call":
                    reasons = unchecked.setdefault(report.nodeid.split("::")[0], {})
                    reasons[reason] = reasons.get(reason, 0) + 1
    if unchecked:
        terminalreporter.section("trnlab: checked cells run unchecked")
    for run, reasons in unchecked.items():
        for reason, cells in reasons.items():
            terminalreporter.write_line(f"{run}: {cells} checked cell(s) {reason}")
