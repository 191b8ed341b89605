// Consumer groups (#/groups) and one group (#/groups/NAME): lag per queue and partition, the
// subscription, seeks, deletion.

import { h, num, duration, time, ago, route, table, empty, badge, field, parseTime, replace } from "./dom.js";
import { get, post, path } from "./api.js";
import { section, actionButton, errorBox, describe, flash } from "./ui.js";
import { skipToEnd, seekToTime, deleteGroup, groupLabel } from "./actions.js";


/** The cells a group's lag on one queue shows, in the list and on the group's page alike. */
function queueLagCells(q) {
  return [
    h("td", {}, h("a", { href: route("queues", q.queue) }, q.queue)),
    h("td", { class: "num" }, num(q.partitions)),
    lagCell(q.lagMessages),
    h("td", {}, q.lagMessages > 0 ? duration(q.lagSeconds) : "–"),
    h("td", { class: "num" }, num(q.activeLeases)),
    h("td", { class: "num" }, num(q.totalConsumed)),
  ];
}
function subscription(q) {
  if (!q.subscriptionMode) return h("span", { class: "muted" }, "not registered");
  return h("span", {}, q.subscriptionMode, q.subscriptionFrom ? [" from ", time(q.subscriptionFrom)] : null);
}

function lagCell(messages) {
  return h("td", { class: "num", "data-field": "lag" }, messages > 0 ? badge(num(messages), "warn") : "0");
}

function listTable(groups) {
  if (!groups.length) return empty("No consumer groups: a group appears with its first pop.");
  const rows = [];
  for (const g of groups) {
    const queues = g.queues.length ? g.queues : [null];
    queues.forEach((q, i) => {
      rows.push(
        h(
          "tr",
          { class: i === 0 ? "group-first" : null, "data-group": g.name, "data-queue": q ? q.queue : null },
          i === 0
            ? [
                h("td", { rowspan: queues.length }, h("a", { href: route("groups", g.name) }, groupLabel(g.name))),
                h("td", { rowspan: queues.length, class: "num", "data-field": "total-lag" }, num(g.totalLag)),
              ]
            : null,
          q
            ? [
                ...queueLagCells(q),
                h("td", {}, subscription(q)),
              ]
            : h("td", { colspan: 7, class: "muted" }, "no queue"),
        ),
      );
    });
  }
  return table(["Group", "Total behind", "Queue", "Partitions", "Behind", "Oldest unread", "Leases", "Consumed", "Subscription"], rows, { class: "groups-table" });
}

export function mountList(root) {
  const filter = h("input", { type: "search", class: "input input-small", placeholder: "Filter by name", "aria-label": "Filter groups by name", autocomplete: "off" });
  const list = section("Consumer groups", { id: "groups", actions: filter });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Consumer groups")), list.el);
  let last = null;
  const render = () => {
    if (!last) return;
    const needle = filter.value.trim().toLowerCase();
    const shown = needle ? last.filter((g) => g.name.toLowerCase().includes(needle)) : last;
    list.show(shown, listTable);
  };
  filter.addEventListener("input", render);
  return {
    title: "Consumer groups",
    async refresh() {
      try {
        last = await get("/api/v1/consumer-groups");
        render();
      } catch (e) {
        list.fail(e);
      }
    },
  };
}

function summary(g) {
  return h(
    "dl",
    { class: "facts" },
    h("div", { "data-fact": "total-lag" }, h("dt", {}, "Behind, all queues"), h("dd", {}, num(g.totalLag))),
    h("div", {}, h("dt", {}, "Oldest unread"), h("dd", {}, g.totalLag > 0 ? duration(g.maxLagSeconds) : "–")),
    h("div", {}, h("dt", {}, "Queues"), h("dd", {}, num(g.queues.length))),
    h("div", {}, h("dt", {}, "Partitions"), h("dd", {}, num(g.partitions.length))),
  );
}

function queuesTable(group, queues, changed, gone) {
  if (!queues.length) return empty("The group reads no queue.");
  return table(
    ["Queue", "Partitions", "Behind", "Oldest unread", "Leases", "Consumed", "Last consumed", "Subscription", ""],
    queues.map((q) =>
      h(
        "tr",
        { "data-queue": q.queue },
        ...queueLagCells(q),
        h("td", {}, q.lastConsumedAt ? ago(q.lastConsumedAt) : "never"),
        h("td", {}, subscription(q)),
        h(
          "td",
          { class: "actions" },
          actionButton("Skip to end", async () => (await skipToEnd({ group, queue: q.queue, behind: q.lagMessages })) && changed(), { kind: "small", dataset: { action: "skip-to-end" } }),
          actionButton("Seek to time…", async () => (await seekToTime({ group, queue: q.queue })) && changed(), { kind: "small", dataset: { action: "seek-to-time" } }),
          actionButton("Delete on queue…", async () => (await deleteGroup(group, q.queue)) && (queues.length > 1 ? changed() : gone()), { kind: "small-danger", dataset: { action: "delete-on-queue" } }),
        ),
      ),
    ),
    { class: "group-queues-table" },
  );
}

