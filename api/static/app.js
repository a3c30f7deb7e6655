// The CTR dashboard: what the analyst selected (range, filters, comparison, table) lives in the
// URL; each refresh asks /api/v1/ctr for every part of the page under that selection, draws the
// charts, the totals and the table, shows what /api/v1/views says of stale buckets and drift.
// Totals, reach included, are the API's one row for the whole range (granularity=all): distinct
// users do not add up over buckets, so nothing on the page sums rows into a total.
// `document.body.dataset.state` tells where it is: loading | ready | error | token.

import {
  AuthError,
  adoptTokenFromUrl,
  forgetToken,
  getCsv,
  getJson,
  queryString,
  storedToken,
  storeToken,
} from "./api.js";
import { ALERTS_PATH, alertMarkers, alertParams, renderAlerts } from "./alerts.js";
import { BreakdownChart, FILLING_LABEL, filling, SeriesCharts, SOURCE_LABEL } from "./charts.js";
import { renderDrift, renderStale } from "./exactness.js";
import { ValuePicker } from "./filters.js";
import { comparedValues, queries, suggestionParams, TABLE_LIMIT } from "./queries.js";
import { frequencyText, reachBounds, reachKind, reachText } from "./reach.js";
import {
  DIMENSION_LABEL,
  DIMENSIONS,
  isoMinute,
  MAX_COMPARE,
  MAX_FILTER_VALUES,
  MIN_COMPARE,
  parseState,
  RANGES,
  serializeState,
  timeWindow,
} from "./state.js";
import { DataTable } from "./table.js";
import { visibleText } from "./visible.js";

const CTR_PATH = "api/v1/ctr";
const VIEWS_PATH = "api/v1/views";
const ACCESS_PATH = "api/v1/access";
const REFRESH_SECONDS = 5;
const RANGE_KEY = "ctr-lambda.range";
const SUGGESTION_TTL_MS = 60_000;

