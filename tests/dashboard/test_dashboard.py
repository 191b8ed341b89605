"""The dashboard in a real browser against a real broker: each page shows what the API holds, and
the actions taken through the page (skip to end, seek, push, delete a group, re-queue and delete
dead letters) reach the broker, checked through the API. Answers that come late or never, and
more queues or partitions than the API lists at once, are shown for what they are.

The tests run in file order and share the data made once by `data`. The page redraws what changed
at every poll (every 2 s here), so rows are read in one script call (`snapshot`) and clicks find
their element again if a redraw replaced it.
"""

import json
import re

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from dashboard_helpers import (
    PHONE,
    WAIT_SECONDS,
    click,
    css_string,
    held_answers,
    hold_answers,
    let_answer,
    never_answer,
    release_answers,
    screenshot,
    snapshot,
    text_of,
    unique,
    wait_for,
    wait_until,
)

# A queue whose name is markup: the page must show it as text and never parse it.
HOSTILE = "<img src=x onerror=window.__injected=1>"


@pytest.fixture(scope="module")
def data(api):
    """Queues, groups and dead letters for every test of the module:

    - `orders`: partitions p1 (5 messages) and p2 (3); group `billing` has read 2 of p1 and 1 of
      p2 (3 and 2 behind); group `audit` has read 1 of p1 (4 behind there, and all 3 of p2, which
      it has not reached, 7 in all); group `leased` holds a lease on p2 (3 behind).
    - `hostile`: a queue named with markup, one message.
    - `dead`: two dead letters of group `reader`, one with markup in its payload.
    """
    orders, hostile, dead = unique("orders"), unique(HOSTILE), unique("dead")
    billing, audit, leased, reader = unique("billing"), unique("audit"), unique("leased"), unique("dlq-reader")
    api.configure(orders, leaseTime=120, retryLimit=3)
    api.push(orders, "p1", [{"order": i, "kind": "p1"} for i in range(5)], [f"p1-{i}" for i in range(5)])
    api.push(orders, "p2", [{"order": i, "kind": "p2"} for i in range(3)], [f"p2-{i}" for i in range(3)])
    api.push(hostile, "Default", [{"hello": HOSTILE}])
    got, _ = api.pop_until(orders, billing, 2, partition="p1")
    api.ack(billing, got)
    got, _ = api.pop_until(orders, billing, 1, partition="p2")
    api.ack(billing, got)
    got, _ = api.pop_until(orders, audit, 1, partition="p1")
    api.ack(audit, got)
    _, lease = api.pop_until(orders, leased, 1, partition="p2", lease_seconds=600)
    api.push(dead, "Default", [{"note": "<b>bold</b>", "n": 1}, {"n": 2}], ["dead-1", "dead-2"])
    letters, _ = api.pop_until(dead, reader, 2)
    api.ack(reader, letters, status="dlq")
    wait_until(lambda: api.get("/api/v1/dlq", queue=dead)["total"] == 2, "two dead letters")
    return {
        "orders": orders,
        "hostile": hostile,
        "dead": dead,
        "billing": billing,
        "audit": audit,
        "leased": leased,
        "lease": lease,
        "reader": reader,
        "p1": api.partition_lag(billing, orders, "p1")["partitionId"],
    }


def open_page(browser, queen_url, hash_route):
    """Opens the dashboard at `hash_route` and waits until its modules ran."""
    if browser.current_url.startswith(queen_url + "/dashboard"):
        browser.execute_script("location.hash = arguments[0]", hash_route)
    else:
        browser.get(f"{queen_url}/dashboard{hash_route}")
    wait_for(browser, lambda d: d.find_element(By.ID, "live").text != "Loading…", "the dashboard started")


def open_dialog(browser, dialog_id):
    return wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"dialog#{dialog_id}[open]"), f"the {dialog_id} opens")


def confirm_dialog(browser, dialog_id):
    """Clicks the confirm button of the open dialog `dialog_id` and waits until it closes."""
    open_dialog(browser, dialog_id).find_element(By.CSS_SELECTOR, "[data-role=confirm]").click()
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, f"dialog#{dialog_id}"), f"the {dialog_id} closes")


