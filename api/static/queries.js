// The /api/v1/ctr queries behind each part of the page, from what the analyst selected (pure
// functions: the selection and the time window in, request parameters out).

import { isoMinute } from "./state.js";

export const TOP_N = 10;
export const TABLE_LIMIT = 1000;
export const SUGGESTIONS = 200;

/** The range and the filters: what every part of the page shares. */
export function baseParams(selection, window_) {
  const end = window_.until ?? window_.end; // never past now: the current bucket as far as it got
  return { start: isoMinute(window_.start), end: isoMinute(end), ...selection.filters };
}

/** The comparison's values, if there are enough to compare (two to five). */
export function comparedValues(selection, min) {
  const { dimension, values } = selection.compare;
  return dimension && values.length >= min ? values : null;
}

export function queries(selection, window_, minCompare) {
  const base = baseParams(selection, window_);
  const { dimension } = selection.compare;
  const compared = comparedValues(selection, minCompare);
  const table = selection.table;
  return {
    // Reach is a distinct count over the range's users, asked for where it is shown: the
    // series (the reach chart), the totals and the table.
    series: { ...base, granularity: window_.granularity, reach: true },
    totals: { ...base, granularity: "all", reach: true },
    breakdowns: Object.fromEntries(
      ["campaign_id", "country", "device_type"].map((d) => [
        d,
        { ...base, granularity: "all", group_by: d, order_by: "-clicks,-impressions", limit: TOP_N },
      ]),
    ),
    // The compared values replace a filter on the same dimension.
    compare: compared && {
      ...base,
      [dimension]: compared,
      granularity: window_.granularity,
      group_by: dimension,
    },
    table: {
      ...base,
      granularity: table.rows === "total" ? "all" : window_.granularity,
      group_by: table.groupBy.join(","),
      order_by: table.sort,
      limit: TABLE_LIMIT,
      reach: true,
    },
  };
}

/** Values of `dimension` by impressions, under every filter but its own. */
export function suggestionParams(selection, window_, dimension) {
  const base = baseParams(selection, window_);
  delete base[dimension];
  return { ...base, granularity: "all", group_by: dimension, order_by: "-impressions", limit: SUGGESTIONS };
}
