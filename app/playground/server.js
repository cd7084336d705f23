// The Server tab: the operator's first look without a Grafana. While the tab is open it
// scrapes /metrics every SCRAPE_MS (the Prometheus text the endpoint picker and
// Prometheus read) and plots the last WINDOW scrapes: requests waiting and running, the
// KV cache's use, output tokens per second per API, the time to first token's p50 and
// p99 (from the histogram's buckets over the last TTFT_WINDOW_S, as Prometheus'
// histogram_quantile reads them), and admission's refusals. Each chart's table holds its
// series' latest values (and a counter's total), for a screen reader and for the tests.

import { apiFetch } from "./connection.js";

const SCRAPE_MS = 2000;
const WINDOW = 90; // scrapes kept: three minutes
const TTFT_WINDOW_S = 30;
const COLORS = ["#2458c6", "#c65a24", "#1b7a3a", "#8a2be2", "#a4161a", "#0a8a8a", "#7a6a00"];

// The Prometheus text format, one sample a line: {name, labels, value}.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const labels = {};
    for (const [, key, value] of (match[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
      labels[key] = value;
    }
    const raw = match[3];
    const value = raw === "+Inf" ? Infinity : raw === "-Inf" ? -Infinity : Number(raw);
    samples.push({ name: match[1], labels, value });
  }
  return samples;
}

function sum(samples, name, where = () => true) {
  return samples.filter((s) => s.name === name && where(s.labels)).reduce((a, s) => a + s.value, 0);
}

function byLabel(samples, name, label) {
  const out = {};
  for (const s of samples) {
    if (s.name === name) out[s.labels[label]] = (out[s.labels[label]] || 0) + s.value;
  }
  return out;
}

// Cumulative bucket counts by upper bound, summed over every other label.
function buckets(samples, name) {
  const out = new Map();
  for (const s of samples) {
    if (s.name !== name) continue;
    const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    out.set(le, (out.get(le) || 0) + s.value);
  }
  return [...out.entries()].sort((a, b) => a[0] - b[0]);
}