def shows(browser, css, check, message, timeout=WAIT_SECONDS):
    """Waits until the element at `css` passes `check(snapshot)`; returns that snapshot."""

    last = []

    def attempt(d):
        seen = snapshot(d, css)
        last[:] = [seen]
        return seen if check(seen) else None

    try:
        return wait_for(browser, attempt, message, timeout)
    except TimeoutException:
        raise AssertionError(f"{message}: {css} never did; it last showed {last[0] if last else 'nothing'}") from None


def cursor_row(queue_or_group_page, partition, group):
    return f'{queue_or_group_page} tr[data-partition="{partition}"][data-group={css_string(group)}]'


def plain_numbers(text):
    """`text` with the thousands separators the browser's locale puts in numbers taken out."""
    return re.sub(r"(?<=\d)[,.\u00a0\u202f](?=\d{3})", "", text)


def test_overview_shows_totals_history_queues_and_the_fleet(browser, queen_url, api, data, screenshots):
    open_page(browser, queen_url, "#/")
    # Poll faster than the default, through the page's own control (kept in localStorage).
    Select(browser.find_element(By.ID, "refresh-interval")).select_by_value("2")

    status = api.get("/api/v1/status")
    totals = shows(browser, "#totals", lambda t: "Queues" in t["text"], "the totals")
    for key in ("queues", "partitions", "consumerGroups", "activeLeases", "deadLetters"):
        assert text_of(browser, f'[data-stat="{key}"] .stat-value') == str(status[key]), (key, totals["text"])
    assert text_of(browser, '[data-stat="messages"] .stat-value') == str(status["messages"]["stored"])
    # Read again if a refresh redraws the element between finding it and reading it.
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, '[data-stat="deadLetters"]').get_attribute("href").endswith("#/dlq"), "the dead letters' link")

    # The queues, each linking to its page, with every group's lag.
    orders = shows(browser, f'tr[data-queue={css_string(data["orders"])}]', lambda r: r["fields"]["messages"] == "8", "the orders queue")
    assert {"text": data["orders"], "href": f"#/queues/{data['orders']}"} in orders["links"], orders["links"]
    billing = snapshot(browser, f'tr[data-queue={css_string(data["orders"])}] li[data-group={css_string(data["billing"])}]')
    assert billing["data"]["lag"] == "5" and "5 behind" in billing["text"], billing
    audit = snapshot(browser, f'tr[data-queue={css_string(data["orders"])}] li[data-group={css_string(data["audit"])}]')
    assert audit["data"]["lag"] == "7", audit
    billing_link = f"/dashboard#/groups/{data['billing']}"
    wait_for(browser, lambda d: billing_link in d.find_element(By.LINK_TEXT, data["billing"]).get_attribute("href"), "the billing group's link")

    # A name made of markup is shown as text, and nothing it says was parsed.
    hostile = snapshot(browser, f'tr[data-queue={css_string(data["hostile"])}]')
    assert HOSTILE in hostile["text"]
    assert not browser.find_elements(By.CSS_SELECTOR, 'main img[src="x"]')
    assert browser.execute_script("return window.__injected") is None

    # The fleet: this broker, live, and both maintenance switches off.
    me = shows(browser, "#brokers tr[data-broker]", lambda b: b["fields"]["state"] == "live", "this broker, live")
    assert "this one" in me["text"] and me["data"]["broker"] == status["broker"], me
    assert "off" in text_of(browser, '[data-maintenance="push"]') and "off" in text_of(browser, '[data-maintenance="pop"]')

    # The last hour as charts: the broker samples every second, so the pushes above show soon.
    pushed = 5 + 3 + 1 + 2
    totals_js = """
        const total = (s) => Number(document.querySelector(`#chart-throughput path[data-series="${s}"]`)?.dataset.total || 0);
        const points = (id) => Number(document.querySelector(`#${id} svg`)?.dataset.points || 0);
        return {pushed: total("pushed"), delivered: total("delivered"), acked: total("acked"),
                throughput: points("chart-throughput"), lag: points("chart-lag-messages"), age: points("chart-lag-seconds")};
    """
    # Wait for every count at once: the pushes and the pops above can fall in different samples.
    delivered = 2 + 1 + 1 + 1 + 2
    seen = {}

    def charted(d):
        seen.update(d.execute_script(totals_js))
        return seen["pushed"] >= pushed and seen["delivered"] >= delivered and all(seen[k] > 0 for k in ("acked", "throughput", "lag", "age"))

    try:
        wait_for(browser, charted, "the charts show the traffic and the lag")
    except TimeoutException:
        raise AssertionError(f"the charts never showed the traffic and the lag; last seen: {seen}") from None

    screenshot(browser, screenshots, "overview")

    # At phone size the navigation folds into a menu that opens, and nothing is wider than the screen.
    browser.set_window_size(*PHONE)
    nav = browser.find_element(By.ID, "nav")
    wait_for(browser, lambda d: not nav.is_displayed(), "the navigation folds on a phone")
    assert not browser.execute_script("return document.documentElement.scrollWidth > window.innerWidth + 1"), "a table should scroll inside its panel"
    screenshot(browser, screenshots, "overview-phone", size=PHONE)
    browser.set_window_size(*PHONE)
    browser.find_element(By.ID, "nav-toggle").click()
    wait_for(browser, lambda d: nav.is_displayed(), "the menu opens")
    screenshot(browser, screenshots, "overview-phone-menu", size=PHONE, full_page=False)


