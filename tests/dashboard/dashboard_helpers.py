"""Helpers for the dashboard's browser tests: the broker's API over plain HTTP (to make data and to
check what the dashboard did), the browser, waits with deadlines, and screenshots.
"""

import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = os.environ.get("QUEEN_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("QUEEN_CHROMEDRIVER", "/usr/bin/chromedriver")

# What a wait may take at most: the page polls every 2 s in these tests, the broker samples its
# history every second.
WAIT_SECONDS = 20

LAPTOP = (1440, 900)
PHONE = (390, 844)

# Chromium on a machine without network: no background fetches, no component updates, no QUIC,
# or it stalls on refused connections.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--force-device-scale-factor=1",
    "--hide-scrollbars",
]


def unique(label):
    """A fresh name: `dash-<label>-<8 hex digits>`."""
    return f"dash-{label}-{uuid.uuid4().hex[:8]}"


def require_browser():
    """Fails (never skips) with what to install when Chromium or its driver is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(path) and os.access(path, os.X_OK))]
    if missing:
        raise RuntimeError(
            f"the dashboard tests need Chromium and its WebDriver, missing: {', '.join(missing)}. "
            "Install them with `apt-get install chromium chromium-driver` (scripts/test.sh does when run as root), "
            "or point QUEEN_CHROMIUM / QUEEN_CHROMEDRIVER at them."
        )


def start_browser():
    """Headless Chromium through chromedriver, both named explicitly so that Selenium Manager never
    tries to download anything; a fresh profile that is removed when the browser quits."""
    require_browser()
    profile = tempfile.mkdtemp(prefix="queen-dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={LAPTOP[0]},{LAPTOP[1]}")
    # The console, to catch policy violations and uncaught errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except WebDriverException:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    original_quit = driver.quit

    def quit_and_clean():
        try:
            original_quit()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean
    return driver


class Api:
    """The broker's HTTP API, for making data and checking results behind the page's back."""

    def __init__(self, base, token=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base, headers=headers, timeout=30)

    def close(self):
        self.http.close()

    def get(self, path, **params):
        answer = self.http.get(path, params=params)
        answer.raise_for_status()
        return answer.json()

    def status_of(self, method, path, **kwargs):
        return self.http.request(method, path, **kwargs).status_code

    def post(self, path, body=None):
        answer = self.http.post(path, json=body)
        answer.raise_for_status()
        return answer.json() if answer.content else None

    def configure(self, queue, **options):
        return self.post("/api/v1/configure", {"queue": queue, "options": options})

    def push(self, queue, partition, payloads, transaction_ids=None):
        items = []
        for index, payload in enumerate(payloads):
            item = {"queue": queue, "partition": partition, "payload": payload}
            if transaction_ids:
                item["transactionId"] = transaction_ids[index]
            items.append(item)
        results = self.post("/api/v1/push", {"items": items})
        assert [r["status"] for r in results] == ["queued"] * len(items), results
        return results

    def pop(self, queue, group, partition=None, batch=10, lease_seconds=None):
        """One pop without waiting: the messages (possibly none) and the lease id."""
        path = f"/api/v1/pop/queue/{queue}" + (f"/partition/{partition}" if partition else "")
        params = {"consumerGroup": group, "batch": batch, "wait": "false"}
        if lease_seconds:
            params["leaseSeconds"] = lease_seconds
        answer = self.http.get(path, params=params)
        answer.raise_for_status()
        if answer.status_code == 204 or not answer.content:
            return [], None
        body = answer.json()
        return body.get("messages", []), body.get("leaseId")

    def pop_until(self, queue, group, count, partition=None, lease_seconds=None, within=10.0):
        """Pops until `count` messages came (a push may take a moment to be visible)."""
        deadline = time.monotonic() + within
        got, lease = [], None
        while len(got) < count:
            messages, lease_id = self.pop(queue, group, partition, batch=count - len(got), lease_seconds=lease_seconds)
            got.extend(messages)
            lease = lease_id or lease
            if len(got) < count:
                assert time.monotonic() < deadline, f"only {len(got)} of {count} messages popped from {queue}"
                time.sleep(0.1)
        return got, lease

    def ack(self, group, messages, status="completed"):
        body = {
            "consumerGroup": group,
            "acknowledgments": [
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m.get("leaseId"), "status": status}
                for m in messages
            ],
        }
        results = self.post("/api/v1/ack/batch", body)
        assert all(r["success"] for r in results), results
        return results

    def group(self, name):
        return self.get(f"/api/v1/consumer-groups/{name}")

    def partition_lag(self, group, queue, partition):
        for p in self.group(group)["partitions"]:
            if p["queue"] == queue and p["partition"] == partition:
                return p
        raise AssertionError(f"group {group} has no cursor on {queue}/{partition}")


def wait_for(driver, condition, message, timeout=WAIT_SECONDS):
    """Waits until `condition(driver)` is truthy (stale elements and missing ones just retry)."""

    def attempt(d):
        try:
            return condition(d)
        except (StaleElementReferenceException, NoSuchElementException, AssertionError, LookupError):
            return False

    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)).until(attempt, message)


def wait_until(check, message, timeout=WAIT_SECONDS, interval=0.2):
    """Waits until `check()` is truthy, outside the browser (API state); returns its value."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (AssertionError, httpx.HTTPError, LookupError) as e:
            last_error = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (after {timeout} s; last error: {last_error})")
        time.sleep(interval)


