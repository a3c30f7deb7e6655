// The dashboard's access to /api/v1: the bearer token and requests that fail loudly.

const TOKEN_KEY = "ctr-lambda.api-token";
const TIMEOUT_MS = 10000;
// The newest version of each table an answer has named (its Ctr-Versions header), sent with
// every request: behind a load balancer, an API replica that has not read them yet looks at
// once (or answers 503), so the dashboard never moves back to older data.
const VERSIONS_HEADER = "Ctr-Versions";
const seenVersions = new Map();

/** Keep the newest version of each table named by an answer's Ctr-Versions header. */
export function noteVersions(value) {
  for (const pair of (value || "").split(",")) {
    const [name, version] = pair.split("=");
    const number = Number.parseInt(version, 10);
    if (!name || !Number.isSafeInteger(number)) continue;
    if (!(seenVersions.get(name) >= number)) seenVersions.set(name, number);
  }
}

/** The Ctr-Versions value to send: every table's newest version seen. */
export function versionsSeen() {
  return [...seenVersions].map(([name, version]) => `${name}=${version}`).join(",");
}

/** The API refused the token (HTTP 401): ask for it again. */
export class AuthError extends Error {}

/** The API answered with an error status; `message` carries its detail. */
export class ApiError extends Error {}

/** The API could not be reached (network down, server stopped, timeout). */
export class NetworkError extends Error {}

/**
 * Take a token from the URL fragment (`#token=...`) into local storage, and drop it from
 * the address bar so it does not linger in history or screenshots.
 */
export function adoptTokenFromUrl() {
  const fragment = new URLSearchParams(window.location.hash.slice(1));
  const token = fragment.get("token");
  if (token === null) return;
  if (token) storeToken(token);
  fragment.delete("token");
  const rest = fragment.toString();
  const url = window.location.pathname + window.location.search + (rest ? `#${rest}` : "");
  window.history.replaceState(null, "", url);
}

export function storedToken() {
  return window.localStorage.getItem(TOKEN_KEY) || "";
}

export function storeToken(token) {
  window.localStorage.setItem(TOKEN_KEY, token.trim());
}

export function forgetToken() {
  window.localStorage.removeItem(TOKEN_KEY);
}

/** `params` as a query string: arrays repeat their key, empty values are left out. */
export function queryString(params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null && item !== "") query.append(key, String(item));
    }
  }
  return query.toString();
}

/** GET `path` (relative to the page) with `params`; resolves to the decoded JSON body. */
export async function getJson(path, params) {
  const response = await get(path, params, "application/json");
  return response.json();
}

/** GET `path` as CSV (`format=csv`); resolves to {text, headers}. */
export async function getCsv(path, params) {
  const response = await get(path, { ...params, format: "csv" }, "text/csv");
  return { text: await response.text(), headers: response.headers };
}

async function get(path, params, accept) {
  const url = `${path}?${queryString(params)}`;
  const controller = new AbortController();
  const timer = window.setTimeout(() => controller.abort(), TIMEOUT_MS);
  const headers = { Authorization: `Bearer ${storedToken()}`, Accept: accept };
  const seen = versionsSeen();
  if (seen) headers[VERSIONS_HEADER] = seen;
  let response;
  try {
    response = await fetch(url, { headers, signal: controller.signal, cache: "no-store" });
  } catch (err) {
    const why = err.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : err.message;
    throw new NetworkError(`cannot reach the API (${path}): ${why}`);
  } finally {
    window.clearTimeout(timer);
  }
  if (response.status === 401) {
    throw new AuthError("the API refused the key (401 Unauthorized: unknown, revoked or expired)");
  }
  if (!response.ok) {
    // 429 and 503 (busy, or stopped at the server's time limit) say when to ask again.
    const wait = response.headers.get("Retry-After");
    const again = wait ? ` (ask again in ${wait} s)` : "";
    throw new ApiError(`${path} answered ${response.status}: ${await errorDetail(response)}${again}`);
  }
  noteVersions(response.headers.get(VERSIONS_HEADER));
  return response;
}

async function errorDetail(response) {
  const text = await response.text();
  try {
    const { detail } = JSON.parse(text);
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail)) return detail.map((d) => d.msg ?? JSON.stringify(d)).join("; ");
    return JSON.stringify(detail ?? text);
  } catch {
    return text.slice(0, 300) || response.statusText;
  }
}