def test_queue_page_shows_partitions_cursors_and_leases(browser, queen_url, data, screenshots):
    open_page(browser, queen_url, f"#/queues/{data['orders']}")
    page = "#queue-partitions"
    shows(browser, cursor_row(page, "p1", data["billing"]), lambda r: r["fields"]["lag"] == "3", "billing is 3 behind on p1")
    assert snapshot(browser, cursor_row(page, "p2", data["billing"]))["fields"]["lag"] == "2"
    audit = snapshot(browser, cursor_row(page, "p1", data["audit"]))
    assert audit["fields"]["lag"] == "4" and audit["fields"]["age"] not in ("", "–"), audit
    # Each partition's depth, and the lease `leased` holds on p2: its id and expiry.
    assert snapshot(browser, f'{page} tr.partition-first[data-partition="p1"]')["fields"]["depth"] == "5"
    assert snapshot(browser, f'{page} tr.partition-first[data-partition="p2"]')["fields"]["depth"] == "3"
    lease = snapshot(browser, cursor_row(page, "p2", data["leased"]))["fields"]["lease"]
    assert data["lease"][:8] in lease and "until" in lease, lease
    assert snapshot(browser, cursor_row(page, "p2", data["billing"]))["fields"]["lease"] == "none"
    # The queue's options, and its newest messages.
    assert "120" in text_of(browser, '#queue-options [data-option="leaseTime"]')
    assert "3" in text_of(browser, '#queue-options [data-option="retryLimit"]')
    newest = shows(browser, '#queue-messages tr[data-transaction-id="p1-4"]', lambda r: True, "the newest messages")
    assert '"order":4' in newest["text"], newest
    screenshot(browser, screenshots, "queue")


def test_skip_to_end_on_one_partition_moves_that_cursor_only(browser, queen_url, api, data):
    open_page(browser, queen_url, f"#/queues/{data['orders']}")
    target = cursor_row("#queue-partitions", "p1", data["billing"])
    shows(browser, target, lambda r: r["fields"]["lag"] == "3", "billing's cursor on p1")
    assert api.partition_lag(data["billing"], data["orders"], "p1")["lagMessages"] == 3
    click(browser, f'{target} [data-action="skip-to-end"]')
    dialog = open_dialog(browser, "skip-dialog")
    assert "3 unread" in dialog.text and data["billing"] in dialog.text and "p1" in dialog.text, dialog.text
    confirm_dialog(browser, "skip-dialog")

    moved = api.partition_lag(data["billing"], data["orders"], "p1")
    assert moved["lagMessages"] == 0 and moved["committed"] == moved["lastOffset"] == 5, moved
    assert api.partition_lag(data["billing"], data["orders"], "p2")["lagMessages"] == 2, "p2 is untouched"
    assert api.partition_lag(data["audit"], data["orders"], "p1")["lagMessages"] == 4, "other groups are untouched"
    shows(browser, target, lambda r: r["fields"]["lag"] == "0" and r["fields"]["committed"] == "5", "the page shows the cursor at the end")
    assert "moved to the end" in text_of(browser, "#flash")


