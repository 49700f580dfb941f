// Compare finished jobs on the same dataset: pick two or more (the first picked is the baseline;
// older jobs load a page at a time, or one is added by its id),
// then GET /compare: ROUGE side by side, each run against the baseline with paired-bootstrap and
// approximate-randomization p-values and the 95% interval of the difference, and the biggest wins
// and losses with their texts.

import { api } from "./api.js";
import { forestPlot } from "./charts.js";
import {
  ROUGE_NAMES, ROUGE_TYPES, describeDataset, describeGeneration, fmt, fmtP, fmtSigned, h, notice, replace, shortId, table,
} from "./dom.js";

function picker(jobs, selected, metric, more) {
  const chosen = selected; // shared with the page, so a pick survives loading older jobs
  const order = h("span", { id: "compare-order", "aria-live": "polite" });
  const go = h("button", { type: "submit" }, "Compare selected jobs");
  const metricSelect = h("select", { id: "compare-metric", name: "metric" },
    ROUGE_TYPES.map((t) => h("option", { value: t, selected: t === metric }, ROUGE_NAMES[t])));
  const redraw = () => {
    replace(order, chosen.length ? chosen.map((id, i) => [i ? " → " : "", h("span", { class: "mono" }, shortId(id)), i === 0 ? " (baseline)" : ""])
      : "nothing picked yet");
    go.disabled = chosen.length < 2;
  };
  const groups = new Map();
  for (const job of jobs) {
    const key = describeDataset(job.dataset);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(job);
  }
  const fieldsets = [...groups].map(([dataset, members]) => h("fieldset", { class: "pick" }, h("legend", {}, dataset),
    members.map((job) => {
      const box = h("input", { type: "checkbox", value: job.id, id: `pick-${job.id}`, checked: chosen.includes(job.id),
        onchange: () => {
          if (box.checked) chosen.push(job.id);
          else chosen.splice(chosen.indexOf(job.id), 1);
          redraw();
        } });
      const lsum = job.rouge && job.rouge.rougeLsum ? ` · ROUGE-Lsum ${fmt(job.rouge.rougeLsum.mid.fmeasure)}` : "";
      return h("div", { class: "check" }, box, h("label", { for: `pick-${job.id}` },
        h("span", { class: "mono" }, shortId(job.id)), ` · ${job.model} · ${describeGeneration(job.generation).join(", ")}${lsum}`));
    })));
  const form = h("form", { id: "compare-form" },
    jobs.length ? fieldsets : h("p", { class: "muted" }, "No succeeded job yet."),
    more,
    h("p", {}, "Order: ", order),
    h("div", { class: "toolbar" }, h("label", { for: "compare-metric" }, "Rank examples by"), metricSelect, go));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = `#/compare?jobs=${chosen.map(encodeURIComponent).join(",")}&metric=${metricSelect.value}`;
  });
  redraw();
  return form;
}

function runsTable(result) {
  return table([
    { label: "Job", cell: (run) => h("a", { href: `#/jobs/${encodeURIComponent(run.name)}`, class: "mono" }, shortId(run.name)) },
    { label: "Model", cell: (run) => h("span", { class: "mono small" }, run.info.model ?? "–") },
    { label: "Generation", cell: (run) => h("span", { class: "small" }, describeGeneration(run.info.generation).join(", ")) },
    ...ROUGE_TYPES.map((t) => ({ label: `${ROUGE_NAMES[t]} F1`, numeric: true, cell: (run) => {
      const own = run.info.rouge && run.info.rouge[t];
      return h("span", { "data-type": t, "data-value": run.rouge[t] }, fmt(run.rouge[t]),
        own ? h("span", { class: "interval" }, ` [${fmt(own.low.fmeasure)}–${fmt(own.high.fmeasure)}]`) : null);
    } })),
  ], result.runs, { id: "compare-rouge" });
}

function exampleList(title, examples, comparison, metric) {
  return h("section", {}, h("h3", {}, title),
    examples.length ? h("ol", { class: "examples" }, examples.map((e) => h("li", {}, h("details", {},
      h("summary", {}, h("span", { class: "mono" }, String(e.id)), ` ${fmtSigned(e.delta)} (${fmt(e.baseline.score)} → ${fmt(e.run.score)} ${ROUGE_NAMES[metric]})`),
      h("dl", { class: "texts" },
        h("dt", {}, "Reference"), h("dd", { class: "pre" }, e.reference ?? "(none)"),
        h("dt", {}, `Baseline ${shortId(comparison.baseline)}`), h("dd", {}, e.baseline.prediction),
        h("dt", {}, `Run ${shortId(comparison.run)}`), h("dd", {}, e.run.prediction)),
      h("a", { href: `#/jobs/${encodeURIComponent(comparison.run)}?example=${encodeURIComponent(e.id)}` }, "Open with the article"))))) :
      h("p", { class: "muted" }, "None."));
}

