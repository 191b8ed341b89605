// Queue (#/queues/NAME): options, partitions with every group's cursor on each (behind, oldest
// unread, lease) and per-partition seeks, a form to push a test message, the newest messages.

import { h, num, duration, time, ago, route, routeQuery, table, empty, badge, field, prettyJson, preview, replace } from "./dom.js";
import { get, post, path, withQuery } from "./api.js";
import { section, actionButton, errorBox, describe, flash } from "./ui.js";
import { skipToEnd, seekToTime, groupLabel } from "./actions.js";

const LIMITS = [20, 50, 100, 500];

function summary(q) {
  const facts = [
    ["Partitions", num(q.partitions)],
    ["Messages stored", num(q.messages.stored)],
    ["Pushed in all", num(q.messages.pushed)],
    ["Last push", q.lastPushAt ? ago(q.lastPushAt) : "never"],
    ["Created", time(q.createdAt)],
  ];
  if (q.namespace) facts.push(["Namespace", q.namespace]);
  if (q.task) facts.push(["Task", q.task]);
  return h(
    "div",
    {},
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", { "data-fact": k }, h("dt", {}, k), h("dd", {}, v)))),
    h("p", {}, h("a", { href: routeQuery("dlq", { queue: q.name }) }, "Dead letters of this queue")),
  );
}

function options(opts) {
  const keys = Object.keys(opts || {}).sort();
  if (!keys.length) return empty("No options.");
  return h(
    "dl",
    { class: "options" },
    keys.map((k) => h("div", { "data-option": k }, h("dt", {}, k), h("dd", {}, h("code", {}, typeof opts[k] === "string" ? opts[k] : JSON.stringify(opts[k]))))),
  );
}

function groupsTable(queue, groups, onChange) {
  if (!groups.length) return empty("No consumer group reads this queue yet.");
  return table(
    ["Group", "Partitions", "Behind", "Oldest unread", "Active leases", ""],
    groups.map((g) =>
      h(
        "tr",
        { "data-group": g.name },
        h("td", {}, h("a", { href: route("groups", g.name) }, groupLabel(g.name))),
        h("td", { class: "num" }, num(g.partitions)),
        h("td", { class: "num", "data-field": "lag" }, num(g.lagMessages)),
        h("td", {}, g.lagMessages > 0 ? duration(g.lagSeconds) : "–"),
        h("td", { class: "num" }, num(g.activeLeases)),
        h(
          "td",
          { class: "actions" },
          actionButton(
            "Skip all to end",
            async () => {
              if (await skipToEnd({ group: g.name, queue, behind: g.lagMessages })) onChange();
            },
            { kind: "small" },
          ),
          actionButton(
            "Seek to time…",
            async () => {
              if (await seekToTime({ group: g.name, queue })) onChange();
            },
            { kind: "small" },
          ),
        ),
      ),
    ),
  );
}

/**
 * The partitions to list: those of the answer (the most recently pushed, at most 1,000), then
 * every other one a group has a cursor on (the answer holds every cursor), known from its cursors
 * only, without depth or last push. How many partitions that leaves out is said above the table.
 */
function listedPartitions(partitions, cursors) {
  const answered = new Set(partitions.map((p) => String(p.id)));
  const others = new Map();
  for (const c of cursors) {
    const id = String(c.partitionId);
    if (answered.has(id)) continue;
    const p = others.get(id) || { id, name: c.partition, lastOffset: c.lastOffset, fromCursors: true };
    p.lastOffset = Math.max(p.lastOffset, c.lastOffset);
    others.set(id, p);
  }
  return [...partitions, ...[...others.values()].sort((a, b) => a.name.localeCompare(b.name))];
}

/** What the table leaves out, when the answer did not hold every partition. */
function partitionsNote(total, answered, listed) {
  if (answered >= total) return null;
  const older = listed > answered ? `, and ${num(listed - answered)} older one(s) a group has a cursor on (their depth is not read)` : "";
  const left = Math.max(0, total - listed);
  return h(
    "p",
    { class: "muted partitions-note", "data-not-shown": left },
    `The queue has ${num(total)} partitions. Listed: the ${num(answered)} most recently pushed${older}. `,
    left ? `Not shown: ${num(left)} partition(s) on which no group has a cursor.` : "Every partition is shown.",
  );
}