def test_push_form_pushes_and_shows_the_result(browser, queen_url, api, data):
    open_page(browser, queen_url, f"#/queues/{data['orders']}")
    form = wait_for(browser, lambda d: d.find_element(By.ID, "push-form"), "the push form")
    partition = form.find_element(By.NAME, "partition")
    payload = form.find_element(By.NAME, "payload")
    transaction = form.find_element(By.NAME, "transactionId")
    submit = form.find_element(By.CSS_SELECTOR, "button[type=submit]")

    # Not JSON: refused in the page, nothing sent.
    payload.clear()
    payload.send_keys("{not json")
    submit.click()
    wait_for(browser, lambda d: "not JSON" in text_of(d, "#push-form .push-result"), "the payload is refused")
    assert api.get("/api/v1/messages", queue=data["orders"], limit=100)["messages"].__len__() == 8

    partition.clear()
    partition.send_keys("p3")
    transaction.send_keys("from-the-form")
    payload.clear()
    payload.send_keys('{"from": "dashboard", "n": 42}')
    submit.click()
    result = shows(browser, ".push-result-table tr[data-push-status]", lambda r: True, "the push result")
    assert result["data"]["pushStatus"] == "queued" and "from-the-form" in result["text"], result

    listed = api.get("/api/v1/messages", queue=data["orders"], partition="p3", limit=5)["messages"]
    assert [(m["transactionId"], m["data"]) for m in listed] == [("from-the-form", {"from": "dashboard", "n": 42})]
    shows(browser, '#queue-messages tr[data-transaction-id="from-the-form"]', lambda r: "dashboard" in r["text"], "the message is listed")
    shows(browser, '#queue-partitions tr.partition-first[data-partition="p3"]', lambda r: r["fields"]["depth"] == "1", "the new partition")


def test_message_lookup_shows_status_and_every_groups_progress(browser, queen_url, data, screenshots):
    open_page(browser, queen_url, "#/message")
    form = wait_for(browser, lambda d: d.find_element(By.ID, "message-form"), "the lookup form")
    form.find_element(By.NAME, "pid").send_keys(str(data["p1"]))
    form.find_element(By.NAME, "tid").send_keys("p1-0" + Keys.ENTER)
    # billing skipped to the end and audit read it; leased, registered on the queue, has not
    # reached p1 yet, so the message still waits for it.
    found = shows(browser, "#message .message", lambda m: m["data"]["status"] == "pending", "the message, pending")
    for group in (data["billing"], data["audit"]):
        assert snapshot(browser, f'#message tr[data-group={css_string(group)}]')["fields"]["consumed"] == "consumed"
    assert snapshot(browser, f'#message tr[data-group={css_string(data["leased"])}]')["fields"]["consumed"] == "not yet"
    assert json.loads(text_of(browser, "#message pre.json")) == {"order": 0, "kind": "p1"}
    assert data["orders"] in found["text"] and "p1-0" in found["text"]
    screenshot(browser, screenshots, "message")

    # p1-4 is past audit's cursor: pending, and audit has not consumed it.
    open_page(browser, queen_url, f"#/message?pid={data['p1']}&tid=p1-4")
    shows(browser, "#message .message", lambda m: m["data"]["status"] == "pending", "p1-4, pending")
    assert snapshot(browser, f'#message tr[data-group={css_string(data["audit"])}]')["fields"]["consumed"] == "not yet"

    # A message that is not there: the broker's error, shown.
    open_page(browser, queen_url, f"#/message?pid={data['p1']}&tid=no-such-message")
    error = shows(browser, "#message .error", lambda e: True, "the error")["text"]
    assert "no-such-message" in error and "404" in error and "request id" in error, error


