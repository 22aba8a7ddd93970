// llmgw console: one page per hash (#overview, #keys, #subjects, #usage, #audit), each drawn from
// the admin API under /console/api. No framework and no build step; the charts are plain SVG.
"use strict";

const API = "/console/api";
const CSRF = document.querySelector('meta[name="csrf-token"]').content;
// A team admin or member (single sign-on) sees their keys and usage; the rest is an admin's.
const ROLE = document.querySelector('meta[name="console-role"]').content;
// The teams a team admin administers (their keys, usage and audit entries), by id.
const ADMIN_TEAMS = document.querySelector('meta[name="console-admin-teams"]').content.split(",").filter(Boolean);
const page = document.getElementById("page");
const statusLine = document.getElementById("status");

// ---------------------------------------------------------------------------------------------
// Small helpers

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attributes, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  for (const child of children.flat()) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function say(message) {
  statusLine.textContent = message;
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["X-CSRF-Token"] = CSRF;
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  if (response.status === 401) {
    window.location.assign("/console/sign-in");
    throw new Error("Signed out.");
  }
  const data = await response.json();
  if (!response.ok) throw new Error((data.error && data.error.message) || response.statusText);
  return data;
}

function when(text) {
  if (!text) return "—";
  return new Date(text).toISOString().replace("T", " ").slice(0, 16) + " UTC";
}

function usd(text) {
  const value = Number(text || 0);
  return "$" + (value !== 0 && Math.abs(value) < 0.01 ? value.toPrecision(3) : value.toFixed(2));
}

function num(value) {
  return value === null || value === undefined ? "—" : Number(value).toLocaleString("en-US");
}

function table(caption, columns, rows) {
  const head = el("tr", {}, columns.map((c) => el("th", { scope: "col", class: c.num ? "num" : null }, c.title)));
  const body = rows.length
    ? rows.map((row) => el("tr", {}, columns.map((c) => el("td", { class: c.num ? "num" : null }, c.cell(row)))))
    : [el("tr", {}, el("td", { colspan: columns.length }, "Nothing yet."))];
  return el("div", { class: "table-wrap" }, el("table", {}, el("caption", {}, caption), el("thead", {}, head), el("tbody", {}, body)));
}

// ---------------------------------------------------------------------------------------------
// Bar charts: one bar per point of the chosen range (points without traffic are zeros, so the x
// axis is the range itself), a y axis with rounded ticks, the value of a bar on hover and on
// keyboard focus (one tab stop; the arrow keys, Home and End move between bars), and the same
// figures as a visually hidden table for screen readers.

const CHART = { height: 230, left: 64, right: 12, top: 22, bottom: 34 };

// Ticks 0, step, 2·step … covering max, with step 1, 2 or 5 × 10^n (at least 1 for whole counts).
function ticks(max, whole, count = 4) {
  if (!(max > 0)) return { step: 1, values: [0, 1] };
  const rough = max / count;
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const nice = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= rough);
  const step = whole ? Math.max(1, nice) : nice;  // no "0.5 requests"
  const values = [];
  for (let v = 0; v < max + step / 2; v += step) values.push(Number(v.toPrecision(12)));
  if (values[values.length - 1] < max) values.push(Number((values.length * step).toPrecision(12)));
  return { step, values };
}

// Tick labels keep the digits their step needs ("$0.00002", "1,500"), no more.
function tickFormat(format, step) {
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  if (format === usd) return (v) => "$" + v.toFixed(Math.max(2, decimals));
  return (v) => v.toLocaleString("en-US", { maximumFractionDigits: decimals });
}

let chartCount = 0;