/** Partitions, each followed by every group's cursor on it. */
function partitionsTable(queue, answered, cursors, total, onChange) {
  if (!answered.length) return empty("No partitions: the first push to a partition creates it.");
  const partitions = listedPartitions(answered, cursors);
  const byPartition = new Map();
  for (const c of cursors) {
    const list = byPartition.get(String(c.partitionId)) || [];
    list.push(c);
    byPartition.set(String(c.partitionId), list);
  }
  const rows = [];
  for (const p of partitions) {
    const list = (byPartition.get(String(p.id)) || []).sort((a, b) => a.group.localeCompare(b.group));
    const span = Math.max(1, list.length);
    const partitionCells = [
      h("td", { rowspan: span, class: "partition-cell" }, h("strong", {}, p.name), h("span", { class: "muted small block" }, `id ${p.id}`)),
      h("td", { rowspan: span, class: "num", "data-field": "depth" }, num(p.messagesStored)),
      h("td", { rowspan: span, class: "num" }, num(p.lastOffset)),
      h("td", { rowspan: span }, p.lastPushAt ? ago(p.lastPushAt) : p.fromCursors ? "–" : "never"),
    ];
    if (!list.length) {
      rows.push(h("tr", { class: "partition-first", "data-partition": p.name }, partitionCells, h("td", { colspan: 6, class: "muted" }, "no consumer group has a cursor here")));
      continue;
    }
    list.forEach((c, i) => {
      const lease = c.leaseExpiresAt
        ? h("span", {}, c.leaseId ? h("code", { title: c.leaseId }, c.leaseId.slice(0, 8)) : "held", " until ", time(c.leaseExpiresAt))
        : h("span", { class: "muted" }, "none");
      rows.push(
        h(
          "tr",
          { class: i === 0 ? "partition-first" : null, "data-partition": p.name, "data-partition-id": p.id, "data-group": c.group },
          i === 0 ? partitionCells : null,
          h("td", {}, h("a", { href: route("groups", c.group) }, groupLabel(c.group))),
          h("td", { class: "num", "data-field": "committed" }, num(c.committed)),
          h("td", { class: "num", "data-field": "lag" }, c.lagMessages > 0 ? badge(num(c.lagMessages), "warn") : "0"),
          h("td", { "data-field": "age" }, c.lagMessages > 0 ? duration(c.lagSeconds) : "–"),
          h("td", { "data-field": "lease" }, lease),
          h(
            "td",
            { class: "actions" },
            actionButton(
              "Skip to end",
              async () => {
                if (await skipToEnd({ group: c.group, queue, partitionId: p.id, partition: p.name, behind: c.lagMessages })) onChange();
              },
              { kind: "small", dataset: { action: "skip-to-end" } },
            ),
            actionButton(
              "Seek to time…",
              async () => {
                if (await seekToTime({ group: c.group, queue, partitionId: p.id, partition: p.name })) onChange();
              },
              { kind: "small", dataset: { action: "seek-to-time" } },
            ),
          ),
        ),
      );
    });
  }
  return [
    partitionsNote(total, answered.length, partitions.length),
    table(["Partition", "Depth", "Last offset", "Last push", "Group", "Committed", "Behind", "Oldest unread", "Lease", ""], rows, { class: "partitions-table" }),
  ];
}

function messagesTable(messages) {
  if (!messages.length) return empty("No messages stored.");
  return table(
    ["Created", "Partition", "Offset", "Transaction id", "Payload"],
    messages.map((m) =>
      h(
        "tr",
        { "data-transaction-id": m.transactionId },
        h("td", {}, time(m.createdAt)),
        h("td", {}, m.partition),
        h("td", { class: "num" }, num(m.offset)),
        h("td", {}, h("a", { href: routeQuery("message", { pid: m.partitionId, tid: m.transactionId }) }, h("code", {}, m.transactionId))),
        h("td", { class: "payload-cell" }, h("details", {}, h("summary", {}, h("code", {}, preview(m.data))), prettyJson(m.data))),
      ),
    ),
  );
}