def test_groups_list_and_a_groups_page_with_seek_and_subscription(browser, queen_url, api, data, screenshots):
    open_page(browser, queen_url, "#/groups")
    listed = f'#groups tr[data-group={css_string(data["billing"])}][data-queue={css_string(data["orders"])}]'
    # p1 skipped to its end, 2 behind on p2, and the message the push form put on p3, which
    # billing has not reached yet.
    shows(browser, listed, lambda r: r["fields"]["lag"] == "3" and r["fields"]["total-lag"] == "3", "billing's lag on orders")
    screenshot(browser, screenshots, "groups")

    click(browser, f'{listed} a[href="#/groups/{data["billing"]}"]')
    shows(browser, '#group-partitions tr[data-partition="p2"]', lambda r: r["fields"]["lag"] == "2", "billing's page")
    assert snapshot(browser, '#group-partitions tr[data-partition="p1"]')["fields"]["lag"] == "0"
    assert snapshot(browser, '#group-partitions tr[data-partition="p3"]')["fields"]["lag"] == "1"
    screenshot(browser, screenshots, "group")

    # Seek the whole queue back to before everything: the group reads all of it again.
    click(browser, f'#group-queues tr[data-queue={css_string(data["orders"])}] [data-action="seek-to-time"]')
    open_dialog(browser, "seek-dialog").find_element(By.CSS_SELECTOR, "[data-role=seek-time]").send_keys("-1d")
    confirm_dialog(browser, "seek-dialog")
    stored = api.get(f"/api/v1/status/queues/{data['orders']}")["queue"]["messages"]["stored"]
    queue_lag = next(q for q in api.group(data["billing"])["queues"] if q["queue"] == data["orders"])
    assert stored == 9 and queue_lag["lagMessages"] == stored, (queue_lag, stored)
    shows(browser, '#group-partitions tr[data-partition="p1"]', lambda r: r["fields"]["lag"] == "5", "the page shows the replay")

    # The subscription: where the group starts on partitions it has not read.
    form = browser.find_element(By.ID, "subscription-form")
    form.find_element(By.NAME, "subscriptionTimestamp").send_keys("2026-01-01T00:00:00Z")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    outcome = shows(browser, "#subscription-form .ok, #subscription-form .error", lambda r: True, "the subscription update's outcome")
    assert "2026-01-01T00:00:00" in outcome["text"], outcome
    registered = next(q for q in api.group(data["billing"])["queues"] if q["queue"] == data["orders"])
    assert registered["subscriptionFrom"].startswith("2026-01-01T00:00:00"), registered


def test_deleting_a_group_asks_for_its_name(browser, queen_url, api, data):
    group = data["audit"]
    open_page(browser, queen_url, f"#/groups/{group}")
    shows(browser, '#group-partitions tr[data-partition="p1"]', lambda r: True, "the group's page")
    click(browser, '[data-action="delete-group"]')
    dialog = open_dialog(browser, "delete-group-dialog")
    confirm = dialog.find_element(By.CSS_SELECTOR, "[data-role=confirm]")
    typed = dialog.find_element(By.CSS_SELECTOR, "[data-role=type-to-confirm]")
    assert not confirm.is_enabled(), "nothing is deleted before the name is typed"
    typed.send_keys(group[:-1])
    assert not confirm.is_enabled(), "a name that is not the group's does not confirm"
    typed.send_keys(group[-1])
    assert confirm.is_enabled()
    # Cancelled: nothing happens.
    dialog.find_element(By.CSS_SELECTOR, "[data-role=cancel]").click()
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "dialog#delete-group-dialog"), "the dialog closes")
    assert api.status_of("GET", f"/api/v1/consumer-groups/{group}") == 200

    click(browser, '[data-action="delete-group"]')
    open_dialog(browser, "delete-group-dialog").find_element(By.CSS_SELECTOR, "[data-role=type-to-confirm]").send_keys(group)
    confirm_dialog(browser, "delete-group-dialog")
    wait_for(browser, lambda d: d.current_url.endswith("#/groups"), "back to the list")
    assert f"Deleted {group}" in text_of(browser, "#flash")
    assert api.status_of("GET", f"/api/v1/consumer-groups/{group}") == 404
    shows(browser, "#groups", lambda g: data["billing"] in g["text"] and group not in g["text"], "the group is gone from the list")