const $ = (id) => document.getElementById(id);
const int = (x) => Math.round(x).toLocaleString("en-US");
const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)} %`);

/** Now less the view's click attribution window (ms): the buckets ending after it can still
 * receive clicks. Null for a view without attribution (its clicks count in their own minute). */
function fillingFrom(freshness, nowMs) {
  const minutes = freshness?.clicks_window_minutes ?? 0;
  return minutes > 0 ? nowMs - minutes * 60_000 : null;
}

/** The 95 % Wilson interval of clicks / impressions (serving_layer.wilson's), or null. */
function wilson(clicks, impressions, z = 1.959963984540054) {
  if (!(impressions > 0)) return null;
  const p = clicks / impressions;
  const z2 = z * z;
  const denom = 1 + z2 / impressions;
  const centre = (p + z2 / (2 * impressions)) / denom;
  const half =
    (z * Math.sqrt((p * (1 - p)) / impressions + z2 / (4 * impressions * impressions))) / denom;
  return [Math.max(0, centre - half), Math.min(1, centre + half)];
}

/**
 * The headline's CTR: over the range's buckets whose clicks are all in (those before the view's
 * click attribution window), so the newest minutes, still receiving clicks, do not pull it
 * down; `{ctr, low, high, left}` (`left`: the buckets left out), or null when no bucket is
 * still filling, or every one is.
 */
export function settledCtr(series, stepMs, from) {
  let impressions = 0;
  let clicks = 0;
  let left = 0;
  for (const { t, row } of series) {
    if (filling(t, stepMs, from)) {
      left += 1;
    } else if (row) {
      impressions += row.impressions;
      clicks += row.clicks;
    }
  }
  if (left === 0 || left === series.length || impressions === 0) return null;
  const interval = wilson(clicks, impressions);
  return { ctr: clicks / impressions, low: interval[0], high: interval[1], left };
}

const state = {
  selection: null, // what the analyst chose: see state.js
  generation: 0, // bumped when the selection changes, so late answers for the old one are dropped
  shown: -1, // the generation of the answer on the page
  inFlight: false,
  timer: null,
  refreshes: 0,
  view: null, // the time window of the last answer (state.timeWindow)
  series: [],
  compared: null, // [{label, series}] when comparing
  totals: null,
  breakdowns: {},
  table: null, // the table's answer
  freshness: null,
  ctrView: null, // the ctr view's entry of /api/v1/views: stale intervals, drift
  alerts: null, // /api/v1/alerts/events: the alerts of the range, and those open now
  reachDropped: null, // why the reach queries were answered without reach (a heavy range), or null
  truncated: false,
  error: null,
  failures: [], // the last 20 failed refreshes, for the console and the browser test
  downloads: [], // CSV files handed to the browser: {filename, bytes}
  urlProblems: [], // what the URL asked for that could not be shown
};

/** One entry per bucket of the window; `row` is null where the API has no data for it. */
function bucketSeries(window_, rows) {
  const byStart = new Map(rows.map((row) => [Date.parse(row.bucket_start), row]));
  const series = [];
  for (let t = window_.first; t < window_.end; t += window_.stepMs) {
    series.push({ t, row: byStart.get(t) ?? null });
  }
  return series;
}

const charts = {
  series: new SeriesCharts($("chart-ctr"), $("chart-volume"), $("chart-reach")),
  campaign_id: new BreakdownChart($("chart-campaign"), "campaign_id", (v) => toggleFilter("campaign_id", v)),
  country: new BreakdownChart($("chart-country"), "country", (v) => toggleFilter("country", v)),
  device_type: new BreakdownChart($("chart-device"), "device_type", (v) => toggleFilter("device_type", v)),
};

const suggestionCache = new Map();

/** Values of `dimension` with the most impressions under the other filters, cached a minute. */
async function suggest(dimension) {
  const window_ = timeWindow(state.selection, Date.now());
  const params = suggestionParams(state.selection, window_, dimension);
  const key = `${state.selection.range}|${queryString({ ...params, start: "", end: "" })}`;
  const cached = suggestionCache.get(key);
  if (cached && Date.now() - cached.at < SUGGESTION_TTL_MS) return cached.values;
  const body = await getJson(CTR_PATH, params);
  const values = body.rows.map((row) => ({ value: row[dimension], impressions: row.impressions }));
  suggestionCache.set(key, { at: Date.now(), values });
  return values;
}

const filterPickers = Object.fromEntries(
  DIMENSIONS.map((dimension) => [
    dimension,
    new ValuePicker($("filters"), {
      label: DIMENSION_LABEL[dimension],
      dimension,
      max: MAX_FILTER_VALUES,
      placeholder: "all",
      suggest,
      onChange: (values) =>
        select((s) => {
          if (values.length) s.filters[dimension] = values;
          else delete s.filters[dimension];
        }),
    }),
  ]),
);

const comparePicker = new ValuePicker($("compare-picker"), {
  label: "Values",
  dimension: null,
  max: MAX_COMPARE,
  placeholder: "add a value",
  suggest,
  onChange: (values) =>
    select((s) => {
      s.compare = { ...s.compare, values };
    }),
});

const table = new DataTable({
  onChange: (settings) =>
    select((s) => {
      s.table = settings;
    }),
  onDownload: () => downloadCsv(),
});

async function fetchAll(window_) {
  const q = queries(state.selection, window_, MIN_COMPARE);
  const dimensions = Object.keys(q.breakdowns);
  // The alerts do not depend on the CTR queries: shown even when those fail.
  const alertsAnswer = getJson(ALERTS_PATH, alertParams(window_)).catch((err) => ({ failed: err }));
  const reachDropped = [];
  let parts;
  try {
    parts = await Promise.all([
      getJson(ACCESS_PATH, {}),
      getJson(VIEWS_PATH, {}),
      withReach(q.series, reachDropped),
      withReach(q.totals, reachDropped),
      withReach(q.table, reachDropped),
      q.compare ? getJson(CTR_PATH, q.compare) : null,
      ...dimensions.map((d) => getJson(CTR_PATH, q.breakdowns[d])),
    ]);
  } catch (err) {
    const alerts = await alertsAnswer;
    if (!alerts.failed) renderAlerts(alerts);
    throw err;
  }
  const [access, views, series, totals, tableAnswer, compare, ...breakdowns] = parts;
  const alerts = await alertsAnswer;
  if (alerts.failed) throw alerts.failed;
  return {
    access,
    alerts,
    series,
    totals,
    table: tableAnswer,
    compare,
    breakdowns: Object.fromEntries(dimensions.map((d, i) => [d, breakdowns[i]])),
    ctrView: views.views.find((v) => v.name === "ctr") ?? null,
    reachDropped: reachDropped[0] ?? null,
  };
}

/**
 * A query with reach, or, when the API could not answer it (a heavy range: past its time limit,
 * no place to compute it, no answer in time), the same query without reach: the counts keep
 * showing, and the page says why reach is missing (`dropped` gets the reason).
 */
async function withReach(params, dropped) {
  try {
    return await getJson(CTR_PATH, params);
  } catch (err) {
    if (err instanceof AuthError || !params.reach) throw err;
    dropped.push(err.message);
    return getJson(CTR_PATH, { ...params, reach: false });
  }
}

async function refresh() {
  if (state.inFlight) return;
  if (!storedToken()) {
    askForToken("The API needs a key.");
    return;
  }
  state.inFlight = true;
  const generation = state.generation;
  const window_ = timeWindow(state.selection, Date.now());
  try {
    const answer = await fetchAll(window_);
    if (generation !== state.generation) return;
    show(window_, answer);
    state.refreshes += 1;
    showError(null);
    document.body.dataset.state = "ready";
  } catch (err) {
    if (generation !== state.generation) return;
    if (err instanceof AuthError) {
      forgetToken();
      askForToken(`${err.message}: enter a valid key.`);
    } else {
      showError(err);
    }
  } finally {
    if (generation === state.generation) state.inFlight = false;
    schedule();
  }
}

function show(window_, answer) {
  state.shown = state.generation;
  state.view = window_;
  state.series = bucketSeries(window_, answer.series.rows);
  const values = comparedValues(state.selection, MIN_COMPARE);
  const dimension = state.selection.compare.dimension;
  state.compared = values
    ? values.map((value) => ({
        label: value,
        series: bucketSeries(window_, answer.compare.rows.filter((r) => r[dimension] === value)),
      }))
    : null;
  state.freshness = answer.series.freshness ?? null;
  state.fillingFrom = fillingFrom(state.freshness, Date.now());
  state.totals = answer.totals.rows[0] ?? null;
  state.table = answer.table;
  // The breakdowns are top-N by design; the table says its own truncation.
  state.truncated = [answer.series, answer.compare, answer.totals].some((b) => b?.truncated);
  state.alerts = answer.alerts;
  state.reachDropped = answer.reachDropped;
  const markers = alertMarkers(answer.alerts, window_, state.selection.filters);
  charts.series.update(window_, state.series, state.compared, markers, state.fillingFrom);
  for (const [d, body] of Object.entries(answer.breakdowns)) {
    state.breakdowns[d] = body.rows;
    charts[d].update(body.rows);
  }
  state.ctrView = answer.ctrView;
  state.access = answer.access;
  renderSummary();
  renderTotals();
  table.render(answer.table, TABLE_LIMIT);
  renderFreshness(state.freshness, Date.now());
  renderStale(staleShown(state.ctrView?.stale_intervals ?? []));
  // An advertiser's key gets no drift (it is counted over every campaign): no panel at all.
  $("drift").hidden = Boolean(state.ctrView) && state.ctrView.drift === null;
  renderDrift(state.ctrView?.drift ?? null);
  renderIdentity(answer.access);
  renderAlerts(answer.alerts);
}

/**
 * The stale intervals the banner lists: the view's (every campaign's), or with filters the
 * shown buckets that hold late events not yet recomputed, as intervals of those buckets.
 */
function staleShown(intervals) {
  if (!Object.keys(state.selection.filters).length) return intervals;
  const step = state.view.stepMs;
  const shown = [];
  for (const { t, row } of state.series) {
    if (!row || !(row.stale_events > 0)) continue;
    const last = shown[shown.length - 1];
    if (last && Date.parse(last.end) === t) {
      last.end = new Date(t + step).toISOString();
      last.events += row.stale_events;
    } else {
      shown.push({
        start: new Date(t).toISOString(),
        end: new Date(t + step).toISOString(),
        events: row.stale_events,
        first_archived_at: null,
      });
    }
  }
  return shown;
}

function renderIdentity(access) {
  const scope = access.campaigns
    ? `${access.scope}: ${access.campaigns.join(", ")}${access.ads ? ` (ads ${access.ads.join(", ")})` : ""}`
    : access.scope;
  $("key-identity").textContent = `key ${access.name} · ${scope}`;
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
  showErrorText(`No usable API key: ${reason}`);
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
  $("fresh-batch").title =
    f.settle_minutes === undefined
      ? ""
      : `the batch layer covers a minute ${f.settle_minutes} min after it, once on-time ` +
        "events can no longer change it; the newer minutes are the speed layer's";
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
  const unit = state.view.granularity;
  let text = `· ${unit} buckets: ${parts.join(", ") || "no data in this range"}`;
  if (state.compared) {
    const { dimension } = state.selection.compare;
    text += ` · comparing ${state.compared.length} ${DIMENSION_LABEL[dimension].toLowerCase()} values`;
  }
  if (state.truncated) text += " · the API truncated an answer (row limit)";
  $("ctr-summary").textContent = text;
  renderReachSummary();
}

/** How the reach of the buckets was counted: exact, estimated, not measured. */
function renderReachSummary() {
  if (state.reachDropped) {
    $("reach-summary").textContent = `· reach not shown for this range: ${state.reachDropped}`;
    return;
  }
  const counts = { exact: 0, estimated: 0, "not measured": 0 };
  for (const { row } of state.series) if (row) counts[reachKind(row)] += 1;
  const parts = Object.entries(counts)
    .filter(([, n]) => n > 0)
    .map(([how, n]) => `${n} ${how}`);
  $("reach-summary").textContent = parts.length
    ? `· ${state.view.granularity} buckets: ${parts.join(", ")} · users do not add up across buckets`
    : "· no data in this range";
}

/** What the numbers cover, in words: the range and the filters. */
function scopeText() {
  const { start } = state.view;
  const end = state.view.until ?? state.view.end;
  const filters = Object.entries(state.selection.filters).map(
    ([d, values]) => `${DIMENSION_LABEL[d].toLowerCase()} ${values.map(visibleText).join(" or ")}`,
  );
  const range = `${isoMinute(start).replace("T", " ").slice(0, 16)} – ${isoMinute(end).replace("T", " ").slice(0, 16)} UTC`;
  // An advertiser's key sees its campaigns only: never "all traffic".
  const scoped = state.access?.campaigns
    ? `campaign${state.access.campaigns.length === 1 ? "" : "s"} ${state.access.campaigns.map(visibleText).join(", ")}`
    : null;
  const everything = scoped ?? "all traffic";
  return `· ${range} · ${filters.length ? `only ${filters.join(", ")}` : everything}`;
}

function renderTotals() {
  const row = state.totals;
  $("totals-scope").textContent = scopeText();
  $("total-impressions").textContent = row ? int(row.impressions) : "0";
  $("total-clicks").textContent = row ? int(row.clicks) : "0";
  const settled = settledCtr(state.series, state.view.stepMs, state.fillingFrom);
  const arriving = state.series.filter(({ t }) => filling(t, state.view.stepMs, state.fillingFrom));
  const unit = state.view.granularity === "minute" ? "min" : "h";
  if (settled) {
    // The newest buckets are still receiving clicks: the headline leaves them out.
    $("total-ctr").textContent = pct(settled.ctr);
    $("total-ci").textContent = `95 %: ${pct(settled.low)} – ${pct(settled.high)}`;
    $("total-ctr-note").textContent =
      `without the last ${settled.left} ${unit} (${FILLING_LABEL}); all: ${pct(row?.ctr)}`;
  } else {
    $("total-ctr").textContent = row ? pct(row.ctr) : "–";
    $("total-ci").textContent =
      row && row.ctr_ci_low !== null ? `95 %: ${pct(row.ctr_ci_low)} – ${pct(row.ctr_ci_high)}` : "";
    $("total-ctr-note").textContent =
      row && arriving.length
        ? `${FILLING_LABEL} in every bucket of this range (up to ` +
          `${state.freshness.clicks_window_minutes} min after each impression): it will rise`
        : "";
  }
  const exact = row ? row.covered_fraction : null;
  $("total-exact").textContent =
    exact === null ? "–" : `${(100 * exact).toFixed(exact > 0 && exact < 1 ? 1 : 0)} % of the range`;
  $("table-scope").textContent = scopeText();
  renderReach(row);
  renderAttribution(row);
}

/** Reach and frequency over the range, from the same granularity=all row: "1,234" and "exact",
 * or "≈1,234" and its bounds; "–" and "not measured" where rows written before reach was
 * counted are included. */
function renderReach(row) {
  const kind = row ? reachKind(row) : null;
  // No row: no traffic in the range, so no user reached.
  $("total-reach").textContent = row ? reachText(row) : "0";
  $("total-reach-note").textContent = kind === "estimated" ? reachBounds(row) : (kind ?? "");
  $("total-reach-note").title = kind === "estimated" ? "bounds of the estimate (about 95 %)" : "";
  $("total-frequency").textContent = frequencyText(row);
  $("total-frequency-note").textContent = frequencyText(row) === "–" ? "" : "impressions per user";
}

/** A version with click attribution: its raw, orphan and repeat clicks; orphan clicks as a
 * data-quality figure (clicks whose impression was never seen), a share of the raw clicks. */
function renderAttribution(row) {
  const attributed = row !== null && row.orphan_clicks !== null && row.orphan_clicks !== undefined;
  $("attribution").hidden = !attributed;
  if (!attributed) return;
  $("total-raw-clicks").textContent = int(row.raw_clicks);
  $("total-orphan-clicks").textContent = int(row.orphan_clicks);
  $("total-orphan-share").textContent =
    row.raw_clicks > 0 ? `${pct(row.orphan_clicks / row.raw_clicks)} of raw clicks` : "no raw clicks";
  $("total-repeat-clicks").textContent = int(row.repeat_clicks);
}

// -- the selection ------------------------------------------------------------------------

/** Apply `change` to a copy of the selection, put it in the URL (a history entry), refresh. */
function select(change, { push = true } = {}) {
  const next = structuredClone(state.selection);
  change(next);
  apply(next);
  const url = `${window.location.pathname}?${serializeState(next)}${window.location.hash}`;
  if (push) window.history.pushState(null, "", url);
  else window.history.replaceState(null, "", url);
  refresh();
}

/** Show `selection` in the controls; the next refresh answers it. */
function apply(selection) {
  state.selection = selection;
  state.generation += 1;
  state.inFlight = false;
  if (selection.range !== "custom") localStorage.setItem(RANGE_KEY, selection.range);
  for (const button of document.querySelectorAll("#range button")) {
    button.setAttribute("aria-pressed", String(button.dataset.range === selection.range));
  }
  for (const [dimension, picker] of Object.entries(filterPickers)) {
    picker.setValues(selection.filters[dimension] ?? []);
    picker.invalidate();
  }
  const { dimension, values } = selection.compare;
  $("compare-dimension").value = dimension ?? "";
  $("compare-picker").hidden = !dimension;
  comparePicker.dimension = dimension;
  comparePicker.label.textContent = dimension ? `${DIMENSION_LABEL[dimension]} values` : "Values";
  comparePicker.setValues(values);
  comparePicker.invalidate();
  $("compare-hint").textContent = compareHint(selection);
  $("clear-all").hidden = !Object.keys(selection.filters).length && !dimension;
  table.setSettings(selection.table);
  document.body.dataset.state = "loading";
}

function compareHint(selection) {
  const { dimension, values } = selection.compare;
  if (!dimension) return "";
  if (values.length < MIN_COMPARE) {
    return `pick ${MIN_COMPARE} to ${MAX_COMPARE} values to compare (${values.length} so far)`;
  }
  const filtered = selection.filters[dimension];
  return filtered ? `the ${DIMENSION_LABEL[dimension].toLowerCase()} filter does not apply to the comparison` : "";
}

function toggleFilter(dimension, value) {
  select((s) => {
    const values = s.filters[dimension] ?? [];
    const next = values.includes(value) ? values.filter((v) => v !== value) : [...values, value];
    if (next.length) s.filters[dimension] = next;
    else delete s.filters[dimension];
  });
}

/** Start comparing `dimension`: its top values by impressions, as many as fit (up to three). */
async function compareBy(dimension, { push = true } = {}) {
  if (!dimension) {
    select((s) => {
      s.compare = { dimension: null, values: [] };
    });
    return;
  }
  let top = [];
  try {
    top = (await suggest(dimension)).slice(0, 3).map((s) => s.value);
  } catch {
    // The refresh reports what is wrong with the API; the analyst picks values by hand.
  }
  select(
    (s) => {
      s.compare = { dimension, values: top };
    },
    { push },
  );
}

function showCustomRange(open) {
  const form = $("custom-range");
  form.hidden = !open;
  document.querySelector('#range [data-range="custom"]').setAttribute("aria-expanded", String(open));
  if (!open) return;
  const window_ = timeWindow(state.selection, Date.now());
  $("custom-start").value = isoMinute(window_.start).slice(0, 16);
  $("custom-end").value = isoMinute(window_.end).slice(0, 16);
  $("custom-start").focus();
}

/** The table's rows as the API's CSV: the query of the table on the page (its time window). */
async function downloadCsv() {
  const window_ = state.view ?? timeWindow(state.selection, Date.now());
  const params = queries(state.selection, window_, MIN_COMPARE).table;
  const button = $("download-csv");
  button.disabled = true;
  try {
    const { text } = await getCsv(CTR_PATH, params);
    const stamp = (ms) => isoMinute(ms).replaceAll(":", "").replaceAll("-", "");
    const filename = `ctr_${stamp(window_.start)}_${stamp(window_.end)}.csv`;
    const url = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
    const link = document.createElement("a");
    link.href = url;
    link.download = filename;
    document.body.append(link);
    link.click();
    link.remove();
    window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
    state.downloads.push({ filename, bytes: text.length });
  } catch (err) {
    showError(err);
  } finally {
    button.disabled = false;
  }
}

async function copyLink() {
  const button = $("copy-link");
  try {
    await navigator.clipboard.writeText(window.location.href);
    button.textContent = "Link copied";
  } catch {
    // No clipboard (an insecure origin): the address bar holds the same link.
    button.textContent = "Copy the address bar";
  }
  window.setTimeout(() => (button.textContent = "Copy link"), 2000);
}

function wire() {
  for (const button of document.querySelectorAll("#range button")) {
    button.addEventListener("click", () => {
      if (button.dataset.range === "custom") {
        showCustomRange($("custom-range").hidden);
        return;
      }
      showCustomRange(false);
      select((s) => Object.assign(s, { range: button.dataset.range, start: null, end: null }));
    });
  }
  $("custom-range").addEventListener("submit", (event) => {
    event.preventDefault();
    const start = Date.parse(`${$("custom-start").value}Z`);
    const end = Date.parse(`${$("custom-end").value}Z`);
    if (!(end > start) || end - start > 31 * 86_400_000) {
      $("custom-hint").textContent = "The end must be after the start, at most 31 days later.";
      return;
    }
    showCustomRange(false);
    select((s) => Object.assign(s, { range: "custom", start, end }));
  });
  $("compare-dimension").addEventListener("change", (event) => compareBy(event.target.value || null));
  $("clear-all").addEventListener("click", () =>
    select((s) => {
      s.filters = {};
      s.compare = { dimension: null, values: [] };
    }),
  );
  $("refresh-every").textContent = `(every ${REFRESH_SECONDS} s)`;
  $("auto-refresh").addEventListener("change", () => (state.inFlight ? null : schedule()));
  $("refresh-now").addEventListener("click", () => refresh());
  $("copy-link").addEventListener("click", () => copyLink());
  $("change-token").addEventListener("click", () => askForToken("Enter an API key."));
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
  // Back and forward walk through the views the analyst had.
  window.addEventListener("popstate", () => {
    apply(parseState(window.location.search, localStorage.getItem(RANGE_KEY)).state);
    refresh();
  });
}

/** The selection the page opens with: the URL's, else the last range used here. */
function initialSelection() {
  const remembered = localStorage.getItem(RANGE_KEY);
  const { state: selection, problems } = parseState(window.location.search, RANGES[remembered] ? remembered : undefined);
  state.urlProblems = problems;
  if (problems.length) console.warn(`dashboard: ignored in the URL: ${problems.join("; ")}`);
  return selection;
}

// What the browser test reads (and what a curious user can inspect in the console).
window.ctrDashboard = { state, charts, refresh, table, filterPickers, comparePicker };

adoptTokenFromUrl();
wire();
apply(initialSelection());
window.history.replaceState(null, "", `${window.location.pathname}?${serializeState(state.selection)}${window.location.hash}`);
// A link naming a dimension to compare and no values (?compare=campaign_id) compares its top
// values, as choosing the dimension on the page does.
if (state.selection.compare.dimension && state.selection.compare.values.length === 0) {
  compareBy(state.selection.compare.dimension, { push: false });
} else {
  refresh();
}
