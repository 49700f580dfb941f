// One job: its settings and progress, the ROUGE table and every other metric's, the per-example score distribution, memory
// and device time per batch, the slowest and worst examples, an example viewer, and downloads.

import { Unauthorized, api, examplePath, predictions } from "./api.js";
import { histogram, lineChart } from "./charts.js";
import {
  ROUGE_NAMES, ROUGE_TYPES, describeDataset, describeGeneration, download, fmt, fmtBytes, fmtSeconds, fmtTime, h,
  notice, progressBar, replace, shortId, statusBadge, table,
} from "./dom.js";

const ACTIVE = new Set(["queued", "running"]);
const TOP = 8;
const BIG_JOB = 2000; // examples; past this a running job's predictions are fetched again every 15 s, not every poll

function f1(row, type) {
  return row.rouge && row.rouge[type] ? row.rouge[type].fmeasure : null;
}

function rougeTable(rouge) {
  if (!rouge) return h("p", { class: "muted", id: "rouge-table" }, "No ROUGE yet (it comes when the job succeeds, and needs references).");
  const cell = (type, part, measure) => {
    const value = rouge[type][part][measure];
    return h("span", { "data-type": type, "data-field": `${part}.${measure}`, "data-value": value }, fmt(value));
  };
  return table([
    { label: "Metric", cell: (t) => ROUGE_NAMES[t] },
    { label: "Precision", numeric: true, cell: (t) => cell(t, "mid", "precision") },
    { label: "Recall", numeric: true, cell: (t) => cell(t, "mid", "recall") },
    { label: "F1 (mean)", numeric: true, cell: (t) => cell(t, "mid", "fmeasure") },
    { label: "F1 95% low", numeric: true, cell: (t) => cell(t, "low", "fmeasure") },
    { label: "F1 95% high", numeric: true, cell: (t) => cell(t, "high", "fmeasure") },
  ], ROUGE_TYPES.filter((t) => rouge[t]), { id: "rouge-table" });
}

function baselineTable(baselines) {
  if (!baselines || !baselines.length) return null;
  const cell = (b, type) => {
    if (!b.rouge || !b.rouge[type]) return h("span", { class: "muted" }, "–");
    const value = b.rouge[type].mid.fmeasure;
    return h("span", { "data-type": type, "data-value": value }, fmt(value),
      h("span", { class: "interval" }, ` [${fmt(b.rouge[type].low.fmeasure)}–${fmt(b.rouge[type].high.fmeasure)}]`));
  };
  return h("div", {}, h("h3", {}, "Baselines on the same records (F1, 95% interval)"), table([
    { label: "Baseline", cell: (b) => h("span", { class: "mono" }, b.name) },
    ...ROUGE_TYPES.map((t) => ({ label: ROUGE_NAMES[t], numeric: true, cell: (b) => cell(b, t) })),
  ], baselines, { id: "baseline-table" }));
}

// Every metric beyond ROUGE the job scored (the view's `metrics` and `scores`, read from its metrics: none is
// named here), a row per score: the job's mean and interval, and each baseline's beside it.
function scoresTable(job) {
  const names = (job.metrics || []).filter((name) => name !== "rouge" && job.scores && job.scores[name]);
  if (!names.length) return null;
  const rows = names.flatMap((name) => Object.keys(job.scores[name]).map((score) => ({ name, score })));
  const interval = (found, { name, score }) => {
    const value = found && found[name] && found[name][score];
    if (!value) return h("span", { class: "muted" }, "–");
    return h("span", { "data-metric": name, "data-score": score, "data-value": value.mid }, fmt4(value.mid),
      h("span", { class: "interval" }, ` [${fmt4(value.low)}–${fmt4(value.high)}]`));
  };
  return h("div", {}, h("h3", {}, "Other metrics (mean over examples, bootstrap 95% interval)"), table([
    { label: "Metric", cell: (r) => h("span", { class: "mono" }, r.name) },
    { label: "Score", cell: (r) => h("span", { class: "mono" }, r.score) },
    { label: "This job", numeric: true, cell: (r) => interval(job.scores, r) },
    ...(job.baselines || []).map((b) => ({ label: b.name, numeric: true, cell: (r) => interval(b.scores, r) })),
  ], rows, { id: "scores-table" }));
}

function fmt4(value) {
  return Number.isInteger(value) ? String(value) : Number(value).toPrecision(4);
}

