// The table of the current query: rows from /api/v1/ctr (totals over the range, or per time
// bucket), grouped by the dimensions chosen, ordered by the API (so the order holds for every
// row, not just those shown), sortable from the column headers, downloadable as CSV.

import { SOURCE_LABEL } from "./charts.js";
import { frequencyText, reachDetail, reachText } from "./reach.js";
import { DIMENSION_LABEL, DIMENSIONS, sortableColumns } from "./state.js";
import { visibleText } from "./visible.js";

const int = (x) => Math.round(x).toLocaleString("en-US");
const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)} %`);
const time = (value) => value.slice(0, 16).replace("T", " ");

/** The covered share in whole percent, never rounded up to 100 or down to 0. */
function share(x) {
  if (x >= 1 || x <= 0) return `${Math.round(100 * x)} %`;
  const whole = Math.floor(100 * x);
  return whole === 0 ? "< 1 %" : `${whole} %`;
}

// Measures start descending (the largest first), times and names ascending.
const FIRST_DESCENDING = new Set(["impressions", "clicks", "ctr", "raw_clicks", "orphan_clicks", "repeat_clicks"]);

/** Whether `rows` come from a version with click attribution (the API answers its counts
 * null otherwise). */
const attributed = (rows) => rows.some((r) => r.orphan_clicks !== null && r.orphan_clicks !== undefined);

function columns(table, withAttribution) {
  const list = [];
  if (table.rows === "bucket") {
    list.push({ key: "bucket_start", label: "Bucket (UTC)", text: (r) => time(r.bucket_start) });
  }
  for (const d of table.groupBy) {
    list.push({ key: d, label: DIMENSION_LABEL[d], text: (r) => visibleText(r[d]) });
  }
  list.push(
    { key: "impressions", label: "Impressions", text: (r) => int(r.impressions), numeric: true },
    { key: "clicks", label: "Clicks", text: (r) => int(r.clicks), numeric: true },
  );
  if (withAttribution) {
    list.push(
      { key: "raw_clicks", label: "Raw clicks", text: (r) => int(r.raw_clicks), numeric: true },
      { key: "orphan_clicks", label: "Orphan clicks", text: (r) => int(r.orphan_clicks), numeric: true },
      { key: "repeat_clicks", label: "Repeat clicks", text: (r) => int(r.repeat_clicks), numeric: true },
    );
  }
  list.push(
    { key: "ctr", label: "CTR", text: (r) => pct(r.ctr), numeric: true },
    {
      key: "ci",
      label: "95 % interval",
      text: (r) => (r.ctr_ci_low === null ? "–" : `${pct(r.ctr_ci_low)} – ${pct(r.ctr_ci_high)}`),
      numeric: true,
    },
    // Each row's own distinct users (never summed: the API counts them per row).
    { key: "reach", label: "Reach", text: reachText, title: reachDetail, numeric: true },
    { key: "frequency", label: "Frequency", text: frequencyText, numeric: true },
    { key: "covered_fraction", label: "Exact", text: (r) => share(r.covered_fraction), numeric: true },
    {
      key: "source",
      label: "Source",
      text: (r) =>
        (SOURCE_LABEL[r.source] ?? r.source) +
        (r.stale_events ? ` (+${int(r.stale_events)} late)` : ""),
    },
  );
  return list;
}

export class DataTable {
  /** `onChange(table)`: the analyst changed rows, grouping or order; `onDownload()`: CSV. */
  constructor({ onChange, onDownload }) {
    this.table = document.getElementById("data-table");
    this.note = document.getElementById("table-note");
    this.rowsSelect = document.getElementById("table-rows");
    this.groupBy = document.getElementById("table-group-by");
    this.download = document.getElementById("download-csv");
    this.onChange = onChange;
    this.settings = null;
    for (const d of DIMENSIONS) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.value = d;
      label.append(box, ` ${DIMENSION_LABEL[d]}`);
      this.groupBy.append(label);
    }
    this.rowsSelect.addEventListener("change", () => this.changed({ rows: this.rowsSelect.value }));
    this.groupBy.addEventListener("change", () => {
      const chosen = [...this.groupBy.querySelectorAll("input:checked")].map((b) => b.value);
      this.changed({ groupBy: DIMENSIONS.filter((d) => chosen.includes(d)) });
    });
    this.download.addEventListener("click", () => onDownload());
  }

  changed(part) {
    const next = { ...this.settings, ...part };
    // An order by a column the table no longer has falls back to clicks.
    if (!sortableColumns(next).includes(next.sort.replace(/^-/, ""))) next.sort = "-clicks";
    this.onChange(next);
  }

  /** Show the controls for `settings` ({rows, groupBy, sort}). */
  setSettings(settings) {
    this.settings = settings;
    this.rowsSelect.value = settings.rows;
    for (const box of this.groupBy.querySelectorAll("input")) {
      box.checked = settings.groupBy.includes(box.value);
    }
  }

  /** The API's answer for the table (rows in the API's order). */
  render(answer, limit) {
    const settings = this.settings;
    const cols = columns(settings, attributed(answer.rows));
    const sortable = new Set(sortableColumns(settings));
    const sortKey = settings.sort.replace(/^-/, "");
    const descending = settings.sort.startsWith("-");
    const head = this.table.tHead.rows[0];
    head.replaceChildren(
      ...cols.map((col) => {
        const th = document.createElement("th");
        th.scope = "col";
        if (col.numeric) th.className = "num";
        if (!sortable.has(col.key)) {
          th.textContent = col.label;
          return th;
        }
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.sort = col.key;
        button.textContent = col.label;
        if (col.key === sortKey) {
          th.setAttribute("aria-sort", descending ? "descending" : "ascending");
          button.append(descending ? " ▼" : " ▲");
        }
        button.addEventListener("click", () => {
          const flip = col.key === sortKey ? !descending : FIRST_DESCENDING.has(col.key);
          this.changed({ sort: `${flip ? "-" : ""}${col.key}` });
        });
        th.append(button);
        return th;
      }),
    );
    const body = document.createElement("tbody");
    for (const row of answer.rows) {
      const tr = body.insertRow();
      tr.dataset.source = row.source;
      for (const col of cols) {
        const td = tr.insertCell();
        td.textContent = col.text(row);
        if (col.title) td.title = col.title(row);
        if (col.numeric) td.className = "num";
      }
    }
    this.table.tBodies[0].replaceWith(body);
    const n = answer.rows.length;
    this.note.textContent = answer.truncated
      ? `The first ${int(limit)} rows in this order (more match: narrow the range, filter or group ` +
        "less; the API answers up to its own row limit). The CSV holds the same rows."
      : `${int(n)} row${n === 1 ? "" : "s"}.`;
  }
}