function comparisonSection(comparison, k, result) {
  const rows = ROUGE_TYPES.map((t) => ({ type: t, ...comparison.rouge[t] }));
  const p = (row, test) => h("span", { "data-type": row.type, "data-test": test, "data-value": row[`p_${test}`],
    class: row[`p_${test}`] < 0.05 ? "significant" : null }, fmtP(row[`p_${test}`]));
  return h("section", { class: "comparison card", "aria-labelledby": `cmp-${k}` },
    h("h2", { id: `cmp-${k}` }, h("span", { class: "mono" }, shortId(comparison.run)), " against baseline ",
      h("span", { class: "mono" }, shortId(comparison.baseline))),
    h("p", {}, `On ${ROUGE_NAMES[result.metric]}: ${comparison.better} examples better, ${comparison.worse} worse, ${comparison.same} the same.`),
    h("div", { class: "stack" },
      table([
        { label: "Metric", cell: (r) => ROUGE_NAMES[r.type] },
        { label: "Baseline", numeric: true, cell: (r) => fmt(r.baseline) },
        { label: "Run", numeric: true, cell: (r) => fmt(r.run) },
        { label: "Δ", numeric: true, cell: (r) => h("span", { "data-type": r.type, "data-field": "delta", "data-value": r.delta }, fmtSigned(r.delta)) },
        { label: "95% interval", numeric: true, cell: (r) => `[${fmtSigned(r.interval[0])}, ${fmtSigned(r.interval[1])}]` },
        { label: "p (paired bootstrap)", numeric: true, cell: (r) => p(r, "bootstrap") },
        { label: "p (approx. randomization)", numeric: true, cell: (r) => [p(r, "randomization"),
          r.randomization === "exact" ? h("span", { class: "muted small" }, " exact") : null] },
      ], rows, { id: `significance-${k}`, class: "significance" }),
      forestPlot(rows.map((r) => ({ label: ROUGE_NAMES[r.type], delta: r.delta, low: r.interval[0], high: r.interval[1] })),
        { caption: "Difference in F1 (run − baseline) with its 95% bootstrap interval" })),
    h("div", { class: "two" },
      exampleList("Biggest wins", comparison.wins, comparison, result.metric),
      exampleList("Biggest losses", comparison.losses, comparison, result.metric)));
}

function resultView(result) {
  return h("div", { id: "compare-result" },
    h("p", {}, `${result.examples} examples, ${result.paired} scored in every run`,
      result.unpaired ? ` (${result.unpaired} left out: no ROUGE in some run)` : "",
      `. Paired tests on F1 over those examples: ${result.resamples} resamples, seed ${result.seed}; p < 0.05 in bold.`),
    (result.notes || []).map((note) => notice(note, "warning")),
    result.runs.flatMap((run) => (run.warnings || []).map((w) => notice(`${shortId(run.name)}: ${w}`, "warning"))),
    h("section", { class: "card", "aria-labelledby": "side-title" }, h("h2", { id: "side-title" }, "ROUGE side by side"),
      h("p", { class: "muted small" }, "Mean F1 over the paired examples (each job's own figure when every example is paired); in brackets each job's own 95% bootstrap interval."),
      h("div", { class: "scroll" }, runsTable(result)),
      h("dl", { class: "facts", id: "compare-signatures" }, result.runs.map((run) => [
        h("dt", {}, h("span", { class: "mono" }, shortId(run.name))),
        h("dd", { class: "mono small" }, run.signature || "not recorded")]))),
    result.comparisons.map((c, k) => comparisonSection(c, k, result)));
}

/** Render the compare page into `main` (the jobs to compare come from the hash's ?jobs=a,b). */
export function compareView(main, { fail }, params) {
  const ids = (params.get("jobs") || "").split(",").filter(Boolean);
  const metric = params.get("metric") || "rougeLsum";
  const pickSlot = h("div", {}, h("p", { class: "muted" }, "Loading jobs…"));
  const resultSlot = h("div", { class: "messages" });
  let stopped = false;
  replace(main, h("h1", { tabindex: -1 }, "Compare runs"),
    h("p", {}, "Pick two or more succeeded jobs on the same dataset; the first one picked is the baseline."),
    h("section", { class: "card", "aria-label": "Pick jobs" }, pickSlot), resultSlot);
  const jobs = [];
  let next = "/evaluate?status=succeeded&limit=200";
  const note = h("span", { class: "muted small", role: "status" });
  const older = h("button", { type: "button", id: "compare-older", onclick: () => load(next) }, "Load older jobs");
  const byId = h("input", { id: "compare-add-id", name: "job", autocomplete: "off", placeholder: "job id" });
  const add = h("button", { type: "button", id: "compare-add", onclick: async () => {
    const id = byId.value.trim();
    if (!id) return;
    try {
      const job = await api(`/evaluate/${encodeURIComponent(id)}`);
      if (job.status !== "succeeded") throw new Error(`job ${shortId(id)} is ${job.status}, not succeeded`);
      if (!jobs.some((known) => known.id === job.id)) jobs.push(job);
      if (!ids.includes(job.id)) ids.push(job.id);
      draw();
    } catch (error) {
      if (!fail(error, true)) replace(note, error.message);
    }
  } }, "Add by id");
  const draw = () => {
    older.hidden = !next;
    replace(pickSlot, picker(jobs, ids, metric, h("div", { class: "toolbar" }, older,
      h("label", { for: byId.id }, "Job id"), byId, add, note)));
  };
  async function load(url) {
    try {
      const page = await api(url);
      if (stopped) return;
      jobs.push(...page.jobs.filter((job) => !jobs.some((known) => known.id === job.id)));
      next = page.links.next;
      draw();
      main.setAttribute("aria-busy", "false");
    } catch (error) {
      fail(error);
    }
  }
  load(next);
  if (ids.length >= 2) {
    replace(resultSlot, h("p", { class: "muted", role: "status" }, "Comparing…"));
    api(`/compare?jobs=${ids.map(encodeURIComponent).join(",")}&metric=${encodeURIComponent(metric)}`)
      .then((result) => { if (!stopped) replace(resultSlot, resultView(result)); })
      .catch((error) => { if (!fail(error, true)) replace(resultSlot, notice(error.message)); });
  }
  return () => { stopped = true; };
}
