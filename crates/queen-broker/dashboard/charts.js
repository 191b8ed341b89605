// Line charts drawn as SVG by hand: time on x, one or more series on y, gaps where a value is
// null, a legend with the latest values, and a hover readout. Redrawn at the container's width
// (not scaled), so text stays legible on a phone.

import { h, svg, replace } from "./dom.js";

const HEIGHT = 190;
const MARGIN = { top: 12, right: 14, bottom: 26, left: 54 };

/** The smallest "nice" number (1, 2, 2.5, 5 × 10^n) at or above `value`. */
function niceCeil(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

// Steps for an axis of durations in seconds: whole seconds, minutes, hours, days.
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

/** The top of a y axis of four equal steps, each a round number (of `kind` "time": a round duration). */
function axisTop(max, kind) {
  if (kind === "time") {
    const step = TIME_STEPS.find((s) => max <= s * 4) || niceCeil(max / 4 / 86400) * 86400;
    return step * 4;
  }
  return niceCeil(max / 4) * 4;
}

function clock(ms) {
  const at = new Date(ms);
  return `${String(at.getHours()).padStart(2, "0")}:${String(at.getMinutes()).padStart(2, "0")}`;
}

/**
 * Draws into `container`:
 *   spec = { label, times: [ms], from: ms, to: ms, format: v => text, tick?: v => text, axis?: "time",
 *            series: [{ key, label, values: [number|null], total? }] }
 * The chart is redrawn when the container's width changes.
 */
export function drawChart(container, spec) {
  container._chart = spec;
  if (!container._observed && typeof ResizeObserver === "function") {
    container._observed = true;
    let lastWidth = container.clientWidth;
    new ResizeObserver(() => {
      if (container.clientWidth !== lastWidth && container._chart) {
        lastWidth = container.clientWidth;
        render(container, container._chart);
      }
    }).observe(container);
  }
  render(container, spec);
}

function render(container, spec) {
  const width = Math.max(260, container.clientWidth || 600);
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const span = Math.max(1, spec.to - spec.from);
  const x = (ms) => MARGIN.left + ((ms - spec.from) / span) * plotW;
  let max = 0;
  let points = 0;
  for (let i = 0; i < spec.times.length; i++) {
    let any = false;
    for (const s of spec.series) {
      const v = s.values[i];
      if (v !== null && v !== undefined) {
        any = true;
        if (v > max) max = v;
      }
    }
    if (any) points++;
  }
  const top = axisTop(max, spec.axis);
  const y = (v) => MARGIN.top + plotH - (v / top) * plotH;

  const chart = svg("svg", {
    class: "chart-svg",
    width,
    height: HEIGHT,
    viewBox: `0 0 ${width} ${HEIGHT}`,
    role: "img",
    "aria-label": spec.label,
    "data-points": points,
  });
  // Horizontal grid and y labels.
  for (let i = 0; i <= 4; i++) {
    const v = (top / 4) * i;
    const yy = y(v);
    chart.append(
      svg("line", { class: "grid", x1: MARGIN.left, x2: width - MARGIN.right, y1: yy, y2: yy }),
      svg("text", { class: "axis-label", x: MARGIN.left - 6, y: yy + 4, "text-anchor": "end" }, (spec.tick || spec.format)(v)),
    );
  }
  // Time ticks: the smallest step that leaves room for every label.
  const maxTicks = Math.max(2, Math.floor(plotW / 70));
  const step = [1, 2, 5, 10, 15, 30, 60, 120, 360].map((m) => m * 60000).find((s) => span / s <= maxTicks) || 720 * 60000;
  for (let t = Math.ceil(spec.from / step) * step; t <= spec.to; t += step) {
    const xx = x(t);
    chart.append(
      svg("line", { class: "grid grid-x", x1: xx, x2: xx, y1: MARGIN.top, y2: MARGIN.top + plotH }),
      svg("text", { class: "axis-label", x: xx, y: HEIGHT - 8, "text-anchor": "middle" }, clock(t)),
    );
  }
  chart.append(svg("line", { class: "axis", x1: MARGIN.left, x2: width - MARGIN.right, y1: MARGIN.top + plotH, y2: MARGIN.top + plotH }));

  spec.series.forEach((s, index) => {
    let d = "";
    let open = false;
    const lone = [];
    for (let i = 0; i < spec.times.length; i++) {
      const v = s.values[i];
      if (v === null || v === undefined) {
        open = false;
        continue;
      }
      const px = x(spec.times[i]).toFixed(1);
      const py = y(v).toFixed(1);
      const next = s.values[i + 1];
      if (!open && (next === null || next === undefined)) lone.push([px, py]);
      d += `${open ? "L" : "M"}${px} ${py} `;
      open = true;
    }
    chart.append(
      svg("path", {
        class: `series series-${index}`,
        d: d.trim() || "M0 0",
        "data-series": s.key,
        "data-total": s.total === undefined ? "" : s.total,
      }),
    );
    // A value with no neighbour draws no line: a dot instead.
    for (const [px, py] of lone) chart.append(svg("circle", { class: `dot series-${index}`, cx: px, cy: py, r: 2.5 }));
  });

  const guide = svg("line", { class: "guide", x1: 0, x2: 0, y1: MARGIN.top, y2: MARGIN.top + plotH, visibility: "hidden" });
  const overlay = svg("rect", { class: "overlay", x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH });
  chart.append(guide, overlay);

  const readout = h("div", { class: "chart-readout", hidden: true });
  const legend = h(
    "div",
    { class: "legend" },
    spec.series.map((s, index) => {
      let latest = null;
      for (let i = s.values.length - 1; i >= 0; i--) {
        if (s.values[i] !== null && s.values[i] !== undefined) {
          latest = s.values[i];
          break;
        }
      }
      return h(
        "span",
        { class: "legend-item", "data-series": s.key },
        h("span", { class: `swatch swatch-${index}` }),
        s.label,
        " ",
        h("strong", {}, latest === null ? "–" : spec.format(latest)),
      );
    }),
  );

  const show = (event) => {
    const box = chart.getBoundingClientRect();
    const px = event.clientX - box.left;
    const ms = spec.from + ((px - MARGIN.left) / plotW) * span;
    let best = -1;
    let bestGap = Infinity;
    for (let i = 0; i < spec.times.length; i++) {
      const gap = Math.abs(spec.times[i] - ms);
      if (gap < bestGap) {
        bestGap = gap;
        best = i;
      }
    }
    if (best < 0) return;
    const gx = x(spec.times[best]);
    guide.setAttribute("x1", gx);
    guide.setAttribute("x2", gx);
    guide.setAttribute("visibility", "visible");
    replace(
      readout,
      h("div", { class: "readout-time" }, new Date(spec.times[best]).toLocaleTimeString()),
      spec.series.map((s, index) =>
        h("div", {}, h("span", { class: `swatch swatch-${index}` }), `${s.label}: `, h("strong", {}, s.values[best] === null || s.values[best] === undefined ? "no sample" : spec.format(s.values[best]))),
      ),
    );
    readout.hidden = false;
    // Positioned through the CSSOM: the page's policy forbids style attributes, not this.
    const left = Math.min(Math.max(gx + 10, 0), width - 170);
    readout.style.left = `${left}px`;
  };
  overlay.addEventListener("pointermove", show);
  overlay.addEventListener("pointerleave", () => {
    guide.setAttribute("visibility", "hidden");
    readout.hidden = true;
  });

  replace(container, h("div", { class: "chart-plot" }, chart, readout), legend);
}
