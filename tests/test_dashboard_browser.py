"""The dashboard in a real browser: headless Chromium driven by Selenium against uvicorn on
127.0.0.1 and a queue worker (a thread running the real search), on a temporary SQLite file.

Checks what only a browser shows: the token is asked for and then kept in the cookie, the form
submits, the jobs page's polling script moves the job to succeeded, and the kernel page shows the
sGraph picture and the CUDA source. Screenshots go to $SUPEROPT_TEST_ARTIFACTS (default: the
test's tmp_path) as browser-*.png.

Needs Debian's `chromium` and `chromium-driver` and `pip install selenium` (the dev extra);
skipped, saying which is missing, otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from db_fixtures import running_service

from superopt.db.engine import open_database
from superopt.service import create_app
from superopt.worker import Worker

pytestmark = pytest.mark.browser
TOKEN = "browser-test-token"
ARTIFACTS_ENV = "SUPEROPT_TEST_ARTIFACTS"


def _missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not (shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")):
        return "no chromium binary (apt-get install chromium)"
    if not shutil.which("chromedriver"):
        return "no chromedriver (apt-get install chromium-driver)"
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary:
        opts.binary_location = binary
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(ARTIFACTS_ENV) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    """The service (with a token) and one worker on a fresh SQLite file; yields the base URL."""
    db = open_database(f"sqlite:///{tmp_path / 'superopt.db'}")
    stop = threading.Event()
    worker = threading.Thread(target=Worker(db, poll_s=0.1).run, kwargs={"stop": stop}, daemon=True)
    worker.start()
    try:
        with running_service(create_app(db, token=TOKEN)) as base:
            yield base
    finally:
        stop.set()
        worker.join(120)
        db.close()


def test_submit_watch_and_open_the_kernel_in_chromium(browser, live, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 30)
    shot = lambda name: browser.save_screenshot(str(artifacts / f"browser-{name}.png"))

    # the token is required: the pages answer the sign-in form, the polling endpoint 401
    browser.get(live + "/")
    assert browser.find_element(By.NAME, "token") and "Sign in" in browser.title
    assert "jobs" not in browser.find_element(By.TAG_NAME, "main").text.lower()
    shot("1-sign-in")
    browser.get(live + "/ui/jobs.json")
    assert "missing or wrong bearer token" in browser.page_source
    # a wrong token is refused; the right one once, then the cookie carries on
    browser.get(live + "/")
    browser.find_element(By.NAME, "token").send_keys("wrong")
    browser.find_element(By.CSS_SELECTOR, "form.card button").click()
    # a click returns before the answer has loaded: wait for the page, never read a blank one
    wait.until(ec.text_to_be_present_in_element((By.TAG_NAME, "main"), "wrong token"))
    browser.get(live + f"/?token={TOKEN}")
    assert browser.current_url == live + "/" and browser.title.startswith("Jobs")
    assert all(c["httpOnly"] for c in browser.get_cookies())

    # submit through the form
    browser.get(live + "/ui/submit")
    browser.find_element(By.NAME, "program").send_keys("rmsnorm_matmul:ci")
    Select(browser.find_element(By.NAME, "target")).select_by_value("h100")
    browser.find_element(By.NAME, "budget_s").send_keys("60")
    shot("2-submit")
    browser.find_element(By.CSS_SELECTOR, "#submit-form button").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "p.notice")))
    job_id = browser.find_element(By.CSS_SELECTOR, "p.notice").text.split()[1]

    # the jobs page's script polls until the job has succeeded (no reload)
    row = f'#jobs tr[data-id="{job_id}"]'
    WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-state") == "succeeded")
    assert "Updated" in browser.find_element(By.ID, "poll-status").text
    shot("3-jobs")
    browser.find_element(By.CSS_SELECTOR, f"{row} a[href^='/ui/kernels/']").click()

    # the kernel page: the sGraph picture, the CUDA source with line numbers, the verdict
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#sgraph svg")))
    svg = browser.find_element(By.CSS_SELECTOR, "#sgraph svg")
    assert svg.size["width"] > 100 and svg.size["height"] > 100
    cuda = browser.find_element(By.ID, "cuda")
    assert "__global__" in cuda.text and browser.find_elements(By.CSS_SELECTOR, "#cuda .ln")
    assert "proved" in browser.find_element(By.ID, "verdict").text or "passed" in browser.find_element(
        By.ID, "verdict").text
    download = browser.find_element(By.PARTIAL_LINK_TEXT, "Download")
    assert download.get_attribute("href").endswith("/kernel.cu")
    shot("4-kernel")
    browser.execute_script("document.getElementById('cuda').scrollIntoView()")
    shot("5-kernel-source")

    # the cache and the chart show it too
    browser.get(live + "/ui/cache")
    assert "rmsnorm_matmul:ci" in browser.find_element(By.ID, "cache").text
    shot("6-cache")
    browser.get(live + "/ui/chart")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart rect")
    shot("7-chart")

    # signing out drops the cookie
    browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
    wait.until(ec.presence_of_element_located((By.NAME, "token")))  # redirected to the sign-in form
    browser.get(live + "/ui/cache")
    assert browser.find_elements(By.NAME, "token")