// ``kind``: what a bar stands for ("key", "model" …) when the bars are categories, not a range.
function barChart({ title, points, value, format, unit, axisLabel, kind }) {
  const { height, left, right, top, bottom } = CHART;
  // As wide as the page is now, so one unit is one pixel and the text keeps its size.
  const width = Math.max(300, Math.min(1168, page.clientWidth - 34));
  const plotWidth = width - left - right;
  const plotHeight = height - top - bottom;
  const values = points.map(value);
  const max = Math.max(0, ...values);
  const total = values.reduce((a, b) => a + b, 0);
  const { step, values: yTicks } = ticks(max, format === num);
  const yMax = yTicks[yTicks.length - 1];
  const y = (v) => top + plotHeight - (v / yMax) * plotHeight;
  const slot = plotWidth / Math.max(1, points.length);
  const gap = slot > 6 ? Math.max(Math.min(slot * 0.2, 8), slot - 72) : 0;  // bars at most 72 wide
  const tickText = tickFormat(format, step);
  const id = `chart-${++chartCount}`;

  const grid = yTicks.map((v) => svg("g", { class: "tick" },
    svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v) }),
    svg("text", { x: left - 6, y: y(v), "text-anchor": "end", "dominant-baseline": "middle" }, tickText(v))));

  // As many x labels as fit (about 60 px each, at most 10), evenly spaced, the last one always.
  const every = Math.max(1, Math.ceil(points.length / Math.min(10, Math.max(2, Math.floor(plotWidth / 60)))));
  const xLabels = points.map((point, index) => {
    if (index % every !== 0 && index !== points.length - 1) return null;
    if (index === points.length - 1 && index % every !== 0 && index % every < every / 2) return null;
    return svg("text", { class: "x-label", x: left + slot * (index + 0.5), y: height - bottom + 16, "text-anchor": "middle" }, fit(point.short ?? point.label, slot * every));
  });

  const described = (point, v) => `${point.label}: ${format(v)}${unit ? " " + unit : ""}`;
  const bars = points.map((point, index) => {
    const v = values[index];
    const x = left + slot * index + gap / 2;
    const barWidth = Math.max(1, slot - gap);
    return svg("g", { class: "bar", tabindex: index === points.length - 1 ? "0" : "-1", role: "img", "aria-label": described(point, v), "data-value": String(v) },
      svg("rect", { class: "hit", x: left + slot * index, y: top, width: slot, height: plotHeight }),
      svg("rect", { class: "fill", x, y: y(v), width: barWidth, height: Math.max(0, top + plotHeight - y(v)) }));
  });

  // The value of the bar under the pointer or with the focus: one label drawn above every bar.
  const readoutText = svg("text", { "text-anchor": "middle" });
  const readoutBox = svg("rect", { rx: 3 });
  const readout = svg("g", { class: "readout", "aria-hidden": "true", visibility: "hidden" }, readoutBox, readoutText);
  const show = (bar) => {
    const index = bars.indexOf(bar);
    if (index < 0) return;
    readoutText.textContent = `${points[index].short ?? points[index].label}: ${format(values[index])}`;
    const textWidth = readoutText.getComputedTextLength() + 12;
    const centre = Math.min(Math.max(left + slot * (index + 0.5), left + textWidth / 2), width - right - textWidth / 2);
    const boxTop = Math.max(2, y(values[index]) - 24);
    readoutText.setAttribute("x", centre);
    readoutText.setAttribute("y", boxTop + 14);
    Object.entries({ x: centre - textWidth / 2, y: boxTop, width: textWidth, height: 20 }).forEach(([k, v]) => readoutBox.setAttribute(k, v));
    readout.setAttribute("visibility", "visible");
  };
  const hide = () => {
    const focused = bars.includes(document.activeElement) ? document.activeElement : null;
    if (focused) show(focused);
    else readout.setAttribute("visibility", "hidden");
  };
  for (const bar of bars) {
    bar.addEventListener("pointerenter", () => show(bar));
    bar.addEventListener("pointerleave", hide);
    bar.addEventListener("focus", () => show(bar));
    bar.addEventListener("blur", () => setTimeout(hide));
  }

  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "group", "aria-labelledby": `${id}-title`, "aria-describedby": `${id}-summary` },
    grid,
    svg("line", { class: "axis", x1: left, x2: width - right, y1: top + plotHeight, y2: top + plotHeight }),
    svg("text", { class: "axis-title", x: 12, y: top + plotHeight / 2, transform: `rotate(-90 12 ${top + plotHeight / 2})`, "text-anchor": "middle" }, axisLabel),
    bars,
    xLabels,
    readout,
    total > 0 ? null : svg("text", { x: left + plotWidth / 2, y: top + plotHeight / 2, "text-anchor": "middle" }, "Nothing in this range"));
  chart.addEventListener("keydown", (event) => moveFocus(event, chart));

  const highest = points[values.indexOf(max)];
  const span = kind ? `${points.length} bars, one per ${kind}` : `${points.length} bars from ${points[0]?.label} to ${points[points.length - 1]?.label}`;
  const summary = points.length
    ? `${span}; total ${format(total)}, highest ${format(max)}${highest && max > 0 ? ` (${highest.label})` : ""}.`
    : "No data in this range.";
  // In a hidden box, not a hidden table: a table's own height and overflow do not clip it.
  const alternative = el("div", { class: "visually-hidden" }, el("table", {},
    el("caption", {}, title),
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, kind ? kind[0].toUpperCase() + kind.slice(1) : "Period"), el("th", { scope: "col" }, unit ? `Value (${unit})` : "Value"))),
    el("tbody", {}, points.map((point, index) => el("tr", {}, el("th", { scope: "row" }, point.label), el("td", {}, format(values[index])))))));
  return el("figure", { class: "chart" },
    el("figcaption", { id: `${id}-title` }, title),
    chart,
    el("p", { id: `${id}-summary`, class: "hint" }, summary),
    alternative);
}

// A label cut to the room it has (about 7 px a character at 11 px).
function fit(text, room) {
  const chars = Math.max(3, Math.floor(room / 7));
  return text.length > chars ? text.slice(0, chars - 1) + "…" : text;
}

// One tab stop per chart: the arrow keys, Home and End move between its bars.
function moveFocus(event, chart) {
  const bars = [...chart.querySelectorAll("g.bar")];
  const at = bars.indexOf(document.activeElement);
  if (at < 0) return;
  const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: bars.length - 1 }[event.key];
  if (to === undefined || to < 0 || to >= bars.length) return;
  event.preventDefault();
  bars[at].setAttribute("tabindex", "-1");
  bars[to].setAttribute("tabindex", "0");
  bars[to].focus();
}

