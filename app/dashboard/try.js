// Try the model: texts (and optional references) and generation options in, POST /summarize out:
// the summaries, ROUGE, the request's memory and timing phases, and memory and time at each decoder step,
// as small charts.

import { api } from "./api.js";
import { bars, lineChart } from "./charts.js";
import { clearErrors, field, generationFieldset, showError } from "./forms.js";
import { ROUGE_NAMES, ROUGE_TYPES, fmt, fmtBytes, fmtSeconds, h, notice, replace, rougeSummary } from "./dom.js";

const SAMPLE = "The city council voted on Monday to expand the public library, after a year of debate over its cost. " +
  "Officials said the new wing would open next spring and add space for children and students.";

function textItem(index, remove) {
  const text = field(`Text ${index + 1}`, { tag: "textarea", name: `texts[${index}]`, rows: 5, class: "try-text" });
  const reference = field(`Reference ${index + 1} (optional)`, { tag: "textarea", name: `references[${index}]`, rows: 2,
    class: "try-reference" }, "ROUGE needs a reference for every text, or none.");
  const item = h("fieldset", { class: "try-item" }, h("legend", {}, `Text ${index + 1}`), text, reference,
    index > 0 ? h("button", { type: "button", class: "quiet", onclick: () => remove(item) }, `Remove text ${index + 1}`) : null);
  item.text = text.input;
  item.reference = reference.input;
  return item;
}

function answer(response) {
  const memory = response.memory || {};
  const phases = memory.phases || [];
  const timing = response.timing || {};
  return h("div", { id: "try-result", class: "card" },
    h("h2", { tabindex: -1 }, "Summaries"),
    h("ol", { class: "summaries" }, response.summaries.map((summary, i) => {
      const item = response.items[i] || {};
      return h("li", {},
        item.error ? notice(item.error) : h("p", { class: "summary text" }, summary || "(empty)"),
        h("p", { class: "muted small" }, `${item.input_tokens} input tokens${item.truncated ? " (truncated)" : ""}, ${item.output_tokens} output tokens`),
        item.rouge ? h("p", { class: "small" }, ROUGE_TYPES.filter((t) => item.rouge[t])
          .map((t) => `${ROUGE_NAMES[t]} ${fmt(item.rouge[t].fmeasure)}`).join(" · ")) : null);
    })),
    response.rouge ? [h("h2", {}, "ROUGE F1 over these texts [95% interval]"), rougeSummary(response.rouge)] : null,
    h("h2", {}, "Memory and time"),
    h("p", {}, `Peak ${fmtBytes(memory.peak_bytes)} on ${memory.device} (${memory.peak_source}), ` +
      `${fmtSeconds(memory.seconds)} of model time; this request's share of its model call: ${fmt((memory.share ?? 1) * 100, 0)}%` +
      (memory.batch ? ` (the call held ${memory.batch.requests} requests, ${memory.batch.texts} texts).` : ".")),
    h("div", { class: "charts" },
      bars(phases.map((p) => ({ label: p.count > 1 ? `${p.name} ×${p.count}` : p.name, value: p.seconds })),
        { caption: "Seconds per phase", format: fmtSeconds }),
      bars(phases.map((p) => ({ label: p.name, value: p.peak_bytes })), { caption: "Memory peak per phase", format: fmtBytes }),
      bars(Object.entries(timing).map(([name, value]) => ({ label: name, value })), { caption: "Request timing", format: fmtSeconds })),
    stepCharts(memory.rows || []),
    h("p", { class: "muted small" }, `Model ${response.model}, request ${response.request_id}.`));
}

/** Memory and seconds at each decoder step of the call (the memory log's readings), or nothing. */
function stepCharts(rows) {
  if (rows.length < 2) return null;
  const steps = rows.map((row, i) => ({ x: i + 1, row, dt: i ? row.t - rows[i - 1].t : row.t }));
  return h("div", { class: "charts", id: "try-steps" },
    lineChart(steps.map((p) => ({ x: p.x, y: p.row.mem_bytes })), { caption: "Memory at each decoder step (whole call)",
      xLabel: "step", yLabel: "memory", yFormat: fmtBytes }),
    lineChart(steps.map((p) => ({ x: p.x, y: p.dt })), { caption: "Seconds per decoder step", xLabel: "step",
      yLabel: "seconds", yFormat: fmtSeconds }));
}

/** Render the try-it page into `main`. */
export function tryView(main, { fail }) {
  const list = h("div", { class: "try-items" });
  const slot = h("div", { class: "messages" });
  const result = h("div");
  const items = [];
  const renumber = () => {
    const values = items.map((item) => [item.text.value, item.reference.value]);
    items.splice(0, items.length, ...values.map((_, i) => textItem(i, remove)));
    items.forEach((item, i) => { [item.text.value, item.reference.value] = values[i]; });
    replace(list, items);
  };
  function remove(item) {
    items.splice(items.indexOf(item), 1);
    renumber();
    items[items.length - 1].text.focus();
  }
  const add = () => {
    items.push(textItem(items.length, remove));
    list.append(items[items.length - 1]);
  };
  add();
  items[0].text.value = SAMPLE;
  const generation = generationFieldset("try");
  const submit = h("button", { type: "submit" }, "Summarize");
  const form = h("form", { id: "try-form", class: "card", novalidate: true }, list,
    h("div", { class: "actions" }, h("button", { type: "button", onclick: () => { add(); items[items.length - 1].text.focus(); } },
      "Add another text")),
    generation, h("div", { class: "actions" }, submit), slot);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form, slot);
    const texts = items.map((item) => item.text.value);
    const references = items.map((item) => item.reference.value);
    const body = { texts, generation: generation.values() };
    if (references.some((r) => r.trim())) body.references = references;
    submit.disabled = true;
    replace(result, h("p", { class: "muted", role: "status" }, "Summarizing…"));
    try {
      replace(result, answer(await api("/summarize", { method: "POST", body })));
      result.querySelector("h2").focus();
    } catch (error) {
      replace(result);
      if (!fail(error, true)) showError(form, slot, error);
    } finally {
      submit.disabled = false;
    }
  });
  replace(main, h("h1", { tabindex: -1 }, "Try the model"),
    h("p", {}, "Summaries come from POST /summarize on the service's model, with the memory and time the request took."),
    form, result);
  main.setAttribute("aria-busy", "false");
  return () => {};
}
