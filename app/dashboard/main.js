// The dashboard's entry point: the hash router (#/jobs, #/jobs/<id>, #/compare, #/try, #/service),
// the API-key login, and the error banner. Nothing is shown from the API before it answers 200.

import { Unauthorized, checkKey, forgetKey, storeKey, storedKey } from "./api.js";
import { compareView } from "./compare.js";
import { h, notice, replace } from "./dom.js";
import { jobView } from "./job.js";
import { jobsView } from "./jobs.js";
import { serviceView } from "./service.js";
import { tryView } from "./try.js";

const main = document.getElementById("main");
const banner = h("div", { id: "banner", class: "messages" });
document.querySelector("header.top").after(banner);
const logout = document.getElementById("logout");
let stop = () => {};
let locked = false;

/** Views call this with a failed API call; true when it was the API key (the login form takes over). */
function fail(error, quiet = false) {
  if (error instanceof Unauthorized) return true;
  if (!quiet) replace(banner, notice(`Could not load: ${error.message}`));
  return false;
}

function parseHash() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query) };
}

function route() {
  if (locked) return;
  stop();
  replace(banner);
  main.setAttribute("aria-busy", "true");
  const { parts, params } = parseHash();
  const section = parts[0] || "jobs";
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const context = { fail };
  if (section === "jobs" && parts[1]) stop = jobView(main, context, parts[1], params);
  else if (section === "compare") stop = compareView(main, context, params);
  else if (section === "try") stop = tryView(main, context);
  else if (section === "service") stop = serviceView(main, context);
  else stop = jobsView(main, context);
  document.title = `${main.querySelector("h1")?.textContent || "Dashboard"} · bart-opt`;
}

function showLogin(wrong = false) {
  if (locked) return;
  locked = true;
  stop();
  stop = () => {};
  replace(banner);
  logout.hidden = true;
  const input = h("input", { id: "api-key", name: "api-key", type: "password", autocomplete: "current-password", required: true });
  const slot = h("div", { class: "messages" }, wrong ? notice("That API key was refused.") : null);
  const form = h("form", { id: "login", class: "login card" },
    h("h1", {}, "Sign in"),
    h("p", {}, "This service needs its API key (BART_OPT_API_KEY). It is kept in this browser tab only, until the tab closes."),
    h("div", { class: "field" }, h("label", { for: "api-key" }, "API key"), input),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Sign in")),
    slot);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    try {
      await checkKey(key);
    } catch (error) {
      replace(slot, notice(error instanceof Unauthorized ? "That API key was refused." : error.message));
      input.select();
      return;
    }
    storeKey(key);
    locked = false;
    logout.hidden = false;
    route();
    main.focus();
  });
  replace(main, form);
  main.setAttribute("aria-busy", "false");
  input.focus();
}

window.addEventListener("bart-opt:unauthorized", () => {
  const hadKey = Boolean(storedKey());
  forgetKey();
  showLogin(hadKey);
});
window.addEventListener("hashchange", () => {
  if (location.hash.startsWith("#/") || location.hash === "") {
    route();
    main.querySelector("h1")?.focus();
  }
});
document.getElementById("skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
logout.addEventListener("click", () => {
  forgetKey();
  showLogin();
});

async function start() {
  try {
    await checkKey();
  } catch (error) {
    if (error instanceof Unauthorized) return;
  }
  logout.hidden = !storedKey();
  route();
}

start();
