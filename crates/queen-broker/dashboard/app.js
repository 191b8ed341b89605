// The dashboard's shell: hash routing, polling (paused while the tab is hidden), sign-in when the
// broker asks for a token, and the navigation.

import { h, replace } from "./dom.js";
import { call, token, setToken, onUnauthorized, ApiError } from "./api.js";
import { setFlashArea, flash, openDialog, errorBox, describe } from "./ui.js";
import * as overview from "./overview.js";
import * as queue from "./queue.js";
import * as groups from "./groups.js";
import * as dlq from "./dlq.js";
import * as message from "./message.js";

const REFRESH_KEY = "queen.dashboard.refreshSeconds";
const REFRESH_CHOICES = [2, 5, 10, 30, 0];
const DEFAULT_REFRESH = 5;

const app = document.getElementById("app");
const header = document.getElementById("topbar");
const live = document.getElementById("live");
const refreshSelect = document.getElementById("refresh-interval");
const signOut = document.getElementById("sign-out");
setFlashArea(document.getElementById("flash"));

/** The page for a hash: [section for the navigation, mount function, path parameters]. */
function resolve(segments) {
  const [first, ...rest] = segments;
  if (first === undefined || (first === "queues" && rest.length === 0)) return ["overview", overview.mount, []];
  if (first === "queues" && rest.length === 1) return ["overview", queue.mount, rest];
  if (first === "groups" && rest.length === 0) return ["groups", groups.mountList, []];
  if (first === "groups" && rest.length === 1) return ["groups", groups.mountDetail, rest];
  if (first === "dlq" && rest.length === 0) return ["dlq", dlq.mount, []];
  if (first === "message" && rest.length === 0) return ["message", message.mount, []];
  return null;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const cut = raw.indexOf("?");
  const pathPart = cut < 0 ? raw : raw.slice(0, cut);
  const query = new URLSearchParams(cut < 0 ? "" : raw.slice(cut + 1));
  let segments;
  try {
    segments = pathPart.split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    segments = null;
  }
  return { segments, query };
}

let current = null;
let refreshing = null;
let timer = null;
let signingIn = false;

function navigate(hash) {
  if (location.hash === hash) mount();
  else location.hash = hash;
}

function mount() {
  const { segments, query } = parseHash();
  const found = segments && resolve(segments);
  header.classList.remove("nav-open");
  document.getElementById("nav-toggle").setAttribute("aria-expanded", "false");
  const root = h("div", { class: "page" });
  replace(app, root);
  window.scrollTo(0, 0);
  if (!found) {
    current = null;
    root.append(h("h1", {}, "Not found"), h("p", {}, "No page here. ", h("a", { href: "#/" }, "Back to the overview.")));
    document.title = "Not found · Queen";
    return;
  }
  const [nav, mountPage, params] = found;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.nav === nav);
  try {
    current = mountPage(root, { params, query, navigate });
  } catch (e) {
    current = null;
    root.append(errorBox(e));
    return;
  }
  document.title = `${current.title} · Queen`;
  refreshing = null;
  refreshNow();
}

function refreshSeconds() {
  const stored = Number(localStorage.getItem(REFRESH_KEY));
  return REFRESH_CHOICES.includes(stored) && localStorage.getItem(REFRESH_KEY) !== null ? stored : DEFAULT_REFRESH;
}

function showLive() {
  const seconds = refreshSeconds();
  if (signingIn) live.textContent = "Waiting for a token";
  else if (seconds === 0) live.textContent = "Live updates off";
  else if (document.hidden) live.textContent = "Paused while hidden";
  else live.textContent = live.dataset.updated ? `Updated ${live.dataset.updated}` : "Loading…";
}

/** Refreshes the current page now (unless a refresh is under way), then schedules the next. */
async function refreshNow() {
  clearTimeout(timer);
  timer = null;
  const page = current;
  if (page && !signingIn) {
    if (!refreshing) {
      refreshing = (async () => {
        try {
          await page.refresh();
          live.dataset.updated = new Date().toLocaleTimeString();
        } catch (e) {
          flash(describe(e), "error");
        }
      })();
      const mine = refreshing;
      await mine;
      if (refreshing === mine) refreshing = null;
    }
  }
  showLive();
  schedule();
}

function schedule() {
  clearTimeout(timer);
  const seconds = refreshSeconds();
  // Nothing is polled while the tab is hidden or a token is awaited; coming back refreshes.
  if (seconds > 0 && !document.hidden && !signingIn) timer = setTimeout(refreshNow, seconds * 1000);
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    clearTimeout(timer);
    showLive();
  } else {
    refreshNow();
  }
});

for (const seconds of REFRESH_CHOICES) {
  refreshSelect.append(h("option", { value: seconds, selected: seconds === refreshSeconds() }, seconds ? `every ${seconds} s` : "off"));
}
refreshSelect.addEventListener("change", () => {
  localStorage.setItem(REFRESH_KEY, refreshSelect.value);
  refreshNow();
});

function showSignOut() {
  signOut.hidden = !token();
}

signOut.addEventListener("click", () => {
  setToken(null);
  showSignOut();
  flash("Signed out: the token is forgotten.");
  mount();
});

/** Asks for a token until the broker takes one; the page is mounted again with it. */
async function signIn(refusal) {
  if (signingIn) return;
  signingIn = true;
  clearTimeout(timer);
  showLive();
  const hadToken = Boolean(token());
  setToken(null);
  showSignOut();
  const input = h("input", { type: "password", class: "input", name: "token", autocomplete: "off", spellcheck: "false", required: true, "data-role": "token" });
  await openDialog({
    id: "signin-dialog",
    title: "Sign in",
    confirm: "Sign in",
    cancel: null,
    content: [
      h("p", {}, "This broker requires a token (a JWT or a static API token). It is kept in this tab only, until you sign out or close it."),
      hadToken ? h("p", { class: "error" }, `The broker refused the token: ${refusal.message}`) : null,
      h("label", { class: "field" }, h("span", { class: "field-label" }, "Bearer token"), input),
    ],
    action: async () => {
      const candidate = input.value.trim();
      if (!candidate) throw new Error("Enter a token.");
      try {
        await call("GET", "/api/v1/status", undefined, { token: candidate });
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) throw new Error(`The broker refused this token: ${e.message}`);
        // A valid token that may not read the fleet (403, a queue-confined one): still a token.
        if (!(e instanceof ApiError && e.status === 403)) throw e;
      }
      setToken(candidate);
      return true;
    },
  });
  signingIn = false;
  showSignOut();
  mount();
}

onUnauthorized((error) => signIn(error));

document.getElementById("nav-toggle").addEventListener("click", (event) => {
  const open = header.classList.toggle("nav-open");
  event.currentTarget.setAttribute("aria-expanded", String(open));
});

window.addEventListener("hashchange", mount);
showSignOut();
mount();