function pushForm(queue, partitionsList, refresh) {
  const partition = h("input", { type: "text", class: "input", name: "partition", value: "Default", list: "partition-names", autocomplete: "off", required: true });
  const payload = h("textarea", { class: "input mono", name: "payload", rows: 5, spellcheck: "false" }, '{\n  "hello": "world"\n}');
  const transactionId = h("input", { type: "text", class: "input", name: "transactionId", autocomplete: "off", placeholder: "optional: a fresh one is made" });
  const result = h("div", { class: "push-result", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "form", id: "push-form" },
    h("div", { class: "form-row" }, field("Partition", partition), field("Transaction id", transactionId)),
    field("Payload (JSON)", payload),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "button button-primary" }, "Push")),
    result,
    partitionsList,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let data;
    try {
      data = JSON.parse(payload.value);
    } catch (e) {
      replace(result, h("div", { class: "error", role: "alert" }, `The payload is not JSON: ${e.message}`));
      return;
    }
    const item = { queue, partition: partition.value.trim() || "Default", payload: data };
    if (transactionId.value.trim()) item.transactionId = transactionId.value.trim();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const answer = await post("/api/v1/push", { items: [item] });
      replace(
        result,
        table(
          ["#", "Status", "Transaction id", "Message id", "Partition id", "Offset"],
          answer.map((r) =>
            h(
              "tr",
              { "data-push-status": r.status },
              h("td", {}, String(r.index)),
              h("td", { "data-field": "status" }, badge(r.status, r.status === "queued" ? "ok" : r.status === "duplicate" ? "warn" : "info")),
              h("td", {}, r.partition_id ? h("a", { href: routeQuery("message", { pid: r.partition_id, tid: r.transaction_id }) }, h("code", {}, r.transaction_id)) : h("code", {}, r.transaction_id)),
              h("td", {}, h("code", {}, r.message_id)),
              h("td", {}, r.partition_id || "–"),
              h("td", { class: "num" }, r.offset === undefined ? "–" : num(r.offset)),
            ),
          ),
          { class: "push-result-table" },
        ),
      );
      transactionId.value = "";
      refresh();
    } catch (e) {
      replace(result, errorBox(e));
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

export function mount(root, { params }) {
  const queue = params[0];
  const heading = h("div", { class: "page-head" }, h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Overview"), " / queue"), h("h1", {}, queue));
  const overview = section("Queue", { id: "queue-summary" });
  const opts = section("Options", { id: "queue-options" });
  const groups = section("Consumer groups", { id: "queue-groups" });
  const parts = section("Partitions", { id: "queue-partitions", intro: "Per partition, every consumer group's cursor: how far behind it is, the age of its oldest unread message, and who holds its lease." });
  const partitionsList = h("datalist", { id: "partition-names" });
  let knownPartitions = "";
  const limit = h("select", { class: "input input-small", "aria-label": "How many messages" }, LIMITS.map((n) => h("option", { value: n }, `newest ${n}`)));
  const messages = section("Messages", { id: "queue-messages", actions: limit });
  const pushPanel = h(
    "section",
    { class: "panel", id: "queue-push" },
    h("div", { class: "panel-head" }, h("h2", {}, "Push a test message")),
    pushForm(queue, partitionsList, () => refresh()),
  );
  root.append(heading, overview.el, parts.el, groups.el, pushPanel, messages.el, opts.el);

  const refreshMessages = async () => {
    try {
      const answer = await get(withQuery("/api/v1/messages", { queue, limit: limit.value }));
      messages.show(answer.messages, messagesTable);
    } catch (e) {
      messages.fail(e);
    }
  };
  limit.addEventListener("change", refreshMessages);

  async function refresh() {
    let answer;
    try {
      answer = await get(path("status", "queues", queue));
    } catch (e) {
      for (const s of [overview, opts, groups, parts]) s.fail(e);
      messages.fail(e);
      return;
    }
    overview.show(answer.queue, summary);
    opts.show(answer.queue.options, options);
    groups.show(answer.queue.consumerGroups, (g) => groupsTable(queue, g, changed));
    const names = answer.partitions.map((p) => p.name).join("\n");
    if (names !== knownPartitions) {
      knownPartitions = names;
      replace(partitionsList, answer.partitions.map((p) => h("option", { value: p.name })));
    }
    parts.show({ partitions: answer.partitions, cursors: answer.cursors, total: answer.queue.partitions }, (d) => partitionsTable(queue, d.partitions, d.cursors, d.total, changed));
    await refreshMessages();
  }

  // After an action, show its effect at once rather than at the next poll.
  function changed() {
    refresh().catch((e) => flash(describe(e), "error"));
  }

  return { title: `Queue ${queue}`, refresh };
}