def test_dead_letters_filter_and_inspect(browser, queen_url, api, data, screenshots):
    dead = data["dead"]
    open_page(browser, queen_url, "#/dlq")
    form = wait_for(browser, lambda d: d.find_element(By.ID, "dlq-filter"), "the filter")
    form.find_element(By.NAME, "queue").send_keys(dead)
    form.find_element(By.NAME, "from").send_keys("-1h")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#dlq tr[data-dead-letter-id]")) == 2, "the queue's two dead letters")
    assert "queue=" in browser.current_url and "from=" in browser.current_url
    assert text_of(browser, ".pager-text") == "1–2 of 2"
    # A filter that matches nothing; then a page of one.
    open_page(browser, queen_url, f"#/dlq?queue={dead}&consumerGroup=nobody")
    shows(browser, "#dlq", lambda r: "No dead letters" in r["text"], "nothing for another group")
    open_page(browser, queen_url, f"#/dlq?queue={dead}&limit=20")
    shows(browser, '#dlq tr[data-transaction-id="dead-1"]', lambda r: data["reader"] in r["text"], "dead-1")
    screenshot(browser, screenshots, "dlq")

    # Inspect: the payload as indented JSON, its markup as text.
    click(browser, '#dlq tr[data-transaction-id="dead-1"] [data-action="inspect"]')
    dialog = open_dialog(browser, "dead-letter-dialog")
    shown = dialog.find_element(By.CSS_SELECTOR, "pre.json").text
    assert json.loads(shown) == {"note": "<b>bold</b>", "n": 1} and '\n  "note"' in shown, shown
    assert not dialog.find_elements(By.TAG_NAME, "b")
    screenshot(browser, screenshots, "dlq-inspect", full_page=False)
    confirm_dialog(browser, "dead-letter-dialog")


def test_retrying_a_dead_letter_asks_first(browser, queen_url, api, data):
    dead, row = data["dead"], '#dlq tr[data-transaction-id="dead-1"]'
    open_page(browser, queen_url, f"#/dlq?queue={dead}")
    shows(browser, row, lambda r: True, "dead-1")

    # Cancelled: the dead letter stays, listed, and nothing is pushed again.
    click(browser, f'{row} [data-action="retry"]')
    dialog = open_dialog(browser, "retry-dead-letter-dialog")
    assert "dead-1" in dialog.text and dead in dialog.text, dialog.text
    dialog.find_element(By.CSS_SELECTOR, "[data-role=cancel]").click()
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "dialog#retry-dead-letter-dialog"), "the dialog closes")
    assert sorted(m["transactionId"] for m in api.get("/api/v1/dlq", queue=dead)["messages"]) == ["dead-1", "dead-2"]
    assert api.pop(dead, data["reader"])[0] == [], "nothing was re-queued"
    assert snapshot(browser, row)["data"]["transactionId"] == "dead-1"

    # Confirmed: the dead letter goes, and the message is back in its partition for the group.
    click(browser, f'{row} [data-action="retry"]')
    confirm_dialog(browser, "retry-dead-letter-dialog")
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, row), "dead-1 leaves the list")
    assert "back in" in text_of(browser, "#flash")
    left = api.get("/api/v1/dlq", queue=dead)
    assert [m["transactionId"] for m in left["messages"]] == ["dead-2"] and left["total"] == 1, left
    again, _ = api.pop_until(dead, data["reader"], 1)
    assert again[0]["data"] == {"note": "<b>bold</b>", "n": 1} and again[0]["transactionId"].startswith("dlq:"), again
    api.ack(data["reader"], again)


def test_deleting_a_dead_letter_once_confirmed(browser, queen_url, api, data):
    dead = data["dead"]
    open_page(browser, queen_url, f"#/dlq?queue={dead}")
    click(browser, '#dlq tr[data-transaction-id="dead-2"] [data-action="delete"]')
    confirm_dialog(browser, "delete-dead-letter-dialog")
    shows(browser, "#dlq", lambda r: "No dead letters" in r["text"], "the list is empty")
    assert api.get("/api/v1/dlq", queue=dead)["total"] == 0
    partition = api.get("/api/v1/messages", queue=dead, limit=1)["messages"][0]["partitionId"]
    assert api.status_of("GET", f"/api/v1/messages/{partition}/dead-2") == 200, "the message itself stays in the log"


