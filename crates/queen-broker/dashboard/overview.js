// Overview (#/): totals, the last hour's throughput and lag as charts, the queues with their
// groups' lag, and the brokers of the fleet with the maintenance switches.

import { h, num, rate, duration, durationTick, time, ago, route, table, empty, badge } from "./dom.js";
import { get, withQuery } from "./api.js";
import { section, describe } from "./ui.js";
import { drawChart } from "./charts.js";
import { groupLabel } from "./actions.js";

/** Most points a chart draws; longer histories are summed (counts) or maxed (lag) into buckets. */
const MAX_POINTS = 240;
const WINDOWS = [
  [15, "Last 15 minutes"],
  [60, "Last hour"],
  [360, "Last 6 hours"],
  [1440, "Last 24 hours"],
];
const WINDOW_KEY = "queen.dashboard.historyMinutes";

const windowLabel = (minutes) => WINDOWS.find(([m]) => m === minutes)[1];

function historyMinutes() {
  const stored = Number(localStorage.getItem(WINDOW_KEY));
  return WINDOWS.some(([m]) => m === stored) ? stored : 60;
}

/**
 * How often the history is fetched again: once per chart bucket (a long window's answer is
 * large and its buckets change slowly), between 5 s and a minute.
 */
function historyRefreshMs(minutes) {
  return Math.min(60000, Math.max(5000, (minutes * 60000) / MAX_POINTS / 2));
}

const STATS = [
  ["queues", "Queues"],
  ["partitions", "Partitions"],
  ["messages", "Messages"],
  ["consumerGroups", "Consumer groups"],
  ["activeLeases", "Active leases"],
  ["deadLetters", "Dead letters"],
];

function totals(status) {
  const value = (key) => (key === "messages" ? status.messages.stored : status[key]);
  const note = (key) => (key === "messages" ? `${num(status.messages.pushed)} pushed in all` : null);
  return h(
    "div",
    {},
    h(
      "div",
      { class: "stats" },
      STATS.map(([key, label]) => {
        const inner = [h("span", { class: "stat-value" }, num(value(key))), h("span", { class: "stat-label" }, label), note(key) ? h("span", { class: "stat-note" }, note(key)) : null];
        const attrs = { class: ["stat", key === "deadLetters" && status.deadLetters > 0 && "stat-alert"], "data-stat": key };
        return key === "deadLetters" ? h("a", { ...attrs, href: "#/dlq" }, inner) : h("div", attrs, inner);
      }),
    ),
    h("p", { class: "muted small" }, `Answered by broker ${status.broker} (version ${status.version}, up ${duration(status.uptimeSeconds)}).`),
  );
}

/**
 * The history as chart series, at most about MAX_POINTS points. Buckets are aligned to the clock
 * (not to the first point), so they stay put from one refresh to the next; a rate is a bucket's
 * count over the time its samples cover.
 */
function series(history) {
  const interval = history.intervalSeconds || 1;
  const points = history.points || [];
  const bucketSeconds = Math.max(1, Math.ceil(points.length / MAX_POINTS)) * interval;
  const chunks = [];
  let current = null;
  for (const p of points) {
    const bucket = Math.floor(Date.parse(p.at) / 1000 / bucketSeconds);
    if (bucket !== current) {
      chunks.push([]);
      current = bucket;
    }
    chunks[chunks.length - 1].push(p);
  }
  const out = { times: [], pushed: [], delivered: [], acked: [], lagMessages: [], lagSeconds: [], totals: { pushed: 0, delivered: 0, acked: 0 } };
  for (const chunk of chunks) {
    const sum = (key) => chunk.reduce((acc, p) => acc + (p[key] || 0), 0);
    const maxOf = (key) => {
      const values = chunk.map((p) => p[key]).filter((v) => v !== null && v !== undefined);
      return values.length ? Math.max(...values) : null;
    };
    const seconds = chunk.length * interval;
    out.times.push(Date.parse(chunk[chunk.length - 1].at));
    for (const key of ["pushed", "delivered", "acked"]) {
      const count = sum(key);
      out.totals[key] += count;
      out[key].push(count / seconds);
    }
    out.lagMessages.push(maxOf("lagMessages"));
    out.lagSeconds.push(maxOf("lagSeconds"));
  }
  return out;
}

/**
 * Queues a page of the list shows, by name. One more is asked for, to know whether another page
 * follows: the API answers no total, and at most 1,000 queues at a time.
 */
const QUEUE_PAGE = 500;

