"""The run inspector in a real browser: headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium) follows the landing page's newest recent change to
its run's page, then goes from the landing page (runs by state) through
the run's state to the page of a run the demo drove, finds its current state
highlighted in the diagram and every transition in the timeline, and
saves a screenshot (kept under the test's tmp dir, path printed). The worker has an HTTP
token, which the browser sends as HTTP Basic's password (from the URL's credentials, as
its own prompt would)."""

import shutil
import urllib.parse
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from processor.demo.driver import Driver
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.trust.keyring import signing_keys
from tests.integration.harness import Env, WorkerProcess, make_env


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def browser() -> webdriver.Chrome:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromedriver missing: make tools installs them"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1600"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


TOKEN = "inspect-token-0123456789abcdef"


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_inspector_shows_a_demo_run_in_chromium(env: Env, runtime: str) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime, http_token=TOKEN)
    driver = Driver(KafkaSettings(env.bootstrap), env.topics, signing_keys(env.keyring), seed=7)
    try:
        worker.wait_ready(partitions=3)
        result = driver.run(6)
        run_id = next(r for r, m in sorted(result.machine_of.items()) if m == "task_lifecycle")
        snapshot = worker.snapshot(run_id)
        history = worker.get(worker.run_path(run_id, "/history"))
        assert snapshot is not None and history
        chrome = browser()
        try:
            # Chromium sends the URL's credentials only when asked (a 401 naming Basic)
            signed_in = worker.url.replace("http://", f"http://anyone:{TOKEN}@")
            # The landing page's recent changes: the runs that entered their state last,
            # newest first, each a link to its page.
            chrome.get(f"{signed_in}/inspect")
            recent = chrome.find_elements(By.CSS_SELECTOR, "#recent tr td:first-child a")
            assert recent, "no recent changes on the landing page"
            newest = recent[0].text
            recent[0].click()
            assert chrome.find_element(By.CSS_SELECTOR, "h1").text == newest
            assert chrome.find_element(By.ID, "current-state").text
            # From the landing page: the run's state among the machine's, then the run.
            chrome.get(f"{signed_in}/inspect")
            query = urllib.parse.urlencode({"state": snapshot.state, "machine": snapshot.machine})
            chrome.find_element(By.CSS_SELECTOR, f'#states a[href="/inspect?{query}"]').click()
            chrome.find_element(By.LINK_TEXT, run_id).click()
            assert chrome.current_url.endswith(
                f"/inspect?{urllib.parse.urlencode({'run': run_id})}"
            )
            current = chrome.find_elements(By.CSS_SELECTOR, "svg g.state.current")
            assert [c.get_attribute("data-state") for c in current] == [snapshot.state]
            fill = chrome.execute_script(
                "return getComputedStyle(arguments[0].querySelector('rect')).fill", current[0]
            )
            assert fill == "rgb(9, 105, 218)"  # drawn highlighted, not just tagged
            assert chrome.find_element(By.ID, "current-state").text == snapshot.state
            rows = chrome.find_elements(By.CSS_SELECTOR, "#timeline tr.transition")
            assert [int(r.get_attribute("data-revision") or -1) for r in rows] == [
                t["revision"] for t in history
            ]
            shot = env.tmp / f"inspector-{runtime}-{run_id}.png"
            assert chrome.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
            print(f"screenshot: {shot}")
        finally:
            chrome.quit()
    finally:
        driver.close()
        assert worker.terminate() == 0, worker.log()