def test_a_dead_letter_whose_payload_is_json_null_shows_null(browser, queen_url, api):
    queue, group = unique("null"), unique("null-reader")
    api.push(queue, "Default", [None], ["null-payload"])
    letters, _ = api.pop_until(queue, group, 1)
    api.ack(group, letters, status="dlq")
    letter = wait_until(lambda: api.get("/api/v1/dlq", queue=queue)["messages"], "the dead letter")[0]
    # What the page has to tell apart: data null with the message's id (a JSON null payload), or
    # without it (retention removed the payload).
    assert letter["data"] is None and letter["id"], letter

    open_page(browser, queen_url, f"#/dlq?queue={queue}")
    row = '#dlq tr[data-transaction-id="null-payload"]'
    assert shows(browser, row, lambda r: True, "the dead letter")["fields"]["payload"] == "null"
    click(browser, f'{row} [data-action="inspect"]')
    dialog = open_dialog(browser, "dead-letter-dialog")
    assert dialog.find_element(By.CSS_SELECTOR, "pre.json").text == "null"
    assert "retention" not in dialog.text and "unavailable" not in dialog.text, dialog.text
    confirm_dialog(browser, "dead-letter-dialog")


def test_what_is_typed_survives_the_live_updates(browser, queen_url):
    open_page(browser, queen_url, "#/dlq")
    field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#dlq-filter [name=consumerGroup]"), "the filter")
    field.send_keys("typed-while-polling")
    for _ in range(2):
        before = browser.find_element(By.ID, "live").text
        wait_for(browser, lambda d: d.find_element(By.ID, "live").text != before, "a refresh")
    assert field.get_attribute("value") == "typed-while-polling"
    assert browser.execute_script("return document.activeElement.name") == "consumerGroup"


def test_a_late_answer_for_an_earlier_history_window_does_not_replace_the_latest(browser, queen_url):
    open_page(browser, queen_url, "#/")
    Select(browser.find_element(By.ID, "refresh-interval")).select_by_value("2")
    Select(browser.find_element(By.ID, "history-window")).select_by_value("15")
    shows(browser, "#history-note", lambda n: n["text"].startswith("Last 15 minutes:"), "the last 15 minutes")

    # The next poll asks for the last 15 minutes again, and its answer is held back; meanwhile the
    # operator switches to the last 6 hours, which is answered at once.
    hold_answers(browser, "/api/v1/status/history?minutes=15")
    try:
        wait_for(browser, lambda d: held_answers(d) > 0, "a poll asks for the last 15 minutes")
        polled = text_of(browser, "#live")
        Select(browser.find_element(By.ID, "history-window")).select_by_value("360")
        shows(browser, "#history-note", lambda n: n["text"].startswith("Last 6 hours:"), "the last 6 hours")
    finally:
        release_answers(browser)
    # The poll ends (its time shows) only once the late answer was handled.
    wait_for(browser, lambda d: text_of(d, "#live") != polled, "the poll with the late answer ends")
    note = text_of(browser, "#history-note")
    assert note.startswith("Last 6 hours:"), f"the late answer for 15 minutes replaced the 6 hours asked for: {note}"
    assert Select(browser.find_element(By.ID, "history-window")).first_selected_option.get_attribute("value") == "360"


def test_a_request_the_broker_never_answers_ends_in_an_error(browser, queen_url, data):
    never_answer(browser, "*/api/v1/messages/*")
    try:
        open_page(browser, queen_url, f"#/message?pid={data['p1']}&tid=p1-0")
        shows(browser, "#message", lambda m: "Loading" in m["text"], "the lookup, under way")
        # The dashboard gives up after 15 s, and says so where the answer would have been.
        error = shows(browser, "#message .error", lambda e: True, "the lookup fails", timeout=15 + WAIT_SECONDS)["text"]
    finally:
        let_answer(browser)
    assert "did not answer" in error and "15 s" in error and f"/api/v1/messages/{data['p1']}/p1-0" in error, error


