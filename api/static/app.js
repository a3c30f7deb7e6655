// The CTR dashboard: picks the time range, asks /api/v1/ctr, draws the charts, shows what
// /api/v1/views says of stale buckets and drift, refreshes.
// `document.body.dataset.state` tells where it is: loading | ready | error | token.

import {
  AuthError,
  adoptTokenFromUrl,
  forgetToken,
  getJson,
  storedToken,
  storeToken,
} from "./api.js";
import { BreakdownChart, SeriesCharts, SOURCE_LABEL } from "./charts.js";
import { renderDrift, renderStale } from "./exactness.js";

const CTR_PATH = "api/v1/ctr";
const VIEWS_PATH = "api/v1/views";
const REFRESH_SECONDS = 5;
const TOP_N = 10;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

// Minute buckets up to 6 h (at most 360 points); hourly beyond, where minutes would blur.
const RANGES = {
  "15m": { granularity: "minute", stepMs: MINUTE, buckets: 15 },
  "1h": { granularity: "minute", stepMs: MINUTE, buckets: 60 },
  "6h": { granularity: "minute", stepMs: MINUTE, buckets: 360 },
  "24h": { granularity: "hour", stepMs: HOUR, buckets: 24 },
};
const DEFAULT_RANGE = "1h";
const RANGE_KEY = "ctr-lambda.range";

const $ = (id) => document.getElementById(id);

const state = {
  range: RANGES[localStorage.getItem(RANGE_KEY)] ? localStorage.getItem(RANGE_KEY) : DEFAULT_RANGE,
  generation: 0, // bumped when the range changes, so late answers for the old range are dropped
  inFlight: false,
  timer: null,
  refreshes: 0,
  view: null,
  series: [],
  breakdowns: {},
  freshness: null,
  ctrView: null, // the ctr view's entry of /api/v1/views: stale intervals, drift
  truncated: false,
  error: null,
  failures: [], // the last 20 failed refreshes, for the console and the browser test
};

/** The buckets to show: whole buckets ending with the current (partial) one. */
function currentView(rangeName, nowMs) {
  const range = RANGES[rangeName];
  const end = Math.floor(nowMs / range.stepMs) * range.stepMs + range.stepMs;
  return { name: rangeName, ...range, start: end - range.buckets * range.stepMs, end };
}

const iso = (ms) => new Date(ms).toISOString().replace(".000Z", "Z");

/** One entry per bucket of the view; `row` is null where the API has no data for it. */
function bucketSeries(view, rows) {
  const byStart = new Map(rows.map((row) => [Date.parse(row.bucket_start), row]));
  const series = [];
  for (let t = view.start; t < view.end; t += view.stepMs) {
    series.push({ t, row: byStart.get(t) ?? null });
  }
  return series;
}

/** 95 % Wilson score interval, as the API computes it per row. */
function wilson(clicks, impressions) {
  if (impressions <= 0) return [0, 0];
  const z = 1.959963984540054;
  const p = clicks / impressions;
  const denom = 1 + (z * z) / impressions;
  const centre = (p + (z * z) / (2 * impressions)) / denom;
  const half =
    (z * Math.sqrt((p * (1 - p)) / impressions + (z * z) / (4 * impressions * impressions))) / denom;
  return [Math.max(0, centre - half), Math.min(1, centre + half)];
}

/** The source of two merged rows: covered stays covered (stale if either is), else mixed. */
function mergeSource(a, b) {
  if (a === b) return a;
  const covered = ["batch", "stale"];
  return covered.includes(a) && covered.includes(b) ? "stale" : "mixed";
}

/**
 * Totals per value of `dimension` over the whole range, ranked by clicks. The API is asked
 * for daily rows (the coarsest grain), so a range across midnight yields two rows per value.
 */