/** Where the list is, with previous and next controls; nothing when every queue fits one page. */
function queuePager({ queues, offset, more, total }, turn) {
  if (offset === 0 && !more) return null;
  const of = total === null ? "" : ` of ${num(total)}`;
  return h(
    "div",
    { class: "pager" },
    queues.length ? h("span", { class: "pager-text" }, `Queues ${num(offset + 1)}–${num(offset + queues.length)}${of}, by name`) : null,
    offset > 0 ? h("button", { type: "button", class: "button", "data-action": "previous-queues", onclick: () => turn(Math.max(0, offset - QUEUE_PAGE)) }, "← Previous") : null,
    more ? h("button", { type: "button", class: "button", "data-action": "next-queues", onclick: () => turn(offset + QUEUE_PAGE) }, "Next →") : null,
  );
}

function queueRows(page, turn) {
  const { queues, offset } = page;
  if (!queues.length && offset === 0) return empty("No queues yet: a queue is created by its first push or by configure.");
  if (!queues.length) return [queuePager(page, turn), empty(`No queues after the first ${num(offset)}.`)];
  return [queuePager(page, turn), table(
    ["Queue", "Partitions", "Messages", "Pushed", "Last push", "Consumer groups: behind, oldest unread"],
    queues.map((q) =>
      h(
        "tr",
        { "data-queue": q.name },
        h("td", {}, h("a", { href: route("queues", q.name) }, q.name), q.namespace || q.task ? h("span", { class: "muted small block" }, [q.namespace, q.task].filter(Boolean).join(" / ")) : null),
        h("td", { class: "num" }, num(q.partitions)),
        h("td", { class: "num", "data-field": "messages" }, num(q.messages.stored)),
        h("td", { class: "num" }, num(q.messages.pushed)),
        h("td", {}, q.lastPushAt ? ago(q.lastPushAt) : "never"),
        h(
          "td",
          {},
          q.consumerGroups.length
            ? h(
                "ul",
                { class: "chips" },
                q.consumerGroups.map((g) =>
                  h(
                    "li",
                    { class: ["chip", g.lagMessages > 0 && "chip-lag"], "data-group": g.name, "data-lag": g.lagMessages },
                    h("a", { href: route("groups", g.name) }, groupLabel(g.name)),
                    `: ${num(g.lagMessages)} behind`,
                    g.lagMessages > 0 ? `, ${duration(g.lagSeconds)}` : "",
                  ),
                ),
              )
            : h("span", { class: "muted" }, "none"),
        ),
      ),
    ),
    { class: "queues-table" },
  )];
}

const STATE_KIND = { live: "ok", stopping: "warn", stopped: "muted", missing: "bad" };

function fleet(brokers) {
  const maintenance = h(
    "p",
    { class: "maintenance" },
    "Maintenance: ",
    h("span", { "data-maintenance": "push" }, "push ", brokers.maintenance.push ? badge("on: pushes are buffered", "warn") : badge("off", "ok")),
    " ",
    h("span", { "data-maintenance": "pop" }, "pop ", brokers.maintenance.pop ? badge("on: pops are paused", "warn") : badge("off", "ok")),
  );
  return h(
    "div",
    {},
    maintenance,
    brokers.brokers.length
      ? table(
          ["Broker", "State", "Version", "Started", "Last seen", "Buffered pushes", "Buffer"],
          brokers.brokers.map((b) =>
            h(
              "tr",
              { "data-broker": b.id },
              h("td", {}, h("code", {}, b.id), b.self ? [" ", badge("this one", "info")] : null),
              h("td", { "data-field": "state" }, badge(b.state, STATE_KIND[b.state] || "muted")),
              h("td", {}, b.version),
              h("td", {}, time(b.startedAt)),
              h("td", {}, ago(b.lastSeenAt)),
              h("td", { class: "num" }, num(b.bufferedMessages)),
              h("td", {}, b.bufferHealthy ? badge("healthy", "ok") : badge("unhealthy", "bad")),
            ),
          ),
          { class: "brokers-table" },
        )
      : empty("No broker has reported yet."),
    h("p", { class: "muted small" }, `Brokers report every ${brokers.heartbeatSeconds} s; one not seen for a few reports is missing.`),
  );
}

