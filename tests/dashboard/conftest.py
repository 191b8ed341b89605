"""pytest setup for the dashboard's browser tests.

tests/dashboard/main.rs starts a broker and sets QUEEN_URL to it and QUEEN_DASHBOARD_SCREENSHOTS to
the directory the screenshots go to. One headless Chromium serves every test of a run.
"""

import os

import pytest

from dashboard_helpers import Api, require_browser, start_browser


def pytest_configure(config):
    if not os.environ.get("QUEEN_URL", "").strip():
        pytest.exit(
            "QUEEN_URL is not set: point it at a running broker, e.g. QUEEN_URL=http://127.0.0.1:6632 "
            "python -m pytest tests/dashboard (cargo nextest run -p queen-broker --test dashboard starts one and sets it)",
            returncode=2,
        )
    # Without the browser the suite fails at once, saying what to install; it never skips.
    try:
        require_browser()
    except RuntimeError as e:
        pytest.exit(str(e), returncode=3)


@pytest.fixture(scope="session")
def queen_url():
    return os.environ["QUEEN_URL"].strip().rstrip("/")


@pytest.fixture(scope="session")
def screenshots():
    directory = os.environ.get("QUEEN_DASHBOARD_SCREENSHOTS", "").strip() or "target/dashboard-screenshots"
    os.makedirs(directory, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def admin_token():
    """The token the API helper sends (with auth on); None with auth off."""
    return os.environ.get("QUEEN_DASHBOARD_ADMIN_TOKEN") or None


@pytest.fixture(scope="session")
def api(queen_url, admin_token):
    client = Api(queen_url, admin_token)
    yield client
    client.close()


@pytest.fixture(scope="session")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


# What the console may say: a refused request is logged by the browser itself ("Failed to load
# resource"), and the page shows those; anything else at SEVERE (an uncaught exception, a
# Content-Security-Policy violation) is a bug.
def _is_expected(entry):
    return "Failed to load resource" in entry.get("message", "")


@pytest.fixture(autouse=True)
def console_is_clean(request, browser):
    browser.get_log("browser")
    yield
    problems = [
        e["message"]
        for e in browser.get_log("browser")
        if (e.get("level") == "SEVERE" and not _is_expected(e)) or "Content Security Policy" in e.get("message", "")
    ]
    assert not problems, f"{request.node.name}: the browser console reported:\n" + "\n".join(problems)
