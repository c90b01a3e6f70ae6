"""Normalize the course notebooks so that opening and saving them in JupyterLab changes nothing.

    python tools/normalize_notebooks.py               # every notebooks/*.ipynb, in place
    python tools/normalize_notebooks.py a.ipynb ...   # just these
    python tools/normalize_notebooks.py --check       # exit 1 (and list them) if any would change

`make notebooks` runs it after re-executing the notebooks. For each notebook it:

* stores the kernelspec and language_info that the installed ipykernel reports, exactly as
  JupyterLab would write them when it connects the kernel (otherwise the first save rewrites them);
* keeps, in ``metadata.widgets``, only the widget models that a stored output shows (with the
  models those reference, e.g. a progress bar's layout and style); the rest is stale state;
* drops the per-cell ``metadata.execution`` timestamps nbconvert records (they change on every run);
* writes integral floats in metadata and JSON outputs as ints (46.0 -> 46), as JupyterLab's
  JavaScript does when it saves;
* replaces machine paths in text outputs: the repository root by repo-relative paths, the
  temporary folder by ``<tmp>``, site-packages folders by ``<site-packages>``, a virtual
  environment outside the repository by ``<venv>`` and the home folder by ``~``;
* writes the file the way nbformat (and so Jupyter's save) does: sorted keys, indent 1,
  non-ASCII kept, trailing newline.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# What ipykernel writes; used when ipykernel cannot be imported (it is a jupyterlab dependency).
DEFAULT_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def kernel_metadata() -> tuple[dict, dict]:
    """The kernelspec and language_info the installed ipykernel gives a notebook."""
    kernelspec = dict(DEFAULT_KERNELSPEC)
    language_info = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": sys.version.split()[0],
    }
    try:
        from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

        spec = get_kernel_dict()
        kernelspec = {"display_name": spec["display_name"], "language": spec["language"], "name": KERNEL_NAME}
        from ipykernel.ipkernel import IPythonKernel

        language_info = json.loads(json.dumps(IPythonKernel.language_info))
    except ImportError:
        pass
    return kernelspec, language_info


def _path_replacements(root: Path) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) pairs, most specific first. Each pattern matches a path prefix
    only at a path boundary: not inside a longer word or path."""
    start, end = r"(?<![\w.+-])", r"(?![\w.+-])"
    rules: list[tuple[str, str]] = []
    # Any .../site-packages or .../dist-packages folder, wherever the interpreter lives.
    rules.append((start + r"(?:/[\w.+~-]+)+/(?:site|dist)-packages" + end, "<site-packages>"))
    prefixes = []
    repo = str(root.resolve())
    for raw in {repo, str(root)}:
        prefixes.append((raw + "/", ""))
        prefixes.append((raw, "."))
    venv = os.environ.get("VIRTUAL_ENV") or sys.prefix
    if venv and not Path(venv).resolve().is_relative_to(root.resolve()) and venv != "/usr":
        prefixes.append((venv, "<venv>"))
    tmp = {tempfile.gettempdir(), "/tmp", "/var/tmp"}
    tmp |= {os.path.realpath(t) for t in tmp}
    prefixes += [(t, "<tmp>") for t in tmp if t not in ("", "/")]
    home = os.path.expanduser("~")
    if home not in ("", "/", "~"):
        prefixes.append((home, "~"))
    # Longest first, so that a repository inside $HOME or /tmp becomes repo-relative.
    for prefix, replacement in sorted(prefixes, key=lambda p: -len(p[0])):
        if prefix.endswith("/"):
            rules.append((start + re.escape(prefix), replacement))
        else:
            rules.append((start + re.escape(prefix) + end, replacement))
    return [(re.compile(pattern), replacement) for pattern, replacement in rules]


def replace_paths(text: str, rules) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def _map_text(value, rules):
    if isinstance(value, str):
        return replace_paths(value, rules)
    if isinstance(value, list):
        # nbformat stores multi-line text as a list of lines; join so that no path is split.
        joined = "".join(value) if all(isinstance(v, str) for v in value) else None
        if joined is None:
            return [_map_text(v, rules) for v in value]
        return replace_paths(joined, rules).splitlines(True)
    return value


def _clean_output(output: dict, rules) -> None:
    if "text" in output:  # stream
        output["text"] = _map_text(output["text"], rules)
    if "traceback" in output:  # error: one string per frame, keep them apart
        output["traceback"] = [replace_paths(line, rules) for line in output["traceback"]]
    if "evalue" in output:
        output["evalue"] = replace_paths(output["evalue"], rules)
    for mime, value in output.get("data", {}).items():
        # Text types only: image/png and friends are base64, where "/tmp/" may occur by chance.
        if mime.startswith("text/") or mime == "image/svg+xml":
            output["data"][mime] = _map_text(value, rules)


def _referenced_models(nb) -> set[str]:
    return {
        output["data"][WIDGET_VIEW]["model_id"]
        for cell in nb.cells
        for output in cell.get("outputs", [])
        if WIDGET_VIEW in output.get("data", {}) and "model_id" in output["data"][WIDGET_VIEW]
    }


def _clean_widgets(nb) -> None:
    widgets = nb.metadata.get("widgets")
    if not widgets:
        nb.metadata.pop("widgets", None)
        return
    state = widgets.get(WIDGET_STATE, {}).get("state", {})
    keep, todo = set(), [m for m in _referenced_models(nb) if m in state]
    while todo:  # follow "IPY_MODEL_<id>" references: children, layout, style
        model = todo.pop()
        if model in keep:
            continue
        keep.add(model)
        todo += [m for m in re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model])) if m in state]
    if keep:
        widgets[WIDGET_STATE]["state"] = {m: s for m, s in state.items() if m in keep}
        for mime in [m for m in widgets if m != WIDGET_STATE]:
            del widgets[mime]
    else:
        del nb.metadata["widgets"]


def _js_numbers(value):
    """Integral floats as ints, as JupyterLab's JavaScript writes them back (46.0 -> 46)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        for key in value:
            value[key] = _js_numbers(value[key])
    elif isinstance(value, list):
        value[:] = [_js_numbers(v) for v in value]
    return value


def normalize(nb, root: Path = ROOT):
    """Normalize a notebook node in place and return it."""
    kernelspec, language_info = kernel_metadata()
    nb.metadata["kernelspec"] = kernelspec
    nb.metadata["language_info"] = language_info
    _clean_widgets(nb)
    _js_numbers(nb.metadata)
    rules = _path_replacements(root)
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
        _js_numbers(cell.get("metadata", {}))
        for output in cell.get("outputs", []):
            _clean_output(output, rules)
            _js_numbers(output.get("metadata", {}))
            for mime, data in output.get("data", {}).items():
                if isinstance(data, (dict, list)) and not mime.startswith("text/"):
                    _js_numbers(data)  # JSON outputs (application/json, widget views)
    return nb


def normalized_text(path: Path, root: Path = ROOT) -> str:
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    normalize(nb, root)
    # Exactly what Jupyter's contents manager writes on save (nbformat.write adds the newline).
    text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root for repo-relative paths")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(NOTEBOOKS.glob("*.ipynb"))
    changed = []
    for path in paths:
        old = path.read_text(encoding="utf-8")
        new = normalized_text(path, args.root)
        if new != old:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "would change" if args.check else "normalized"
    for path in changed:
        print(f"{verb}: {path}")
    if not changed:
        print(f"{len(paths)} notebook(s) already normalized")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
