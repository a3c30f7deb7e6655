// The alerts of /api/v1/alerts/events: the panel listing them (newest first) and the markers the
// CTR chart draws at their windows' ends (charts.js). An alert fires when a rule's measure moved
// beyond chance against its baseline; one fired on the speed layer's counts (approximate) is
// confirmed or withdrawn once the batch layer covers its window; it resolves when the change is
// gone. Open: fired and neither resolved nor withdrawn since.

import { visibleText } from "./visible.js";

export const ALERTS_PATH = "api/v1/alerts/events";
export const ALERTS_LIMIT = 100;

const $ = (id) => document.getElementById(id);

const EVENT_LABEL = {
  fired: "fired",
  resolved: "resolved",
  confirmed: "confirmed (exact counts)",
  withdrawn: "withdrawn (exact counts)",
  dead_letter: "webhook failed",
  evaluated: "evaluated",
};

// Rule names are per owner: the owner is part of a rule's key.
const keyOf = (e) => `${e.owner ?? ""}\u0000${e.rule}\u0000${e.group_value ?? ""}`;
const endOf = (e) => Date.parse(e.window_end);

/** The query of the alerts the range may show: those whose window ended in it. */
export function alertParams(window_) {
  return { since: new Date(window_.start).toISOString(), limit: ALERTS_LIMIT };
}

/** A relative change as "−32 %" / "+12 %" (a true minus sign). */
export function changeText(change) {
  if (change === null || change === undefined) return "–";
  const percent = Math.round(100 * change);
  if (percent === 0) return "0 %";
  return `${percent < 0 ? "\u2212" : "+"}${Math.abs(percent)} %`;
}

export function pValueText(p) {
  if (p === null || p === undefined) return "–";
  return p < 0.001 ? "< 0.001" : p.toPrecision(2);
}

function minuteText(value) {
  return new Date(value).toISOString().slice(0, 16).replace("T", " ");
}

/** "2026-11-27 09:00–09:15" (UTC): the end's date only when it differs. */
function windowText(event) {
  const [from, to] = [minuteText(event.window_start), minuteText(event.window_end)];
  return `${from}–${from.slice(0, 10) === to.slice(0, 10) ? to.slice(11) : to}`;
}

/**
 * What the counts were when it fired (exact, approximate) and, for an approximate one, what
 * the batch layer's exact counts said since: "approximate, then confirmed".
 */
export function evidenceText(event, events) {
  const evidence = event.evidence ?? "–";
  if (event.event !== "fired" || evidence !== "approximate") return evidence;
  const later = events.find(
    (e) =>
      (e.event === "confirmed" || e.event === "withdrawn") &&
      keyOf(e) === keyOf(event) &&
      endOf(e) === endOf(event),
  );
  return later ? `approximate, then ${later.event}` : "approximate, awaiting the batch layer";
}

/**
 * The markers to draw on the CTR chart: the fired alerts whose window ended in the shown range
 * and the alerts open now (even when they fired before it), one per rule, group and window end.
 * An alert on a campaign the filters leave out is not marked (the chart does not show it).
 */
export function alertMarkers(answer, view, filters = {}) {
  if (!answer) return [];
  const campaigns = filters.campaign_id ?? null;
  const open = new Set(answer.open.map((e) => `${keyOf(e)}@${endOf(e)}`));
  const seen = new Set();
  const markers = [];
  for (const event of [...answer.open, ...answer.events.filter((e) => e.event === "fired")]) {
    const id = `${keyOf(event)}@${endOf(event)}`;
    const t = endOf(event);
    if (seen.has(id) || t < view.start || t > view.end) continue;
    if (campaigns && event.campaign_id !== null && !campaigns.includes(event.campaign_id)) continue;
    seen.add(id);
    const group = event.group_value === null ? "" : ` [${visibleText(event.group_value)}]`;
    markers.push({
      t,
      open: open.has(id),
      label: `${visibleText(event.rule)}${group} ${changeText(event.change)}`,
    });
  }
  return markers.sort((a, b) => a.t - b.t);
}

const ALERT_OPEN = "#d92d20";
const ALERT_PAST = "#98a2b3";

