"""Every chapter in real JupyterLab, in Debian's Chromium driven by Playwright, set up as a learner.

The Lab is the one a learner without `make` gets: a copy of the course set up with the README's
pip-only commands, as written, in a fresh venv with no `make` on ``PATH``, and started with the
README's `forge-course lab` (`tests/test_lab.py` keeps the README's Windows commands the same).
So a chapter opening with a live kernel here is also the pip-only path's promise kept.

For each released chapter: Run All; then the chapter's widgets must render as widgets (not as
``VBox(...)`` text), its figures must appear, moving a slider must change the simulation's
picture, and the only errors allowed are the unanswered exercises' own messages. A screenshot
of each chapter lands in ``test-artifacts/browser/``. Without Chromium the test skips, unless
``FORGE_REQUIRE_BROWSER=1`` (set by CI) makes a missing browser a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request

import pytest

from tests.conftest import CHAPTERS, REPO
from tests.lab_server import TOKEN, get, pip_only_lab, shared_pip_only_course, shut_down_kernels

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = REPO / "test-artifacts" / "browser"
# What an unanswered exercise is allowed to print: our checks' own messages.
EXPECTED_ERRORS = ("NotImplementedError", "not written yet", "No answer yet")

if CHROMIUM is None:
    if os.environ.get("FORGE_REQUIRE_BROWSER"):
        raise RuntimeError("FORGE_REQUIRE_BROWSER is set but Chromium is not installed")
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    course = shared_pip_only_course(tmp_path_factory)
    state = tmp_path_factory.mktemp("lab")
    with pip_only_lab(course, state) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"],
        )  # fmt: skip
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            yield base, page
        finally:
            browser.close()


@pytest.mark.slow
def test_the_pip_only_lab_serves_the_course_index(browser_page):
    base, _ = browser_page
    # The address a learner opens: the token in the URL, no other credential.
    with urllib.request.urlopen(f"{base}/lab?token={TOKEN}", timeout=10) as response:
        assert response.status == 200 and "JupyterLab" in response.read().decode()
    index = json.loads(get(f"{base}/api/contents/notebooks/index.ipynb"))
    assert index["type"] == "notebook" and index["content"]["cells"]


ALL_RAN = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
}"""


def _open_and_run_all(page, base: str, path: str) -> None:
    page.goto(f"{base}/lab/tree/{path}?token={TOKEN}&reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    # A fresh Lab may ask which kernel to start for the first notebook it opens.
    accept = page.locator(".jp-Dialog button.jp-mod-accept")
    try:
        accept.wait_for(timeout=5_000)
        accept.click()
    except Exception:  # noqa: BLE001  (no dialog: the kernel started by itself)
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    # A chapter opened as released: trusted (signed by `forge-course lab`), and unchanged.
    trust = page.locator(".jp-StatusItem-trust").first.get_attribute("title") or ""
    assert trust.startswith("Notebook trusted"), f"the status bar says: {trust!r}"
    dirty = page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count()
    assert not dirty, "the chapter is marked modified as soon as it opens"
    page.locator(".lm-MenuBar-item", has_text="Run").first.click(timeout=10_000)
    page.click("li.lm-Menu-item[data-command='runmenu:run-all']", timeout=10_000)
    page.wait_for_function(ALL_RAN, timeout=240_000)


PICTURES = "() => [...document.querySelectorAll('.jupyter-widgets img')].map(i => i.src).join()"


def _a_slider_changes_the_picture(page) -> bool:
    """Move each slider (up, or down at its end), then press buttons, until a picture changes."""
    handles = page.locator(".jupyter-widgets .noUi-handle")
    if page.locator(".jupyter-widgets img").count() == 0 or handles.count() == 0:
        return True  # a chapter without a picture-drawing slider has nothing to check here
    moves = [(handles.nth(i), key) for i in range(min(handles.count(), 4))
             for key in ("ArrowRight", "ArrowLeft")]  # fmt: skip
    buttons = page.locator(".jupyter-widgets button")
    moves += [(buttons.nth(i), "click") for i in range(min(buttons.count(), 3))]
    for control, action in moves:
        before = page.evaluate(PICTURES)
        if action == "click":
            control.click()
        else:
            control.focus()
            for _ in range(2):
                page.keyboard.press(action)
        try:
            page.wait_for_function(f"b => ({PICTURES})() !== b", arg=before, timeout=15_000)
            return True
        except Exception:  # noqa: BLE001  (this control did not change the picture; try the next)
            continue
    return False


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_in_jupyterlab_with_live_widgets(browser_page, chapter):
    base, page = browser_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    source = (REPO / "notebooks" / chapter / f"{chapter}.ipynb").read_text()
    has_widgets = "ipywidgets" in source or "_view(" in source  # chapter 12 needs none
    try:
        _open_and_run_all(page, base, f"notebooks/{chapter}/{chapter}.ipynb")
        if has_widgets:
            assert page.locator(".jupyter-widgets").count() > 0, "no widget rendered"
        outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
        as_text = [t for t in outputs if t.startswith(("VBox(", "HBox(", "IntSlider("))]
        assert not as_text, f"widgets shown as text: {as_text[:2]}"
        assert page.locator(".jp-OutputArea-output img").count() > 0, "no figure appeared"
        errors = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
        unexpected = [
            e for e in errors if "Error" in e and not any(x in e for x in EXPECTED_ERRORS)
        ]
        assert not unexpected, f"unexpected errors: {unexpected[:1]}"
        warned = [e for e in errors if "Warning" in e]
        assert not warned, f"a warning the learner must read past: {warned[:1]}"

        assert _a_slider_changes_the_picture(page), "no slider changed the simulation's picture"
    finally:
        page.screenshot(path=str(ARTIFACTS / f"{chapter}.png"), full_page=False)
        shut_down_kernels(base)
