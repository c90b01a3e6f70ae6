"""Every neuron branch of trnlab and of the notebooks runs in a test: :data:`BRANCHES` lists each, with what takes it.

A neuron branch is an ``if`` (``elif`` too) or a ternary whose test holds the string ``"neuron"``, in ``trnlab/**/*.py``
(not ``trnlab/standin/``: the device itself), or an ``if`` line naming ``"neuron"`` in a notebook's code cell. Its
neuron side is the arm taken when the value compared with ``"neuron"`` is ``"neuron"``: the true arm of ``==``, ``in``,
``is not`` or a call such as ``_backend_available("neuron")``, the false arm of ``!=``, ``not in`` and ``is`` (``getattr(
torch, "neuron", None) is None``), each ``not`` around it swapping them. An arm is taken when its first line runs (for
a false arm without ``else``: when the ``if`` goes on to another line than its body's); a ternary when its line runs.

Each entry says how it is taken: ``"standin"``, by the notebooks' trnlab calls on the stand-in neuron device
(tests/scripts/neuron_paths.py, traced; notebooks: the stand-in nbval pass of ``make test``), or
``"tests/test_x.py::test_y"``, the unit test that takes it with the fake (tests/fake_neuron.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trnlab.standin import cache_dir

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "neuron_paths.py"
STANDIN = "standin"
FIX = "add it to BRANCHES in tests/test_neuron_branches.py with the test that takes it"

HERE = "tests/test_neuron_branches.py::"  # the fake tests below: branches no other unit test takes
BRANCHES = {
    "trnlab/bench.py:_run_generate": HERE + "test_bench_generate_keeps_the_neuron_backend_on_neuron",
    "trnlab/bench.py:main_train": HERE + "test_bench_train_quick_leaves_the_backend_to_transformers_on_neuron",
    "trnlab/generation.py:compile_backend": STANDIN,
    "trnlab/generation.py:compile_backend#2": STANDIN,
    "trnlab/generation.py:generation_compile_config": STANDIN,
    "trnlab/device.py:_neuron_module": STANDIN,
    "trnlab/device.py:_backend_available": HERE + "test_without_torch_accelerator_torch_neuron_answers",
    "trnlab/device.py:_device_count": HERE + "test_without_torch_accelerator_torch_neuron_answers",
    "trnlab/device.py:_bf16_supported": STANDIN,
    "trnlab/device.py:pick_device": STANDIN,
    "trnlab/device.py:resolve_device_map": STANDIN,
    "trnlab/device.py:resolve_device_map#2": "tests/test_device.py::test_device_map_elsewhere",
    "trnlab/device.py:core_holders_notice": STANDIN,
    "trnlab/doctor.py:_Machine.gather": STANDIN,
    "trnlab/doctor.py:device_report": STANDIN,
    "trnlab/doctor.py:_autoload_check": "tests/test_doctor.py::test_no_torch_neuron_beside_torchneuron_says_why",
    "trnlab/launcher.py:_cpu_plan":
        "tests/test_launch.py::test_an_explicit_cpu_device_gives_cpu_processes_where_an_accelerator_exists",
    "trnlab/launcher.py:plan_processes": STANDIN,
    "trnlab/launcher.py:plan_processes#2": STANDIN,
    "trnlab/launcher.py:plan_processes#3": "tests/test_launch.py::test_neuron_plan_is_one_process_per_visible_neuroncore",
    "trnlab/launcher.py:_launch_command": HERE + "test_launch_on_neuron_names_the_processes_holding_neuroncores",
    "trnlab/launcher.py:launch": HERE + "test_launch_on_neuron_names_the_processes_holding_neuroncores",
    "trnlab/training.py:precision_choice": STANDIN,
    "trnlab/training.py:_page_arguments": STANDIN,
    'notebooks/01_installation_check.ipynb: if report.backend == "neuron":': STANDIN,
    # its real-TorchNeuron arm: tests/test_installation_check.py, with the fake
    'notebooks/01_installation_check.ipynb: if report.backend == "neuron":   # a trn2, or this kernel on the stand-in: '
    "the page's line above ran in it": STANDIN,
    'notebooks/02_inference.ipynb: if device.type == "neuron":': STANDIN,
    'notebooks/02_inference.ipynb: if device.type == "neuron": #2': STANDIN,
    'notebooks/03_compiled_generation.ipynb: if device.type == "neuron":': STANDIN,
    'notebooks/03_compiled_generation.ipynb: if device.type == "neuron":   # the first graphs of this kernel: every '
    "entry is the page call's": STANDIN,
    'notebooks/04_training.ipynb: if device.type == "neuron":': STANDIN,
    'notebooks/04_training.ipynb: if device.type == "neuron":   # the first training run of this kernel: every entry '
    "is this run's": STANDIN,
}


@dataclass(frozen=True)
class Branch:
    """One neuron branch: where it is, its test, and the lines that show its neuron side ran."""

    file: str
    line: int
    test: str
    ternary: bool = False
    neuron_arm: bool = True
    test_lines: tuple[int, int] = (0, 0)  # first and last line of the if's test
    arm_line: int = 0                     # first line of the neuron arm; 0: a false arm without else
    body_line: int = 0                    # first line of the if's body


def _mentions_neuron(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == "neuron" for n in ast.walk(node))


def _neuron_arm(test: ast.expr) -> bool:
    """The arm (True/False) the test takes when the value compared with "neuron" is "neuron" (module docstring)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not _neuron_arm(test.operand)
    if isinstance(test, ast.BoolOp):
        return _neuron_arm(next(v for v in test.values if _mentions_neuron(v)))
    if isinstance(test, ast.Compare):
        return not isinstance(test.ops[0], (ast.NotEq, ast.NotIn, ast.Is))
    return True


