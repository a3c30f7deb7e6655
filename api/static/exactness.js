// How exact the served numbers are, as /api/v1/views tells: the covered buckets with late events
// no batch run has counted yet (stale), and how far the speed layer's counts were from the exact
// ones where batch runs caught up with it (drift).

const MAX_LISTED = 5;

const $ = (id) => document.getElementById(id);
const int = (x) => Math.round(x).toLocaleString("en-US");
const signed = (x) => x.toLocaleString("en-US", { signDisplay: "exceptZero" });
const percent = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)} %`);
const plural = (n, word) => `${int(n)} ${word}${n === 1 ? "" : "s"}`;

function utcMinute(value) {
  return new Date(value).toISOString().slice(0, 16).replace("T", " ");
}

/** `[start, end)` of whole minutes: the end's date only when it differs from the start's. */
function formatInterval({ start, end }) {
  const [from, to] = [utcMinute(start), utcMinute(end)];
  return `${from}–${from.slice(0, 10) === to.slice(0, 10) ? to.slice(11) : to} UTC`;
}

/** Text only when it changed, so a screen reader is not told the same thing every refresh. */
function setText(element, text) {
  if (element.textContent !== text) element.textContent = text;
}

/** The stale intervals (StaleIntervalBody): summed up with the freshness, listed below it. */
export function renderStale(intervals) {
  const detail = $("stale-detail");
  detail.hidden = intervals.length === 0;
  if (intervals.length === 0) {
    setText($("fresh-stale"), "none");
    $("fresh-stale").classList.remove("warn");
    return;
  }
  const events = intervals.reduce((sum, i) => sum + i.events, 0);
  // Intervals of the shown (filtered) buckets carry no archive time.
  const archived = intervals.filter((i) => i.first_archived_at).map((i) => Date.parse(i.first_archived_at));
  const since = archived.length ? ` · stale since ${utcMinute(Math.min(...archived))} UTC` : " in this selection";
  setText(
    $("fresh-stale"),
    `${plural(intervals.length, "interval")} · ${plural(events, "late event")}${since}`,
  );
  $("fresh-stale").classList.add("warn");
  const listed = intervals
    .slice(0, MAX_LISTED)
    .map((i) => `${formatInterval(i)} (${plural(i.events, "event")})`);
  const more = intervals.length - listed.length;
  if (more > 0) listed.push(`${more} more`);
  setText($("stale-intervals"), listed.join(", "));
}

/** The drift summary (DriftBody), or "No drift recorded yet" before a run recorded some. */
export function renderDrift(drift) {
  const empty = !drift || drift.buckets === 0;
  $("drift-empty").hidden = !empty;
  $("drift-figures").hidden = empty;
  if (empty) return;
  setText(
    $("drift-scope"),
    `${plural(drift.buckets, "minute")} compared, first covered by the latest ` +
      `${plural(drift.runs, "batch run")}`,
  );
  for (const measure of ["impressions", "clicks"]) {
    const row = document.querySelector(`#drift-table tr[data-measure="${measure}"]`);
    setText(row.cells[1], percent(drift[`${measure}_weighted`]));
    setText(row.cells[2], percent(drift[`${measure}_p50`]));
    setText(row.cells[3], percent(drift[`${measure}_p99`]));
    setText(row.cells[4], signed(drift[`speed_minus_batch_${measure}`]));
  }
}
