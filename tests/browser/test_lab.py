"""The course in JupyterLab, in Chromium: notebooks open, run and save without surprises.

All of it works on a temporary copy of notebooks/ (see conftest.py): the committed files are
never written, and the session checks at the end that they did not change.
"""

from __future__ import annotations

import difflib
import json
import re
import time

import pytest

NEWS_PROMPT = "official Jupyter news"
RUN_HERE = "The course can run here."


def open_notebook(page, lab, name: str) -> None:
    """Bring the notebook's tab to the front if this page has it open (the tests share one page), else open it
    alone (?reset: no tabs restored from an earlier session); wait for its kernel."""
    if not tab(page, name).count():
        page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    wait_kernel_idle(page, name)


def tab(page, name: str):
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)


FRONT = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def panel(page):
    """The notebook panel in front."""
    return page.locator(FRONT)


def wait_kernel_idle(page, name: str, timeout: float = 60_000) -> None:
    tab(page, name).wait_for(timeout=timeout)
    tab(page, name).click(timeout=timeout)  # six kernels starting at once can stall the page on 2 busy cores
    indicator = panel(page).locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    indicator.wait_for(timeout=timeout)


def menu(page, top: str, item: str) -> None:
    page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel",
                 has_text=re.compile(rf"^{re.escape(item)}$")).click()


def wait_all_run(page, timeout: float = 120) -> None:
    """Wait until the kernel is idle and no cell is queued or running ([*])."""
    deadline = time.monotonic() + timeout
    prompts = panel(page).locator(".jp-CodeCell .jp-InputArea-prompt")
    idle = panel(page).locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    while time.monotonic() < deadline:
        texts = prompts.all_text_contents()  # innerText is empty for cells out of view
        if idle.count() and not any("*" in t for t in texts) and all(re.search(r"\d", t) for t in texts):
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"cells still running after {timeout}s: {prompts.all_text_contents()}")


def error_outputs(page) -> list[str]:
    """Tracebacks shown in the notebook in front. JupyterLab renders an error output with the
    stderr MIME type, like stderr text; what tells them apart is the traceback in it."""
    stderr = panel(page).locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    return [t for t in stderr.all_text_contents()
            if "Traceback" in t or re.search(r"^\w*(Error|Exception)\b", t, re.M)]


def save(page, lab, names: list[str], timeout: float = 20) -> None:
    """Save ``names``: Ctrl+S on the notebook in front (one name), else File > Save All (every open notebook);
    wait until the server has written each."""
    paths = [lab.notebook_dir / name for name in names]
    before = [path.stat().st_mtime_ns for path in paths]
    if len(names) == 1:
        page.keyboard.press("Control+s")
    else:
        menu(page, "File", "Save All")
    deadline = time.monotonic() + timeout
    while unwritten := [n for n, p, t in zip(names, paths, before) if p.stat().st_mtime_ns == t]:
        if time.monotonic() > deadline:
            raise AssertionError(f"saving wrote nothing in {timeout}s to {unwritten}")
        time.sleep(0.1)
    time.sleep(0.3)  # the server writes via a temporary file and a rename; let it finish


def short_diff(old: bytes, new: bytes, name: str, lines: int = 40) -> str:
    diff = difflib.unified_diff(old.decode().splitlines(), new.decode().splitlines(),
                                f"committed/{name}", f"saved by JupyterLab/{name}", lineterm="", n=1)
    return "\n".join(list(diff)[:lines])


def check_tqdm_renders_as_a_widget(page) -> None:
    """Progress bars (tqdm.auto, as Transformers uses) must show as widgets, not as text such as
    `HBox(children=...)`: the ipywidgets extension works in this JupyterLab. A scratch cell at the
    end of the open notebook runs one."""
    panel(page).locator(".jp-Cell").last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below, in command mode
    page.keyboard.press("Enter")  # edit it
    page.keyboard.insert_text("from tqdm.auto import tqdm\n_ = [x for x in tqdm(range(3), desc='scratch')]")
    page.keyboard.press("Shift+Enter")
    output = panel(page).locator(".jp-Cell").filter(has_text="desc='scratch'").locator(".jp-OutputArea-output")
    output.locator(".widget-hprogress").first.wait_for(timeout=60_000)
    text = " ".join(output.all_text_contents())
    assert "HBox(children" not in text and "Error displaying widget" not in text, text[-500:]