// Every day or hour of the UTC days [from, to) as a point: its row of the report, or zeros.
const PERIODS = {
  day: { step: 86400000, key: (t) => isoDay(t), label: (k) => k, short: (k) => k.slice(5) },
  hour: {
    step: 3600000,
    key: (t) => t.toISOString().slice(0, 13) + ":00:00Z",
    label: (k) => k.replace("T", " ").slice(0, 16) + " UTC",
    short: (k) => (k.slice(11, 13) === "00" ? k.slice(5, 10) : k.slice(11, 16)),  // midnight: the date
  },
};

function everyPeriod(by, from, to, rows) {
  const period = PERIODS[by];
  const found = new Map(rows.map((row) => [row[by], row]));
  const points = [];
  const end = new Date(to + "T00:00:00Z");
  for (let t = new Date(from + "T00:00:00Z"); t < end; t = new Date(t.getTime() + period.step)) {
    const key = period.key(t);
    points.push({ requests: 0, errors: 0, cost_usd: "0", ...found.get(key), label: period.label(key), short: period.short(key) });
  }
  return points;
}

function card(label, value, detail) {
  return el("div", { class: "card" }, el("div", { class: "value" }, value), el("div", { class: "label" }, label),
    detail ? el("div", { class: "detail" }, detail) : null);
}

function refusedTotal(rows) {
  return rows.reduce((sum, row) => sum + row.requests, 0);
}

function field(label, input) {
  return el("label", {}, label, input);
}

// ---------------------------------------------------------------------------------------------
// Overview

async function overview() {
  const [data, routes] = await Promise.all([api("/overview"), api("/routes")]);
  const modelColumns = [
    { title: "Model", cell: (r) => r.model },
    { title: "Requests", num: true, cell: (r) => num(r.requests) },
    { title: "Errors", num: true, cell: (r) => num(r.errors) },
    { title: "p50 latency (ms)", num: true, cell: (r) => num(r.p50_ms) },
    { title: "p95 latency (ms)", num: true, cell: (r) => num(r.p95_ms) },
    { title: "Spend", num: true, cell: (r) => usd(r.cost_usd) },
  ];
  const refusedLastHour = refusedTotal(data.last_hour.refused);
  const refusedToday = refusedTotal(data.today.refused);
  const refusalColumns = [
    { title: "Status", num: true, cell: (r) => String(r.status) },
    { title: "Code", cell: (r) => el("code", {}, r.code) },
    { title: "Requests", num: true, cell: (r) => num(r.requests) },
  ];
  const series = data.series.map((point) => ({ ...point, label: point.hour.replace("T", " ").slice(0, 16) + " UTC", short: point.hour.slice(11, 16) }));
  return [
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      card("Requests, last hour", num(data.last_hour.requests + refusedLastHour)),
      card("Errors, last hour", num(data.last_hour.errors + refusedLastHour), `${num(refusedLastHour)} refused by the gateway`),
      card("Spend, last hour", usd(data.last_hour.cost_usd)),
      card("Requests today", num(data.today.requests + refusedToday)),
      card("Errors today", num(data.today.errors + refusedToday), `${num(refusedToday)} refused by the gateway`),
      card("Spend today", usd(data.today.cost_usd)),
      card("Cache hit rate today", `${(data.today.cache_hit_rate * 100).toFixed(1)}%`, `${num(data.today.cache_hits)} answered by the response cache`),
      card("Saved by the cache today", usd(data.today.saved_cost_usd), "what those answers cost when fetched")),
    el("p", { class: "hint" }, "Requests and errors include those the gateway refused itself (401, 403, 413, 429 …), which never reached a provider; the tables by model count only requests that did."),
    el("h2", {}, "Last 24 hours"),
    barChart({ title: "Requests per hour, last 24 hours (UTC)", points: series, value: (p) => p.requests, format: num, unit: "requests", axisLabel: "Requests" }),
    barChart({ title: "Spend per hour, last 24 hours (UTC)", points: series, value: (p) => Number(p.cost_usd), format: usd, axisLabel: "USD" }),
    el("h2", {}, "Last hour by model"),
    table("Requests in the last 60 minutes, per model", modelColumns, data.last_hour.by_model),
    el("h2", {}, "Today by model"),
    table("Requests since midnight UTC, per model (latency from hourly buckets)", modelColumns, data.today.by_model),
    el("h2", {}, "Refused by the gateway"),
    table("Refused in the last 60 minutes, by status and code", refusalColumns, data.last_hour.refused),
    table("Refused since midnight UTC, by status and code", refusalColumns, data.today.refused),
    el("h2", {}, "Deployments"),
    table("Deployment health, as the replica that answered sees it", deploymentColumns, routes.deployments),
  ];
}

const deploymentColumns = [
  { title: "Deployment", cell: (d) => el("code", {}, d.deployment) },
  { title: "Circuit", cell: (d) => d.open_until === null || d.state !== "open" ? d.state : `open until ${new Date(d.open_until * 1000).toISOString().slice(11, 19)} UTC` },
  { title: "Failures in a row", num: true, cell: (d) => num(d.consecutive_failures) },
  { title: "In flight", num: true, cell: (d) => num(d.in_flight) },
  { title: "Time to first token (ms)", num: true, cell: (d) => d.latency_seconds === null ? "—" : num(Math.round(d.latency_seconds * 1000)) },
];

// ---------------------------------------------------------------------------------------------
// Keys

