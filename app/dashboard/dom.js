// Small DOM helpers and number formats shared by the views. Text always goes in as text nodes
// (never parsed as HTML), so example texts and error messages cannot inject markup.

export const ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"];
export const ROUGE_NAMES = { rouge1: "ROUGE-1", rouge2: "ROUGE-2", rougeL: "ROUGE-L", rougeLsum: "ROUGE-Lsum" };
const SVG = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "text") element.textContent = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: h("button", {type: "button", onclick}, "Cancel"). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, same call shape as h(). */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG, tag), attrs, children);
}

export function replace(element, ...children) {
  element.replaceChildren();
  return build(element, {}, children);
}

export function fmt(value, digits = 2) {
  return value === null || value === undefined || Number.isNaN(value) ? "–" : Number(value).toFixed(digits);
}

export function fmtSigned(value, digits = 2) {
  return value === null || value === undefined ? "–" : (value > 0 ? "+" : "") + Number(value).toFixed(digits);
}

export function fmtP(p) {
  return p === null || p === undefined ? "–" : Number(p).toFixed(4);
}

export function fmtBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function fmtSeconds(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 0)} ms`;
  if (seconds < 120) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 120 ? `${minutes} min ${Math.round(seconds % 60)} s` : `${(minutes / 60).toFixed(1)} h`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

export function shortId(id) {
  return String(id).slice(0, 8);
}

/** "file cnn.jsonl", "hub abisee/cnn_dailymail 3.0.0 test", "24 inline records" (other shapes as JSON). */
export function describeDataset(dataset) {
  if (!dataset || typeof dataset !== "object") return String(dataset ?? "–");
  if (dataset.file) return `file ${dataset.file}`;
  if (dataset.hub) return ["hub", dataset.hub, dataset.config, dataset.split].filter(Boolean).join(" ");
  if (typeof dataset.records === "number") return `${dataset.records} inline records`;
  return JSON.stringify(dataset);
}

// The settings people choose, in this order; the rest of a stored spec (token ids) only with {all: true}.
const GENERATION_LABELS = {
  num_beams: "beams",
  min_length: "min",
  min_new_tokens: "min new",
  max_length: "max",
  max_new_tokens: "max new",
  length_penalty: "len. penalty",
  no_repeat_ngram_size: "no-repeat n-gram",
  early_stopping: "early stop",
};

/** The generation settings as short "name value" pieces (unset ones left out; unknown ones shown as they are with `all`). */
export function describeGeneration(generation, { all = false } = {}) {
  const settings = generation || {};
  const names = [...Object.keys(GENERATION_LABELS).filter((name) => name in settings),
    ...(all ? Object.keys(settings).filter((name) => !(name in GENERATION_LABELS)) : [])];
  return names
    .filter((name) => settings[name] !== null && settings[name] !== undefined)
    .map((name) => `${GENERATION_LABELS[name] || name} ${typeof settings[name] === "object" ? JSON.stringify(settings[name]) : settings[name]}`);
}

/** A <table> from column specs {label, cell(row) -> node|text, numeric?} and rows. */
export function table(columns, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.numeric ? "num" : null }, c.label)))),
    h(
      "tbody",
      {},
      rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.numeric ? "num" : null }, c.cell(row))))),
    ),
  );
}

/** The ROUGE F-measure of a job or run: "12.34 [10.10–14.50]" for each type with an interval. */
export function rougeSummary(rouge) {
  if (!rouge) return h("span", { class: "muted" }, "–");
  return h(
    "dl",
    { class: "rouge-mini" },
    ROUGE_TYPES.filter((t) => rouge[t]).map((t) => [
      h("dt", {}, ROUGE_NAMES[t]),
      h(
        "dd",
        { "data-type": t, "data-value": rouge[t].mid.fmeasure },
        fmt(rouge[t].mid.fmeasure),
        h("span", { class: "interval" }, ` [${fmt(rouge[t].low.fmeasure)}–${fmt(rouge[t].high.fmeasure)}]`),
      ),
    ]),
  );
}

/** A progress bar of done (ok + failed) out of total, with rate and ETA underneath. */
export function progressBar(progress, status) {
  const { done = 0, failed = 0, total = 0, rate, eta_s: eta } = progress || {};
  const ok = total ? ((done - failed) / total) * 100 : 0;
  const bad = total ? (failed / total) * 100 : 0;
  const okBar = h("span", { class: "ok" });
  const badBar = h("span", { class: "failed" });
  okBar.style.width = `${ok}%`;
  badBar.style.width = `${bad}%`;
  const parts = [`${done} / ${total} done`];
  if (failed) parts.push(`${failed} failed`);
  if (rate) parts.push(`${fmt(rate, 1)} /s`);
  if (eta !== null && eta !== undefined && (status === "running" || status === "queued")) parts.push(`ETA ${fmtSeconds(eta)}`);
  return h(
    "div",
    { class: "progress-cell" },
    h(
      "div",
      {
        class: "progress",
        role: "progressbar",
        "aria-valuemin": 0,
        "aria-valuemax": total,
        "aria-valuenow": done,
        "aria-valuetext": parts.join(", "),
        "data-done": done,
        "data-failed": failed,
        "data-total": total,
      },
      okBar,
      badBar,
    ),
    h("span", { class: "progress-text" }, parts.join(" · ")),
  );
}

export function statusBadge(status) {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

/** A message box: role=alert for errors, role=status otherwise. */
export function notice(message, kind = "error") {
  return h("p", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, message);
}

/** Offer `content` as a file download (works with the API key: the data was fetched already). */
export function download(filename, content, type) {
  const url = URL.createObjectURL(new Blob([content], { type }));
  const link = h("a", { href: url, download: filename, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