export function mount(root) {
  const summary = section("Totals", { id: "totals" });
  const throughput = h("div", { class: "chart", id: "chart-throughput" });
  const lagMessages = h("div", { class: "chart", id: "chart-lag-messages" });
  const lagSeconds = h("div", { class: "chart", id: "chart-lag-seconds" });
  const chartNote = h("p", { class: "muted small", id: "history-note" });
  const windowSelect = h(
    "select",
    { class: "input input-small", "aria-label": "History window", id: "history-window" },
    WINDOWS.map(([minutes, label]) => h("option", { value: minutes, selected: minutes === historyMinutes() }, label)),
  );
  const charts = h(
    "section",
    { class: "panel", id: "history" },
    h("div", { class: "panel-head" }, h("h2", {}, "History"), h("div", { class: "panel-actions" }, windowSelect)),
    chartNote,
    h(
      "div",
      { class: "charts" },
      h("figure", {}, h("figcaption", {}, "Throughput, messages per second"), throughput),
      h("figure", {}, h("figcaption", {}, "Messages behind, every group"), lagMessages),
      h("figure", {}, h("figcaption", {}, "Oldest unread message"), lagSeconds),
    ),
  );
  const queues = section("Queues", { id: "queues" });
  const brokers = section("Brokers", { id: "brokers" });
  root.append(summary.el, charts, queues.el, brokers.el);

  let historyShown = null;
  let historyFetched = 0;
  // Which history request is the latest: switching the window quickly can leave an earlier,
  // slower answer arriving last, and it must not replace the one the window asks for.
  let historyAsked = 0;

  windowSelect.addEventListener("change", () => {
    localStorage.setItem(WINDOW_KEY, windowSelect.value);
    refreshHistory(true);
  });

  async function refreshHistory(force = false) {
    const minutes = historyMinutes();
    if (!force && historyShown && Date.now() - historyFetched < historyRefreshMs(minutes)) return;
    const asked = ++historyAsked;
    let history;
    try {
      history = await get(withQuery("/api/v1/status/history", { minutes }));
    } catch (e) {
      if (asked !== historyAsked) return;
      historyShown = null;
      chartNote.textContent = describe(e);
      chartNote.className = "error";
      return;
    }
    if (asked !== historyAsked) return;
    historyFetched = Date.now();
    if (!history.points.length) {
      historyShown = null;
      chartNote.textContent = "No samples yet: the brokers record one every few seconds.";
      chartNote.className = "muted small";
      return;
    }
    const key = JSON.stringify([minutes, history.to, history.points.length, history.points.at(-1)]);
    if (key === historyShown) return;
    historyShown = key;
    const s = series(history);
    chartNote.className = "muted small";
    chartNote.textContent = `${windowLabel(minutes)}: ${history.points.length} samples of ${history.intervalSeconds} s, ${new Date(history.from).toLocaleTimeString()} to ${new Date(history.to).toLocaleTimeString()}, the whole fleet.`;
    const span = { times: s.times, from: Date.parse(history.from), to: Date.parse(history.to) };
    drawChart(throughput, {
      ...span,
      label: "Throughput",
      format: (v) => rate(v) + "/s",
      series: [
        { key: "pushed", label: "pushed", values: s.pushed, total: s.totals.pushed },
        { key: "delivered", label: "delivered", values: s.delivered, total: s.totals.delivered },
        { key: "acked", label: "acked", values: s.acked, total: s.totals.acked },
      ],
    });
    drawChart(lagMessages, { ...span, label: "Messages behind", format: num, series: [{ key: "lagMessages", label: "behind", values: s.lagMessages }] });
    drawChart(lagSeconds, { ...span, label: "Oldest unread", format: duration, tick: durationTick, axis: "time", series: [{ key: "lagSeconds", label: "oldest unread", values: s.lagSeconds }] });
  }

  // How many queues there are in all, from the totals, for the list's pager.
  let queueTotal = null;
  let queueOffset = 0;

  async function refreshStatus() {
    try {
      const status = await get("/api/v1/status");
      queueTotal = status.queues;
      summary.show(status, totals);
    } catch (e) {
      queueTotal = null;
      summary.fail(e);
    }
  }

  function turn(offset) {
    queueOffset = offset;
    refreshQueues();
  }

  async function refreshQueues() {
    const offset = queueOffset;
    try {
      const answer = await get(withQuery("/api/v1/status/queues", { limit: QUEUE_PAGE + 1, offset }));
      // An answer for a page the operator has since left is not shown.
      if (offset !== queueOffset) return;
      const page = { queues: answer.queues.slice(0, QUEUE_PAGE), offset, more: answer.queues.length > QUEUE_PAGE, total: queueTotal };
      queues.show(page, (p) => queueRows(p, turn));
    } catch (e) {
      if (offset === queueOffset) queues.fail(e);
    }
  }

  async function refreshBrokers() {
    try {
      // Ages ("12s ago") change every second; redraw only when something else does.
      brokers.show(await get("/api/v1/status/brokers"), fleet);
    } catch (e) {
      brokers.fail(e);
    }
  }

  return {
    title: "Overview",
    async refresh() {
      await refreshStatus();
      await Promise.all([refreshHistory(), refreshQueues(), refreshBrokers()]);
    },
  };
}

