// Hand-drawn SVG charts: a histogram, a line over an index, horizontal bars and a forest plot of
// differences with their intervals. Each returns a <figure> with a caption; every mark has a <title>.

import { h, s } from "./dom.js";

const WIDTH = 560;
const HEIGHT = 210;
const M = { top: 12, right: 16, bottom: 40, left: 64 };
const PLOT_W = WIDTH - M.left - M.right;
const PLOT_H = HEIGHT - M.top - M.bottom;

/** About `count` round tick values covering [lo, hi]. */
function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((v) => v >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function figure(caption, svg, extra) {
  return h("figure", { class: "chart" }, svg, h("figcaption", {}, caption), extra);
}

function frame(label) {
  return s("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": label, class: "plot" });
}

function axes(svg, { xTicks, x, xFormat, yTicks, y, yFormat, xLabel, yLabel }) {
  for (const t of yTicks) {
    svg.append(
      s("line", { x1: M.left, x2: WIDTH - M.right, y1: y(t), y2: y(t), class: "grid" }),
      s("text", { x: M.left - 6, y: y(t) + 4, class: "tick", "text-anchor": "end" }, yFormat(t)),
    );
  }
  for (const t of xTicks) {
    svg.append(s("text", { x: x(t), y: HEIGHT - M.bottom + 16, class: "tick", "text-anchor": "middle" }, xFormat(t)));
  }
  svg.append(
    s("line", { x1: M.left, x2: WIDTH - M.right, y1: HEIGHT - M.bottom, y2: HEIGHT - M.bottom, class: "axis" }),
    s("text", { x: M.left + PLOT_W / 2, y: HEIGHT - 6, class: "label", "text-anchor": "middle" }, xLabel),
    s("text", { x: 12, y: M.top + PLOT_H / 2, class: "label", "text-anchor": "middle",
      transform: `rotate(-90 12 ${M.top + PLOT_H / 2})` }, yLabel),
  );
}

/** Histogram of `values` over [min, max] in `bins` equal bins. */
export function histogram(values, { min = 0, max = 100, bins = 20, caption, xLabel = "score", yLabel = "examples" } = {}) {
  const counts = new Array(bins).fill(0);
  for (const v of values) {
    const i = Math.min(bins - 1, Math.max(0, Math.floor(((v - min) / (max - min)) * bins)));
    counts[i] += 1;
  }
  const top = Math.max(1, ...counts);
  const x = (v) => M.left + ((v - min) / (max - min)) * PLOT_W;
  const y = (v) => M.top + PLOT_H - (v / top) * PLOT_H;
  const svg = frame(caption);
  axes(svg, { xTicks: niceTicks(min, max, 5), x, xFormat: String, yTicks: niceTicks(0, top, 4).filter(Number.isInteger),
    y, yFormat: String, xLabel, yLabel });
  const width = PLOT_W / bins;
  counts.forEach((count, i) => {
    const lo = min + ((max - min) * i) / bins;
    const hi = min + ((max - min) * (i + 1)) / bins;
    svg.append(s("rect", { x: M.left + i * width + 1, y: y(count), width: Math.max(1, width - 2),
      height: M.top + PLOT_H - y(count), class: "bar", "data-count": count },
    s("title", {}, `${lo.toFixed(0)}–${hi.toFixed(0)}: ${count} examples`)));
  });
  return figure(caption, svg);
}

/** A line through points {x, y} (x increasing), with a marker and tooltip on each. */
export function lineChart(points, { caption, xLabel, yLabel, yFormat = String, xFormat = String, tooltip } = {}) {
  const svg = frame(caption);
  const xs = points.map((p) => p.x);
  const ys = points.map((p) => p.y);
  const x0 = Math.min(...xs, 0);
  const x1 = Math.max(...xs, x0 + 1);
  const y1 = Math.max(...ys, 0) * 1.1 || 1;
  const x = (v) => M.left + ((v - x0) / (x1 - x0)) * PLOT_W;
  const y = (v) => M.top + PLOT_H - (v / y1) * PLOT_H;
  axes(svg, { xTicks: niceTicks(x0, x1, 6), x, xFormat, yTicks: niceTicks(0, y1, 4), y, yFormat, xLabel, yLabel });
  if (points.length) {
    svg.append(s("polyline", { points: points.map((p) => `${x(p.x)},${y(p.y)}`).join(" "), class: "line" }));
  }
  for (const p of points) {
    svg.append(s("circle", { cx: x(p.x), cy: y(p.y), r: 3, class: "dot" },
      s("title", {}, tooltip ? tooltip(p) : `${xFormat(p.x)}: ${yFormat(p.y)}`)));
  }
  return figure(caption, svg);
}

/** Horizontal bars: items {label, value}; `format` writes the value at the end of each bar. */
export function bars(items, { caption, format = String } = {}) {
  const row = 24;
  const left = Math.min(300, 16 + 6.8 * Math.max(4, ...items.map((i) => String(i.label).length)));
  const height = items.length * row + 8;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-label": caption, class: "plot" });
  const top = Math.max(...items.map((i) => i.value), 0) || 1;
  items.forEach((item, k) => {
    const w = (item.value / top) * (WIDTH - left - 110);
    svg.append(
      s("text", { x: left - 8, y: k * row + 20, class: "tick", "text-anchor": "end" }, item.label),
      s("rect", { x: left, y: k * row + 8, width: Math.max(1, w), height: row - 8, class: "bar" },
        s("title", {}, `${item.label}: ${format(item.value)}`)),
      s("text", { x: left + Math.max(1, w) + 6, y: k * row + 20, class: "tick" }, format(item.value)),
    );
  });
  return figure(caption, svg);
}

/** Differences with their intervals around a zero line: rows {label, delta, low, high}. */
export function forestPlot(rows, { caption, unit = "" } = {}) {
  const row = 28;
  const left = 110;
  const height = rows.length * row + 34;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-label": caption, class: "plot" });
  const extent = Math.max(0.5, ...rows.flatMap((r) => [Math.abs(r.low), Math.abs(r.high), Math.abs(r.delta)])) * 1.1;
  const x = (v) => left + ((v + extent) / (2 * extent)) * (WIDTH - left - 20);
  svg.append(s("line", { x1: x(0), x2: x(0), y1: 4, y2: height - 26, class: "axis" }));
  for (const t of niceTicks(-extent, extent, 6)) {
    svg.append(s("text", { x: x(t), y: height - 8, class: "tick", "text-anchor": "middle" }, `${t > 0 ? "+" : ""}${t}`));
  }
  rows.forEach((r, k) => {
    const cy = k * row + 18;
    svg.append(
      s("text", { x: left - 8, y: cy + 4, class: "tick", "text-anchor": "end" }, r.label),
      s("line", { x1: x(r.low), x2: x(r.high), y1: cy, y2: cy, class: "whisker" }),
      s("circle", { cx: x(r.delta), cy, r: 4.5, class: r.low > 0 ? "dot up" : r.high < 0 ? "dot down" : "dot" },
        s("title", {}, `${r.label}: ${r.delta.toFixed(2)}${unit} [${r.low.toFixed(2)}, ${r.high.toFixed(2)}]`)),
    );
  });
  return figure(caption, svg);
}