function partitionsTable(group, partitions, changed) {
  if (!partitions.length) return empty("No cursors: the group has not read a partition yet.");
  const sorted = [...partitions].sort((a, b) => a.queue.localeCompare(b.queue) || a.partition.localeCompare(b.partition));
  return table(
    ["Queue", "Partition", "Committed", "Last offset", "Behind", "Oldest unread", "Lease until", "Consumed", "Retries", ""],
    sorted.map((p) =>
      h(
        "tr",
        { "data-queue": p.queue, "data-partition": p.partition, "data-partition-id": p.partitionId },
        h("td", {}, h("a", { href: route("queues", p.queue) }, p.queue)),
        h("td", {}, p.partition, h("span", { class: "muted small block" }, `id ${p.partitionId}`)),
        h("td", { class: "num", "data-field": "committed" }, num(p.committed)),
        h("td", { class: "num" }, num(p.lastOffset)),
        lagCell(p.lagMessages),
        h("td", {}, p.lagMessages > 0 ? duration(p.lagSeconds) : "–"),
        h("td", {}, p.leaseActive ? time(p.leaseExpiresAt) : h("span", { class: "muted" }, "none")),
        h("td", { class: "num" }, num(p.totalConsumed)),
        h("td", { class: "num", title: "retries / redeliveries" }, `${p.retryCount} / ${p.redeliveryCount}`),
        h(
          "td",
          { class: "actions" },
          actionButton("Skip to end", async () => (await skipToEnd({ group, queue: p.queue, partitionId: p.partitionId, partition: p.partition, behind: p.lagMessages })) && changed(), { kind: "small", dataset: { action: "skip-to-end" } }),
          actionButton("Seek to time…", async () => (await seekToTime({ group, queue: p.queue, partitionId: p.partitionId, partition: p.partition })) && changed(), { kind: "small", dataset: { action: "seek-to-time" } }),
        ),
      ),
    ),
    { class: "group-partitions-table" },
  );
}

function subscriptionForm(group, changed) {
  const input = h("input", { type: "text", class: "input", name: "subscriptionTimestamp", placeholder: "2026-07-29T14:00:00Z, now, -1h", autocomplete: "off" });
  const result = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    { class: "form", id: "subscription-form" },
    h("p", { class: "intro" }, "Where the group starts on partitions it has not read yet (new partitions, say). It does not move a cursor the group already has: to replay or skip, seek."),
    h("div", { class: "form-row" }, field("Start from", input, "ISO 8601, local time (2026-07-29 14:00), now, or -15m / -2h / -1d"), h("div", { class: "form-actions" }, h("button", { type: "submit", class: "button button-primary" }, "Update subscription"))),
    result,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const answer = await post(path("consumer-groups", group, "subscription"), { subscriptionTimestamp: parseTime(input.value) });
      replace(result, h("p", { class: "ok", role: "status" }, `The subscription now starts at ${answer.newTimestamp} on ${answer.queues.join(", ")}.`));
      changed();
    } catch (e) {
      replace(result, errorBox(e));
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export function mountDetail(root, { params, navigate }) {
  const group = params[0];
  const gone = () => navigate("#/groups");
  const remove = actionButton("Delete group…", async () => (await deleteGroup(group)) && gone(), { kind: "danger", dataset: { action: "delete-group" } });
  root.append(
    h(
      "div",
      { class: "page-head" },
      h("p", { class: "crumbs" }, h("a", { href: "#/groups" }, "Consumer groups"), " / group"),
      h("div", { class: "title-row" }, h("h1", {}, groupLabel(group)), remove),
    ),
  );
  const overview = section("Lag", { id: "group-summary" });
  const queues = section("Queues", { id: "group-queues" });
  const parts = section("Partitions", { id: "group-partitions" });
  const subscriptionPanel = h(
    "section",
    { class: "panel", id: "group-subscription" },
    h("div", { class: "panel-head" }, h("h2", {}, "Subscription")),
    subscriptionForm(group, () => changed()),
  );
  root.append(overview.el, queues.el, parts.el, subscriptionPanel);

  async function refresh() {
    try {
      const g = await get(path("consumer-groups", group));
      overview.show(g, summary);
      queues.show(g.queues, (q) => queuesTable(group, q, changed, gone));
      parts.show(g.partitions, (p) => partitionsTable(group, p, changed));
    } catch (e) {
      for (const s of [overview, queues, parts]) s.fail(e);
    }
  }
  function changed() {
    refresh().catch((e) => flash(describe(e), "error"));
  }
  return { title: `Group ${group}`, refresh };
}
