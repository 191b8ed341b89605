// Message (#/message?pid=&tid=): one message by partition id and transaction id, its status and
// every group's progress on it.

import { h, num, time, route, routeQuery, table, empty, badge, field, prettyJson } from "./dom.js";
import { get, path } from "./api.js";
import { section } from "./ui.js";
import { groupLabel } from "./actions.js";

const STATUS_KIND = { completed: "ok", processing: "info", pending: "warn" };

function render(m) {
  const facts = [
    ["Queue", h("a", { href: route("queues", m.queue) }, m.queue)],
    ["Partition", `${m.partition} (id ${m.partitionId})`],
    ["Offset", num(m.offset)],
    ["Transaction id", h("code", {}, m.transactionId)],
    ["Message id", h("code", {}, m.id)],
    ["Trace id", m.traceId ? h("code", {}, m.traceId) : "–"],
    ["Producer", m.producerSub || "–"],
    ["Created", time(m.createdAt)],
  ];
  if (m.namespace) facts.push(["Namespace", m.namespace]);
  if (m.task) facts.push(["Task", m.task]);
  return h(
    "div",
    { class: "message", "data-status": m.status },
    h("p", {}, "Status: ", h("span", { "data-field": "status" }, badge(m.status, STATUS_KIND[m.status] || "muted"))),
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", { "data-fact": k }, h("dt", {}, k), h("dd", {}, v)))),
    h("h3", {}, "Consumer groups"),
    m.consumerGroups.length
      ? table(
          ["Group", "Consumed", "Lease expires"],
          m.consumerGroups.map((g) =>
            h(
              "tr",
              { "data-group": g.name },
              h("td", {}, h("a", { href: route("groups", g.name) }, groupLabel(g.name))),
              h("td", { "data-field": "consumed" }, g.consumed ? badge("consumed", "ok") : badge("not yet", "warn")),
              h("td", {}, g.leaseExpiresAt ? time(g.leaseExpiresAt) : h("span", { class: "muted" }, "no lease")),
            ),
          ),
          { class: "message-groups-table" },
        )
      : empty("No consumer group has a cursor on this partition."),
    h("h3", {}, "Payload"),
    prettyJson(m.data),
  );
}

export function mount(root, { query, navigate }) {
  const pid = query.get("pid") || "";
  const tid = query.get("tid") || "";
  const pidInput = h("input", { type: "text", class: "input", name: "pid", value: pid, inputmode: "numeric", autocomplete: "off", required: true });
  const tidInput = h("input", { type: "text", class: "input", name: "tid", value: tid, autocomplete: "off", required: true });
  const form = h(
    "form",
    { class: "form", id: "message-form" },
    h("div", { class: "form-row" }, field("Partition id", pidInput), field("Transaction id", tidInput), h("div", { class: "form-actions" }, h("button", { type: "submit", class: "button button-primary" }, "Look up"))),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    navigate(routeQuery("message", { pid: pidInput.value.trim(), tid: tidInput.value.trim() }));
  });
  const found = section("Message", { id: "message" });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Message")), h("section", { class: "panel" }, form));
  if (!pid || !tid) {
    root.append(h("p", { class: "muted" }, "Give a partition id and a transaction id (the queue page lists messages with both)."));
    return { title: "Message", refresh: async () => {} };
  }
  root.append(found.el);
  return {
    title: `Message ${tid}`,
    async refresh() {
      try {
        found.show(await get(path("messages", pid, tid)), render);
      } catch (e) {
        found.fail(e);
      }
    },
  };
}