def _branch(rel: str, node: ast.If | ast.IfExp) -> Branch:
    arm, text = _neuron_arm(node.test), ast.unparse(node.test)
    if isinstance(node, ast.IfExp):
        return Branch(rel, node.lineno, text, ternary=True, neuron_arm=arm)
    body = node.body if arm else node.orelse
    if body and body[0].lineno <= node.test.end_lineno:
        raise AssertionError(f"{rel}:{node.lineno}: put the body of `if {text}:` on its own line, so a line tracer "
                             "can tell its arms apart")
    return Branch(rel, node.lineno, text, neuron_arm=arm, test_lines=(node.test.lineno, node.test.end_lineno),
                  arm_line=body[0].lineno if body else 0, body_line=node.body[0].lineno)


def scan_python(root: Path, rel: str) -> dict[str, Branch]:
    """``{"trnlab/x.py:function": Branch}`` for each neuron branch of one file, ``#2``, ``#3`` for later ones."""
    found: dict[str, Branch] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.If, ast.IfExp)) and _mentions_neuron(child.test):
                key = f"{rel}:{scope}"
                n = sum(k == key or k.startswith(key + "#") for k in found)
                found[key if n == 0 else f"{key}#{n + 1}"] = _branch(rel, child)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, child.name if scope == "<module>" else f"{scope}.{child.name}")
            else:
                visit(child, scope)

    visit(ast.parse((root / rel).read_text(), rel), "<module>")
    return found


IF_LINE = re.compile(r"""\b(?:el)?if\b.*["']neuron["']""")