const keyFilters = { state: "all", subject_id: "", team_id: "", offset: 0 };

function shownOnce(title, issued) {
  const copy = el("button", { type: "button", class: "secondary", onclick: async () => {
    await navigator.clipboard.writeText(issued.key);
    say("Key copied to the clipboard.");
  } }, "Copy key");
  return el("section", { class: "notice", "aria-label": "New key" },
    el("h2", {}, title),
    el("p", {}, "This is the only time the key is shown. Store it now."),
    el("p", { class: "secret", "data-testid": "plaintext-key" }, issued.key),
    copy);
}

function keyState(key, listed) {
  const expired = key.expires_at && new Date(key.expires_at) <= new Date();
  if (key.replaced_by) {
    // Rotated: the old key works on until its grace period ends (its expiry), then it is done.
    const successor = listed.find((other) => other.id === key.replaced_by);
    const by = successor ? ` by ${successor.prefix}` : "";
    if (key.is_active && !expired) return el("span", { class: "state-grace", title: `Replaced${by}; works until ${when(key.expires_at)}` }, `rotated${by}, in grace period`);
    return `rotated${by}`;
  }
  if (!key.is_active) return "revoked";
  if (expired) return "expired";
  return "active";
}

function keyDialog(title, fields, submitLabel, onSubmit) {
  const form = el("form", { method: "dialog" }, el("h2", {}, title), fields,
    el("div", { class: "row-actions" },
      el("button", { type: "submit" }, submitLabel),
      el("button", { type: "button", class: "secondary", onclick: () => dialog.close() }, "Cancel")));
  const dialog = el("dialog", { "aria-label": title }, form);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await onSubmit(new FormData(form));
      dialog.close();
    } catch (error) {
      say(error.message);
    }
  });
  document.body.append(dialog);
  dialog.addEventListener("close", () => dialog.remove());
  dialog.showModal();
}

function numberOrNull(text) {
  return text === "" || text === null ? null : Number(text);
}

