// The jobs page: evaluation jobs with live progress, ROUGE and a cancel button, a page of 200 at a
// time (Older / Newer follow the listing's links, so every job can be reached), and the form that
// starts a new one. Rows are updated in place, so keyboard focus survives the polling.

import { api } from "./api.js";
import { clearErrors, field, generationFieldset, showError } from "./forms.js";
import {
  describeDataset, describeGeneration, fmtTime, h, notice, progressBar, replace, rougeSummary, shortId, statusBadge,
} from "./dom.js";

const ACTIVE = new Set(["queued", "running"]);

function jobRow(job, cancel) {
  const cells = Array.from({ length: 7 }, () => h("td"));
  const cancelButton = h("button", { type: "button", class: "danger", onclick: () => cancel(job.id, cancelButton) },
    "Cancel", h("span", { class: "visually-hidden" }, ` job ${shortId(job.id)}`));
  const row = h("tr", { "data-job": job.id }, h("th", { scope: "row" },
    h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, class: "mono" }, shortId(job.id)),
    h("div", { class: "muted small" }, fmtTime(job.created_at))), cells);
  row.update = (view) => {
    row.dataset.status = view.status;
    replace(cells[0], statusBadge(view.status), view.error ? h("div", { class: "small error-text" }, view.error) : null);
    replace(cells[1], progressBar(view.progress, view.status));
    replace(cells[2], h("span", { class: "mono small model" }, view.model));
    replace(cells[3], describeDataset(view.dataset));
    replace(cells[4], h("span", { class: "small" }, describeGeneration(view.generation).join(" · ")));
    replace(cells[5], rougeSummary(view.rouge));
    if (ACTIVE.has(view.status)) {
      if (!cells[6].contains(cancelButton)) replace(cells[6], cancelButton);
    } else if (cells[6].contains(cancelButton)) {
      const hadFocus = document.activeElement === cancelButton;
      replace(cells[6]);
      if (hadFocus) row.querySelector("a").focus();
    }
  };
  row.update(job);
  return row;
}

function recordsFromText(text) {
  const trimmed = text.trim();
  if (!trimmed) return [];
  if (trimmed.startsWith("[")) return JSON.parse(trimmed);
  return trimmed.split("\n").filter((line) => line.trim()).map((line, i) => {
    try {
      return JSON.parse(line);
    } catch {
      throw new Error(`records line ${i + 1} is not valid JSON`);
    }
  });
}