def check_bucket_slider_responds(page) -> None:
    """Notebook 03's control, in a scratch cell: the slider renders as a widget, and moving it
    (arrow key on its handle, as a keyboard user would) redraws the line for the new k."""
    panel(page).locator(".jp-Cell").last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.keyboard.press("Enter")
    page.keyboard.insert_text("from trnlab import plots\nplots.bucket_slider([4, 9, 17, 30, 41, 95, 96, 150], max_buckets=4, value=2)")
    page.keyboard.press("Shift+Enter")
    cell = panel(page).locator(".jp-Cell").filter(has_text="plots.bucket_slider(")
    line = cell.locator(".widget-html-content")
    line.filter(has_text="2 bucket(s)").wait_for(timeout=60_000)
    cell.locator(".widget-slider .noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    line.filter(has_text="3 bucket(s)").wait_for(timeout=30_000)
    assert cell.locator(".widget-output img, .jp-OutputArea-output img").count() >= 1, "no redrawn picture"
    text = " ".join(cell.locator(".jp-OutputArea-output").all_text_contents())
    assert "VBox(children" not in text and "Error displaying widget" not in text, text[-500:]


def test_opening_and_saving_every_notebook_changes_nothing(lab, page, shots):
    """JupyterLab once rewrote the kernelspec on open and autosaved. Open every notebook, let its
    kernel start, save them all: the bytes on disk must stay the committed ones."""
    names = sorted(p.name for p in lab.notebook_dir.glob("*.ipynb"))
    original = {n: (lab.notebook_dir / n).read_bytes() for n in names}
    with shots.on_failure("open every notebook"):
        page.goto(f"{lab.url}/lab?reset&token={lab.token}")
        page.locator(".jp-DirListing-item", has_text=names[0]).click()
        page.locator(".jp-DirListing-item", has_text=names[-1]).click(modifiers=["Shift"])
        page.keyboard.press("Enter")  # the file browser opens every selected file, each in its tab
        for name in names:
            wait_kernel_idle(page, name)
        page.wait_for_timeout(1000)  # kernel info (language_info) reaches the model right after
        dirty = [n for n in names if "jp-mod-dirty" in (tab(page, n).get_attribute("class") or "")]
    with shots.on_failure("save every notebook"):
        save(page, lab, names)
    changed = [n for n in names if (lab.notebook_dir / n).read_bytes() != original[n]]
    diffs = "\n\n".join(short_diff(original[n], (lab.notebook_dir / n).read_bytes(), n) for n in changed)
    assert not changed, (f"JupyterLab changed {changed} on open+save; run `python tools/normalize_notebooks.py` "
                         f"(or `make notebooks`):\n{diffs}")
    assert not dirty, f"JupyterLab marks {dirty} modified right after opening them"


def test_notebook_01_runs_in_the_browser_without_errors(lab, page, shots):
    """Run All Cells in notebook 01: no error output, the doctor's verdict shown, no news pop-up;
    a tqdm bar in a scratch cell renders as a widget, and notebook 03's bucket slider responds."""
    name = "01_installation_check.ipynb"
    with shots.on_failure("open notebook 01"):
        open_notebook(page, lab, name)
        menu(page, "Edit", "Clear Outputs of All Cells")
        assert panel(page).get_by_text(RUN_HERE).count() == 0
    started = time.monotonic()
    with shots.on_failure("run all cells of notebook 01"):
        menu(page, "Run", "Run All Cells")
        panel(page).locator(".jp-OutputArea-output", has_text=RUN_HERE).wait_for(timeout=120_000)
        wait_all_run(page)
    with shots.on_failure("notebook 01 outputs"):
        errors = error_outputs(page)
        assert not errors, f"error outputs in {name}:\n" + "\n---\n".join(e[:2000] for e in errors)
        assert page.get_by_text(NEWS_PROMPT).count() == 0, "the Jupyter news pop-up is shown"
    with shots.on_failure("scratch cell with a tqdm progress bar"):
        check_tqdm_renders_as_a_widget(page)
    with shots.on_failure("scratch cell with notebook 03's bucket slider"):
        check_bucket_slider_responds(page)
    with shots.on_failure("save notebook 01"):
        save(page, lab, [name])
    saved = json.loads((lab.notebook_dir / name).read_text())
    outputs = [o for c in saved["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], "the saved notebook holds an error output"
    assert any(RUN_HERE in "".join(o.get("text", "")) for o in outputs)
    print(f"notebook 01 ran in the browser in {time.monotonic() - started:.1f}s")


def test_notebook_04_stored_outputs_render(lab, page, shots):
    """Notebook 04 trains for minutes on a CPU: here it is only opened. Its stored plots must
    render as images and no output may show a widget as text (HBox(...)) or a widget error."""
    name = "04_training.ipynb"
    with shots.on_failure("open notebook 04"):
        open_notebook(page, lab, name)
        images = panel(page).locator(".jp-RenderedImage img")
        images.first.wait_for()
        page.wait_for_function("() => [...document.querySelectorAll('" + FRONT + " .jp-RenderedImage img')]"
                               ".every(img => img.complete && img.naturalWidth > 0)")
        stored = json.loads((lab.notebook_dir / name).read_text())
        pngs = sum("image/png" in o.get("data", {}) for c in stored["cells"] for o in c.get("outputs", []))
        assert images.count() == pngs, f"{images.count()} images shown, {pngs} stored"
        text = " ".join(panel(page).locator(".jp-OutputArea-output").all_text_contents())
        assert "HBox(children" not in text and "Error displaying widget" not in text
        assert not error_outputs(page)