def scan_notebook(root: Path, rel: str) -> dict[str, Branch]:
    """``{"notebooks/x.ipynb: <line>": Branch}`` for each code-cell line ``if ... "neuron"``, `` #2`` for repeats."""
    found: dict[str, Branch] = {}
    for cell in json.loads((root / rel).read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        for line in "".join(cell["source"]).splitlines():
            if IF_LINE.search(line):
                text = re.sub(r"\s+#[^\"']*$", "", line.strip())  # without its comment
                key = f"{rel}: {text}"
                n = sum(k == key or k.startswith(key + " #") for k in found)
                found[key if n == 0 else f"{key} #{n + 1}"] = Branch(rel, 0, text)
    return found


def scan(root: Path = ROOT) -> dict[str, Branch]:
    """Every neuron branch of ``root``'s trnlab/ (not trnlab/standin/) and notebooks/."""
    found: dict[str, Branch] = {}
    for path in sorted((root / "trnlab").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not rel.startswith("trnlab/standin/"):
            found.update(scan_python(root, rel))
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        found.update(scan_notebook(root, path.relative_to(root).as_posix()))
    return found


FOUND = scan()


def test_every_neuron_branch_is_listed_and_every_listed_one_exists():
    unlisted = [f"{key} (line {b.line}: {b.test})" if b.line else key
                for key, b in FOUND.items() if key not in BRANCHES]
    gone = [key for key in BRANCHES if key not in FOUND]
    problems = []
    if unlisted:
        problems.append(f"neuron branch(es) that no test is listed for: {'; '.join(unlisted)}. For each, {FIX}: "
                        '"standin" if a notebook path on the stand-in takes it (then call that path in '
                        'tests/scripts/neuron_paths.py), else "tests/test_x.py::test_y", the test that takes it with '
                        "the fake_neuron fixture")
    if gone:
        problems.append(f"listed in BRANCHES but not in the code any more: {'; '.join(gone)}. Remove them from "
                        "BRANCHES in tests/test_neuron_branches.py, or rename their key (a renamed function, a moved "
                        "branch)")
    assert not problems, "\n".join(problems)


def test_the_scan_finds_each_kind_of_branch_and_its_neuron_side(tmp_path):
    (tmp_path / "trnlab").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "trnlab" / "m.py").write_text(
        'if FLAG == "neuron":\n    a = 1\n'
        "class C:\n"
        "    def f(self, x, b):\n"
        '        if not x != "neuron":\n            return 1\n'
        '        if b and x != "neuron":\n            return 2\n        else:\n            return 3\n'
        '        y = 1 if x in ("neuron", "cuda") else 2\n'
        '        if getattr(x, "neuron", None) is None:\n            return 4\n'
        '        return y\n')
    cell = {"cell_type": "code", "source": ['if device.type == "neuron":  # a comment\n', "    pass\n",
                                            'elif device.type == "neuron":\n', '    pass\n']}
    (tmp_path / "notebooks" / "n.ipynb").write_text(json.dumps({"cells": [cell]}))
    found = scan(tmp_path)
    assert {k: (b.neuron_arm, b.arm_line, b.ternary) for k, b in found.items()} == {
        "trnlab/m.py:<module>": (True, 2, False),
        "trnlab/m.py:C.f": (True, 6, False),
        "trnlab/m.py:C.f#2": (False, 10, False),
        "trnlab/m.py:C.f#3": (True, 0, True),
        "trnlab/m.py:C.f#4": (False, 0, False),
        'notebooks/n.ipynb: if device.type == "neuron":': (True, 0, False),
        'notebooks/n.ipynb: elif device.type == "neuron":': (True, 0, False),
    }
    assert found["trnlab/m.py:C.f#4"].test_lines == (12, 12)


def test_every_entry_names_the_stand_in_or_a_test_that_exists():
    for key, taken_by in BRANCHES.items():
        if taken_by == STANDIN:
            continue
        assert key.startswith("trnlab/"), f"{key}: the stand-in pass takes notebook branches: list it as 'standin'"
        path, _, name = taken_by.partition("::")
        assert re.fullmatch(r"tests/test_\w+\.py", path) and name, (
            f"BRANCHES[{key!r}] = {taken_by!r}: write 'standin' or 'tests/test_x.py::test_y'")
        exists = (ROOT / path).is_file() and re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M)
        assert exists, f"BRANCHES[{key!r}] names {taken_by}, which does not exist: name the test that takes this branch"


#: Set in the traced pytest run of the fake tests: the tracer is not started again inside it.
TRACE_VAR = "TRNLAB_BRANCH_TRACE"
STANDIN_BUILDS = shutil.which(os.environ.get("CXX", "c++")) is not None or (cache_dir() / "ready").exists()
needs_compiler = pytest.mark.skipif(not STANDIN_BUILDS, reason="the stand-in is built with a C++ compiler: "
                                                               "apt-get install g++")