function describeEngine(engine) {
  if (!engine) return "–";
  const options = ["static", "el_attention"].filter((name) => engine[name]).map((name) => name.replace("_", "-"));
  if (engine.quantize) options.push(engine.quantize);
  return [engine.dtype, engine.mode, ...options, `on ${engine.device}`].join(" · ");
}

function facts(job) {
  const t = job.timing || {};
  const m = job.memory || {};
  const r = job.rouge_settings;
  const items = [
    ["Id", h("span", { class: "mono" }, job.id)],
    ["System", job.system === "external" ? "another system's predictions, scored (no model run)" : "this server's model"],
    ["Model", h("span", { class: "mono" }, job.model)],
    ["Engine", h("span", { id: "job-engine" }, describeEngine(job.engine))],
    ["ROUGE settings", r ? `${r.tokenizer} tokenizer · ${r.lang} · stemmer ${r.stemmer} · Lsum split ${r.splitter} · point estimate: ${r.point === "mean" ? "mean over examples" : r.point}` : "defaults"],
    ["Signature", h("span", { class: "mono small", id: "job-signature" }, job.signature || "–")],
    ["Dataset", describeDataset(job.dataset)],
    ["Generation", describeGeneration(job.generation, { all: true }).join(" · ") || "defaults"],
    ["Created", fmtTime(job.created_at)],
    ["Started", fmtTime(job.started_at)],
    ["Finished", fmtTime(job.finished_at)],
    ["Work time", `${fmtSeconds(t.runtime_s)} (${fmtSeconds(t.seconds_per_sample)} per example)`],
    ["Wall time running", fmtSeconds(t.active_s)],
    ["Memory peak", `${fmtBytes(m.peak_bytes)}${m.device ? ` on ${m.device}` : ""}${m.peak_source ? ` (${m.peak_source})` : ""}`],
  ];
  if (job.tokens) items.push(["Tokens", `${job.tokens.input} in, ${job.tokens.output} out, ${job.tokens.truncated_inputs} inputs truncated`]);
  if (job.padding) items.push(["Padding", `${job.padding.computed} computed, ${job.padding.avoided} avoided`]);
  return h("dl", { class: "facts" }, items.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function exampleTable(rows, columns, open, id) {
  if (!rows.length) return h("p", { class: "muted" }, "None.");
  return table([
    { label: "Example", cell: (r) => h("button", { type: "button", class: "link", onclick: () => open(r.id) }, String(r.id)) },
    ...columns,
  ], rows, { id });
}

function batchCharts(batches) {
  if (!batches || !batches.length) return h("p", { class: "muted" }, "No batch has finished yet.");
  let clock = 0;
  const points = batches.map((b) => {
    clock += b.seconds;
    return { x: clock, peak: b.peak_bytes, seconds: b.seconds, batch: b.batch, size: b.size };
  });
  const tip = (p) => `batch ${p.batch} (${p.size} examples), ends at ${fmtSeconds(p.x)}: peak ${fmtBytes(p.peak)}, ${fmtSeconds(p.seconds)}`;
  return h("div", { class: "charts" },
    lineChart(points.map((p) => ({ ...p, y: p.peak })), { caption: "Memory peak of each batch over device time",
      xLabel: "device seconds (cumulative)", yLabel: "peak", yFormat: fmtBytes, xFormat: (v) => `${v}`, tooltip: tip }),
    lineChart(points.map((p) => ({ ...p, y: p.seconds })), { caption: "Device seconds of each batch over device time",
      xLabel: "device seconds (cumulative)", yLabel: "seconds", yFormat: (v) => `${v}`, xFormat: (v) => `${v}`, tooltip: tip }));
}

/** The example viewer: pick an example (select, previous, next) and see its texts and scores.
 * `state.example` keeps the one shown across the re-renders of a running job. */
function exampleViewer(job, rowsById, order, state) {
  const select = h("select", { id: "example-select" }, order.map((id) => h("option", { value: id }, String(id))));
  const body = h("div", { class: "example-body", "aria-live": "polite" });
  const step = (delta) => {
    const i = Math.min(order.length - 1, Math.max(0, order.indexOf(select.value) + delta));
    show(order[i]);
  };
  async function show(id, focus = false) {
    select.value = id;
    state.example = id;
    const row = rowsById.get(id);
    replace(body, h("p", { class: "muted" }, "Loading the article…"));
    let example;
    try {
      example = await api(examplePath(job.id, id));
    } catch (error) {
      replace(body, notice(error.message));
      return;
    }
    const scores = row && row.rouge ? table([
      { label: "Metric", cell: (t) => ROUGE_NAMES[t] },
      ...["precision", "recall", "fmeasure"].map((m) => ({ label: m === "fmeasure" ? "F1" : m[0].toUpperCase() + m.slice(1),
        numeric: true, cell: (t) => fmt(row.rouge[t][m]) })),
    ], ROUGE_TYPES.filter((t) => row.rouge[t]), { class: "compact" }) : h("p", { class: "muted" }, "No ROUGE for this example.");
    replace(body,
      row && row.error ? notice(`Error: ${row.error}`) : null,
      h("div", { class: "texts" },
        h("section", {}, h("h4", {}, "Summary"), h("p", { class: "text", id: "example-prediction" }, row ? row.prediction : "(not done yet)")),
        h("section", {}, h("h4", {}, "Reference"), h("p", { class: "text pre" }, example.reference ?? "(none)"))),
      scores,
      row ? h("p", { class: "muted small" }, `${row.input_tokens} input tokens${row.truncated ? " (truncated)" : ""}, ` +
        `${row.output_tokens} output tokens, ${fmtSeconds(row.seconds)}, batch peak ${fmtBytes(row.batch_peak_bytes)}`) : null,
      h("details", { open: true }, h("summary", {}, "Article"), h("p", { class: "text pre article" }, example.text)));
    if (focus) body.focus();
  }
  select.addEventListener("change", () => show(select.value));
  const element = h("section", { id: "example-viewer", class: "card", "aria-labelledby": "viewer-title" },
    h("h2", { id: "viewer-title" }, "Example viewer"),
    h("div", { class: "toolbar" }, h("label", { for: "example-select" }, "Example"), select,
      h("button", { type: "button", onclick: () => step(-1) }, "Previous"),
      h("button", { type: "button", onclick: () => step(1) }, "Next")),
    body);
  body.tabIndex = -1;
  element.show = show;
  return element;
}

function results(job, rows, state) {
  const rowsById = new Map(rows.map((r) => [String(r.id), r]));
  const order = rows.map((r) => String(r.id));
  const viewer = order.length ? exampleViewer(job, rowsById, order, state) : h("p", { class: "muted" }, "No example is done yet.");
  const open = (id) => {
    viewer.show(String(id), true);
    viewer.scrollIntoView({ block: "start" });
  };
  const metric = h("select", { id: "distribution-metric" }, ROUGE_TYPES.map((t) => h("option", { value: t, selected: t === "rougeLsum" }, ROUGE_NAMES[t])));
  const distribution = h("div");
  const drawDistribution = () => {
    const values = rows.map((r) => f1(r, metric.value)).filter((v) => v !== null);
    replace(distribution, values.length
      ? histogram(values, { caption: `${ROUGE_NAMES[metric.value]} F1 of ${values.length} examples`, xLabel: `${ROUGE_NAMES[metric.value]} F1` })
      : h("p", { class: "muted" }, "No per-example ROUGE (no references, or nothing done yet)."));
  };
  metric.addEventListener("change", drawDistribution);
  drawDistribution();
  const scored = rows.filter((r) => f1(r, "rougeLsum") !== null);
  const worst = [...scored].sort((a, b) => f1(a, "rougeLsum") - f1(b, "rougeLsum")).slice(0, TOP);
  const slowest = [...rows].sort((a, b) => b.seconds - a.seconds).slice(0, TOP);
  const errors = rows.filter((r) => r.error);
  const element = h("div", {},
    h("section", { class: "card", "aria-labelledby": "dist-title" }, h("h2", { id: "dist-title" }, "Per-example ROUGE"),
      h("div", { class: "toolbar" }, h("label", { for: "distribution-metric" }, "Metric"), metric), distribution),
    h("div", { class: "two card" },
      h("section", { "aria-labelledby": "worst-title" }, h("h2", { id: "worst-title" }, "Worst-scoring examples"),
        exampleTable(worst, [
          { label: "ROUGE-Lsum F1", numeric: true, cell: (r) => fmt(f1(r, "rougeLsum")) },
          { label: "ROUGE-2 F1", numeric: true, cell: (r) => fmt(f1(r, "rouge2")) },
        ], open, "worst-table")),
      h("section", { "aria-labelledby": "slow-title" }, h("h2", { id: "slow-title" }, "Slowest examples"),
        exampleTable(slowest, [
          { label: "Seconds", numeric: true, cell: (r) => fmtSeconds(r.seconds) },
          { label: "Tokens in / out", numeric: true, cell: (r) => `${r.input_tokens} / ${r.output_tokens}` },
        ], open, "slowest-table"))),
    errors.length ? h("section", { class: "card", "aria-labelledby": "errors-title" }, h("h2", { id: "errors-title" }, `Errors (${errors.length})`),
      exampleTable(errors.slice(0, 50), [{ label: "Error", cell: (r) => r.error }], open, "errors-table")) : null,
    viewer);
  if (order.length) viewer.show(state.example && rowsById.has(state.example) ? state.example : order[0]);
  return element;
}

/** Render the job `id` into `main`; returns a function that stops its polling. */
export function jobView(main, { fail }, id, params) {
  let timer;
  let stopped = false;
  let shownDone = -1;
  let lastStatus;
  const head = h("div");
  const rougeSlot = h("div");
  const batchSlot = h("div");
  const resultSlot = h("div");
  const messages = h("div", { class: "messages" });
  let job;
  let rows = [];
  let jsonl = "";
  let fetchedAt = 0;
  const state = { example: params.get("example") };

  const cancel = h("button", { type: "button", class: "danger", onclick: async () => {
    cancel.disabled = true;
    try {
      await api(`/evaluate/${encodeURIComponent(id)}`, { method: "DELETE" });
    } catch (error) {
      messages.replaceChildren(notice(error.message));
    }
    cancel.disabled = false;
    refresh();
  } }, "Cancel job");
  const downloads = h("div", { class: "toolbar" },
    h("button", { type: "button", id: "download-predictions",
      onclick: () => download(`${id}-predictions.jsonl`, jsonl, "application/x-ndjson") }, "Download predictions (JSONL)"),
    h("button", { type: "button", id: "download-metrics", onclick: () => download(`${id}-metrics.json`,
      JSON.stringify(job, null, 2), "application/json") }, "Download metrics (JSON)"));

  const page = [
    head,
    messages,
    downloads,
    h("section", { class: "card", "aria-labelledby": "rouge-title" }, h("h2", { id: "rouge-title" }, "ROUGE (0–100: mean over examples, bootstrap 95% interval)"), rougeSlot),
    h("section", { class: "card", "aria-labelledby": "batch-title" }, h("h2", { id: "batch-title" }, "Memory and device time per batch"), batchSlot),
    resultSlot,
  ];

  async function refresh() {
    clearTimeout(timer);
    if (stopped) return;
    try {
      job = await api(`/evaluate/${encodeURIComponent(id)}`);
      if (!main.contains(head)) replace(main, ...page); // the job exists: its page, with its buttons, from now on
      const wait = rows.length > BIG_JOB ? 15_000 : 0;
      const progressChanged = job.status !== lastStatus || (job.progress.done !== shownDone && Date.now() - fetchedAt >= wait);
      if (progressChanged) {
        ({ text: jsonl, rows } = await predictions(id));
        fetchedAt = Date.now();
      }
      if (stopped) return;
      replace(head,
        h("div", { class: "title-row" }, h("h1", { tabindex: -1 }, `Job ${shortId(id)}`), statusBadge(job.status),
          ACTIVE.has(job.status) ? cancel : null),
        job.error ? notice(job.error) : null,
        progressBar(job.progress, job.status),
        facts(job));
      replace(rougeSlot, (job.warnings || []).map((w) => notice(w, "warning")), rougeTable(job.rouge),
        baselineTable(job.baselines), scoresTable(job));
      replace(batchSlot, batchCharts(job.memory && job.memory.batches));
      if (progressChanged) {
        const focused = resultSlot.contains(document.activeElement);
        replace(resultSlot, results(job, rows, state));
        shownDone = job.progress.done;
        lastStatus = job.status;
        if (focused) resultSlot.querySelector("select")?.focus();
      }
      main.setAttribute("aria-busy", "false");
    } catch (error) {
      if (!job) {
        // No job to show (unknown id, or the first call failed): the error alone, no page to act on.
        if (error instanceof Unauthorized || stopped) return;
        replace(main, h("h1", { tabindex: -1 }, `Job ${shortId(id)}`), notice(error.message));
        main.setAttribute("aria-busy", "false");
        return;
      }
      if (fail(error)) return;
    }
    if (!stopped && job && ACTIVE.has(job.status)) timer = setTimeout(refresh, 1500);
  }

  replace(main, h("p", { class: "muted" }, "Loading…"));
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

