// Dead letters (#/dlq?queue=&consumerGroup=&partition=&from=&to=&limit=&offset=): filter, page,
// inspect, re-queue and delete. The filter lives in the address, so a link can carry it.

import { h, num, time, routeQuery, table, empty, field, parseTime, prettyJson, preview, replace } from "./dom.js";
import { get, post, del, path, withQuery } from "./api.js";
import { section, actionButton, describe, flash, openDialog, showDialog } from "./ui.js";
import { groupLabel } from "./actions.js";

const PAGE_SIZES = [20, 50, 100, 500];
const FILTERS = ["queue", "consumerGroup", "partition", "from", "to"];

// The broker answers `data: null` both for a payload that is JSON null and for one retention
// removed before the message was dead-lettered; only the latter comes without the message's id.
const removed = (d) => d.id === null;

function inspect(d) {
  const facts = [
    ["Queue", d.queue],
    ["Partition", `${d.partition} (id ${d.partitionId})`],
    ["Offset", num(d.offset)],
    ["Consumer group", d.consumerGroup],
    ["Transaction id", d.transactionId || "–"],
    ["Message id", d.id || "–"],
    ["Dead letter id", String(d.deadLetterId)],
    ["Trace id", d.traceId || "–"],
    ["Producer", d.producerSub || "–"],
    ["Created", time(d.createdAt)],
    ["Failed", time(d.failedAt)],
    ["Retries", num(d.retryCount)],
  ];
  return showDialog(
    "Dead letter",
    [
      h("dl", { class: "facts facts-compact" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
      h("h3", {}, "Error"),
      h("pre", { class: "error-text" }, d.errorMessage || "–"),
      h("h3", {}, "Payload"),
      removed(d) ? h("p", { class: "muted" }, "The payload is unavailable: retention removed the message first.") : prettyJson(d.data),
    ],
    "dead-letter-dialog",
  );
}

async function retry(d, changed) {
  const answer = await openDialog({
    id: "retry-dead-letter-dialog",
    title: "Retry the message",
    confirm: "Retry",
    content: [
      h("p", {}, "Push message ", h("code", {}, d.transactionId), " of queue ", h("strong", {}, d.queue), ", partition ", h("strong", {}, d.partition), " again, as a new message at the end of the partition?"),
      h("p", { class: "muted" }, "Every group that reads the partition receives it; the message's dead letters (all its groups) go."),
    ],
    action: () => post(path("messages", d.partitionId, d.transactionId, "retry")),
  });
  if (answer) {
    flash(
      answer.result === "moved"
        ? `Message ${d.transactionId} is back in ${answer.queue} (partition id ${answer.partitionId}, offset ${answer.offset}) as ${answer.transactionId}; ${answer.deadLetters} dead letter(s) removed.`
        : `Message ${d.transactionId} was already re-queued as ${answer.transactionId}; ${answer.deadLetters} dead letter(s) removed.`,
    );
    changed();
  }
}

async function remove(d, changed) {
  const answer = await openDialog({
    id: "delete-dead-letter-dialog",
    title: "Delete dead letters",
    confirm: "Delete",
    danger: true,
    content: [
      h("p", {}, "Delete every dead letter of message ", h("code", {}, d.transactionId), " of queue ", h("strong", {}, d.queue), ", partition ", h("strong", {}, d.partition), " (all its groups)?"),
      h("p", { class: "muted" }, "The message stays in the log; only the dead letters go, and cannot be re-queued afterwards."),
    ],
    action: () => del(path("messages", d.partitionId, d.transactionId)),
  });
  if (answer) {
    flash(`Deleted ${answer.deletedDeadLetters} dead letter(s) of ${d.transactionId}.`);
    changed();
  }
}

function rows(page, changed) {
  if (!page.messages.length) return empty(page.total > 0 ? "No dead letters on this page." : "No dead letters.");
  return table(
    ["Failed", "Queue", "Partition", "Group", "Transaction id", "Error", "Retries", "Payload", ""],
    page.messages.map((d) => {
      const usable = Boolean(d.transactionId);
      const why = usable ? null : "This dead letter lost its transaction id with its message";
      return h(
        "tr",
        { "data-dead-letter-id": d.deadLetterId, "data-transaction-id": d.transactionId || "", "data-queue": d.queue },
        h("td", {}, time(d.failedAt)),
        h("td", {}, h("a", { href: routeQuery("dlq", { queue: d.queue }) }, d.queue)),
        h("td", {}, d.partition),
        h("td", {}, groupLabel(d.consumerGroup)),
        h("td", {}, h("code", {}, d.transactionId || "–")),
        h("td", { class: "error-cell" }, d.errorMessage || "–"),
        h("td", { class: "num" }, num(d.retryCount)),
        h("td", { class: "payload-cell", "data-field": "payload" }, h("code", {}, removed(d) ? "(unavailable)" : preview(d.data, 60))),
        h(
          "td",
          { class: "actions" },
          actionButton("Inspect", () => inspect(d), { kind: "small", dataset: { action: "inspect" } }),
          usable ? actionButton("Retry…", () => retry(d, changed), { kind: "small", title: "Push the message again into its partition", dataset: { action: "retry" } }) : h("button", { class: "button button-small", disabled: true, title: why }, "Retry…"),
          usable ? actionButton("Delete…", () => remove(d, changed), { kind: "small-danger", dataset: { action: "delete" } }) : null,
        ),
      );
    }),
    { class: "dlq-table" },
  );
}

export function mount(root, { query, navigate }) {
  const limit = PAGE_SIZES.includes(Number(query.get("limit"))) ? Number(query.get("limit")) : 50;
  const offset = Math.max(0, Number(query.get("offset")) || 0);
  const inputs = {};
  const labels = { queue: "Queue", consumerGroup: "Consumer group", partition: "Partition", from: "Failed from", to: "Failed until" };
  for (const key of FILTERS) {
    inputs[key] = h("input", { type: "text", class: "input", name: key, value: query.get(key) || "", autocomplete: "off", placeholder: key === "from" || key === "to" ? "-1h, 2026-07-29 14:00" : "" });
  }
  const pageSize = h("select", { class: "input", name: "limit" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === limit }, String(n))));
  const formError = h("div", {});
  const form = h(
    "form",
    { class: "form filter-form", id: "dlq-filter" },
    h("div", { class: "form-row" }, FILTERS.map((k) => field(labels[k], inputs[k])), field("Per page", pageSize)),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "button button-primary" }, "Filter"), h("a", { class: "button", href: "#/dlq" }, "Clear")),
    formError,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = { limit: pageSize.value, offset: 0 };
    try {
      for (const key of FILTERS) {
        const value = inputs[key].value.trim();
        // Times go to the broker as ISO 8601; what was typed is kept readable in the address.
        if (value) next[key] = key === "from" || key === "to" ? parseTime(value) : value;
      }
    } catch (e) {
      replace(formError, h("div", { class: "error", role: "alert" }, e.message));
      return;
    }
    navigate(routeQuery("dlq", next));
  });

  const list = section("Dead letters", { id: "dlq" });
  const pager = h("div", { class: "pager" });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Dead letters")), h("section", { class: "panel" }, form), list.el, pager);

  const filter = {};
  for (const key of FILTERS) if (query.get(key)) filter[key] = query.get(key);

  const at = (newOffset) => routeQuery("dlq", { ...filter, limit, offset: newOffset });
  async function refresh() {
    let page;
    try {
      page = await get(withQuery("/api/v1/dlq", { ...filter, limit, offset }));
    } catch (e) {
      list.fail(e);
      replace(pager);
      return;
    }
    list.show(page, (p) => rows(p, changed));
    const last = Math.min(offset + page.messages.length, page.total);
    replace(
      pager,
      h("span", { class: "pager-text", "data-total": page.total }, page.total ? `${num(offset + (page.messages.length ? 1 : 0))}–${num(last)} of ${num(page.total)}` : "0 dead letters"),
      offset > 0 ? h("a", { class: "button", href: at(Math.max(0, offset - limit)) }, "← Newer") : null,
      offset + limit < page.total ? h("a", { class: "button", href: at(offset + limit) }, "Older →") : null,
    );
  }
  function changed() {
    list.invalidate();
    refresh().catch((e) => flash(describe(e), "error"));
  }
  return { title: "Dead letters", refresh };
}
