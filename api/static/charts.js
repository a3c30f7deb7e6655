// Chart.js charts of the dashboard, with provenance drawn into every mark:
// exact (batch) solid, approximate (speed) dashed lines and hatched bars, mixed dotted and pale,
// stale (exact plus late events not yet recomputed) dash-dotted, dotted bars, triangle points.
// The reach line follows its own exactness (reach.js): solid where the batch layer counted the
// distinct users, dashed with hollow points and a band of bounds where a sketch estimated them.

import { alertMarkerPlugin } from "./alerts.js";
import { frequencyText, reachDetail, reachSource, reachText } from "./reach.js";
import { visibleText } from "./visible.js";

const Chart = window.Chart;

const BLUE = "#4c78a8";
const ORANGE = "#f58518";
const TEAL = "#2a7f62";
const PURPLE = "#b279a2";

// A segment between two buckets takes the less exact of their sources. Stale sits between
// batch and mixed: every minute is covered and exact but for its few late events (added as
// archived), while mixed and speed buckets hold the speed layer's approximate counts.
const EXACTNESS = { batch: 0, stale: 1, mixed: 2, speed: 3 };
const LEAST_EXACT = 3;
const DASH = { batch: [], stale: [8, 3, 2, 3], mixed: [2, 3], speed: [6, 4] };

export const SOURCE_LABEL = {
  batch: "exact (batch)",
  stale: "stale (late events not yet recomputed)",
  speed: "approximate (speed)",
  mixed: "mixed",
};

/** A row's provenance in words, with the late events it holds that no batch run counted yet. */
export function provenance(row) {
  const late = row.stale_events ?? 0;
  const events = `${int(late)} late event${late === 1 ? "" : "s"} not yet recomputed`;
  if (row.source === "stale") return `exact, plus ${events}`;
  const label = SOURCE_LABEL[row.source] ?? row.source;
  return late > 0 ? `${label}, plus ${events}` : label;
}

function hatch(color) {
  const tile = document.createElement("canvas");
  tile.width = 8;
  tile.height = 8;
  const g = tile.getContext("2d");
  g.fillStyle = withAlpha(color, 0.22);
  g.fillRect(0, 0, 8, 8);
  g.strokeStyle = color;
  g.lineWidth = 2;
  g.beginPath();
  g.moveTo(-2, 10);
  g.lineTo(10, -2);
  g.moveTo(6, 10);
  g.lineTo(10, 6);
  g.moveTo(-2, 2);
  g.lineTo(2, -2);
  g.stroke();
  return g.createPattern(tile, "repeat");
}

/** A tile of `color` with white dots: almost solid, as the counts are almost exact. */
function dotted(color) {
  const tile = document.createElement("canvas");
  tile.width = 6;
  tile.height = 6;
  const g = tile.getContext("2d");
  g.fillStyle = color;
  g.fillRect(0, 0, 6, 6);
  g.fillStyle = "#fff";
  g.beginPath();
  g.arc(3, 3, 1.3, 0, 2 * Math.PI);
  g.fill();
  return g.createPattern(tile, "repeat");
}

