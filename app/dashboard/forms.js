// Form pieces shared by the new-job form and the try-it form: generation options, and showing a
// 422 next to the input it names (the API's error.field, e.g. "generation.num_beams").

import { api } from "./api.js";
import { h, notice } from "./dom.js";

let options; // GET /options, asked once per page load: the generation options the service takes

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

/** The generation-options fieldset, filled in from GET /options; `.values()` gives the options that were set, typed. */
export function generationFieldset(prefix) {
  const inputs = {};
  const grid = h("div", { class: "grid" });
  const element = h("fieldset", { class: "generation" },
    h("legend", {}, "Generation options"),
    h("p", { class: "muted small" }, "Empty fields keep the checkpoint's defaults."),
    grid);
  options ||= api("/options");
  options.then(({ generation }) => {
    grid.replaceChildren(...generation.map((option) => {
      const attrs = { name: `generation.${option.name}`, id: `${prefix}-${option.name}` };
      const wrapper = option.type === "choice"
        ? field(option.label, { ...attrs, tag: "select" })
        : field(option.label, { ...attrs, type: "number", min: option.minimum, step: option.type === "integer" ? 1 : "any",
          inputmode: "decimal", placeholder: "default" });
      if (option.type === "choice") {
        wrapper.input.append(h("option", { value: "" }, "default"),
          ...option.choices.map((choice) => h("option", { value: String(choice) }, String(choice))));
      }
      inputs[option.name] = { input: wrapper.input, option };
      return wrapper;
    }));
  }, () => { options = undefined; }); // asked again by the next form (the page shows the API's error itself)
  element.values = () => {
    const values = {};
    for (const [name, { input, option }] of Object.entries(inputs)) {
      const text = input.value.trim();
      if (text === "") continue;
      values[name] = option.type === "choice" ? option.choices.find((choice) => String(choice) === text) : Number(text);
    }
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
