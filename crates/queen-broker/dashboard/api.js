// Calls to the broker's HTTP API, with the operator's token when there is one. Every failure
// becomes an ApiError carrying what the broker said ({error, code, requestId}), so the page can
// show it; nothing is swallowed here.

const TOKEN_KEY = "queen.dashboard.token";

// How long a call may take, its answer read in full: a broker that never answers must not leave
// a page loading for ever. An action (a write) may take longer than a read, and when it gives up
// its outcome is unknown.
const READ_TIMEOUT_SECONDS = 15;
const WRITE_TIMEOUT_SECONDS = 120;

export class ApiError extends Error {
  constructor(method, path, status, body, requestId) {
    const said = body && typeof body.error === "string" ? body.error : null;
    super(said || (status ? `HTTP ${status}` : "the broker did not answer"));
    this.method = method;
    this.path = path;
    this.status = status;
    this.code = body && body.code ? body.code : null;
    this.requestId = (body && body.requestId) || requestId || null;
  }

  /** What the operator reads: what went wrong, with the call and the request id. */
  describe() {
    let text;
    if (this.status === 403) text = `Forbidden: this token's role is not sufficient (${this.message})`;
    else if (this.status === 401) text = `Not signed in: ${this.message}`;
    else if (this.status === 0) text = `The broker did not answer: ${this.message}`;
    else text = `${this.message}`;
    const parts = [`${this.method} ${this.path}`];
    if (this.status) parts.push(String(this.status) + (this.code ? ` ${this.code}` : ""));
    if (this.requestId) parts.push(`request id ${this.requestId}`);
    return `${text} — ${parts.join(", ")}`;
  }
}

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

const listeners = new Set();

/** Called with the ApiError of every 401, so the page can ask for a token. */
export function onUnauthorized(listener) {
  listeners.add(listener);
}

/** "/api/v1/x" with the query's non-empty members. */
export function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") params.set(k, String(v));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

/** A path from segments, each encoded: path("consumer-groups", g) → "/api/v1/consumer-groups/g". */
export function path(...segments) {
  return "/api/v1/" + segments.map((s) => encodeURIComponent(String(s))).join("/");
}

/**
 * One call. `body` undefined sends no body at all (the per-partition seek's "to the end"); any
 * other value is sent as JSON. Answers the parsed JSON (null for an empty answer).
 */
export async function call(method, url, body, { token: given } = {}) {
  const headers = { Accept: "application/json" };
  const bearer = given === undefined ? token() : given;
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const reads = method === "GET";
  const seconds = reads ? READ_TIMEOUT_SECONDS : WRITE_TIMEOUT_SECONDS;
  const init = { method, headers, cache: "no-store", credentials: "omit", signal: AbortSignal.timeout(seconds * 1000) };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  let text;
  try {
    response = await fetch(url, init);
    text = await response.text();
  } catch (e) {
    const gaveUp = `gave up after ${seconds} s${reads ? "" : "; whether it was done is unknown"}`;
    const said = e && e.name === "TimeoutError" ? gaveUp : e && e.message ? e.message : String(e);
    throw new ApiError(method, url, 0, { error: said });
  }
  let parsed = null;
  if (text) {
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = response.ok ? text : { error: text.slice(0, 300) };
    }
  }
  if (!response.ok) {
    const error = new ApiError(method, url, response.status, parsed, response.headers.get("X-Request-Id"));
    if (response.status === 401 && given === undefined) for (const listener of listeners) listener(error);
    throw error;
  }
  return parsed;
}

export const get = (url) => call("GET", url);
export const post = (url, body) => call("POST", url, body);
export const del = (url) => call("DELETE", url);