async function keys() {
  const query = new URLSearchParams({ limit: "25", offset: String(keyFilters.offset), state: keyFilters.state });
  if (keyFilters.subject_id) query.set("subject_id", keyFilters.subject_id);
  if (keyFilters.team_id) query.set("team_id", keyFilters.team_id);
  const [listing, myTeams] = await Promise.all([api(`/keys?${query}`), ROLE === "admin" ? null : api("/teams?limit=200")]);
  const result = el("div", { id: "key-result" });
  // A team admin or member creates keys in a team of theirs: offered by name, the first filled in.
  const teamChoices = myTeams && el("datalist", { id: "my-teams" },
    myTeams.data.map((t) => el("option", { value: t.id }, t.name)));

  const createForm = el("form", { class: "inline", "aria-label": "Create key" },
    field("Name", el("input", { name: "name", required: true, maxlength: 200 })),
    ROLE === "admin" ? field("Subject ID (optional)", el("input", { name: "subject_id", placeholder: "UUID" })) : null,
    field("Team ID (optional)", el("input", { name: "team_id", placeholder: "UUID", list: teamChoices ? "my-teams" : undefined, value: myTeams?.data[0]?.id })),
    teamChoices,
    field("Requests per window", el("input", { name: "rate_limit_requests", type: "number", min: 1, value: 60 })),
    field("Window (seconds)", el("input", { name: "rate_limit_window_seconds", type: "number", min: 1, value: 60 })),
    field("Tokens per minute (optional)", el("input", { name: "tokens_per_minute", type: "number", min: 1 })),
    field("Concurrent requests (optional)", el("input", { name: "max_concurrent_requests", type: "number", min: 1 })),
    field("Allowed models (comma-separated, optional)", el("input", { name: "allowed_models" })),
    field("Expires (UTC, optional)", el("input", { name: "expires_at", type: "datetime-local" })),
    el("button", { type: "submit" }, "Create key"));
  createForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(createForm);
    const body = {
      name: form.get("name"),
      rate_limit_requests: Number(form.get("rate_limit_requests")),
      rate_limit_window_seconds: Number(form.get("rate_limit_window_seconds")),
    };
    if (form.get("subject_id")) body.subject_id = form.get("subject_id");
    if (form.get("team_id")) body.team_id = String(form.get("team_id")).trim();
    if (form.get("tokens_per_minute")) body.tokens_per_minute = Number(form.get("tokens_per_minute"));
    if (form.get("max_concurrent_requests")) body.max_concurrent_requests = Number(form.get("max_concurrent_requests"));
    const models = String(form.get("allowed_models") || "").split(",").map((m) => m.trim()).filter(Boolean);
    if (models.length) body.allowed_models = models;
    if (form.get("expires_at")) body.expires_at = form.get("expires_at") + ":00Z";
    try {
      const issued = await api("/keys", { method: "POST", body });
      await render();
      document.getElementById("key-result").replaceChildren(shownOnce(`Key “${issued.name}” created`, issued));
      say(`Key ${issued.prefix} created.`);
    } catch (error) {
      say(error.message);
    }
  });

  const filters = el("form", { class: "filters", "aria-label": "Filter keys" },
    field("State", el("select", { name: "state" },
      ["all", "active", "revoked", "expired"].map((s) => el("option", { value: s, selected: s === keyFilters.state }, s)))),
    field("Subject ID", el("input", { name: "subject_id", value: keyFilters.subject_id })),
    field("Team ID", el("input", { name: "team_id", value: keyFilters.team_id })),
    el("button", { type: "submit", class: "secondary" }, "Filter"));
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    const form = new FormData(filters);
    Object.assign(keyFilters, {
      state: form.get("state"),
      subject_id: String(form.get("subject_id")).trim(),
      team_id: String(form.get("team_id")).trim(),
      offset: 0,
    });
    render();
  });

  const usageOf = (key) => el("button", { type: "button", class: "secondary", "aria-label": `Usage of ${key.name}`, onclick: () => {
    Object.assign(usageQuery, { key_id: key.id, team_id: "" });
    window.location.hash = "#usage";
  } }, "Usage");
  // Only an admin, or an admin of the key's team, changes its limits.
  const editable = (key) => ROLE === "admin" || ADMIN_TEAMS.includes(key.team_id);
  const actions = (key) => {
    if (!key.is_active) return el("div", { class: "row-actions" }, usageOf(key));
    return el("div", { class: "row-actions" }, usageOf(key),
      el("button", { type: "button", class: "danger", "aria-label": `Revoke ${key.name}`, onclick: async () => {
        if (!window.confirm(`Revoke key ${key.name} (${key.prefix})? Calls with it stop at once.`)) return;
        try {
          await api(`/keys/${key.id}/revoke`, { method: "POST", body: {} });
          say(`Key ${key.prefix} revoked.`);
          render();
        } catch (error) { say(error.message); }
      } }, "Revoke"),
      el("button", { type: "button", class: "secondary", "aria-label": `Rotate ${key.name}`, onclick: () =>
        keyDialog(`Rotate ${key.name}`, [
          field("Grace period (seconds the old key keeps working)", el("input", { name: "grace_seconds", type: "number", min: 0, value: 0 })),
        ], "Rotate", async (form) => {
          const issued = await api(`/keys/${key.id}/rotate`, { method: "POST", body: { grace_seconds: Number(form.get("grace_seconds")) } });
          await render();
          document.getElementById("key-result").replaceChildren(shownOnce(`Key “${issued.name}” rotated`, issued));
        }) }, "Rotate"),
      editable(key) ? el("button", { type: "button", class: "secondary", "aria-label": `Edit limits of ${key.name}`, onclick: () =>
        keyDialog(`Edit limits of ${key.name}`, [
          field("Requests per window", el("input", { name: "rate_limit_requests", type: "number", min: 1, value: key.rate_limit_requests })),
          field("Window (seconds)", el("input", { name: "rate_limit_window_seconds", type: "number", min: 1, value: key.rate_limit_window_seconds })),
          field("Tokens per minute (empty = none)", el("input", { name: "tokens_per_minute", type: "number", min: 1, value: key.tokens_per_minute ?? "" })),
          field("Concurrent requests (empty = none)", el("input", { name: "max_concurrent_requests", type: "number", min: 1, value: key.max_concurrent_requests ?? "" })),
          field("Allowed models (comma-separated, empty = all)", el("input", { name: "allowed_models", value: key.allowed_models.join(", ") })),
        ], "Save limits", async (form) => {
          await api(`/keys/${key.id}`, { method: "PATCH", body: {
            rate_limit_requests: Number(form.get("rate_limit_requests")),
            rate_limit_window_seconds: Number(form.get("rate_limit_window_seconds")),
            tokens_per_minute: numberOrNull(form.get("tokens_per_minute")),
            max_concurrent_requests: numberOrNull(form.get("max_concurrent_requests")),
            allowed_models: String(form.get("allowed_models")).split(",").map((m) => m.trim()).filter(Boolean),
          } });
          say(`Limits of ${key.prefix} saved.`);
          render();
        }) }, "Edit limits") : null);
  };

  const pager = el("div", { class: "row-actions" },
    el("button", { type: "button", class: "secondary", disabled: keyFilters.offset === 0, onclick: () => {
      keyFilters.offset = Math.max(0, keyFilters.offset - 25);
      render();
    } }, "Previous page"),
    el("button", { type: "button", class: "secondary", disabled: !listing.has_more, onclick: () => {
      keyFilters.offset = listing.next_offset;
      render();
    } }, "Next page"));

  return [
    el("h1", {}, "Keys"),
    el("h2", {}, "Create key"),
    createForm,
    result,
    el("h2", {}, "All keys"),
    filters,
    table(`Keys ${keyFilters.offset + 1}–${keyFilters.offset + listing.data.length}`, [
      { title: "Name", cell: (k) => k.name },
      { title: "Prefix", cell: (k) => el("code", {}, k.prefix) },
      { title: "Subject", cell: (k) => (k.subject_id ? el("code", { title: k.subject_id, "aria-label": k.subject_id }, k.subject_id.slice(0, 8) + "…") : "—") },
      { title: "Team", cell: (k) => (k.team_id ? el("code", { title: k.team_id, "aria-label": k.team_id }, k.team_id.slice(0, 8) + "…") : "—") },
      { title: "Requests", cell: (k) => el("span", { class: "nowrap" }, `${num(k.rate_limit_requests)} / ${num(k.rate_limit_window_seconds)} s`) },
      { title: "Tokens per minute", num: true, cell: (k) => (k.tokens_per_minute ? num(k.tokens_per_minute) : "no limit") },
      { title: "Concurrency", num: true, cell: (k) => (k.max_concurrent_requests ? num(k.max_concurrent_requests) : "no limit") },
      { title: "Allowed models", cell: (k) => (k.allowed_models.length ? k.allowed_models.join(", ") : "all models") },
      { title: "Expires", cell: (k) => when(k.expires_at) },
      { title: "State", cell: (k) => keyState(k, listing.data) },
      { title: "Last used", cell: (k) => when(k.last_used_at) },
      { title: "Actions", cell: actions },
    ], listing.data),
    pager,
  ];
}