# One element read in a single script call, so a refresh that redraws it between two reads cannot
# leave the test holding a detached element: its text, its data attributes, the text of each
# [data-field] inside it, and its links.
_SNAPSHOT_JS = """
const el = document.querySelector(arguments[0]);
if (!el) return null;
const fields = {};
for (const f of el.querySelectorAll('[data-field]')) fields[f.dataset.field] = f.innerText.trim();
const links = [...el.querySelectorAll('a')].map(a => ({text: a.innerText.trim(), href: a.getAttribute('href')}));
return {text: el.innerText, data: {...el.dataset}, fields, links};
"""


def snapshot(driver, css):
    """What the first element matching `css` shows (see _SNAPSHOT_JS), or raise LookupError."""
    found = driver.execute_script(_SNAPSHOT_JS, css)
    if found is None:
        raise LookupError(css)
    return found


def click(driver, css, message=None):
    """Clicks the first element matching `css`, finding it again if a refresh replaced it."""
    wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True, message or f"click {css}")


def text_of(driver, css):
    """The text of the first element matching `css`, or raise LookupError."""
    return snapshot(driver, css)["text"]


def css_string(value):
    """`value` as a quoted CSS string, for attribute selectors with any characters."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def screenshot(driver, directory, name, size=LAPTOP, full_page=True):
    """Saves `<directory>/<name>.png` at `size`; the whole page when `full_page` (the window is made
    as tall as the page, at most 4000 px, then put back)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    driver.set_window_size(*size)
    if full_page:
        height = driver.execute_script("return Math.max(document.documentElement.scrollHeight, document.body.scrollHeight)")
        driver.set_window_size(size[0], max(size[1], min(int(height) + 20, 4000)))
    path = Path(directory) / f"{name}.png"
    # Let a chart redrawn at the new width settle.
    driver.execute_script("return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert driver.save_screenshot(str(path)), f"could not write {path}"
    driver.set_window_size(*LAPTOP)
    return path


# Holds back, in the page, the answers to the calls whose URL contains `needle`: each call goes to
# the broker at once, but its answer reaches the page only when released, as over a slow network.
# `window.__held` holds a release for each answer held back.
_HOLD_JS = """
const needle = arguments[0];
const real = window.fetch;
window.__held = [];
window.__release = () => {
  window.fetch = real;
  for (const release of window.__held.splice(0)) release();
};
window.fetch = (url, init) => {
  const answer = real(url, init);
  if (!String(url).includes(needle)) return answer;
  // A failure is the page's to handle once released, not an unhandled rejection meanwhile.
  answer.catch(() => {});
  return new Promise((resolve) => window.__held.push(() => resolve(answer)));
};
"""


def hold_answers(driver, needle):
    """Holds back the answers to the page's calls to URLs containing `needle` (see _HOLD_JS)."""
    driver.execute_script(_HOLD_JS, needle)


def held_answers(driver):
    """How many answers hold_answers is holding back now."""
    return driver.execute_script("return window.__held ? window.__held.length : 0")


def release_answers(driver):
    """Lets every held answer through and stops holding."""
    driver.execute_script("if (window.__release) window.__release()")


def never_answer(driver, url_pattern):
    """Makes the browser's requests to `url_pattern` (a DevTools pattern, `*` for any text) wait
    for ever for their answer, as from a broker that never answers: they are paused in the
    browser's network layer and never let through. Ended by let_answer()."""
    driver.execute_cdp_cmd("Fetch.enable", {"patterns": [{"urlPattern": url_pattern}]})


def let_answer(driver):
    """Ends never_answer()."""
    driver.execute_cdp_cmd("Fetch.disable", {})
