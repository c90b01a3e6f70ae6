"""The README's CI recipe for a learner's own repository, run as written in a small outside repository.

The recipe's bash block runs unchanged (``bash -e``, as a CI step runs it) in a fresh git repository
under ``tmp_path``; only ``TRNLAB_SOURCE`` is set, to a ``git+file://`` URL of a commit holding this
checkout's working tree. To keep it to seconds, the packages the recipe would download (torch,
Transformers, nbval...) are lent from this test's own environment on ``PYTHONPATH``, as a CI cache
would: pip finds them installed. trnlab and pip are left out of that loan, so the venv's own pip
builds trnlab from the git URL (setuptools for its isolated build comes from the index) and
installs it into the new ``.venv``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPE_FILE = REPO / "README.md"
START, END = "<!-- learner-ci:start -->", "<!-- learner-ci:end -->"
# Not lent to the recipe's venv: what it must install (trnlab) or bring itself (pip).
NOT_LENT = re.compile(r"^(__editable__.*|trnlab.*|pip|pip-.*|.*\.pth)$")
GIT = ["git", "-c", "user.name=learner", "-c", "user.email=learner@example.com", "-c", "commit.gpgsign=false"]

CHECKED = "# NBVAL_CHECK_OUTPUT\n"
CELLS = [  # (source, the output stored as if executed on the learner's machine)
    (CHECKED + "import sys\nfrom pathlib import Path\nimport trnlab\n"
     "print(\"trnlab from this repo's .venv:\", Path(trnlab.__file__).is_relative_to(sys.prefix))",
     "trnlab from this repo's .venv: True\n"),
    # The stored timing can never be printed again: this cell passes only if the plugin sanitizes it.
    (CHECKED + "import time\nstart = time.perf_counter()\nprint(f\"tokenized in {time.perf_counter() - start:.3f} s\")",
     "tokenized in 987.654 s\n"),
]


def recipe(text: str) -> str:
    """The one ```bash block between the learner-ci markers of ``text``."""
    assert text.count(START) == 1 and text.count(END) == 1, f"{RECIPE_FILE}: one {START} ... {END} pair expected"
    blocks = re.findall(r"^```bash\n(.*?)^```$", text.split(START)[1].split(END)[0], re.S | re.M)
    assert len(blocks) == 1, f"{RECIPE_FILE}: one ```bash block expected between the learner-ci markers"
    return blocks[0]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _snapshot(dest: Path) -> str:
    """A new git repository whose one commit holds this checkout's working tree as it is now (edits included).

    Not a clone: a CI checkout is shallow, and pip's ``git clone --filter=blob:none`` of a clone of a
    shallow repository never ends.
    """
    dest.mkdir()
    _git(dest, "init", "-q")
    tree = ["--git-dir", str(dest / ".git"), "--work-tree", str(REPO)]
    _git(dest, *tree, "add", "-A")  # what this checkout's .gitignore leaves out stays out
    _git(dest, *tree, "commit", "-q", "-m", "this checkout's working tree")
    return _git(dest, "rev-parse", "HEAD")


def _learner_repo(root: Path) -> Path:
    """A learner's repository: one notebook, committed executed with its outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for count, (source, text) in enumerate(CELLS, start=1):
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    (root / "notebooks").mkdir(parents=True)
    nbformat.write(nb, root / "notebooks" / "first.ipynb")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "first notebook")
    return root


def _lent_packages(dest: Path) -> Path:
    """A folder of links to this environment's installed packages, less trnlab, pip and setuptools."""
    dest.mkdir()
    for site in dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")):
        for entry in Path(site).iterdir():
            if not NOT_LENT.match(entry.name) and not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)
    return dest


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """Run the recipe once in a learner's repository; the repository, its run and the trnlab commit."""
    tmp = tmp_path_factory.mktemp("learner-ci")
    commit = _snapshot(tmp / "trnlab")
    repo = _learner_repo(tmp / "project")
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)  # `python` is this test's Python, whatever PATH holds
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONHOME", "PIP_USER")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(_lent_packages(tmp / "lent")),
               TRNLAB_SOURCE=f"git+file://{tmp / 'trnlab'}", OMP_NUM_THREADS="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_RETRIES="0", PIP_TIMEOUT="20", PIP_DEFAULT_TIMEOUT="20")  # an unreachable index fails fast
    script = recipe(RECIPE_FILE.read_text())

    def run(text: str, folder: Path) -> subprocess.CompletedProcess:
        (tmp / "recipe.sh").write_text(text)
        return subprocess.run(["bash", "-e", str(tmp / "recipe.sh")], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=300)

    return {"repo": repo, "commit": commit, "url": env["TRNLAB_SOURCE"], "script": script, "run": run,
            "result": run(script, repo)}


def test_recipe_installs_this_checkout_and_the_notebook_passes(learner):
    result, repo = learner["result"], learner["repo"]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert re.search(r"\b2 passed\b", result.stdout), result.stdout[-2000:]
    (record,) = (repo / ".venv").glob("lib/python*/site-packages/trnlab-*.dist-info/direct_url.json")
    origin = json.loads(record.read_text())
    assert origin["url"] == learner["url"].removeprefix("git+")
    assert origin["vcs_info"] == {"vcs": "git", "commit_id": learner["commit"]}
    assert _git(repo, "status", "--porcelain", "--untracked-files=no") == "", "the recipe changed a committed file"


def test_recipe_from_an_index_fails(learner):
    """Near miss: the recipe's install line with `trnlab` for its source fails: no index has trnlab. Run by the
    recipe's pip, in its venv, which has trnlab already: --ignore-installed asks the index all the same, --dry-run
    installs nothing."""
    (line,) = [line for line in learner["script"].splitlines() if '"${TRNLAB_SOURCE:?' in line]
    source = re.search(r'"\$\{TRNLAB_SOURCE:\?[^}]*\}"', line)[0]
    miss = line.replace(source, "trnlab").replace("pip install", "pip install --dry-run --ignore-installed", 1)
    result = learner["run"](f". .venv/bin/activate\n{miss}\n", learner["repo"])
    assert result.returncode != 0, result.stdout[-2000:]
    assert "No matching distribution found for trnlab" in result.stderr, result.stderr[-2000:]


def test_recipe_without_a_source_stops_and_says_what_to_set(learner):
    """Near miss: with TRNLAB_SOURCE unset, the recipe's install line stops before pip, naming the variable and what
    to set it to (the course names no address of its own)."""
    (line,) = [line for line in learner["script"].splitlines() if '"${TRNLAB_SOURCE:?' in line]
    result = learner["run"](f". .venv/bin/activate\nunset TRNLAB_SOURCE\n{line}\n", learner["repo"])
    assert result.returncode != 0, result.stdout[-2000:]
    assert "TRNLAB_SOURCE: set it to git+<URL of this repository>, or a checkout path" in result.stderr, (
        result.stderr[-2000:])
