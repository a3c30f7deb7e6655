// What the dashboard shows, as the page's URL query string, so a view can be shared, bookmarked
// and reloaded: the time range, the filters, the comparison, the table's rows and order.
//
//   ?range=6h&country=US&country=DE&compare=campaign_id&compare_value=cmp-001&compare_value=cmp-002
//    &table_by=site_id&table_rows=bucket&table_sort=-ctr
//
// Filters use the API's own parameter names. Anything invalid in a URL is dropped (the view
// falls back to its default for that part) and reported, never thrown.

export const DIMENSIONS = ["campaign_id", "ad_id", "site_id", "country", "device_type"];
export const DIMENSION_LABEL = {
  campaign_id: "Campaign",
  ad_id: "Ad",
  site_id: "Site",
  country: "Country",
  device_type: "Device",
};
// The counts of every version, then those of a version with click attribution (the API answers
// them null without it; ordering by them is then the groups' order).
export const MEASURES = ["impressions", "clicks", "ctr", "raw_clicks", "orphan_clicks", "repeat_clicks"];
export const MAX_COMPARE = 5;
export const MIN_COMPARE = 2;
export const MAX_FILTER_VALUES = 100; // the API's limit per dimension
const MAX_RANGE_MS = 31 * 24 * 3_600_000; // the API's default API_MAX_RANGE_DAYS

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
export const STEP_MS = { minute: MINUTE, hour: HOUR, day: DAY };

// Minute buckets up to 6 h (at most 360 points); hourly up to a week; daily beyond.
export const RANGES = {
  "15m": { label: "15 min", granularity: "minute", buckets: 15 },
  "1h": { label: "1 h", granularity: "minute", buckets: 60 },
  "6h": { label: "6 h", granularity: "minute", buckets: 360 },
  "24h": { label: "24 h", granularity: "hour", buckets: 24 },
  "7d": { label: "7 d", granularity: "hour", buckets: 168 },
};
export const DEFAULT_RANGE = "1h";
const TABLE_ROWS = ["total", "bucket"];

export function defaultState(range = DEFAULT_RANGE) {
  return {
    range, // a key of RANGES, or "custom" with start and end (ms)
    start: null,
    end: null,
    filters: {}, // dimension -> [values]
    compare: { dimension: null, values: [] },
    table: { rows: "total", groupBy: ["campaign_id"], sort: "-clicks" },
  };
}

/** The columns a table of `groupBy` rows can be ordered by (the API's order_by). */
export function sortableColumns(table) {
  return [...(table.rows === "bucket" ? ["bucket_start"] : []), ...table.groupBy, ...MEASURES];
}

function granularityFor(lengthMs) {
  if (lengthMs <= 6 * HOUR) return "minute";
  return lengthMs <= 7 * DAY ? "hour" : "day";
}

/**
 * The buckets to show for `state` at `nowMs`: {name, granularity, stepMs, start, end} with
 * start/end the queried range, and `first` the start of the first (whole UTC) bucket.
 */
export function timeWindow(state, nowMs) {
  if (state.range === "custom") {
    const granularity = granularityFor(state.end - state.start);
    const stepMs = STEP_MS[granularity];
    return {
      name: "custom",
      granularity,
      stepMs,
      start: state.start,
      end: state.end,
      until: state.end,
      first: Math.floor(state.start / stepMs) * stepMs,
    };
  }
  const range = RANGES[state.range];
  const stepMs = STEP_MS[range.granularity];
  // Whole buckets ending with the current (partial) one.
  const end = Math.floor(nowMs / stepMs) * stepMs + stepMs;
  const start = end - range.buckets * stepMs;
  // What the data can hold: up to now (the current minute included), not the end of the
  // current hour or day, which lies in the future.
  const until = Math.min(end, Math.ceil((nowMs + 1) / MINUTE) * MINUTE);
  return { name: state.range, granularity: range.granularity, stepMs, start, end, until, first: start };
}