function newJobForm(onCreated) {
  const slot = h("div", { class: "messages" });
  const sources = [["file", "File in the data directory"], ["hub", "Hub dataset"], ["records", "Inline records"]];
  const file = field("File name", { name: "dataset.file", placeholder: "cnn_sample.jsonl", autocomplete: "off" },
    "Relative to the service's data directory (BART_OPT_DATA_DIR).");
  const hub = field("Dataset id", { name: "dataset.hub", placeholder: "abisee/cnn_dailymail" });
  const config = field("Config", { name: "dataset.config", placeholder: "3.0.0" });
  const split = field("Split", { name: "dataset.split", value: "test" });
  const records = field("Records", { tag: "textarea", name: "dataset.records", rows: 5,
    placeholder: '{"id": "a", "text": "Article ...", "reference": "Summary ..."}' },
  "JSON lines or a JSON array; fields id, text, reference by default.");
  const panels = {
    file: h("div", { class: "panel" }, file),
    hub: h("div", { class: "panel grid", hidden: true }, hub, config, split),
    records: h("div", { class: "panel", hidden: true }, records),
  };
  const radios = sources.map(([value, label], i) => h("label", { class: "radio" },
    h("input", { type: "radio", name: "source", value, checked: i === 0,
      onchange: () => Object.entries(panels).forEach(([k, p]) => { p.hidden = k !== value; }) }), ` ${label}`));
  const columns = {
    text_column: field("Text column", { name: "text_column", placeholder: "article / text" }),
    summary_column: field("Summary column", { name: "summary_column", placeholder: "highlights / reference" }),
    id_column: field("Id column", { name: "id_column", placeholder: "id" }),
    limit: field("Limit", { name: "limit", type: "number", min: 1, placeholder: "all" }),
  };
  const generation = generationFieldset("job");
  const lead3 = h("input", { type: "checkbox", name: "baselines", value: "lead-3", id: "job-baseline-lead-3", checked: true });
  const baselines = h("div", { class: "field" }, h("label", { for: lead3.id }, lead3,
    " Score the lead-3 baseline (the article's first three sentences) beside the model"));
  const submit = h("button", { type: "submit" }, "Start job");
  const form = h("form", { id: "new-job", novalidate: true },
    h("fieldset", {}, h("legend", {}, "Dataset"), h("div", { class: "radios" }, radios), Object.values(panels)),
    h("details", {}, h("summary", {}, "Columns and limit"), h("div", { class: "grid" }, Object.values(columns))),
    generation, baselines, h("div", { class: "actions" }, submit), slot);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form, slot);
    const source = form.querySelector("input[name=source]:checked").value;
    const body = { generation: generation.values() };
    try {
      if (source === "file") body.dataset = { file: file.input.value.trim() };
      if (source === "hub") {
        body.dataset = { hub: hub.input.value.trim(), split: split.input.value.trim() || "test" };
        if (config.input.value.trim()) body.dataset.config = config.input.value.trim();
      }
      if (source === "records") body.dataset = { records: recordsFromText(records.input.value) };
    } catch (error) {
      showError(form, slot, { message: error.message, field: "dataset.records" });
      return;
    }
    for (const name of ["text_column", "summary_column", "id_column"]) {
      if (columns[name].input.value.trim()) body[name] = columns[name].input.value.trim();
    }
    if (columns.limit.input.value.trim()) body.limit = Number(columns.limit.input.value);
    if (lead3.checked) body.baselines = ["lead-3"];
    submit.disabled = true;
    try {
      const job = await api("/evaluate", { method: "POST", body });
      slot.replaceChildren(notice(h("span", {}, "Job ", h("a", { href: `#/jobs/${encodeURIComponent(job.id)}` },
        shortId(job.id)), ` queued: ${job.progress.total} examples.`), "ok"));
      onCreated(job);
    } catch (error) {
      showError(form, slot, error);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

/** Render the jobs page into `main`; returns a function that stops its polling. */
export function jobsView(main, { fail }) {
  const rows = new Map();
  const tbody = h("tbody");
  const empty = h("p", { class: "muted", hidden: true }, "No jobs yet: start one with the form below.");
  const status = h("div", { class: "messages" });
  const FIRST = "/evaluate?limit=200";
  let current = FIRST; // the page shown: the newest, or one reached through the links
  let links = { next: null, prev: null };
  let timer;
  let stopped = false;
  const go = (url) => { current = url || FIRST; refresh(); };
  const older = h("button", { type: "button", id: "jobs-older", onclick: () => go(links.next) }, "Older jobs →");
  const newer = h("button", { type: "button", id: "jobs-newer", onclick: () => go(links.prev) }, "← Newer jobs");
  const newest = h("button", { type: "button", id: "jobs-newest", onclick: () => go(FIRST) }, "Newest");

  async function cancel(id, button) {
    button.disabled = true;
    try {
      await api(`/evaluate/${encodeURIComponent(id)}`, { method: "DELETE" });
    } catch (error) {
      status.replaceChildren(notice(error.message));
    }
    button.disabled = false;
    refresh();
  }

  async function refresh() {
    clearTimeout(timer);
    if (stopped) return;
    let active = false;
    try {
      const page = await api(current);
      const { jobs } = page;
      links = page.links;
      older.disabled = !links.next;
      newer.disabled = !links.prev;
      newest.disabled = current === FIRST;
      const seen = new Set();
      jobs.forEach((job, i) => {
        seen.add(job.id);
        active ||= ACTIVE.has(job.status);
        let row = rows.get(job.id);
        if (row) row.update(job);
        else rows.set(job.id, (row = jobRow(job, cancel)));
        if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] || null);
      });
      for (const [id, row] of rows) if (!seen.has(id)) { row.remove(); rows.delete(id); }
      empty.hidden = jobs.length > 0;
      main.setAttribute("aria-busy", "false");
    } catch (error) {
      if (fail(error)) return;
    }
    if (!stopped) timer = setTimeout(refresh, active ? 1000 : 4000);
  }

  const list = h("table", { id: "jobs-table", class: "jobs" },
    h("caption", { class: "visually-hidden" }, "Evaluation jobs, newest first"),
    h("thead", {}, h("tr", {}, ["Job", "Status", "Progress", "Model", "Dataset", "Generation", "ROUGE F1 [95%]", ""]
      .map((label) => h("th", { scope: "col" }, label)))),
    tbody);
  replace(main,
    h("h1", { tabindex: -1 }, "Evaluation jobs"),
    status,
    h("div", { class: "scroll card" }, list),
    h("nav", { class: "toolbar", "aria-label": "Pages of jobs" }, newest, newer, older),
    empty,
    h("section", { class: "card", "aria-labelledby": "new-job-title" }, h("h2", { id: "new-job-title" }, "New evaluation job"),
      newJobForm(() => refresh())));
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
