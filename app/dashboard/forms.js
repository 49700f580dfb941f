// Form pieces shared by the new-job form and the try-it form: generation options, and showing a
// 422 next to the input it names (the API's error.field, e.g. "generation.num_beams").

import { h, notice } from "./dom.js";

const NUMBER_OPTIONS = [
  { name: "num_beams", label: "Beams", min: 1, step: 1 },
  { name: "min_length", label: "Min length", min: 0, step: 1 },
  { name: "min_new_tokens", label: "Min new tokens", min: 0, step: 1 },
  { name: "max_length", label: "Max length", min: 1, step: 1 },
  { name: "max_new_tokens", label: "Max new tokens", min: 1, step: 1 },
  { name: "length_penalty", label: "Length penalty", step: "any" },
  { name: "no_repeat_ngram_size", label: "No-repeat n-gram", min: 0, step: 1 },
];

let counter = 0;

/** A labelled input; returns the wrapper, the input is `wrapper.input`. */
export function field(label, attrs = {}, hint) {
  counter += 1;
  const id = attrs.id || `f${counter}`;
  const tag = attrs.tag || "input";
  const input = h(tag, { ...attrs, tag: null, id, "aria-describedby": hint ? `${id}-hint` : null });
  const wrapper = h("div", { class: "field" }, h("label", { for: id }, label), input,
    hint ? h("small", { id: `${id}-hint`, class: "muted" }, hint) : null);
  wrapper.input = input;
  return wrapper;
}

/** The generation-options fieldset; `.values()` gives the options that were set, typed. */
export function generationFieldset(prefix) {
  const inputs = {};
  const fields = NUMBER_OPTIONS.map((option) => {
    const wrapper = field(option.label, { type: "number", name: `generation.${option.name}`, id: `${prefix}-${option.name}`,
      min: option.min, max: option.max, step: option.step, inputmode: "decimal", placeholder: "default" });
    inputs[option.name] = wrapper.input;
    return wrapper;
  });
  const early = field("Early stopping", { tag: "select", name: "generation.early_stopping", id: `${prefix}-early_stopping` });
  for (const [value, label] of [["", "default"], ["true", "true"], ["false", "false"], ["never", "never"]]) {
    early.input.append(h("option", { value }, label));
  }
  const element = h("fieldset", { class: "generation" },
    h("legend", {}, "Generation options"),
    h("p", { class: "muted small" }, "Empty fields keep the checkpoint's defaults."),
    h("div", { class: "grid" }, fields, early));
  element.values = () => {
    const values = {};
    for (const [name, input] of Object.entries(inputs)) {
      if (input.value.trim() !== "") values[name] = Number(input.value);
    }
    const stop = early.input.value;
    if (stop) values.early_stopping = stop === "never" ? "never" : stop === "true";
    return values;
  };
  return element;
}

/** Show `error` in `slot`, and move focus to the input named by the API's error.field when the form has one. */
export function showError(form, slot, error) {
  slot.replaceChildren(notice(error.message));
  const name = error.field;
  const input = name && [...form.querySelectorAll("[name]")].find((el) => el.name === name || name.startsWith(`${el.name}[`));
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
}

export function clearErrors(form, slot) {
  slot.replaceChildren();
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
}