// Prometheus' histogram_quantile over the increase from `then` to `now` (null: none).
export function quantile(q, then, now) {
  const earlier = new Map(then);
  const counts = now.map(([le, count]) => [le, count - (earlier.get(le) || 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, count] of counts) {
    if (count >= rank) {
      if (le === Infinity) return lower;
      return lower + ((le - lower) * (rank - below)) / Math.max(count - below, 1e-12);
    }
    lower = le;
    below = count;
  }
  return lower;
}

const CHARTS = [
  { key: "queue", title: "Requests waiting and running", unit: "" },
  { key: "kv", title: "KV-cache use", unit: "%" },
  { key: "tokens", title: "Output tokens per second, by API", unit: "tok/s", totals: true },
  { key: "ttft", title: `Time to first token (last ${TTFT_WINDOW_S} s)`, unit: "ms" },
  { key: "refused", title: "Admission refusals per second", unit: "/s", totals: true },
];

// One scrape read into each chart's series: {chart: {series: value}}, plus totals.
function reading(samples, at, previous, history) {
  const seconds = previous ? (at - previous.at) / 1000 : 1;
  const out = {
    at,
    queue: {
      waiting: sum(samples, "vllm:num_requests_waiting"),
      running: sum(samples, "vllm:num_requests_running"),
      "queued (admission)": sum(samples, "switchboard_queued_requests"),
    },
    kv: { "KV cache": 100 * Math.max(0, ...samples.filter((s) => s.name === "vllm:kv_cache_usage_perc").map((s) => s.value)) },
    tokens: {},
    ttft: {},
    refused: {},
    totals: { tokens: byLabel(samples, "switchboard_output_tokens_total", "api"), refused: {} },
    ttftBuckets: buckets(samples, "switchboard_time_to_first_token_seconds_bucket"),
  };
  out.totals.refused = {
    requests: sum(samples, "switchboard_requests_total", (l) => l.outcome === "refused"),
    units: sum(samples, "switchboard_refused_total"),
  };
  for (const kind of ["tokens", "refused"]) {
    for (const [series, total] of Object.entries(out.totals[kind])) {
      const before = previous ? previous.totals[kind][series] : undefined;
      out[kind][series] = previous && before !== undefined ? Math.max(0, total - before) / seconds : 0;
    }
  }
  const then = history.find((r) => out.at - r.at <= TTFT_WINDOW_S * 1000) || previous;
  for (const [label, q] of [["p50", 0.5], ["p99", 0.99]]) {
    const value = then ? quantile(q, then.ttftBuckets, out.ttftBuckets) : null;
    out.ttft[label] = value === null ? null : value * 1000;
  }
  return out;
}

function format(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (Math.abs(value) >= 100) return value.toFixed(0);
  return value.toFixed(Math.abs(value) >= 10 ? 1 : 2);
}

const SVG = "http://www.w3.org/2000/svg";

function draw(figure, chart, history) {
  const names = [...new Set(history.flatMap((r) => Object.keys(r[chart.key])))].sort();
  const values = history.flatMap((r) => Object.values(r[chart.key]).filter((v) => v !== null));
  const top = Math.max(1e-9, ...values) * 1.1;
  const svg = figure.querySelector("svg");
  svg.replaceChildren();
  names.forEach((name, i) => {
    const points = history
      .map((r, x) => [x, r[chart.key][name]])
      .filter(([, v]) => v !== null && v !== undefined)
      .map(([x, v]) => `${(300 * x) / (WINDOW - 1)},${100 - (100 * v) / top}`);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("stroke", COLORS[i % COLORS.length]);
    svg.append(line);
  });
  svg.setAttribute("aria-label", `${chart.title}, up to ${format(top)} ${chart.unit}`);
  figure.querySelector(".top").textContent = `${format(top)} ${chart.unit}`;
  const latest = history[history.length - 1];
  const rows = names.map((name, i) => {
    const row = document.createElement("tr");
    const label = document.createElement("th");
    label.scope = "row";
    label.textContent = name;
    label.style.color = COLORS[i % COLORS.length];
    const now = document.createElement("td");
    now.dataset.series = name;
    const value = latest[chart.key][name];
    now.dataset.value = value === null || value === undefined ? "" : String(value);
    now.textContent = `${format(value)} ${chart.unit}`;
    row.append(label, now);
    if (chart.totals) {
      const total = document.createElement("td");
      total.dataset.total = name;
      total.textContent = format(latest.totals[chart.key][name]);
      total.dataset.value = String(latest.totals[chart.key][name] ?? "");
      row.append(total);
    }
    return row;
  });
  figure.querySelector("tbody").replaceChildren(...rows);
}

function figureOf(chart) {
  const figure = document.createElement("figure");
  figure.className = "chart";
  figure.id = `srv-${chart.key}`;
  const caption = document.createElement("figcaption");
  caption.textContent = chart.title;
  const top = document.createElement("span");
  top.className = "top";
  caption.append(" ", top);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 300 100");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  const table = document.createElement("table");
  table.className = "latest";
  const head = document.createElement("thead");
  head.innerHTML = `<tr><th scope="col">series</th><th scope="col">now</th>${chart.totals ? '<th scope="col">total</th>' : ""}</tr>`;
  table.append(head, document.createElement("tbody"));
  figure.append(caption, svg, table);
  return figure;
}

export function setupServer() {
  const panel = document.getElementById("panel-server");
  const status = document.getElementById("srv-status");
  const figures = CHARTS.map(figureOf);
  document.getElementById("srv-charts").replaceChildren(...figures);
  const history = [];
  let scraping = false; // a scrape is under way or due

  async function scrape() {
    try {
      const response = await apiFetch("/metrics");
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const text = await response.text();
      // A scrape answered after the tab was hidden is dropped: what a hidden tab shows
      // never changes.
      if (panel.hidden) {
        scraping = false;
        return;
      }
      const samples = parseMetrics(text);
      const at = Date.now();
      history.push(reading(samples, at, history[history.length - 1], history));
      if (history.length > WINDOW) history.shift();
      CHARTS.forEach((chart, i) => draw(figures[i], chart, history));
      status.textContent = `scraped /metrics at ${new Date(at).toLocaleTimeString()} (${history.length} of ${WINDOW} kept)`;
    } catch (error) {
      if (!panel.hidden) status.textContent = `cannot scrape /metrics: ${error.message}`;
    }
    if (panel.hidden) scraping = false;
    else setTimeout(scrape, SCRAPE_MS);
  }

  // Scrapes only while the tab is shown.
  function shown() {
    if (panel.hidden || scraping) return;
    scraping = true;
    scrape();
  }
  new MutationObserver(shown).observe(panel, { attributes: true, attributeFilter: ["hidden"] });
  shown();
}
