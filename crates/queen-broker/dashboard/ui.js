// Pieces every page uses: sections whose content is refreshed in place, messages, buttons that
// run an API call, and in-page dialogs (never window.confirm: they must be drivable and styled).

import { h, replace } from "./dom.js";
import { ApiError } from "./api.js";

export function describe(error) {
  if (error instanceof ApiError) return error.describe();
  return error && error.message ? error.message : String(error);
}

export function errorBox(error) {
  return h("div", { class: "error", role: "alert" }, describe(error));
}

/**
 * A titled block whose body is redrawn from data. `show(data, render)` redraws only when the
 * data changed, so a refresh that brings nothing new leaves the DOM (selection, focus, an open
 * <details>) alone. Forms are never inside a body: a refresh cannot touch what is typed.
 */
export function section(title, { id, actions, intro } = {}) {
  const body = h("div", { class: "section-body" }, h("p", { class: "loading" }, "Loading…"));
  const el = h(
    "section",
    { class: "panel", id },
    h("div", { class: "panel-head" }, h("h2", {}, title), actions ? h("div", { class: "panel-actions" }, actions) : null),
    intro ? h("p", { class: "intro" }, intro) : null,
    body,
  );
  let shown = null;
  return {
    el,
    body,
    show(data, render) {
      const key = JSON.stringify(data);
      if (key === shown) return;
      shown = key;
      replace(body, render(data));
    },
    fail(error) {
      shown = null;
      replace(body, errorBox(error));
    },
    /** Forget what is shown, so the next show() redraws (after an action, say). */
    invalidate() {
      shown = null;
    },
  };
}

// Messages about actions, newest first, at the top of the page.
let flashArea = null;

export function setFlashArea(el) {
  flashArea = el;
}

/** Shows a message; successes go away after a while, errors stay until dismissed. */
export function flash(text, kind = "ok") {
  if (!flashArea) return;
  const item = h(
    "div",
    { class: ["flash", `flash-${kind}`], role: kind === "error" ? "alert" : "status" },
    h("span", { class: "flash-text" }, text),
    h("button", { type: "button", class: "link-button flash-close", "aria-label": "Dismiss", onclick: () => item.remove() }, "×"),
  );
  flashArea.prepend(item);
  if (kind === "ok") setTimeout(() => item.remove(), 10000);
  while (flashArea.children.length > 5) flashArea.lastElementChild.remove();
}

/** A button that runs `action` once at a time; its failure is shown, never swallowed. */
export function actionButton(label, action, { kind, title, dataset } = {}) {
  const button = h("button", { type: "button", class: ["button", kind && `button-${kind}`], title, dataset }, label);
  button.addEventListener("click", async () => {
    if (button.disabled) return;
    button.disabled = true;
    try {
      await action();
    } catch (e) {
      flash(describe(e), "error");
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/**
 * An in-page modal dialog. `content` is the body; `confirm` the label of the action button;
 * `typeToConfirm` a text the operator must type before the action is enabled; `action` an async
 * function whose failure is shown inside the dialog (which stays open). Resolves to the action's
 * result, or null when cancelled.
 */
export function openDialog({ title, content, confirm = "OK", danger = false, typeToConfirm, action, id, cancel = "Cancel" }) {
  return new Promise((resolve) => {
    const errorArea = h("div", { class: "dialog-error" });
    const ok = h("button", { type: "submit", class: ["button", danger ? "button-danger" : "button-primary"], "data-role": "confirm" }, confirm);
    let typed = null;
    if (typeToConfirm !== undefined) {
      typed = h("input", { type: "text", class: "input", autocomplete: "off", spellcheck: "false", "data-role": "type-to-confirm" });
      ok.disabled = true;
      typed.addEventListener("input", () => {
        ok.disabled = typed.value !== typeToConfirm;
      });
    }
    const form = h(
      "form",
      { method: "dialog", class: "dialog-form" },
      h("h2", { class: "dialog-title" }, title),
      h("div", { class: "dialog-body" }, content),
      typed ? h("label", { class: "field" }, h("span", { class: "field-label" }, "Type ", h("code", {}, typeToConfirm), " to confirm"), typed) : null,
      errorArea,
      h(
        "div",
        { class: "dialog-actions" },
        cancel ? h("button", { type: "button", class: "button", "data-role": "cancel", onclick: () => finish(null) }, cancel) : null,
        ok,
      ),
    );
    const dialog = h("dialog", { class: "dialog", id }, form);
    let done = false;
    const finish = (value) => {
      if (done) return;
      done = true;
      dialog.close();
      dialog.remove();
      resolve(value);
    };
    dialog.addEventListener("cancel", (event) => {
      event.preventDefault();
      if (cancel) finish(null);
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (ok.disabled) return;
      ok.disabled = true;
      replace(errorArea);
      try {
        const result = action ? await action() : true;
        finish(result === undefined ? true : result);
      } catch (e) {
        replace(errorArea, errorBox(e));
        ok.disabled = typed ? typed.value !== typeToConfirm : false;
      }
    });
    document.body.append(dialog);
    dialog.showModal();
    (typed || dialog.querySelector("input, textarea, select") || ok).focus();
  });
}

/** A dialog that shows something and has only a Close button. */
export function showDialog(title, content, id) {
  return openDialog({ title, content, confirm: "Close", cancel: null, id });
}
