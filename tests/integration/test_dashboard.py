"""/dashboard in a real headless chromium against the real cluster (Redis, gateway, two SmolLM2 workers): the
page loads without console errors, lists the live workers and a fresh error, and its playground streams a chat
completion into the page token by token.

Needs Debian's chromium and chromium-driver (.ci/run installs them) and selenium, which drives the system
chromedriver and never downloads a browser; the test is skipped with the reason when any of them is missing
or the browser cannot start. Set LLMFLEET_DASHBOARD_SCREENSHOT=path.png to keep a screenshot.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import keys
from tests.support.cluster import start_extra_gateway

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BROWSERS = ("chromium", "chromium-browser")
GROWTH_RECORDER = """
const output = document.getElementById("pg-output");
window.__growth = [];
new MutationObserver(() => window.__growth.push([performance.now(), output.textContent.length]))
  .observe(output, {childList: true, characterData: true, subtree: true});
"""


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless chromium driven through the system chromedriver, with the console log kept."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    binary = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1440,1300", "--lang=en-US"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as exc:
        pytest.skip(f"chromium cannot start here: {exc.msg or exc}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _live_worker_ids(cluster: Any) -> list[str]:
    ids = [i.decode() for i in cluster.client.zrange(keys.WORKERS_INDEX, 0, -1)]
    return [i for i in ids if cluster.client.exists(keys.worker_key(i))]


def _console_problems(driver: Any) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def test_the_dashboard_shows_the_live_fleet_and_streams_a_chat_completion(browser: Any, cluster: Any,
                                                                          tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(cluster.base_url + "/dashboard")
    workers = _live_worker_ids(cluster)
    assert len(workers) == 2
    table = browser.find_element(By.ID, "workers")
    WebDriverWait(browser, 20).until(lambda d: all(w in table.text for w in workers))
    assert browser.find_element(By.ID, "status").text == "live"
    rows = {r.find_element(By.CLASS_NAME, "worker-id").text: r.text
            for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert sorted(rows) == sorted(workers) and all("ready" in text for text in rows.values())
    assert browser.find_element(By.ID, "card-workers").text == "2"

    refused = httpx.post(cluster.base_url + "/v1/chat/completions", timeout=30,
                         json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 404
    errors = browser.find_element(By.ID, "errors")
    WebDriverWait(browser, 10).until(lambda d: "model_not_found" in errors.text)
    assert "no-such-model" in errors.text

    browser.find_element(By.ID, "pg-prompt").clear()
    browser.find_element(By.ID, "pg-prompt").send_keys("Name three uses of Redis.")
    for field, value in (("pg-max-tokens", "40"), ("pg-temperature", "0")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    browser.execute_script(GROWTH_RECORDER)
    browser.find_element(By.ID, "pg-send").click()
    output = browser.find_element(By.ID, "pg-output")
    WebDriverWait(browser, 180, poll_frequency=0.2).until(lambda d: output.get_attribute("data-state") != "streaming")
    assert output.get_attribute("data-state") == "done", output.text
    growth = browser.execute_script("return window.__growth")
    lengths = [length for _, length in growth if length]
    assert len(lengths) >= 5 and lengths == sorted(lengths) and lengths[-1] == len(output.get_attribute("textContent"))
    assert growth[-1][0] - next(t for t, length in growth if length) > 200  # ms: token by token, not all at once
    stats = browser.find_element(By.ID, "pg-stats").text
    assert stats.startswith("finish: ") and " tokens" in stats

    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "card-gen-rate").text not in ("", "–"))
    screenshot = Path(os.environ.get("LLMFLEET_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
    assert browser.save_screenshot(str(screenshot))
    assert _console_problems(browser) == []


@pytest.fixture
def keyed_gateway(cluster: Any, tmp_path: Path) -> Iterator[str]:
    """A second gateway on the cluster's Redis that requires the key 'sk-dashboard-test'; yields its URL."""
    proc, base = start_extra_gateway(cluster, tmp_path / "gateway.log", LLMFLEET_API_KEY="sk-dashboard-test")
    try:
        yield base
    finally:
        cluster.stop(proc)


def test_with_keys_the_page_asks_for_one_and_then_uses_it(browser: Any, cluster: Any, keyed_gateway: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # drop what earlier tests left
    browser.get(keyed_gateway + "/dashboard")  # the page itself needs no key
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 10).until(lambda d: status.text == "API key needed")
    browser.find_element(By.ID, "api-key").send_keys("sk-dashboard-test")
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    WebDriverWait(browser, 10).until(lambda d: status.text == "live")
    table = browser.find_element(By.ID, "workers")
    WebDriverWait(browser, 10).until(lambda d: all(w in table.text for w in _live_worker_ids(cluster)))
    browser.find_element(By.ID, "pg-max-tokens").clear()
    browser.find_element(By.ID, "pg-max-tokens").send_keys("8")
    browser.find_element(By.ID, "pg-send").click()  # the playground sends the key too
    output = browser.find_element(By.ID, "pg-output")
    WebDriverWait(browser, 180, poll_frequency=0.2).until(lambda d: output.get_attribute("data-state") != "streaming")
    assert output.get_attribute("data-state") == "done" and output.text, output.text
    problems = _console_problems(browser)  # only the polls that went out before the key was typed
    assert problems and all("fleet.json" in e["message"] and "401" in e["message"] for e in problems), problems
