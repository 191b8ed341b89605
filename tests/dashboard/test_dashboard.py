"""The dashboard in a real browser against a real broker: each page shows what the API holds, and
the actions taken through the page (skip to end, seek, push, delete a group, re-queue and delete
dead letters) reach the broker, checked through the API.

The tests run in file order and share the data made once by `data`. The page redraws what changed
at every poll (every 2 s here), so rows are read in one script call (`snapshot`) and clicks find
their element again if a redraw replaced it.
"""

import json

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from dashboard_helpers import PHONE, click, css_string, screenshot, snapshot, text_of, unique, wait_for, wait_until

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


def shows(browser, css, check, message):
    """Waits until the element at `css` passes `check(snapshot)`; returns that snapshot."""

    last = []

    def attempt(d):
        seen = snapshot(d, css)
        last[:] = [seen]
        return seen if check(seen) else None

    try:
        return wait_for(browser, attempt, message)
    except TimeoutException:
        raise AssertionError(f"{message}: {css} never did; it last showed {last[0] if last else 'nothing'}") from None


def cursor_row(queue_or_group_page, partition, group):
    return f'{queue_or_group_page} tr[data-partition="{partition}"][data-group={css_string(group)}]'


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


def test_dead_letters_filter_inspect_retry_and_delete(browser, queen_url, api, data, screenshots):
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

    # Retry: the dead letter goes, and the message is back in its partition for the group.
    click(browser, '#dlq tr[data-transaction-id="dead-1"] [data-action="retry"]')
    wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, '#dlq tr[data-transaction-id="dead-1"]'), "dead-1 leaves the list")
    assert "back in" in text_of(browser, "#flash")
    left = api.get("/api/v1/dlq", queue=dead)
    assert [m["transactionId"] for m in left["messages"]] == ["dead-2"] and left["total"] == 1, left
    again, _ = api.pop_until(dead, data["reader"], 1)
    assert again[0]["data"] == {"note": "<b>bold</b>", "n": 1} and again[0]["transactionId"].startswith("dlq:"), again
    api.ack(data["reader"], again)

    # Delete, confirmed.
    click(browser, '#dlq tr[data-transaction-id="dead-2"] [data-action="delete"]')
    confirm_dialog(browser, "delete-dead-letter-dialog")
    shows(browser, "#dlq", lambda r: "No dead letters" in r["text"], "the list is empty")
    assert api.get("/api/v1/dlq", queue=dead)["total"] == 0
    assert api.status_of("GET", f"/api/v1/messages/{again[0]['partitionId']}/dead-2") == 200, "the message itself stays in the log"


def test_what_is_typed_survives_the_live_updates(browser, queen_url):
    open_page(browser, queen_url, "#/dlq")
    field = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#dlq-filter [name=consumerGroup]"), "the filter")
    field.send_keys("typed-while-polling")
    for _ in range(2):
        before = browser.find_element(By.ID, "live").text
        wait_for(browser, lambda d: d.find_element(By.ID, "live").text != before, "a refresh")
    assert field.get_attribute("value") == "typed-while-polling"
    assert browser.execute_script("return document.activeElement.name") == "consumerGroup"
