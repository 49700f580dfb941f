// Calls to the service's own API. The API key (when the service has one) lives in this tab's
// sessionStorage and goes out as "Authorization: Bearer"; a 401 anywhere sends the page to the login form.

const KEY = "bart-opt-api-key";

export class Unauthorized extends Error {}

class ApiError extends Error {
  constructor(status, error) {
    super(error && error.message ? error.message : `the service answered ${status}`);
    this.status = status;
    this.code = error ? error.code : undefined;
    this.field = error ? error.field : undefined;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

function headers(extra = {}, key = storedKey()) {
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

/** fetch() one API path; JSON in and out (or text with {text: true}; null for 204). Throws Unauthorized or ApiError. */
export async function api(path, { method = "GET", body, text = false, key } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }, key) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (response.status === 401) {
    if (key === undefined) window.dispatchEvent(new Event("bart-opt:unauthorized"));
    throw new Unauthorized("the API key is missing or wrong");
  }
  if (!response.ok) {
    let error;
    try {
      error = (await response.json()).error;
    } catch {
      error = undefined;
    }
    throw new ApiError(response.status, error);
  }
  if (response.status === 204) return null;
  return text ? response.text() : response.json();
}

/** Whether `key` (the stored one by default) opens the API: GET /auth, which needs neither the model nor the jobs database. */
export async function checkKey(key) {
  await api("/auth", key === undefined ? {} : { key });
}

/** The path of one example of a job. An id of "." or ".." (refused at submission since, but possible in an
 * older job) is no path segment: a browser resolves it away and would fetch another resource. */
export function examplePath(jobId, exampleId) {
  if (exampleId === "." || exampleId === "..") {
    throw new Error(`the example id ${JSON.stringify(exampleId)} cannot be fetched by URL (a browser resolves it away)`);
  }
  return `/evaluate/${encodeURIComponent(jobId)}/examples/${encodeURIComponent(exampleId)}`;
}

/** A job's predictions JSONL as served (`text`) and parsed (`rows`). */
export async function predictions(jobId) {
  const text = await api(`/evaluate/${encodeURIComponent(jobId)}/predictions`, { text: true });
  return { text, rows: text.split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line)) };
}