function unique(values) {
  return [...new Set(values.filter((v) => typeof v === "string" && v !== ""))];
}

function parseTime(text) {
  if (!text) return null;
  // Without an offset a time is UTC, as in the API.
  const ms = Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(text) ? text : `${text}Z`);
  return Number.isFinite(ms) ? Math.floor(ms / MINUTE) * MINUTE : null;
}

export const isoMinute = (ms) => new Date(ms).toISOString().slice(0, 16) + "Z";

/**
 * The state a query string describes; `fallbackRange` when it names none. Returns
 * {state, problems}: what was dropped, in words.
 */
export function parseState(search, fallbackRange = DEFAULT_RANGE) {
  const params = new URLSearchParams(search);
  const problems = [];
  const state = defaultState(RANGES[fallbackRange] ? fallbackRange : DEFAULT_RANGE);

  const range = params.get("range");
  if (range === "custom") {
    const start = parseTime(params.get("start"));
    const end = parseTime(params.get("end"));
    if (start !== null && end !== null && end > start && end - start <= MAX_RANGE_MS) {
      Object.assign(state, { range, start, end });
    } else {
      problems.push("range: custom needs start < end, at most 31 days apart");
    }
  } else if (range !== null) {
    if (RANGES[range]) state.range = range;
    else problems.push(`range: unknown range '${range}'`);
  }

  for (const dimension of DIMENSIONS) {
    const values = unique(params.getAll(dimension));
    if (values.length > MAX_FILTER_VALUES) problems.push(`${dimension}: at most ${MAX_FILTER_VALUES} values`);
    if (values.length) state.filters[dimension] = values.slice(0, MAX_FILTER_VALUES);
  }

  const compare = params.get("compare");
  if (compare !== null) {
    if (DIMENSIONS.includes(compare)) {
      const values = unique(params.getAll("compare_value"));
      if (values.length > MAX_COMPARE) problems.push(`compare_value: at most ${MAX_COMPARE} values`);
      state.compare = { dimension: compare, values: values.slice(0, MAX_COMPARE) };
    } else {
      problems.push(`compare: unknown dimension '${compare}'`);
    }
  }

  const rows = params.get("table_rows");
  if (rows !== null) {
    if (TABLE_ROWS.includes(rows)) state.table.rows = rows;
    else problems.push(`table_rows: must be total or bucket`);
  }
  const by = params.get("table_by");
  if (by !== null) {
    const names = unique(by.split(","));
    const known = names.filter((n) => DIMENSIONS.includes(n));
    if (known.length !== names.length) problems.push(`table_by: unknown dimension in '${by}'`);
    state.table.groupBy = known;
  }
  const sort = params.get("table_sort");
  if (sort !== null) {
    if (sortableColumns(state.table).includes(sort.replace(/^-/, ""))) state.table.sort = sort;
    else problems.push(`table_sort: cannot order by '${sort}'`);
  }
  if (!sortableColumns(state.table).includes(state.table.sort.replace(/^-/, ""))) {
    state.table.sort = "-clicks";
  }
  return { state, problems };
}

/** The query string of `state` (defaults of the filters, comparison and table left out). */
export function serializeState(state) {
  const params = new URLSearchParams();
  params.set("range", state.range);
  if (state.range === "custom") {
    params.set("start", isoMinute(state.start));
    params.set("end", isoMinute(state.end));
  }
  for (const dimension of DIMENSIONS) {
    for (const value of state.filters[dimension] ?? []) params.append(dimension, value);
  }
  if (state.compare.dimension) {
    params.set("compare", state.compare.dimension);
    for (const value of state.compare.values) params.append("compare_value", value);
  }
  const table = defaultState().table;
  if (state.table.rows !== table.rows) params.set("table_rows", state.table.rows);
  if (state.table.groupBy.join(",") !== table.groupBy.join(",")) {
    params.set("table_by", state.table.groupBy.join(","));
  }
  if (state.table.sort !== table.sort) params.set("table_sort", state.table.sort);
  return params.toString();
}