def _start(out: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("TRNLAB_")}  # no settings
    env = {**clean, "OMP_NUM_THREADS": "1", TRACE_VAR: "1", **env,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(out.with_suffix(".log"), "w") as log:
        return subprocess.Popen([sys.executable, str(SCRIPT), str(out), *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT), out


def _finish(started: tuple[subprocess.Popen, Path], what: str) -> dict:
    process, out = started
    process.wait(timeout=900)
    assert process.returncode == 0, (f"{SCRIPT.relative_to(ROOT)} {what} failed:\n"
                                     f"{out.with_suffix('.log').read_text()[-4000:]}")
    ran = json.loads(out.read_text())
    assert ran["facts"]["trnlab"].startswith(str(ROOT / "trnlab")), f"{what}: it imported {ran['facts']['trnlab']}"
    return ran


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """tests/scripts/neuron_paths.py on the stand-in and on the fake tests BRANCHES names, started together."""
    if os.environ.get(TRACE_VAR):
        pytest.fail(f"{TRACE_VAR} is set: BRANCHES names a test that traces, list the unit test that takes the branch")
    folder = tmp_path_factory.mktemp("neuron-paths")
    fake = {"TRNLAB_NEURON_STANDIN": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # no nbval: seconds less
    runs = {"fake": _start(folder / "fake.json", fake, "--pytest", *sorted(set(BRANCHES.values()) - {STANDIN}))}
    if STANDIN_BUILDS:
        runs["standin"] = _start(folder / "standin.json", {"TRNLAB_NEURON_STANDIN": "1"})
    yield runs
    for process, _ in runs.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def standin_run(started) -> dict:
    """The trnlab lines the notebooks' calls ran on the stand-in, and what they returned."""
    return _finish(started["standin"], "on the stand-in")


@pytest.fixture(scope="module")
def fake_run(started) -> dict:
    """The trnlab lines each test BRANCHES names ran, by node id."""
    return _finish(started["fake"], "--pytest (the tests BRANCHES names)")


def _taken(branch: Branch, ran: dict) -> bool:
    lines, edges = set(ran["lines"].get(branch.file, ())), ran["edges"].get(branch.file, ())
    if branch.ternary:
        return branch.line in lines
    if branch.arm_line:
        return branch.arm_line in lines
    first, last = branch.test_lines  # a false arm without else: from the test to a line other than the body's
    return any(first <= a <= last and not first <= b <= last and b != branch.body_line for a, b in edges)


def test_an_arm_is_taken_when_its_first_line_runs_or_the_if_jumps_past_its_body():
    def ran(*edges):
        return {"lines": {"m.py": sorted({n for edge in edges for n in edge if n})}, "edges": {"m.py": list(edges)}}

    true_arm = Branch("m.py", 12, "x == 'neuron'", test_lines=(12, 13), arm_line=14, body_line=14)
    assert _taken(true_arm, ran((12, 13), (13, 14))) and not _taken(true_arm, ran((12, 13), (13, 20)))
    false_arm = Branch("m.py", 12, "x != 'neuron'", neuron_arm=False, test_lines=(12, 13), body_line=14)
    assert _taken(false_arm, ran((12, 13), (13, 20))) and _taken(false_arm, ran((12, 0)))  # past the body, or return
    assert not _taken(false_arm, ran((12, 13), (13, 14))) and not _taken(false_arm, ran((11, 20)))
    ternary = Branch("m.py", 12, "x == 'neuron'", ternary=True)
    assert _taken(ternary, ran((11, 12))) and not _taken(ternary, ran((11, 13)))


def _describe(key: str, b: Branch) -> str:
    kind, arm = "ternary" if b.ternary else "if", "true" if b.neuron_arm else "false"
    return f"{key} (line {b.line}: {kind} {b.test}, {arm} arm)"


@needs_compiler
def test_the_stand_in_runs_the_notebooks_trnlab_paths_on_a_neuron_device(standin_run):
    facts = standin_run["facts"]
    assert facts["standin"] and facts["device"] == "neuron:0" and facts["report_backend"] == "neuron"
    assert "Using neuron: 4 NeuronCore(s) visible (STAND-IN neuron device" in facts["setup"]  # pick_device's arm
    assert "\nrun record for nbval: neuron (STAND-IN), bfloat16\n" in facts["setup"]  # what the plugin reads
    assert facts["failed_checks"] == []
    assert (facts["device_map_auto"], facts["device_map_warned"], facts["device_map"]) == ("neuron", True, "neuron:0")
    assert (facts["dtype"], facts["backend"], facts["compile_config"]) == ("torch.bfloat16", "neuron", "None")
    assert facts["memory"].startswith("neuron:0: ") and "allocated by tensors now" in facts["memory"]
    assert facts["plan"].startswith("4 process(es) on neuron, backend neuron: one process per NeuronCore, 4 visible")
    assert "STAND-IN: each rank's core is host memory, its collectives gloo's" in facts["plan"]
    assert facts["model_device"] == facts["args_device"] == "neuron:0" and facts["args_backend"] == "neuron"
    assert facts["precision"].startswith("bf16=True: every Trainium generation computes in bfloat16 natively")
    assert (facts["graphs"], facts["output_device"]) == (0, "cpu")  # generate's output comes back to the CPU
    assert ("0 graph(s) the STAND-IN backend received, no NEFF (0 forward, 0 backward, 0 inference) since setup()"
            in facts["summary"])


@needs_compiler
def test_the_stand_in_takes_the_neuron_side_of_each_branch_listed_as_standin(standin_run):
    ran = standin_run["runs"]["standin"]
    missed = [_describe(key, b) for key, b in FOUND.items()
              if key.startswith("trnlab/") and BRANCHES.get(key) == STANDIN and not _taken(b, ran)]
    assert not missed, (f"the stand-in run of tests/scripts/neuron_paths.py did not take the neuron side of: "
                        f"{'; '.join(missed)}. Call the notebook path that takes it in that script, or list in "
                        "BRANCHES in tests/test_neuron_branches.py the test that takes it with the fake")


def test_each_test_that_branches_names_takes_the_neuron_side_of_its_branch(fake_run):
    missed = []
    for key, b in FOUND.items():
        test = BRANCHES.get(key, STANDIN)
        if test != STANDIN and not _taken(b, fake_run["runs"].get(test, {"lines": {}, "edges": {}})):
            missed.append(f"{_describe(key, b)}: {test} " + ("ran but did not take it" if test in fake_run["runs"]
                                                            else "did not run"))
    assert not missed, (f"{'; '.join(missed)}. Name in BRANCHES in tests/test_neuron_branches.py the test that takes "
                        "it with the fake, or make that test take it")


def _notebook_condition(line: str) -> ast.expr:
    """The test of the ``if`` (or ternary) naming "neuron" on one notebook line."""
    line = line.removeprefix("el")
    try:
        tree = ast.parse(line)
    except SyntaxError:  # an if's first line: give it a body
        tree = ast.parse(line + "\n    pass")
    return next(n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp)) and _mentions_neuron(n.test))


#: The values a notebook's neuron branch may test, and the trnlab call that sets each (neuron on the stand-in).
MADE_BY = {"device.type": r"^device = trnlab\.setup\(", "report.backend": r"^report = show_report\("}


def test_the_notebooks_branches_run_in_make_tests_stand_in_pass():
    """make test's stand-in pass runs every code cell; each branch tests a value the stand-in makes "neuron"."""
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "Makefile: no `test:` target"
    env = re.search(r'--notebook-env\s+"([^"]*)"', recipe.group(1))
    standin_pass = (env is not None and "TRNLAB_NEURON_STANDIN=1" in env.group(1).split()
                    and " notebooks " in recipe.group(1))
    assert standin_pass, (
        'Makefile\'s test target must run the notebooks once more with --notebook-env "TRNLAB_NEURON_STANDIN=1 ...": '
        "that pass takes the notebooks' neuron branches listed in tests/test_neuron_branches.py")
    for key, branch in FOUND.items():
        if not key.startswith("notebooks/"):
            continue
        test = _notebook_condition(branch.test)
        name = ast.unparse(test.left) if isinstance(test, ast.Compare) else ""
        assert name in MADE_BY and isinstance(test.ops[0], ast.Eq), (
            f'{key}: the stand-in pass takes a notebook branch on `device.type == "neuron"` (device = trnlab.setup()) '
            'or `report.backend == "neuron"` (report = show_report(), from trnlab.doctor): test one of those')
        cells = json.loads((ROOT / branch.file).read_text())["cells"]
        code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
        assert re.search(MADE_BY[name], code, re.M), (
            f"{key}: {branch.file} tests {name} but does not set it with {MADE_BY[name]!r}, which the stand-in "
            "makes neuron (test_the_stand_in_runs_the_notebooks_trnlab_paths_on_a_neuron_device)")


# The fake tests: neuron branches that no other unit test takes (tests/fake_neuron.py's fake; nothing is launched).

NEURON_LS = """\
| NEURON | NEURON |  PID  |     COMMAND     |
| DEVICE | CORES  |       |                 |
| 0      | 4      | 4343  | python train.py |"""


class _Stop(Exception):
    """Raised by a stub once the branch under test is behind: the rest (a model, a run) is not needed."""


def _stop(*args, **kwargs):
    raise _Stop(args)


def test_without_torch_accelerator_torch_neuron_answers(fake_neuron, monkeypatch):
    from trnlab import device as dev

    monkeypatch.setattr(dev, "_current_accelerator", lambda: None)  # a torch or TorchNeuron without torch.accelerator
    assert dev._backend_available("neuron") and dev._device_count("neuron") == 4 and dev.detect_backend() == "neuron"
    fake_neuron.cores = 2
    assert dev._device_count("neuron") == 2
    fake_neuron.cores = 0
    assert not dev._backend_available("neuron") and dev._device_count("neuron") == 0


def test_launch_on_neuron_names_the_processes_holding_neuroncores(fake_neuron, monkeypatch, capsys):
    from trnlab import launcher

    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    monkeypatch.setattr(launcher, "_neuron_ls_output", lambda: NEURON_LS)
    monkeypatch.setattr(launcher, "_run_commands", lambda commands, *rest: commands)  # nothing starts
    assert launcher.launch("train.py", timeout=60) == [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                        "--nproc-per-node=4", "--tee=3", "train.py"]]
    said = capsys.readouterr().out
    assert "[trnlab] NeuronCores: held by PID 4343 (python train.py) (neuron-ls)" in said  # trnlab.device's notice
    launcher.launch("train.py", nproc_per_node=1, device="cpu", timeout=60)
    assert "NeuronCores: held by" not in capsys.readouterr().out  # CPU ranks hold no NeuronCore


def test_bench_generate_keeps_the_neuron_backend_on_neuron(fake_neuron, monkeypatch):
    from trnlab import bench

    asked, real = [], bench.compile_backend
    monkeypatch.setattr(bench, "compile_backend", lambda device, requested: asked.append(requested) or
                        real(device, requested))
    monkeypatch.setattr(bench, "sample_prompt_lengths", _stop)
    for device in ("neuron", "cpu"):
        with pytest.raises(_Stop):  # the full run, no --backend
            bench._run_generate(bench._generate_args(["--device", device]), model=object(), tokenizer=object())
    assert asked == [None, bench._MEASURED_BACKEND]  # Neuron compiles with its own backend


def test_bench_train_quick_leaves_the_backend_to_transformers_on_neuron(fake_neuron, monkeypatch):
    from trnlab import bench

    monkeypatch.setattr(bench, "_run_strategies", _stop)
    chosen = {}
    for device in ("neuron", "cpu"):
        with pytest.raises(_Stop) as stopped:
            bench.main_train(["--quick", "--device", device])
        _, run_on, backend, *_ = stopped.value.args[0]
        chosen[str(run_on)] = backend
    assert chosen == {"neuron": None, "cpu": "eager"}  # quick runs eager graphs off Neuron only