def test_the_overview_pages_through_every_queue(browser, queen_url, api):
    # More queues than the API lists at once (1,000), so than any page of the overview.
    prefix = unique("many")
    names = [f"{prefix}-{i:04d}" for i in range(1001)]
    pushed = api.post("/api/v1/push", {"items": [{"queue": name, "payload": {"i": i}} for i, name in enumerate(names)]})
    assert [r["status"] for r in pushed] == ["queued"] * len(names)
    every = []
    while True:
        page = api.get("/api/v1/status/queues", limit=1000, offset=len(every))["queues"]
        every += [q["name"] for q in page]
        if len(page) < 1000:
            break
    assert set(names) <= set(every) and len(every) == api.get("/api/v1/status")["queues"]

    listing = """
        const pager = document.querySelector('#queues .pager-text');
        return {pager: pager ? pager.innerText : null,
                queues: [...document.querySelectorAll('#queues tr[data-queue]')].map((r) => r.dataset.queue),
                next: Boolean(document.querySelector('#queues [data-action="next-queues"]'))};
    """

    def page_after(pager):
        """A wait for a page of queues whose pager says something else than `pager`."""

        def shown(d):
            page = d.execute_script(listing)
            return page if page["pager"] not in (None, pager) and page["queues"] else None

        return shown

    open_page(browser, queen_url, "#/")
    page = wait_for(browser, page_after(None), "the first page of queues, with its pager")
    assert plain_numbers(page["pager"]).startswith("Queues 1–") and f"of {len(every)}," in plain_numbers(page["pager"]), page["pager"]
    pages = [page]
    while page["next"]:
        click(browser, '#queues [data-action="next-queues"]')
        page = wait_for(browser, page_after(page["pager"]), "the next page of queues")
        pages.append(page)
    # Every queue, each once, in the order of their names, and the last page says where it ends.
    seen = [name for p in pages for name in p["queues"]]
    assert len(pages) > 1 and seen == every, f"{len(seen)} queues shown of {len(every)}, on {len(pages)} page(s)"
    assert plain_numbers(page["pager"]).endswith(f"–{len(every)} of {len(every)}, by name"), page["pager"]

    click(browser, '#queues [data-action="previous-queues"]')
    back = wait_for(browser, page_after(page["pager"]), "the previous page of queues")
    assert back == pages[-2], back["pager"]


def test_a_queue_page_shows_every_cursor_and_counts_the_partitions_it_leaves_out(browser, queen_url, api):
    queue, group = unique("wide"), unique("wide-reader")
    # Two partitions, then 1,000 newer ones: more than the queue's status lists (the 1,000 most
    # recently pushed).
    api.push(queue, "oldest", [{"n": 0}])
    api.push(queue, "older", [{"n": 1}])
    newer = api.post("/api/v1/push", {"items": [{"queue": queue, "partition": f"p{i:04d}", "payload": {"i": i}} for i in range(1000)]})
    assert [r["status"] for r in newer] == ["queued"] * 1000
    status = api.get(f"/api/v1/status/queues/{queue}")
    listed = {p["name"] for p in status["partitions"]}
    assert status["queue"]["partitions"] == 1002 and len(listed) == 1000 and not {"oldest", "older"} & listed, status["queue"]

    # No group reads the queue: the two older partitions are not shown, and the page says so.
    open_page(browser, queen_url, f"#/queues/{queue}")
    page = "#queue-partitions"
    note = shows(browser, f"{page} .partitions-note", lambda n: n["data"]["notShown"] == "2", "how many partitions are not shown")
    text = plain_numbers(note["text"])
    assert "1002 partitions" in text and "most recently pushed" in text and "Not shown: 2 partition" in text, note
    assert len(browser.find_elements(By.CSS_SELECTOR, f"{page} tr.partition-first")) == 1000
    assert not browser.find_elements(By.CSS_SELECTOR, f'{page} tr[data-partition="oldest"], {page} tr[data-partition="older"]')

    # A group reads the oldest partition, and so has a cursor on every one: all are listed.
    api.pop_until(queue, group, 1, partition="oldest", lease_seconds=600)
    oldest = shows(browser, cursor_row(page, "oldest", group), lambda r: r["fields"]["lag"] == "1", "the cursor on the oldest partition")
    assert "until" in oldest["fields"]["lease"], oldest
    older = snapshot(browser, cursor_row(page, "older", group))
    assert older["fields"]["lag"] == "1" and older["fields"]["lease"] == "none", older
    note = snapshot(browser, f"{page} .partitions-note")
    assert note["data"]["notShown"] == "0" and "Every partition is shown" in note["text"], note
    assert len(browser.find_elements(By.CSS_SELECTOR, f"{page} tr.partition-first")) == 1002