// ---------------------------------------------------------------------------------------------
// Subjects

async function subjects() {
  const listing = await api("/subjects?limit=100");
  const setForm = el("form", { class: "inline", "aria-label": "Set budget" },
    field("Subject ID", el("input", { name: "subject_id", required: true, placeholder: "UUID" })),
    field("Monthly budget (USD)", el("input", { name: "usd", type: "number", min: "0", step: "any", required: true })),
    el("button", { type: "submit" }, "Set budget"));
  setForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(setForm);
    try {
      await api(`/subjects/${String(form.get("subject_id")).trim()}`, { method: "PUT", body: { monthly_budget_usd: Number(form.get("usd")) } });
      say("Budget set.");
      render();
    } catch (error) { say(error.message); }
  });
  // Settled spend (the ledger's) and what requests in flight have reserved, as parts of the cap.
  const bar = (s) => {
    if (s.monthly_budget_usd === null) return "no cap";
    const cap = s.monthly_budget_usd;
    const spent = s.month_to_date_spend_usd;
    const reserved = s.month_to_date_reserved_usd;
    const share = (amount) => (cap > 0 ? Math.min(100, (amount / cap) * 100) : amount > 0 ? 100 : 0);
    const settledShare = share(spent);
    const reservedShare = Math.min(100 - settledShare, share(reserved || 0));
    const reservedText = reserved === null ? "reserved unknown (limit store unreachable)" : `${usd(reserved)} reserved`;
    const label = `Spend of ${s.subject_id}: ${usd(spent)} settled, ${reservedText}, of ${usd(cap)}`;
    const percent = (value) => `${Math.round(value)}%`;
    // Widths through the CSSOM: the page's CSP refuses style attributes.
    const settledPart = el("span", { class: "settled" });
    const reservedPart = el("span", { class: "reserved" });
    settledPart.style.width = `${settledShare}%`;
    reservedPart.style.width = `${reservedShare}%`;
    return el("div", { class: "budget" },
      el("div", { class: `budget-bar${spent + (reserved || 0) >= cap ? " over" : ""}`, role: "meter", "aria-label": label,
        "aria-valuemin": "0", "aria-valuemax": String(cap), "aria-valuenow": String(Math.min(cap, spent + (reserved || 0))),
        "aria-valuetext": label, title: label },
        settledPart, reservedPart),
      el("span", { class: "hint" }, `${percent(settledShare)} settled${reserved ? ` + ${percent(reservedShare)} reserved` : ""}`));
  };
  return [
    el("h1", {}, "Subjects"),
    el("p", { class: "hint" }, "A subject is the team or user keys are issued to; its monthly budget caps every key it owns."),
    setForm,
    el("p", { class: "legend" },
      el("span", {}, el("span", { class: "swatch settled" }), "settled: spend the ledger has recorded"),
      el("span", {}, el("span", { class: "swatch reserved" }), "reserved: worst cases of requests still running")),
    table("Subjects this month, highest spend first", [
      { title: "Subject", cell: (s) => el("code", {}, s.subject_id) },
      { title: "Monthly budget", num: true, cell: (s) => (s.monthly_budget_usd === null ? "—" : usd(s.monthly_budget_usd)) },
      { title: "Settled this month", num: true, cell: (s) => usd(s.month_to_date_spend_usd) },
      { title: "Reserved now", num: true, cell: (s) => (s.month_to_date_reserved_usd === null ? "unknown" : usd(s.month_to_date_reserved_usd)) },
      { title: "Budget used", cell: bar },
      { title: "Actions", cell: (s) => (s.monthly_budget_usd === null ? "—" : el("button", { type: "button", class: "secondary",
          "aria-label": `Clear cap of ${s.subject_id}`, onclick: async () => {
            try {
              await api(`/subjects/${s.subject_id}`, { method: "PUT", body: { monthly_budget_usd: null } });
              say("Cap cleared.");
              render();
            } catch (error) { say(error.message); }
          } }, "Clear cap")) },
    ], listing.data),
  ];
}

// ---------------------------------------------------------------------------------------------
// Usage

const usageQuery = { by: "day", from: "", to: "", team_id: "", key_id: "" };

// What a team admin or member may ask the usage of: the teams they administer (every key in them)
// and the keys they see (a member: their own), each as the query it is.
async function usageChoices() {
  const [teams, keys] = await Promise.all([api("/teams?limit=200"), api("/keys?limit=200&state=all")]);
  return [
    ...teams.data.filter((t) => ADMIN_TEAMS.includes(t.id)).map((t) => ({ team_id: t.id, key_id: "", label: `Team ${t.name} (all its keys)` })),
    ...keys.data.map((k) => ({ team_id: "", key_id: k.id, label: `Key ${k.name} (${k.prefix})` })),
  ];
}

