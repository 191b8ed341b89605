"""The dashboard against a broker with authentication on (static API tokens, an admin and a
read-only one): the page asks for a token, refuses a wrong one, shows data with a right one, says
when the token's role is not enough, and forgets the token on sign-out.
"""

import os

import pytest
from selenium.webdriver.common.by import By

from dashboard_helpers import css_string, screenshot, text_of, unique, wait_for

TOKEN_KEY = "queen.dashboard.token"


@pytest.fixture(scope="module")
def tokens():
    admin = os.environ.get("QUEEN_DASHBOARD_ADMIN_TOKEN")
    reader = os.environ.get("QUEEN_DASHBOARD_READER_TOKEN")
    assert admin and reader, "QUEEN_DASHBOARD_ADMIN_TOKEN and QUEEN_DASHBOARD_READER_TOKEN name the broker's tokens"
    return {"admin": admin, "reader": reader}


@pytest.fixture(scope="module")
def queue(api):
    name = unique("secured")
    api.push(name, "Default", [{"n": 1}, {"n": 2}])
    return name


def sign_in(browser, token):
    dialog = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "dialog#signin-dialog[open]"), "the token prompt")
    field = dialog.find_element(By.CSS_SELECTOR, "[data-role=token]")
    field.clear()
    field.send_keys(token)
    dialog.find_element(By.CSS_SELECTOR, "[data-role=confirm]").click()
    return dialog


def test_the_page_asks_for_a_token_and_refuses_a_wrong_one(browser, queen_url, api, queue, tokens, screenshots):
    assert api.status_of("GET", "/api/v1/status", headers={"Authorization": ""}) == 401, "auth is on"
    browser.get(f"{queen_url}/dashboard#/")
    dialog = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "dialog#signin-dialog[open]"), "the token prompt")
    screenshot(browser, screenshots, "auth-prompt", full_page=False)

    sign_in(browser, "not-a-token-the-broker-knows")
    wait_for(browser, lambda d: "refused" in dialog.find_element(By.CSS_SELECTOR, ".dialog-error").text, "the wrong token is refused")
    assert dialog.is_displayed(), "the prompt stays open"
    assert browser.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')") is None

    sign_in(browser, tokens["reader"])
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "dialog#signin-dialog"), "the prompt closes")
    assert browser.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')") == tokens["reader"]
    row = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-queue={css_string(queue)}]"), "the queue is listed")
    assert row.find_element(By.CSS_SELECTOR, '[data-field="messages"]').text == "2"
    assert browser.find_element(By.ID, "sign-out").is_displayed()


def test_a_read_only_token_is_told_its_role_is_not_enough(browser, queen_url, queue):
    browser.execute_script("location.hash = arguments[0]", f"#/queues/{queue}")
    form = wait_for(browser, lambda d: d.find_element(By.ID, "push-form"), "the push form")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    error = wait_for(browser, lambda d: form.find_element(By.CSS_SELECTOR, ".push-result .error"), "the push is refused")
    assert "Forbidden" in error.text and "403" in error.text and "role" in error.text, error.text


def test_signing_out_forgets_the_token_and_the_admin_token_works(browser, queen_url, api, queue, tokens):
    browser.find_element(By.ID, "sign-out").click()
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "dialog#signin-dialog[open]"), "the prompt is back")
    assert browser.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')") is None

    sign_in(browser, tokens["admin"])
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "dialog#signin-dialog"), "the prompt closes")
    form = wait_for(browser, lambda d: d.find_element(By.ID, "push-form"), "the queue page again")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    result = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, ".push-result-table tr[data-push-status]"), "the push result")
    assert result.get_attribute("data-push-status") == "queued"
    messages = api.get("/api/v1/messages", queue=queue, limit=10)["messages"]
    assert len(messages) == 3 and messages[0]["producerSub"] == "dashboard-admin", messages
    assert "Sign out" in text_of(browser, "#sign-out")