function rankBreakdown(dimension, rows, limit) {
  const totals = new Map();
  for (const row of rows) {
    const key = row[dimension];
    const acc = totals.get(key);
    if (!acc) {
      totals.set(key, { ...row });
      continue;
    }
    acc.impressions += row.impressions;
    acc.clicks += row.clicks;
    acc.stale_events += row.stale_events;
    acc.source = mergeSource(acc.source, row.source);
    acc.merged = true;
  }
  const ranked = [...totals.values()];
  for (const acc of ranked) {
    if (!acc.merged) continue;
    acc.ctr = acc.impressions > 0 ? acc.clicks / acc.impressions : 0;
    [acc.ctr_ci_low, acc.ctr_ci_high] = wilson(acc.clicks, acc.impressions);
  }
  ranked.sort(
    (a, b) =>
      b.clicks - a.clicks || b.impressions - a.impressions || String(a[dimension]).localeCompare(b[dimension]),
  );
  return ranked.slice(0, limit);
}

const charts = {
  series: new SeriesCharts($("chart-ctr"), $("chart-volume")),
  campaign_id: new BreakdownChart($("chart-campaign"), "campaign_id"),
  country: new BreakdownChart($("chart-country"), "country"),
  device_type: new BreakdownChart($("chart-device"), "device_type"),
};

async function fetchAll(view) {
  const window_ = { start: iso(view.start), end: iso(view.end) };
  const dimensions = ["campaign_id", "country", "device_type"];
  const [views, series, ...breakdowns] = await Promise.all([
    getJson(VIEWS_PATH, {}),
    getJson(CTR_PATH, { ...window_, granularity: view.granularity }),
    ...dimensions.map((d) => getJson(CTR_PATH, { ...window_, granularity: "day", group_by: d })),
  ]);
  return {
    series,
    breakdowns: Object.fromEntries(dimensions.map((d, i) => [d, breakdowns[i]])),
    ctrView: views.views.find((v) => v.name === "ctr") ?? null,
  };
}

async function refresh() {
  if (state.inFlight) return;
  if (!storedToken()) {
    askForToken("The API needs a token.");
    return;
  }
  state.inFlight = true;
  const generation = state.generation;
  const view = currentView(state.range, Date.now());
  try {
    const answer = await fetchAll(view);
    if (generation !== state.generation) return;
    state.view = view;
    state.series = bucketSeries(view, answer.series.rows);
    state.freshness = answer.series.freshness ?? null;
    state.truncated = [answer.series, ...Object.values(answer.breakdowns)].some((b) => b.truncated);
    charts.series.update(view, state.series);
    for (const [dimension, body] of Object.entries(answer.breakdowns)) {
      const limit = dimension === "device_type" ? Infinity : TOP_N;
      state.breakdowns[dimension] = rankBreakdown(dimension, body.rows, limit);
      charts[dimension].update(state.breakdowns[dimension]);
    }
    state.ctrView = answer.ctrView;
    state.refreshes += 1;
    showError(null);
    renderSummary();
    renderFreshness(state.freshness, Date.now());
    renderStale(state.ctrView?.stale_intervals ?? []);
    renderDrift(state.ctrView?.drift ?? null);
    document.body.dataset.state = "ready";
  } catch (err) {
    if (generation !== state.generation) return;
    if (err instanceof AuthError) {
      forgetToken();
      askForToken(`${err.message}: enter a valid token.`);
    } else {
      showError(err);
    }
  } finally {
    state.inFlight = false;
    schedule();
  }
}

function schedule() {
  window.clearTimeout(state.timer);
  state.timer = null;
  if ($("auto-refresh").checked && document.body.dataset.state !== "token") {
    // A hidden tab skips its refreshes; coming back refreshes at once (see wire()).
    state.timer = window.setTimeout(
      () => (document.hidden ? schedule() : refresh()),
      REFRESH_SECONDS * 1000,
    );
  }
}