/**
 * An inline Chart.js plugin (no dependency): each alert of `markers()` ({t, open, label}) as a
 * vertical line at its window's end with a triangle on top, red and solid while open, grey and
 * dashed once over. What it drew, in pixels, goes to `drawn` (the browser test reads it).
 */
// Alert labels stack on up to this many lines at the chart's top, this far apart.
const LABEL_LINES = 4;
const LABEL_LINE_PX = 13;

export function alertMarkerPlugin(markers, drawn) {
  return {
    id: "alertMarkers",
    afterDatasetsDraw(chart) {
      const { ctx, chartArea: area } = chart;
      drawn.length = 0;
      const rows = []; // per line of labels, the [left, right] spans taken
      for (const marker of markers()) {
        const x = chart.scales.x.getPixelForValue(marker.t);
        if (!(x >= area.left - 0.5 && x <= area.right + 0.5)) continue;
        const color = marker.open ? ALERT_OPEN : ALERT_PAST;
        ctx.save();
        ctx.strokeStyle = color;
        ctx.fillStyle = color;
        ctx.lineWidth = 1.5;
        ctx.setLineDash(marker.open ? [] : [4, 3]);
        ctx.beginPath();
        ctx.moveTo(x, area.top);
        ctx.lineTo(x, area.bottom);
        ctx.stroke();
        ctx.setLineDash([]);
        ctx.beginPath();
        ctx.moveTo(x - 6, area.top);
        ctx.lineTo(x + 6, area.top);
        ctx.lineTo(x, area.top + 9);
        ctx.closePath();
        ctx.fill();
        ctx.font = "11px system-ui, sans-serif";
        ctx.textAlign = x > (area.left + area.right) / 2 ? "right" : "left";
        // Several alerts in one minute (or close by): each label on the first line where it
        // overlaps none, up to LABEL_LINES; past them the line alone (the panel lists them all).
        const width = ctx.measureText(marker.label).width;
        const left = ctx.textAlign === "right" ? x - 8 - width : x + 8;
        const span = [left - 4, left + width + 4];
        let line = rows.findIndex((taken) => taken.every(([a, b]) => span[1] < a || span[0] > b));
        if (line < 0 && rows.length < LABEL_LINES) line = rows.push([]) - 1;
        if (line >= 0) {
          rows[line].push(span);
          const y = area.top + 9 + line * LABEL_LINE_PX;
          ctx.fillText(marker.label, x + (ctx.textAlign === "right" ? -8 : 8), y);
        }
        ctx.restore();
        drawn.push({
          t: marker.t,
          x,
          y: area.top + 3,
          open: marker.open,
          label: marker.label,
          line: line >= 0 ? line : null,
        });
      }
    },
  };
}

function cell(tr, text, className = "") {
  const td = tr.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

/** The panel: one row per alert event, newest first; "No alerts…" without any. */
export function renderAlerts(answer) {
  const events = answer?.events ?? [];
  const open = answer?.open ?? [];
  $("alerts-empty").hidden = events.length > 0;
  $("alerts-table").hidden = events.length === 0;
  const count = open.length;
  $("alerts-summary").textContent =
    `· ${count ? `${count} open` : "none open"}` +
    (answer?.truncated ? ` · the newest ${events.length} shown` : "");
  const body = document.createElement("tbody");
  for (const event of events) {
    const tr = body.insertRow();
    tr.dataset.event = event.event;
    tr.dataset.rule = event.rule;
    if (event.open && event.event === "fired") tr.classList.add("open");
    cell(tr, `${windowText(event)} UTC`);
    cell(tr, visibleText(event.rule));
    cell(tr, event.group_value === null ? "all" : visibleText(event.group_value));
    cell(tr, (EVENT_LABEL[event.event] ?? event.event) + (event.open && event.event === "fired" ? " · open" : ""));
    cell(tr, changeText(event.change), "num");
    cell(tr, pValueText(event.p_value), "num");
    const evidence = cell(tr, evidenceText(event, events));
    if (event.reason) evidence.title = event.reason;
  }
  $("alerts-table").tBodies[0].replaceWith(body);
}
