"""JupyterLab in a real browser: `make lab`'s own command, on a temporary copy of the notebooks.

Needs Debian's Chromium (/usr/bin/chromium; `apt-get install chromium`) and Playwright's Python
package (`pip install playwright`; its own browser download is not used). Without them these
tests are skipped, except under CI=true, where they fail.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHROMIUM = Path(os.environ.get("TRNLAB_CHROMIUM", "/usr/bin/chromium"))
TOKEN = "trnlab-browser-test"
INSTALL_HINT = ("install both: `apt-get install -y chromium` (Debian's Chromium at /usr/bin/chromium, "
                "or set TRNLAB_CHROMIUM) and `pip install playwright` (or `make test`, which installs it)")
# Flags for a closed network: without them Chromium keeps trying Google's hosts.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing() -> list[str]:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"Chromium ({CHROMIUM} not found)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package")
    return missing


@pytest.fixture(scope="session")
def browser_tools():
    missing = _missing()
    if missing:
        message = f"browser tests need {' and '.join(missing)}: {INSTALL_HINT}"
        if _in_ci():
            pytest.fail(message + " (CI=true: failing instead of skipping)", pytrace=False)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_command(notebook_dir: Path, port: int) -> str:
    """The `jupyter lab` line `make lab` runs (from `make -n`), for this folder, port and token."""
    lab_args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} "
                f"--ServerApp.port_retries=0 --IdentityProvider.token={TOKEN}")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "--no-print-directory", "-n", "lab", f"VENV={sys.prefix}",
                          f"NOTEBOOKS={notebook_dir}", f"LAB_ARGS={lab_args}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    lines = [line for line in dry.splitlines() if re.search(r"/jupyter lab ", line)]
    assert lines, f"`make -n lab` runs no `jupyter lab`:\n{dry}"
    return lines[-1]


def _our_processes(marker: str) -> list[psutil.Process]:
    """Processes whose command line names `marker` (a folder of this test session's)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
    return found


class Lab:
    def __init__(self, base: Path, notebook_dir: Path):
        self.base, self.notebook_dir, self.token = base, notebook_dir, TOKEN
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = base / "jupyter-lab.log"
        self.command = lab_command(notebook_dir, self.port)
        # Isolated from ~/.jupyter: no user settings or workspaces of whoever runs the tests, and
        # the kernels' connection files in a folder of ours, to find any kernel left behind.
        self.runtime = base / "runtime"
        env = dict(os.environ,
                   JUPYTER_CONFIG_DIR=str(base / "config"),
                   JUPYTER_RUNTIME_DIR=str(self.runtime),
                   JUPYTERLAB_SETTINGS_DIR=str(base / "user-settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
                   PYTHONUNBUFFERED="1")
        for key in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
            env.pop(key, None)
        # JupyterLab 4 renders only the cells in view (windowing); render them all, so that
        # counting the outputs on the page does not depend on the window's height.
        tracker = base / "user-settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True, exist_ok=True)
        tracker.write_text('{"windowingMode": "none"}\n')
        self.log_file = open(self.log, "w")
        # Its own process group (session), so that stopping it cannot hit pytest.
        self.proc = subprocess.Popen(["bash", "-c", self.command], cwd=ROOT, env=env,
                                     stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log.read_text()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.3)
        raise AssertionError(f"jupyter lab not answering after {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> list[str]:
        """Stop the server by its process group; return what was left running (killed then)."""
        problems = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            problems.append("jupyter lab did not stop within 30 s of SIGTERM")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.log_file.close()
        # Kernels run in their own session: find them by their connection file in our runtime dir.
        deadline = time.monotonic() + 10
        while (left := _our_processes(str(self.runtime))) and time.monotonic() < deadline:
            time.sleep(0.2)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                problems.append(f"left running: pid {proc.pid} {' '.join(proc.cmdline())[:200]}")
                proc.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 0)
            problems.append(f"process group {self.proc.pid} still has processes")
        return problems


@pytest.fixture(scope="session")
def committed_bytes():
    """The committed notebooks' bytes, to check at the end that no test changed them."""
    return {p.name: p.read_bytes() for p in sorted(NOTEBOOKS.glob("*.ipynb"))}


@pytest.fixture(scope="session")
def lab(browser_tools, tmp_path_factory, committed_bytes):
    """`make lab`'s JupyterLab on a copy of notebooks/ in a temporary folder, started once."""
    base = tmp_path_factory.mktemp("lab")
    notebook_dir = base / "notebooks"
    shutil.copytree(NOTEBOOKS, notebook_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    server = Lab(base, notebook_dir)
    try:
        server.wait_ready()
        yield server
    finally:
        problems = server.stop()
        changed = [n for n, b in committed_bytes.items() if (NOTEBOOKS / n).read_bytes() != b]
        problems += [f"committed notebook changed during the tests: {n}" for n in changed]
        assert not problems, "\n".join(problems) + f"\nserver log: {server.log}"


@pytest.fixture(scope="session")
def browser(lab, tmp_path_factory):
    """Debian's Chromium driven by Playwright, with its profile in a temporary folder."""
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()
    # The browser and Playwright's driver must be gone too.
    deadline = time.monotonic() + 10
    while (left := _our_processes(str(profile))) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, f"browser processes left running: {[p.pid for p in left]}"


class Screenshots:
    """Screenshots of a page, taken on failure and named in the failure message."""

    def __init__(self, page, folder: Path):
        self.page, self.folder, self.taken = page, folder, []

    def take(self, name: str) -> Path:
        slug = re.sub(r"[^\w.-]+", "_", name)
        path = self.folder / f"{len(self.taken):02d}-{slug}.png"
        with contextlib.suppress(Exception):
            self.page.screenshot(path=str(path), full_page=True)
            self.taken.append(path)
        return path

    @contextlib.contextmanager
    def on_failure(self, what: str):
        try:
            yield
        except BaseException as error:
            shot = self.take(what)
            if isinstance(error, (AssertionError, Exception)) and not isinstance(error, pytest.skip.Exception):
                raise AssertionError(f"{what}: {error}\nscreenshot: {shot}") from error
            raise


@pytest.fixture(scope="module")
def page(browser):
    """One page for a module's tests: what a notebook opened in one test stays open, with its kernel, for the next."""
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        page.close()


@pytest.fixture
def shots(page, tmp_path):
    return Screenshots(page, tmp_path)