function showError(err) {
  state.error = err ? String(err.message ?? err) : null;
  if (state.error) state.failures = [...state.failures.slice(-19), state.error];
  const box = $("error");
  box.hidden = !err;
  if (!err) return;
  box.textContent = `Could not update: ${state.error}.`;
  if ($("auto-refresh").checked) box.textContent += ` Retrying every ${REFRESH_SECONDS} s.`;
  if (state.view) box.textContent += " The charts show the last successful answer.";
  document.body.dataset.state = "error";
}

function askForToken(reason) {
  document.body.dataset.state = "token";
  $("token-reason").textContent = reason;
  showErrorText(`No usable API token: ${reason}`);
  const dialog = $("token-dialog");
  if (!dialog.open) dialog.showModal();
  $("token-input").focus();
}

function showErrorText(text) {
  state.error = text;
  $("error").textContent = text;
  $("error").hidden = false;
}

function formatBucket(value) {
  if (!value) return "none yet";
  return `${new Date(value).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function formatAge(value, nowMs) {
  if (!value) return "unknown";
  const seconds = Math.max(0, (nowMs - Date.parse(value)) / 1000);
  if (seconds < 120) return `${Math.round(seconds)} s ago`;
  if (seconds < 2 * 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

/** The response's freshness (serving_layer.Freshness): exact and approximate horizons, lag. */
function renderFreshness(freshness, nowMs) {
  const f = freshness ?? {};
  $("fresh-batch").textContent = formatBucket(f.latest_covered_bucket);
  $("fresh-speed").textContent = formatBucket(f.latest_speed_bucket);
  const lag = f.speed_lag_records;
  $("fresh-lag").textContent =
    lag === null || lag === undefined ? "unknown" : `${lag.toLocaleString("en-US")} records`;
  $("fresh-stream").textContent = formatAge(f.speed_updated_at, nowMs);
  $("fresh-stream").title = f.speed_watermark
    ? `speed layer watermark: ${formatBucket(f.speed_watermark)}`
    : "the speed layer has not reported a watermark";
  $("fresh-updated").textContent = `${new Date(nowMs).toISOString().slice(11, 19)} UTC`;
}

function renderSummary() {
  const counts = { batch: 0, stale: 0, speed: 0, mixed: 0 };
  for (const { row } of state.series) if (row) counts[row.source] = (counts[row.source] ?? 0) + 1;
  const parts = Object.entries(counts)
    .filter(([, n]) => n > 0)
    .map(([source, n]) => `${n} ${SOURCE_LABEL[source] ?? source}`);
  const unit = state.view.granularity === "minute" ? "minute" : "hour";
  $("ctr-summary").textContent = `· ${unit} buckets: ${parts.join(", ") || "no data in this range"}`;
  if (state.truncated) $("ctr-summary").textContent += " · the API truncated an answer (row limit)";
}

function selectRange(name) {
  state.range = name;
  state.generation += 1;
  state.inFlight = false;
  localStorage.setItem(RANGE_KEY, name);
  for (const button of document.querySelectorAll("#range button")) {
    button.setAttribute("aria-pressed", String(button.dataset.range === name));
  }
  document.body.dataset.state = "loading";
  refresh();
}

function wire() {
  for (const button of document.querySelectorAll("#range button")) {
    button.addEventListener("click", () => selectRange(button.dataset.range));
  }
  $("refresh-every").textContent = `(every ${REFRESH_SECONDS} s)`;
  $("auto-refresh").addEventListener("change", () => (state.inFlight ? null : schedule()));
  $("refresh-now").addEventListener("click", () => refresh());
  $("change-token").addEventListener("click", () => askForToken("Enter the API token."));
  $("token-form").addEventListener("submit", () => {
    storeToken($("token-input").value);
    $("token-input").value = "";
    document.body.dataset.state = "loading";
    showError(null);
    refresh();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && document.body.dataset.state !== "token") refresh();
  });
}

// What the browser test reads (and what a curious user can inspect in the console).
window.ctrDashboard = { state, charts, refresh };

adoptTokenFromUrl();
wire();
selectRange(state.range);
