// The service page: device memory (allocated, peak, weights), requests in flight, queue depth,
// latency percentiles per route and the last requests, from GET /metrics?format=json.

import { api } from "./api.js";
import { bars } from "./charts.js";
import { fmt, fmtBytes, fmtSeconds, fmtTime, h, replace, table } from "./dom.js";

function tiles(items) {
  return h("dl", { class: "tiles" }, items.map(([label, value, id]) => h("div", { class: "tile" },
    h("dt", {}, label), h("dd", { id, class: String(value).length > 16 ? "long" : null }, value))));
}

function render(snapshot, ready) {
  const memory = snapshot.memory || {};
  const queue = snapshot.queue || {};
  const waiting = queue.waiting || {};
  const latency = Object.entries(snapshot.latency || {}).map(([route, stats]) => ({ route, ...stats }));
  const recent = [...(snapshot.recent || [])].reverse().slice(0, 12);
  return h("div", {},
    tiles([
      ["Model", ready ? ready.model : "–", "svc-model"],
      ["State", queue.state ?? "–", "svc-state"],
      ["Device", memory.device ?? "–", "svc-device"],
      ["Memory allocated", fmtBytes(memory.allocated_bytes), "svc-allocated"],
      ["Memory peak", fmtBytes(memory.peak_bytes), "svc-peak"],
      ["Weights", fmtBytes(memory.weights_bytes), "svc-weights"],
      ["Process RSS", fmtBytes(memory.rss_bytes), "svc-rss"],
      ["Requests in flight", String(snapshot.requests ? snapshot.requests.in_flight : "–"), "svc-in-flight"],
      ["Queue: interactive", `${waiting.interactive ?? 0} / ${queue.capacity ?? "–"}`, "svc-queue"],
      ["Queue: job batches", String(waiting.job ?? 0), "svc-queue-jobs"],
    ]),
    h("h2", {}, "Latency by route"),
    h("p", { class: "muted small" }, "Estimated from the bart_opt_request_seconds histogram, as Prometheus' histogram_quantile does."),
    latency.length ? h("div", { class: "stack card" },
      table([
        { label: "Route", cell: (r) => h("span", { class: "mono" }, r.route) },
        { label: "Requests", numeric: true, cell: (r) => String(r.count) },
        { label: "Mean", numeric: true, cell: (r) => fmtSeconds(r.mean_s) },
        { label: "p50", numeric: true, cell: (r) => fmtSeconds(r.p50) },
        { label: "p90", numeric: true, cell: (r) => fmtSeconds(r.p90) },
        { label: "p99", numeric: true, cell: (r) => fmtSeconds(r.p99) },
      ], latency, { id: "latency-table" }),
      bars(latency.map((r) => ({ label: r.route, value: r.p99 })), { caption: "p99 latency by route", format: fmtSeconds }))
      : h("p", { class: "muted" }, "No request yet."),
    h("h2", {}, "Recent summarize requests"),
    recent.length ? h("div", { class: "card" }, table([
      { label: "Time", cell: (r) => fmtTime(new Date(r.time * 1000).toISOString()) },
      { label: "Texts", numeric: true, cell: (r) => String(r.texts) },
      { label: "Tokens in / out", numeric: true, cell: (r) => `${r.input_tokens} / ${r.output_tokens}` },
      { label: "Peak (share)", numeric: true, cell: (r) => fmtBytes(r.memory && r.memory.peak_bytes) },
      { label: "Queue", numeric: true, cell: (r) => fmtSeconds(r.timing && r.timing.queue) },
      { label: "Total", numeric: true, cell: (r) => fmtSeconds(r.timing && r.timing.total) },
      { label: "Batch", numeric: true, cell: (r) => (r.memory && r.memory.batch ? `${r.memory.batch.requests} req, ${r.memory.batch.texts} texts` : "–") },
    ], recent, { id: "recent-table" })) : h("p", { class: "muted" }, "No summarize request yet."),
    h("p", { class: "muted small" }, `Updated ${new Date().toLocaleTimeString()}; ${fmt(recent.length, 0)} of the last requests shown.`));
}

/** Render the service page into `main`; returns a function that stops its polling. */
export function serviceView(main, { fail }) {
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  let timer;
  let stopped = false;
  let ready = null;
  async function refresh() {
    try {
      const snapshot = await api("/metrics?format=json");
      if (!ready) ready = await fetch("/ready").then((r) => (r.ok ? r.json() : null));
      if (stopped) return;
      const focused = document.activeElement;
      replace(slot, render(snapshot, ready));
      if (focused && !document.body.contains(focused)) main.focus();
      main.setAttribute("aria-busy", "false");
    } catch (error) {
      if (fail(error)) return;
    }
    if (!stopped) timer = setTimeout(refresh, 2000);
  }
  replace(main, h("h1", { tabindex: -1 }, "Service"), slot);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
