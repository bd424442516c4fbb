"""A real browser for the pages' tests: Debian's headless Chromium, driven
through its own chromedriver with Selenium (scripts/setup installs both as
test extras). One driver per test module; each test loads its page fresh.

`screenshot(driver, name)` writes NAME.png under the directory named by
KEM_SCREENSHOTS (`KEM_SCREENSHOTS=docs/screenshots scripts/test` renews the
docs' pictures), else into a temporary directory: a test run leaves the
work tree as it found it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A viewport wide enough for the pages' two-column layouts (1280 px) and
# tall enough that a screenshot holds the charts without scrolling.
WINDOW = (1280, 1000)


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) executables; a missing one fails the test (the README's test command installs both)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail("needs Debian's chromium and chromium-driver (scripts/setup installs them)")
    return browser, driver


def open_browser():
    """A headless Chromium under Selenium; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture(scope="module")
def browser():
    driver = open_browser()
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, timeout: float = 30.0):
    """Wait until condition(driver) is truthy and return it (Selenium's WebDriverWait)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def screenshots_dir() -> Path:
    chosen = os.environ.get("KEM_SCREENSHOTS")
    folder = ROOT / chosen if chosen else Path(tempfile.gettempdir()) / "kem-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver, name: str) -> Path:
    path = screenshots_dir() / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
