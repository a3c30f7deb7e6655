// Reach and frequency of a /api/v1/ctr row, as the page shows them. Reach is the distinct users
// with an impression in the row: exact when the batch layer counted it (`reach_exact`), else an
// estimate (a sketch's, or a stale bucket's exact count plus at most one user per late event)
// within `reach_low`..`reach_high`; null where rows written before reach was measured are
// included. Distinct users do not add up across buckets or groups: a total over a range is the
// API's own row for the whole range (granularity=all), never a sum of rows.

const int = (x) => Math.round(x).toLocaleString("en-US");

const measured = (row) => Boolean(row) && row.reach !== null && row.reach !== undefined;

/** How a row's reach was counted: "exact", "estimated" or "not measured". */
export function reachKind(row) {
  if (!measured(row)) return "not measured";
  return row.reach_exact ? "exact" : "estimated";
}

/** "1,234" when exact, "≈1,234" when estimated, "–" when not measured. */
export function reachText(row) {
  if (!measured(row)) return "–";
  return row.reach_exact ? int(row.reach) : `≈${int(row.reach)}`;
}

/** The bounds of an estimate, "1,200–1,270"; "" when exact or not measured. */
export function reachBounds(row) {
  if (!measured(row) || row.reach_exact) return "";
  return `${int(row.reach_low)}–${int(row.reach_high)}`;
}

/** Impressions per user reached, two decimals; "–" without reach. */
export function frequencyText(row) {
  const f = row?.frequency;
  return f === null || f === undefined ? "–" : f.toFixed(2);
}

/**
 * The provenance to draw a row's reach with (charts.js' sources): exact as batch, a stale
 * bucket's bounded count as stale, a mixed bucket's estimate as mixed, any other estimate as
 * speed (approximate).
 */
export function reachSource(row) {
  if (!measured(row)) return undefined;
  if (row.reach_exact) return "batch";
  return row.source === "stale" || row.source === "mixed" ? row.source : "speed";
}

/** A row's reach in words, for a tooltip. */
export function reachDetail(row) {
  if (!measured(row)) return "reach not measured (rows written before reach was counted)";
  if (row.reach_exact) return "exact: distinct users counted by the batch layer";
  if (row.source === "stale") {
    return `at least the batch layer's count, at most one more user per late event (${reachBounds(row)})`;
  }
  return `estimated from sketches, 95 % bounds ${reachBounds(row)}`;
}