function withAlpha(hex, alpha) {
  const n = Number.parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

/** Bar fill for a source: solid, dotted, hatched or pale. */
function barFill(color) {
  const patterns = {
    batch: color,
    stale: dotted(color),
    speed: hatch(color),
    mixed: withAlpha(color, 0.45),
  };
  return (source) => patterns[source] ?? withAlpha(color, 0.2);
}

// Points are filled where every minute is covered, hollow where the speed layer counted.
const COVERED = new Set(["batch", "stale"]);
const POINT_STYLE = { stale: "triangle", mixed: "rectRot" };

function lessExact(a, b) {
  return (EXACTNESS[a] ?? LEAST_EXACT) >= (EXACTNESS[b] ?? LEAST_EXACT) ? a : b;
}

/** Line options whose segments and points follow the sources of `points`. */
function provenanceLine(color, sourceOf) {
  const segmentSource = (ctx) => lessExact(sourceOf(ctx.p0DataIndex), sourceOf(ctx.p1DataIndex));
  return {
    borderColor: color,
    backgroundColor: color,
    borderWidth: 2,
    pointRadius: 2.5,
    pointHoverRadius: 5,
    pointBackgroundColor: (ctx) => (COVERED.has(sourceOf(ctx.dataIndex)) ? color : "#fff"),
    pointBorderColor: color,
    pointStyle: (ctx) => POINT_STYLE[sourceOf(ctx.dataIndex)] ?? "circle",
    segment: {
      borderDash: (ctx) => DASH[segmentSource(ctx)],
      borderColor: (ctx) => (segmentSource(ctx) === "batch" ? color : withAlpha(color, 0.75)),
    },
    spanGaps: false,
  };
}

function timeTicks(granularity) {
  const pad = (n) => String(n).padStart(2, "0");
  return (value) => {
    const d = new Date(value);
    const hm = `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
    return granularity === "minute" ? hm : `${pad(d.getUTCDate())}.${pad(d.getUTCMonth() + 1)} ${hm}`;
  };
}

const TICK_STEPS_MIN = [1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440];

/** Tick positions on whole minutes/hours, at most about ten of them. */
function roundTimeTicks(min, max) {
  const minutes = (max - min) / 60_000;
  const stepMs = (TICK_STEPS_MIN.find((s) => minutes / s <= 10) ?? 1440) * 60_000;
  const ticks = [];
  for (let t = Math.ceil(min / stepMs) * stepMs; t <= max; t += stepMs) ticks.push(t);
  return ticks;
}

function formatTime(ms) {
  return `${new Date(ms).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)} %`);
const pctTick = (x) => `${Number((100 * x).toFixed(2))} %`;
const int = (x) => Math.round(x).toLocaleString("en-US");

const GREY = "#8a8a8a";
export const FILLING_LABEL = "clicks still arriving";

/**
 * A chart plugin that draws the buckets whose clicks can still arrive apart: a grey hatched
 * band behind the data from the first such bucket's left edge to the end, darkening towards
 * now, labelled. `band()` gives `{from}` (ms, the band's left edge) or null.
 */
function fillingBandPlugin(band) {
  let pattern = null;
  return {
    id: "clicksArriving",
    beforeDatasetsDraw(chart) {
      const shown = band();
      if (!shown) return;
      const { ctx, chartArea: area, scales } = chart;
      const left = Math.max(area.left, scales.x.getPixelForValue(shown.from));
      if (left >= area.right) return;
      pattern ??= hatch(GREY);
      ctx.save();
      ctx.fillStyle = pattern;
      // Paler where the window began, darker towards now: the younger the bucket, the more of
      // its clicks are still to come.
      const strips = 24;
      const width = (area.right - left) / strips;
      for (let i = 0; i < strips; i += 1) {
        ctx.globalAlpha = 0.06 + (0.5 * (i + 1)) / strips;
        ctx.fillRect(left + i * width, area.top, width + 0.5, area.bottom - area.top);
      }
      ctx.globalAlpha = 1;
      ctx.fillStyle = "#444";
      ctx.font = "11px system-ui, sans-serif";
      ctx.textAlign = "right";
      ctx.textBaseline = "bottom";
      ctx.fillText(FILLING_LABEL, area.right - 4, area.bottom - 4);
      ctx.restore();
    },
  };
}

function baseOptions() {
  return {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: "nearest", axis: "x", intersect: false },
    plugins: { legend: { labels: { boxWidth: 14, filter: (item) => !item.text.startsWith("_") } } },
  };
}

function timeAxis(view) {
  return {
    type: "linear",
    offset: false, // bars sit on their bucket start, like the line points
    grid: { offset: false },
    // Half a bucket of margin on each side, so the first and last bars are whole.
    min: view.start - view.stepMs / 2,
    max: view.end - view.stepMs / 2,
    title: { display: true, text: "bucket start (UTC)" },
    ticks: { callback: timeTicks(view.granularity), maxRotation: 0 },
    afterBuildTicks: (axis) => {
      axis.ticks = roundTimeTicks(axis.min, axis.max).map((value) => ({ value }));
    },
  };
}

// A bucket of fewer impressions than this is noise on a CTR chart (one click in 3 impressions
// is 33 %): its point is faded, it draws no interval band, and it does not set the CTR axis.
export const FEW_IMPRESSIONS = 30;
// Nor does a bucket with under this share of the range's full buckets (the 90th percentile of
// its buckets' impressions: a range half of which came before the traffic began has a median
// of a few dozen): on a long range, the minutes before the traffic began hold a few dozen late
// events each, whose CTR swings by tens of percent beside the thousands of impressions of every
// other minute.
export const TYPICAL_SHARE = 0.1;

/** The fewest impressions a bucket of `rows` needs to count on the CTR chart: FEW_IMPRESSIONS,
 * or TYPICAL_SHARE of the range's full buckets', whichever is more. The same rule on every
 * range. */
export function enoughImpressions(rows) {
  const sorted = rows.map((r) => r.impressions).sort((a, b) => a - b);
  const full = sorted.length ? sorted[Math.floor(0.9 * (sorted.length - 1))] : 0;
  return Math.max(FEW_IMPRESSIONS, TYPICAL_SHARE * full);
}

const rowsOf = (series) => series.map((b) => b.row).filter(Boolean);
const few = (row, floor = FEW_IMPRESSIONS) => Boolean(row) && row.impressions < floor;

/** Whether the bucket starting at `t` can still receive clicks: it ends after `fillingFrom`
 * (now less the view's click attribution window; null: a view without attribution). */
export const filling = (t, stepMs, fillingFrom) =>
  fillingFrom !== null && fillingFrom !== undefined && t + stepMs > fillingFrom;

// One colour per compared series (Tableau's first five: distinct for most colour visions).
export const SERIES_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2"];

/**
 * The datasets of one CTR line: the line (provenance in its segments and points), and its 95 %
 * interval as a band between two invisible lines. `line.series` is one entry per bucket.
 */
function ctrDatasets(line, index, compared) {
  const sourceOf = (i) => line.series[i]?.row?.source;
  const floor = enoughImpressions(rowsOf(line.series));
  const fewAt = (i) => few(line.series[i]?.row, floor);
  const at = (value) => line.series.map(({ t, row }) => ({ x: t, y: row ? value(row) : null }));
  const banded = (value) => at((r) => (few(r, floor) ? null : value(r)));
  const drawn = provenanceLine(line.color, sourceOf);
  const faded = withAlpha(line.color, 0.25);
  return [
    {
      role: "ctr",
      line: index,
      label: visibleText(line.label),
      data: at((r) => r.ctr),
      ...drawn,
      pointBackgroundColor: (ctx) => (fewAt(ctx.dataIndex) ? "#fff" : drawn.pointBackgroundColor(ctx)),
      pointBorderColor: (ctx) => (fewAt(ctx.dataIndex) ? faded : line.color),
      segment: {
        ...drawn.segment,
        borderColor: (ctx) =>
          fewAt(ctx.p0DataIndex) || fewAt(ctx.p1DataIndex) ? faded : drawn.segment.borderColor(ctx),
      },
    },
    {
      role: "ci-low",
      label: "_ci_low",
      data: banded((r) => r.ctr_ci_low),
      pointRadius: 0,
      borderWidth: 0,
      spanGaps: false,
    },
    {
      role: "ci-high",
      // One legend entry for the single series' band; compared lines' bands share their colour.
      label: compared ? `_ci_${visibleText(line.label)}` : "95 % interval",
      data: banded((r) => r.ctr_ci_high),
      pointRadius: 0,
      borderWidth: 0,
      backgroundColor: withAlpha(line.color, compared ? 0.12 : 0.15),
      fill: "-1",
      spanGaps: false,
    },
  ];
}

/**
 * The top of the CTR axis: room above the highest CTR of the buckets with enough impressions
 * (enoughImpressions, per line; all of them when none has), so a few buckets with a handful of
 * impressions (at 0 or 100 %, whose intervals span tens of percent) do not flatten every line;
 * what passes the top is cut. Undefined (Chart.js decides) when everything fits anyway.
 */
export function ctrAxisMax(lines) {
  const all = lines.flatMap((line) => rowsOf(line.series));
  const weighty = lines.flatMap((line) => {
    const floor = enoughImpressions(rowsOf(line.series));
    return rowsOf(line.series).filter((r) => !few(r, floor));
  });
  const rows = weighty.length ? weighty : all;
  const top = Math.max(0, ...rows.map((r) => r.ctr ?? 0));
  const highest = Math.max(0, ...all.map((r) => r.ctr ?? 0));
  const bands = Math.max(0, ...rows.map((r) => r.ctr_ci_high ?? 0));
  if (top <= 0 || (bands <= 2 * top && highest <= 2 * top)) return undefined;
  const max = 2 * top;
  const step = 10 ** Math.floor(Math.log10(max)) / 2;
  return Math.min(1, Math.ceil(max / step) * step);
}

/**
 * The datasets of the reach line: distinct users per bucket, drawn with the provenance of
 * `sourceOf` (reach.js' reachSource: solid and filled where exact, dashed and hollow where
 * estimated), and the bounds of the estimates as a band between two invisible lines (no width
 * where exact).
 */
function reachDatasets(sourceOf) {
  return [
    { role: "reach", label: "reach (distinct users)", data: [], ...provenanceLine(PURPLE, sourceOf) },
    { role: "reach-low", label: "_reach_low", data: [], pointRadius: 0, borderWidth: 0, spanGaps: false },
    {
      role: "reach-high",
      label: "bounds of the estimates",
      data: [],
      pointRadius: 0,
      borderWidth: 0,
      backgroundColor: withAlpha(PURPLE, 0.18),
      fill: "-1",
      spanGaps: false,
    },
  ];
}

/**
 * The time-series charts: CTR with its 95 % interval (one line, or one per compared value),
 * impressions (bars) with clicks, and reach (distinct users) with the bounds of its estimates.
 * A series is one entry per bucket of the range: `{t, row}` with `row` null where there is no
 * data.
 */
export class SeriesCharts {
  constructor(ctrCanvas, volumeCanvas, reachCanvas) {
    this.series = [];
    this.lines = [];
    this.alerts = []; // alerts.js' markers: {t, open, label}
    this.alertsDrawn = [];
    this.filling = null; // {from, buckets}: the buckets whose clicks can still arrive
    const band = fillingBandPlugin(() => this.filling);
    const sourceOf = (i) => this.series[i]?.row?.source;
    const fill = barFill(BLUE);
    this.ctr = new Chart(ctrCanvas, {
      type: "line",
      data: { datasets: [] },
      plugins: [band, alertMarkerPlugin(() => this.alerts, this.alertsDrawn)],
      options: {
        ...baseOptions(),
        scales: { x: { type: "linear" }, y: { beginAtZero: true, ticks: { callback: pctTick } } },
        plugins: {
          ...baseOptions().plugins,
          tooltip: {
            filter: (item) => item.dataset.role === "ctr" && item.raw.y !== null,
            callbacks: {
              title: (items) => formatTime(items[0].parsed.x),
              label: (item) => {
                const line = this.lines[item.dataset.line];
                const row = line.series[item.dataIndex].row;
                const name = this.lines.length > 1 ? `${visibleText(line.label)}: ` : "";
                return [
                  `${name}CTR ${pct(row.ctr)} (95 % ${pct(row.ctr_ci_low)} – ${pct(row.ctr_ci_high)})`,
                  provenance(row),
                ];
              },
            },
          },
        },
      },
    });
    this.volume = new Chart(volumeCanvas, {
      type: "bar",
      plugins: [band],
      data: {
        datasets: [
          {
            type: "line",
            label: "clicks",
            data: [],
            yAxisID: "clicks",
            order: 0,
            ...provenanceLine(ORANGE, sourceOf),
          },
          {
            type: "bar",
            label: "impressions",
            data: [],
            yAxisID: "impressions",
            order: 1,
            backgroundColor: (ctx) => fill(sourceOf(ctx.dataIndex)),
            borderColor: BLUE,
            borderWidth: 0,
            barPercentage: 1,
            categoryPercentage: 0.9,
          },
        ],
      },
      options: {
        ...baseOptions(),
        scales: {
          x: { type: "linear" },
          impressions: { position: "left", beginAtZero: true, title: { display: true, text: "impressions" } },
          clicks: {
            position: "right",
            beginAtZero: true,
            grid: { drawOnChartArea: false },
            title: { display: true, text: "clicks" },
          },
        },
        plugins: {
          legend: {
            labels: {
              boxWidth: 14,
              // The legend shows each series' colour; provenance has its own legend on the page.
              generateLabels: (chart) =>
                Chart.defaults.plugins.legend.labels.generateLabels(chart).map((item) => ({
                  ...item,
                  fillStyle: [ORANGE, BLUE][item.datasetIndex],
                  strokeStyle: [ORANGE, BLUE][item.datasetIndex],
                  lineDash: [],
                })),
            },
          },
          tooltip: {
            callbacks: {
              title: (items) => formatTime(items[0].parsed.x),
              afterBody: (items) => {
                const row = this.series[items[0].dataIndex].row;
                return row ? provenance(row) : "";
              },
            },
          },
        },
      },
    });
    this.reach = new Chart(reachCanvas, {
      type: "line",
      data: { datasets: reachDatasets((i) => reachSource(this.series[i]?.row)) },
      options: {
        ...baseOptions(),
        scales: {
          x: { type: "linear" },
          y: { beginAtZero: true, title: { display: true, text: "distinct users" } },
        },
        plugins: {
          ...baseOptions().plugins,
          tooltip: {
            filter: (item) => item.dataset.role === "reach" && item.raw.y !== null,
            callbacks: {
              title: (items) => formatTime(items[0].parsed.x),
              label: (item) => {
                const row = this.series[item.dataIndex].row;
                return [
                  `reach ${reachText(row)} · frequency ${frequencyText(row)}`,
                  `${int(row.impressions)} impressions, ${int(row.clicking_users ?? 0)} users clicked`,
                  reachDetail(row),
                ];
              },
            },
          },
        },
      },
    });
  }

  /**
   * `series`: the (filtered) traffic per bucket, for the volume and reach charts and, without
   * `compared`, the CTR line; `compared`: [{label, series}] lines to draw on the CTR chart instead;
   * `fillingFrom`: now less the view's click attribution window (null: none), the buckets ending
   * after it drawn apart (clicks still arriving).
   */
  update(view, series, compared = null, alerts = [], fillingFrom = null) {
    this.series = series;
    this.alerts = alerts;
    const arriving = series.filter(({ t }) => filling(t, view.stepMs, fillingFrom));
    this.filling = arriving.length
      ? { from: arriving[0].t - view.stepMs / 2, buckets: arriving.length }
      : null;
    this.lines = compared
      ? compared.map((line, i) => ({ ...line, color: SERIES_COLORS[i % SERIES_COLORS.length] }))
      : [{ label: "CTR", color: TEAL, series }];
    const many = this.lines.length > 1;
    this.ctr.data.datasets = this.lines.flatMap((line, i) => ctrDatasets(line, i, many));
    this.ctr.options.scales.y.max = ctrAxisMax(this.lines);
    const at = (value) => series.map(({ t, row }) => ({ x: t, y: row ? value(row) : null }));
    for (const chart of [this.ctr, this.volume, this.reach]) {
      chart.options.scales.x = timeAxis(view);
    }
    this.volume.data.datasets[0].data = at((r) => r.clicks);
    this.volume.data.datasets[1].data = at((r) => r.impressions);
    // Null reach (not measured): no point, no band.
    const reach = this.reach.data.datasets;
    reach[0].data = at((r) => r.reach ?? null);
    reach[1].data = at((r) => r.reach_low ?? null);
    reach[2].data = at((r) => r.reach_high ?? null);
    this.ctr.update("none");
    this.volume.update("none");
    this.reach.update("none");
  }
}

/** A horizontal bar chart of CTR per value of one dimension; `rows` are already ranked. */
export class BreakdownChart {
  /** `onSelect(value)`: a bar was clicked (the page filters on it). */
  constructor(canvas, dimension, onSelect = null) {
    this.dimension = dimension;
    this.rows = [];
    const fill = barFill(TEAL);
    this.chart = new Chart(canvas, {
      type: "bar",
      data: {
        labels: [],
        datasets: [
          {
            label: "CTR",
            data: [],
            backgroundColor: (ctx) => fill(this.rows[ctx.dataIndex]?.source),
            borderColor: TEAL,
            borderWidth: 1,
          },
        ],
      },
      options: {
        ...baseOptions(),
        indexAxis: "y",
        interaction: { mode: "nearest", axis: "y", intersect: false },
        onClick: (_event, elements) => {
          if (onSelect && elements.length) onSelect(this.rows[elements[0].index][this.dimension]);
        },
        onHover: (event, elements) => {
          event.native.target.style.cursor = onSelect && elements.length ? "pointer" : "default";
        },
        scales: {
          x: { beginAtZero: true, ticks: { callback: pctTick, maxRotation: 0 } },
          // The bars are the top values by clicks: each label says how many, the bar its CTR.
          y: {
            ticks: {
              callback: (_value, index) => {
                const row = this.rows[index];
                return row ? `${visibleText(row[this.dimension])} · ${int(row.clicks)} clicks` : "";
              },
            },
          },
        },
        plugins: {
          legend: { display: false },
          tooltip: {
            callbacks: {
              label: (item) => {
                const row = this.rows[item.dataIndex];
                return [
                  `CTR ${pct(row.ctr)} (95 % ${pct(row.ctr_ci_low)} – ${pct(row.ctr_ci_high)})`,
                  `${int(row.clicks)} clicks / ${int(row.impressions)} impressions`,
                  provenance(row),
                ];
              },
            },
          },
        },
      },
    });
  }

  update(rows) {
    this.rows = rows;
    this.chart.data.labels = rows.map((r) => visibleText(r[this.dimension]));
    this.chart.data.datasets[0].data = rows.map((r) => r.ctr);
    this.chart.update("none");
  }
}