function choiceValue(choice) {
  return choice.key_id ? `key:${choice.key_id}` : `team:${choice.team_id}`;
}

function isoDay(date) {
  return date.toISOString().slice(0, 10);
}

// A key by its name and prefix (the report adds them), a subject or model as it is.
function groupName(by, row) {
  if (by === "key" && row.name) return `${row.name} (${row.prefix})`;
  if (by === "team") return row.name ?? row.team ?? "no team";
  if (by === "hour") return PERIODS.hour.label(row.hour);
  return row[by] ?? "—";
}

function usagePoints(report) {
  if (report.by in PERIODS) return everyPeriod(report.by, report.from, report.to, report.data);
  // Categories, largest first; a key is drawn by its name (its prefix is in the full label).
  return [...report.data].sort((a, b) => b.requests - a.requests).map((row) => {
    const label = String(groupName(report.by, row));
    return { ...row, label, short: report.by === "key" && row.name ? row.name : label };
  });
}

async function usage() {
  if (!usageQuery.to) {
    const tomorrow = new Date(Date.now() + 86400000);
    usageQuery.to = isoDay(tomorrow);
    usageQuery.from = isoDay(new Date(tomorrow.getTime() - 30 * 86400000));
  }
  let scope;
  if (ROLE === "admin") {
    scope = [
      field("Team ID (optional)", el("input", { name: "team_id", value: usageQuery.team_id, placeholder: "UUID" })),
      field("Key ID (optional)", el("input", { name: "key_id", value: usageQuery.key_id, placeholder: "UUID" })),
    ];
  } else {
    const choices = await usageChoices();
    if (!choices.length) {
      return [el("h1", {}, "Usage"), el("p", {}, "You have no keys yet: create one on the Keys page, and its usage shows here.")];
    }
    const chosen = choices.find((c) => choiceValue(c) === choiceValue(usageQuery)) || choices[0];
    Object.assign(usageQuery, { team_id: chosen.team_id, key_id: chosen.key_id });
    scope = field("Usage of", el("select", { name: "of" },
      choices.map((c) => el("option", { value: choiceValue(c), selected: c === chosen }, c.label))));
  }
  const query = new URLSearchParams(usageQuery);
  for (const name of ["team_id", "key_id"]) if (!usageQuery[name]) query.delete(name);
  const report = await api(`/usage/report?${query}`);
  const form = el("form", { class: "filters", "aria-label": "Usage range" },
    field("Group by", el("select", { name: "by" },
      ["day", "hour", "model", "key", "subject", "team"].map((b) => el("option", { value: b, selected: b === usageQuery.by }, b)))),
    scope,
    field("From (UTC day)", el("input", { name: "from", type: "date", value: usageQuery.from, required: true })),
    field("To (UTC day, exclusive)", el("input", { name: "to", type: "date", value: usageQuery.to, required: true })),
    el("button", { type: "submit" }, "Show usage"),
    el("a", { href: `${API}/usage/report?${query}&format=csv`, download: "", class: "button-link" }, "Export CSV"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const [kind, id] = String(data.get("of") || ":").split(":");
    Object.assign(usageQuery, {
      by: data.get("by"), from: data.get("from"), to: data.get("to"),
      team_id: ROLE === "admin" ? String(data.get("team_id") || "").trim() : kind === "team" ? id : "",
      key_id: ROLE === "admin" ? String(data.get("key_id") || "").trim() : kind === "key" ? id : "",
    });
    render();
  });
  const points = usagePoints(report);
  const overTime = report.by in PERIODS;
  const per = overTime ? `per ${report.by}` : `by ${report.by}`;
  const kind = overTime ? undefined : report.by;
  const range = `${report.from} to ${report.to} (UTC, end exclusive)`;
  return [
    el("h1", {}, "Usage"),
    form,
    barChart({ title: `Requests ${per}, ${range}`, points, value: (p) => p.requests, format: num, unit: "requests", axisLabel: "Requests", kind }),
    barChart({ title: `Spend ${per}, ${range}`, points, value: (p) => Number(p.cost_usd), format: usd, axisLabel: "USD", kind }),
    // Rows as the charts order them (categories largest first); periods without traffic left out.
    table(`Usage by ${report.by}, ${report.from} to ${report.to}`, [
      { title: report.by[0].toUpperCase() + report.by.slice(1), cell: (r) => groupName(report.by, r) },
      { title: "Requests", num: true, cell: (r) => num(r.requests) },
      { title: "Errors", num: true, cell: (r) => num(r.errors) },
      { title: "Input tokens", num: true, cell: (r) => num(r.input_tokens) },
      { title: "Output tokens", num: true, cell: (r) => num(r.output_tokens) },
      { title: "Spend", num: true, cell: (r) => usd(r.cost_usd) },
    ], overTime ? report.data : points),
    ...requestLookup(),
  ];
}

