// DOM building and formatting. Every node is made with createElement and every text goes in
// through textContent, so nothing a queue name or a payload holds is ever parsed as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(parent, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) {
    for (const c of child) append(parent, c);
  } else if (child instanceof Node) {
    parent.appendChild(child);
  } else {
    parent.appendChild(document.createTextNode(String(child)));
  }
}

function applyAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "value" && "value" in el) el.value = value;
    else if (key === "checked" || key === "disabled" || key === "selected") el[key] = Boolean(value);
    else if (key === "style") throw new Error("inline styles are refused by the page's policy; use a class");
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

/** An HTML element: h("a", {href: "#/"}, "text", child, [more]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

/** An SVG element, for the charts. */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

/** Replaces every child of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** The hash of a page: route("queues", name) → "#/queues/<name encoded>". */
export function route(...parts) {
  return "#/" + parts.map((p) => encodeURIComponent(p)).join("/");
}

/** A hash with a query: routeQuery("dlq", {queue: "x"}) → "#/dlq?queue=x". */
export function routeQuery(page, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== "" && v !== null && v !== undefined) params.set(k, v);
  const text = params.toString();
  return "#/" + page + (text ? "?" + text : "");
}

const numberFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const rateFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });

export function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return numberFormat.format(n);
}

export function rate(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return rateFormat.format(n);
}

/** A duration in seconds as "3h 12m", "4m 05s", "12.3s". */
export function duration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  const s = Math.max(0, seconds);
  if (s < 10) return (Math.round(s * 10) / 10).toFixed(s % 1 === 0 ? 0 : 1) + "s";
  if (s < 60) return Math.round(s) + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.round(s % 60)).padStart(2, "0")}s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d ${hours % 24}h`;
}

/** A round duration as an axis label: "20m", "2h", "1d"; others as duration(). */
export function durationTick(seconds) {
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size && seconds % size === 0) return `${seconds / size}${unit}`;
  }
  return duration(seconds);
}

/** A timestamp as local time, with the exact ISO text on hover. */
export function time(iso) {
  if (!iso) return h("span", { class: "muted" }, "–");
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return h("span", {}, iso);
  return h("time", { datetime: iso, title: iso }, at.toLocaleString());
}

/** "12s ago", for how recent something is. */
export function ago(iso, now = Date.now()) {
  if (!iso) return "–";
  const at = Date.parse(iso);
  if (Number.isNaN(at)) return iso;
  const seconds = (now - at) / 1000;
  return seconds < 0 ? "in " + duration(-seconds) : duration(seconds) + " ago";
}

/** JSON as indented text (for payloads), in a <pre>. */
export function prettyJson(value) {
  let text;
  try {
    text = JSON.stringify(value, null, 2);
  } catch {
    text = String(value);
  }
  return h("pre", { class: "json" }, text === undefined ? "undefined" : text);
}

/** A short one-line preview of a payload. */
export function preview(value, max = 80) {
  let text = value === undefined ? "" : JSON.stringify(value);
  if (text === undefined) text = "";
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

/** A table inside a horizontally scrolling wrapper; rows are arrays of cells or <tr>s. */
export function table(headers, rows, attrs = {}) {
  const head = h("thead", {}, h("tr", {}, headers.map((label) => h("th", { scope: "col" }, label))));
  const body = h(
    "tbody",
    {},
    rows.map((row) => (row instanceof Node ? row : h("tr", {}, row.map((cell) => (cell instanceof Node && cell.tagName === "TD" ? cell : h("td", {}, cell)))))),
  );
  return h("div", { class: "table-wrap" }, h("table", attrs, head, body));
}

export function empty(text) {
  return h("p", { class: "empty" }, text);
}

export function badge(text, kind) {
  return h("span", { class: ["badge", kind && "badge-" + kind] }, text);
}

/** A labelled form field. */
export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, label), input, hint ? h("span", { class: "hint" }, hint) : null);
}

/**
 * Parses what an operator types as a time: ISO 8601 (with or without a zone; without one it is
 * local time), or "now", "-5m", "-2h", "-1d". Returns an ISO string in UTC or throws.
 */
export function parseTime(text) {
  const t = text.trim();
  if (t === "") throw new Error("enter a time");
  if (t === "now") return new Date().toISOString();
  const relative = /^-(\d+(?:\.\d+)?)\s*([smhd])$/.exec(t);
  if (relative) {
    const unit = { s: 1, m: 60, h: 3600, d: 86400 }[relative[2]];
    return new Date(Date.now() - Number(relative[1]) * unit * 1000).toISOString();
  }
  const at = new Date(t.replace(" ", "T"));
  if (Number.isNaN(at.getTime())) throw new Error(`"${t}" is not a time: use 2026-07-29T14:00:00Z, 2026-07-29 14:00 (local), now or -15m`);
  return at.toISOString();
}