// One request, by the id its caller got (X-Request-Id): its ledger row and every upstream
// attempt it made, with the deployment each went to and how it ended (/usage/requests/{id}).
function requestLookup() {
  const found = el("div", { "aria-live": "polite" });
  const form = el("form", { class: "filters", "aria-label": "Look up a request" },
    field("Request ID", el("input", { name: "request_id", required: true, size: 36, placeholder: "X-Request-Id" })),
    el("button", { type: "submit" }, "Show attempts"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = String(new FormData(form).get("request_id") || "").trim();
    try {
      const shown = await api(`/usage/requests/${encodeURIComponent(id)}`);
      found.replaceChildren(...shown.data.flatMap((row) => requestTables(shown.request_id, row)));
    } catch (error) {
      found.replaceChildren(el("p", { class: "error", role: "alert" }, error.message));
    }
  });
  return [el("h2", {}, "A request and its attempts"), form, found];
}

function requestTables(id, row) {
  const cost = (value) => (value === null || value === undefined ? "—" : usd(value));
  return [
    table(`Request ${id}`, [
      { title: "When", cell: (r) => when(r.occurred_at) },
      { title: "Status", num: true, cell: (r) => r.status },
      { title: "Error", cell: (r) => r.error_type || "—" },
      { title: "Answered by", cell: (r) => r.deployment || "—" },
      { title: "Started on", cell: (r) => r.started_deployment || "—" },
      { title: "Model answered", cell: (r) => r.response_model || "—" },
      { title: "Attempts", num: true, cell: (r) => num(r.attempts) },
      { title: "Input tokens", num: true, cell: (r) => num(r.input_tokens) },
      { title: "Output tokens", num: true, cell: (r) => num(r.output_tokens) },
      { title: "Cost", num: true, cell: (r) => cost(r.cost_usd) },
    ], [row]),
    // Rows written before attempts were recorded have none to list.
    table(`Attempts of request ${id}, in order`, [
      { title: "Deployment", cell: (a) => a.deployment },
      { title: "Ended", cell: (a) => a.ended },
      { title: "Status", num: true, cell: (a) => a.status ?? "—" },
      { title: "Error", cell: (a) => a.error || "—" },
      { title: "Model answered", cell: (a) => a.response_model || "—" },
      { title: "Input tokens", num: true, cell: (a) => num(a.input_tokens) },
      { title: "Output tokens", num: true, cell: (a) => num(a.output_tokens) },
      { title: "Cost", num: true, cell: (a) => cost(a.cost_usd) + (a.estimated ? " (estimated)" : "") },
    ], row.attempt_log),
  ];
}

// ---------------------------------------------------------------------------------------------
// Audit

async function audit() {
  const entries = [];
  let next = null;
  const body = el("div", {});
  const more = el("button", { type: "button", class: "secondary", onclick: () => load() }, "Load more");
  async function load() {
    const listing = await api(`/audit?limit=50${next ? `&before_id=${next}` : ""}`);
    entries.push(...listing.data);
    next = listing.next_before_id;
    more.hidden = next === null;
    body.replaceChildren(table("Admin changes, newest first", [
      { title: "When", cell: (e) => when(e.occurred_at) },
      { title: "Actor", cell: (e) => e.actor },
      { title: "Action", cell: (e) => e.action },
      { title: "Target", cell: (e) => e.target || "—" },
      { title: "Change", cell: (e) => describeChange(e) },
    ], entries));
  }
  await load();
  return [el("h1", {}, "Audit"), body, more];
}

function describeChange(entry) {
  const before = entry.before || {};
  const after = entry.after || {};
  const changed = Object.keys(after).filter((name) => JSON.stringify(before[name]) !== JSON.stringify(after[name]));
  if (!entry.before) return "created";
  return changed.length ? changed.map((name) => `${name}: ${JSON.stringify(before[name])} → ${JSON.stringify(after[name])}`).join("; ") : "—";
}

// ---------------------------------------------------------------------------------------------
// Routing

const pages = ROLE === "admin" ? { overview, keys, subjects, usage, audit } : { keys, usage, audit };
const FIRST = ROLE === "admin" ? "overview" : "keys";
for (const link of document.querySelectorAll("nav a")) {
  if (!(link.getAttribute("href").slice(1) in pages)) link.hidden = true;
}
if (ROLE !== "admin") {
  for (const button of document.querySelectorAll('button[value="everywhere"]')) button.hidden = true;
}

// Renders overlap when a page is left before its data came: only the latest one is drawn, so a
// slow earlier one never replaces the page (and the focus) the user has moved on to.
let renders = 0;

async function render() {
  const mine = ++renders;
  const wanted = (window.location.hash || `#${FIRST}`).slice(1);
  const name = wanted in pages ? wanted : FIRST;
  const draw = pages[name];
  for (const link of document.querySelectorAll("nav a")) {
    if (link.getAttribute("href") === `#${name}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  let children;
  try {
    children = await draw();
  } catch (error) {
    children = [el("h1", {}, "Something went wrong"), el("p", { class: "error", role: "alert" }, error.message)];
  }
  if (mine !== renders) return;
  page.replaceChildren(...children);
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · llmgw console`;
}

// The first page's own address, so following its link does not draw it a second time.
if (!window.location.hash) history.replaceState(null, "", `#${FIRST}`);
window.addEventListener("hashchange", render);
render();
