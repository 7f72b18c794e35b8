"use strict";
// The ramd dashboard: reads the REST API of the daemon that served this
// page (same origin, the session cookie), follows GET /v1/events for the
// live figures, and sends the admin actions. No framework, no build step.
//
// Every request that changes something carries X-Ramd-Csrf: 1 (the
// server refuses cookie-authorized changes without it). All text from the
// API goes into the page through textContent, never as HTML.

const MiB = 1024 * 1024;
const INVENTORY_MS = 5000;
const BENCH_MS = 30000;

const state = {
  whoami: null,
  admin: false,
  drives: new Map(), // name -> GET /v1/drives entry
  remotes: [],
  rows: new Map(), // "drive:NAME" / "cache:NAME" -> <tr>
  prevCaches: new Map(), // name -> { hits, total } of the previous event
  stats: null,
  unixMs: Date.now(),
  health: null,
  benchKey: null,
  charts: {},
};

const $ = (sel) => document.querySelector(sel);

// ---------------------------------------------------------------- helpers

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}

function number(v, digits) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  if (Math.abs(v) >= 1e6) return `${(v / 1e6).toFixed(2)}M`;
  if (Math.abs(v) >= 1e4) return `${(v / 1e3).toFixed(1)}k`;
  return v.toFixed(digits === undefined ? 0 : digits);
}

function duration(ms) {
  const s = ms / 1000;
  if (s < 120) return `${Math.round(s * 10) / 10} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

function ago(unixMs) {
  if (!unixMs) return "never";
  const s = Math.max(0, (state.unixMs - unixMs) / 1000);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function notice(kind, text) {
  const n = $("#notice");
  n.className = kind;
  n.textContent = text;
  n.hidden = false;
}

// One API call; throws an Error with .status and .code from the API's
// error body ({"error": {"code", "message"}}).
async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD") headers["X-Ramd-Csrf"] = "1";
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (e) {
      data = null;
    }
  }
  if (!res.ok) {
    const detail = data && data.error ? data.error : {};
    const err = new Error(detail.message || `${res.status} ${res.statusText}`);
    err.status = res.status;
    err.code = detail.code || "";
    if (res.status === 401) sessionEnded(err.code);
    throw err;
  }
  return data;
}

// A 401: the token expired (the server says so, or the browser dropped
// the cookie, whose Max-Age is the token's life, once whoami's expiry
// passed), or it was revoked, or the cookie is gone.
function sessionEnded(code) {
  const until = state.whoami ? state.whoami.expires_unix_s : null;
  const now = Math.max(Date.now(), state.unixMs) / 1000;
  const expired = code === "token_expired" || (until !== null && until !== undefined && now >= until);
  const why = expired
    ? "This session has expired (dashboard links last 7 days unless `ramd dashboard --expires` says otherwise)"
    : "This session has ended (signed out, its token was revoked, or the daemon restarted)";
  notice("error", `${why}: run \`ramd dashboard\` on the daemon's host and open the new link.`);
}

// An admin action: runs `work`, says what happened, refreshes.
async function act(what, work) {
  try {
    const done = await work();
    if (done) notice("ok", done);
    await refreshInventory();
  } catch (e) {
    // A session that ended says so (api() did); not "Failed: ..." over it.
    if (e.status === 401) return;
    const why = e.status ? ` (${e.status}${e.code ? " " + e.code : ""})` : "";
    const refused = e.status === 403 ? "Refused: " : "Failed: ";
    notice("error", `${refused}${what}${why}: ${e.message}`);
  }
}

// ---------------------------------------------------------------- session

async function loadWhoami() {
  const w = await api("GET", "/v1/whoami");
  state.whoami = w;
  state.admin = w.role === "admin";
  const badge = $("#role");
  badge.textContent = w.token_name ? `${w.role} · ${w.token_name}` : w.role;
  badge.className = `badge ${state.admin ? "admin" : "read-only"}`;
  document.body.classList.toggle("read-only", !state.admin);
  $("#read-only-note").hidden = state.admin;
  for (const b of document.querySelectorAll(".admin-action")) b.disabled = !state.admin;
}

async function logout() {
  try {
    await api("POST", "/logout");
  } finally {
    window.location.replace("/");
  }
}

// ---------------------------------------------------------------- inventory

async function refreshInventory() {
  const [drives, dirs, remotes, health] = await Promise.all([
    api("GET", "/v1/drives"),
    api("GET", "/v1/dirs"),
    api("GET", "/v1/remotes").catch(() => ({ remotes: [] })),
    api("GET", "/v1/health"),
  ]);
  state.drives = new Map(drives.drives.map((d) => [d.name, d]));
  state.remotes = remotes.remotes || [];
  state.health = health;
  renderHealth();
  renderDirs(dirs.dirs || []);
  if (state.stats) renderStats(state.stats);
}

function renderHealth() {
  const h = state.health;
  if (!h) return;
  const up = h.uptime_s < 3600 ? `${Math.round(h.uptime_s / 60)} min` : `${(h.uptime_s / 3600).toFixed(1)} h`;
  $("#daemon").textContent = `${window.location.host} · pid ${h.pid} · up ${up} · ${h.drives} drive${h.drives === 1 ? "" : "s"}`;
  $("#version").textContent = h.version;
  const facts = [
    ["version", `ramd ${h.version}, pid ${h.pid}, up ${up}`],
    ["API socket", h.api_socket],
    ["NBD socket", h.nbd_socket],
    ["NBD over TCP", h.nbd_tcp.length ? h.nbd_tcp.join(", ") : "off"],
    ["state", h.state_dir],
    ["config", h.config_file || "none"],
    ["metrics", h.metrics_enabled ? "on" : "off (no rates or latency)"],
  ];
  const items = [];
  for (const [k, v] of facts) items.push(el("dt", k), el("dd", v));
  $("#daemon-facts").replaceChildren(...items);
  const p = h.memory_pressure;
  if (p) {
    const psi = p.full_avg10_pct === null ? "no PSI" : `PSI full avg10 ${p.full_avg10_pct.toFixed(1)}%`;
    $("#pressure-text").textContent = `Host memory ${p.short ? "SHORT" : "ok"}: ${bytes(p.available_bytes)} available (short below ${bytes(p.min_available_bytes)}), ${psi}; ${p.episodes} shortage${p.episodes === 1 ? "" : "s"}, ${p.refused_allocations} pages refused`;
  }
}

function renderMemory(budget) {
  const p = state.health ? state.health.memory_pressure : null;
  const limit = budget.limit_bytes || 1;
  $("#mem-used").style.width = `${Math.min(100, (100 * budget.used_bytes) / limit)}%`;
  $("#mem-committed").style.width = `${Math.min(100, (100 * budget.committed_bytes) / limit)}%`;
  let text = `held ${bytes(budget.used_bytes)} · promised ${bytes(budget.committed_bytes)} · budget ${bytes(budget.limit_bytes)}`;
  if (p && p.short) text += " · MEMORY SHORT: new pages are refused";
  $("#mem-text").textContent = text;
}

// The row for `key`, made by `make` the first time.
function row(tbody, key, make) {
  let tr = state.rows.get(key);
  if (!tr) {
    tr = make();
    tr.dataset.key = key;
    state.rows.set(key, tr);
  }
  tbody.append(tr);
  return tr;
}

// Drops the rows of `prefix` whose keys are not in `keep`.
function prune(prefix, keep) {
  for (const [key, tr] of state.rows) {
    if (key.startsWith(prefix) && !keep.has(key)) {
      tr.remove();
      state.rows.delete(key);
    }
  }
}

function cells(tr, values) {
  values.forEach((v, i) => {
    if (tr.cells[i].textContent !== v) tr.cells[i].textContent = v;
  });
}

function button(label, title, onClick) {
  const b = el("button", label, "admin-action");
  b.type = "button";
  b.title = title;
  b.disabled = !state.admin;
  b.addEventListener("click", onClick);
  return b;
}

function driveKind(info, s) {
  const parts = ["RAM"];
  if (s.compression) parts.push(`compressed ${s.compression.algorithm}`);
  if (info && info.persist) parts.push("persistent");
  if (info && info.read_only) parts.push("locked");
  if (info && info.state !== "ready") parts.push(info.state);
  return parts.join(", ");
}

function persistence(info, s) {
  if (!info || !info.persist) return "volatile (RAM only)";
  const p = s.persist;
  const every = info.persist.durability === "none" ? "" : ` every ${duration(info.persist.sync_interval_ms)}`;
  let text = `${info.persist.durability}${every}`;
  if (p) {
    text += ` · ${p.sync_state} · ${bytes(p.dirty_bytes)} dirty · synced ${ago(p.last_sync_unix_ms)}`;
    if (p.last_error) text += ` · error: ${p.last_error}`;
  }
  return text;
}

function compression(s) {
  const c = s.compression;
  if (!c) return "–";
  if (!c.orig_data_bytes) return `${c.algorithm}`;
  const ratio = c.ratio || c.orig_data_bytes / Math.max(1, c.mem_used_bytes);
  return `${ratio.toFixed(2)}x ${c.algorithm}`;
}

function renderDrives(list) {
  const tbody = $("#drive-table tbody");
  const keep = new Set();
  for (const s of list) {
    const key = `drive:${s.name}`;
    keep.add(key);
    const info = state.drives.get(s.name);
    const tr = row(tbody, key, () => makeDriveRow(s.name));
    tr.dataset.name = s.name;
    const held = s.compression ? s.compression.mem_used_bytes : s.allocated_bytes;
    const limit = s.mem_limit_bytes ? ` / ${bytes(s.mem_limit_bytes)}` : "";
    cells(tr, [
      s.name,
      driveKind(info, s),
      bytes(s.size_bytes),
      `${bytes(held)}${limit}`,
      compression(s),
      persistence(info, s),
      String(s.connections),
      s.rates ? number(s.rates.iops) : "–",
    ]);
    updateDriveActions(tr, info);
  }
  prune("drive:", keep);
  $("#no-drives").hidden = list.length > 0;
}

function makeDriveRow(name) {
  const tr = el("tr");
  for (let i = 0; i < 8; i++) tr.append(el("td"));
  for (const i of [2, 3, 4, 6, 7]) tr.cells[i].className = "num";
  const actions = el("td", null, "actions");
  actions.append(
    button("Resize", `change the size of ${name}`, () => resizeDrive(name)),
    button("Sync", `save ${name} to disk now`, () => syncDrive(name)),
    button("Snapshot", `push a snapshot of ${name} to object storage`, () => snapshotDrive(name)),
    button("Delete", `delete ${name}`, () => deleteDrive(name)),
  );
  actions.children[0].dataset.action = "resize";
  actions.children[1].dataset.action = "sync";
  actions.children[2].dataset.action = "snapshot";
  actions.children[3].dataset.action = "delete";
  tr.append(actions);
  return tr;
}

function updateDriveActions(tr, info) {
  const by = (a) => tr.querySelector(`[data-action="${a}"]`);
  by("sync").hidden = !(info && info.persist);
  by("snapshot").hidden = state.remotes.length === 0;
  for (const b of tr.querySelectorAll(".admin-action")) b.disabled = !state.admin;
}

function renderCaches(list) {
  const tbody = $("#cache-table tbody");
  const keep = new Set();
  for (const c of list) {
    const key = `cache:${c.name}`;
    keep.add(key);
    const tr = row(tbody, key, () => {
      const t = el("tr");
      for (let i = 0; i < 9; i++) t.append(el("td"));
      for (const i of [3, 4, 5, 6, 8]) t.cells[i].className = "num";
      const actions = el("td", null, "actions");
      const sync = button("Sync", `write ${c.name}'s dirty blocks back now`, () => syncCache(c.name));
      sync.dataset.action = "sync";
      actions.append(sync);
      t.append(actions);
      return t;
    });
    tr.dataset.name = c.name;
    const st = c.stats;
    cells(tr, [
      c.name,
      c.settings.mode,
      c.backing.spec,
      bytes(c.size_bytes),
      st ? `${bytes(st.memory_bytes)} / ${bytes(c.promised_bytes)}` : "–",
      st && st.read_hits + st.read_misses + st.write_hits + st.write_misses > 0 ? `${(100 * st.hit_ratio).toFixed(1)}%` : "–",
      st ? bytes(st.dirty_bytes) : "–",
      c.backing.state === "healthy" ? c.state : `${c.state} (backing ${c.backing.state})`,
      String(c.connections),
    ]);
    for (const b of tr.querySelectorAll(".admin-action")) b.disabled = !state.admin;
  }
  prune("cache:", keep);
  $("#no-caches").hidden = list.length > 0;
}

function renderDirs(list) {
  const tbody = $("#dir-table tbody");
  const rows = list.map((d) => {
    const tr = el("tr");
    tr.dataset.path = d.path;
    const used = d.usage ? `${bytes(d.usage.used_bytes)} / ${bytes(d.usage.total_bytes)}` : "–";
    const notes = [d.last_error, ...(d.notes || [])].filter(Boolean).join("; ");
    for (const v of [d.path, d.mode, d.status, used, ago(d.last_sync_unix_ms), notes || ""]) tr.append(el("td", v));
    tr.cells[3].className = "num";
    return tr;
  });
  tbody.replaceChildren(...rows);
  $("#no-dirs").hidden = list.length > 0;
}

// ---------------------------------------------------------------- live

function worst(latency, field) {
  let v = null;
  for (const l of Object.values(latency || {})) {
    if (l.count > 0 && l[field] !== null && (v === null || l[field] > v)) v = l[field];
  }
  return v;
}

function targets(stats) {
  const list = stats.drives.map((d) => ({ name: d.name, rates: d.rates }));
  for (const c of stats.caches) list.push({ name: c.name, rates: c.io ? c.io.rates : null });
  return list;
}

// Two points per cache: the hit ratio of the requests since the last
// event (solid; a gap when there were none, and on a page's first event,
// which has nothing to subtract), and since the cache was made (dashed,
// as the table shows it: there from the first request on, so an idle
// cache or a page opened after the I/O still shows where it stands).
function hitRatios(caches) {
  const points = [];
  for (const cache of caches) {
    const st = cache.stats;
    if (!st) continue;
    const hit = st.read_hits + st.write_hits;
    const now = { hits: hit, total: hit + st.read_misses + st.write_misses };
    const prev = state.prevCaches.get(cache.name);
    state.prevCaches.set(cache.name, now);
    // A cache made again under the same name starts from 0: no interval.
    const asked = prev ? now.total - prev.total : 0;
    const got = prev ? now.hits - prev.hits : 0;
    const interval = asked > 0 && got >= 0 ? Math.min(100, (100 * got) / asked) : null;
    points.push({ name: cache.name, value: interval });
    points.push({
      name: `${cache.name} overall`,
      group: cache.name,
      dashed: true,
      value: now.total > 0 ? (100 * now.hits) / now.total : null,
    });
  }
  return points;
}

function feedCharts(ev) {
  const t = ev.unix_ms;
  const stats = ev.stats;
  const all = targets(stats);
  const c = state.charts;
  c.iops.push(t, all.map((x) => ({ name: x.name, value: x.rates ? x.rates.iops : null })));
  c.mibs.push(t, all.map((x) => ({
    name: x.name,
    value: x.rates ? (x.rates.read_bytes_per_s + x.rates.write_bytes_per_s) / MiB : null,
  })));
  const lat = [];
  for (const x of all) {
    const l = x.rates ? x.rates.latency : null;
    lat.push({ name: `${x.name} p50`, group: x.name, dashed: true, value: worst(l, "p50_us") });
    lat.push({ name: `${x.name} p99`, group: x.name, value: worst(l, "p99_us") });
  }
  c.latency.push(t, lat);
  c.hits.push(t, hitRatios(stats.caches));
  const dirty = [];
  const lag = [];
  for (const d of stats.drives) {
    if (!d.persist) continue;
    dirty.push({ name: d.name, value: d.persist.dirty_bytes / MiB });
    // How old the state on disk is while RAM holds newer data; unknown
    // (a gap) before the drive's first sync.
    const p = d.persist;
    let behind = 0;
    if (p.dirty_bytes > 0) behind = p.durable_as_of_unix_ms ? Math.max(0, (t - p.durable_as_of_unix_ms) / 1000) : null;
    lag.push({ name: d.name, value: behind });
  }
  for (const cache of stats.caches) {
    if (!cache.stats) continue;
    dirty.push({ name: cache.name, value: cache.stats.dirty_bytes / MiB });
    lag.push({ name: cache.name, value: cache.stats.writeback_lag_ms / 1000 });
  }
  c.dirty.push(t, dirty);
  c.lag.push(t, lag);
}

function renderStats(stats) {
  renderMemory(stats.memory_budget);
  renderDrives(stats.drives);
  renderCaches(stats.caches || []);
}

function onStats(ev) {
  state.stats = ev.stats;
  state.unixMs = ev.unix_ms;
  renderStats(ev.stats);
  feedCharts(ev);
}

function startEvents() {
  const live = $("#live");
  const source = new EventSource("/v1/events");
  source.addEventListener("open", () => {
    live.textContent = "live";
    live.className = "live on";
  });
  source.addEventListener("stats", (m) => onStats(JSON.parse(m.data)));
  // The server ends the stream when the session's credential ends (the
  // token revoked or expired, the session signed out): no reconnecting.
  source.addEventListener("ended", () => {
    source.close();
    live.textContent = "offline";
    live.className = "live off";
    api("GET", "/v1/whoami").catch(() => {});
  });
  source.addEventListener("error", () => {
    live.textContent = source.readyState === EventSource.CLOSED ? "offline" : "reconnecting…";
    live.className = "live off";
    if (source.readyState === EventSource.CLOSED) {
      // A refused stream (401) is not retried by the browser: say why.
      api("GET", "/v1/whoami").catch(() => {});
    }
  });
}

// ---------------------------------------------------------------- actions

async function createDrive(form) {
  const f = new FormData(form);
  const name = String(f.get("name")).trim();
  const body = { name, size: String(f.get("size")).trim() };
  const limit = String(f.get("mem_limit") || "").trim();
  if (limit) body.mem_limit = limit;
  const compress = String(f.get("compress") || "");
  if (compress) body.compress = compress;
  if (f.get("persist")) body.persist = true;
  await act(`create drive '${name}'`, async () => {
    const d = await api("POST", "/v1/drives", body);
    form.reset();
    return `Drive '${d.name}' created: ${bytes(d.size_bytes)}, ${d.uri}`;
  });
}

async function resizeDrive(name) {
  const info = state.drives.get(name);
  const size = window.prompt(`New size of drive '${name}' (e.g. 2G):`, info ? bytes(info.size_bytes).replace(" ", "") : "");
  if (!size) return;
  await act(`resize drive '${name}'`, async () => {
    try {
      const d = await api("PATCH", `/v1/drives/${encodeURIComponent(name)}`, { size });
      return `Drive '${name}' is now ${bytes(d.size_bytes)}`;
    } catch (e) {
      if (e.code !== "data_beyond_size") throw e;
      if (!window.confirm(`${e.message}\n\nShrink anyway and discard that data?`)) return null;
      const d = await api("PATCH", `/v1/drives/${encodeURIComponent(name)}`, { size, force: true });
      return `Drive '${name}' is now ${bytes(d.size_bytes)} (data beyond it discarded)`;
    }
  });
}

async function syncDrive(name) {
  await act(`sync drive '${name}'`, async () => {
    const r = await api("POST", `/v1/drives/${encodeURIComponent(name)}/sync`);
    return `Drive '${name}' synced: generation ${r.generation}, ${bytes(r.data_bytes)} written in ${Math.round(r.duration_ms)} ms`;
  });
}

async function snapshotDrive(name) {
  const names = state.remotes.map((r) => r.name);
  const remote = names.length === 1 ? names[0] : window.prompt(`Push a snapshot of '${name}' to which remote? (${names.join(", ")})`, names[0] || "");
  if (!remote) return;
  await act(`snapshot drive '${name}' to '${remote}'`, async () => {
    const job = await api("POST", `/v1/drives/${encodeURIComponent(name)}/snapshots`, { remote });
    return `Snapshot of '${name}' to '${remote}' started (job ${job.id}); \`ramd snapshot status ${name}\` follows it`;
  });
}

async function deleteDrive(name) {
  const info = state.drives.get(name);
  const gone = info && info.persist ? " Its state directory on disk is removed too." : "";
  if (!window.confirm(`Delete drive '${name}'? Its data is lost and open connections are closed.${gone}`)) return;
  await act(`delete drive '${name}'`, async () => {
    await api("DELETE", `/v1/drives/${encodeURIComponent(name)}?force=true`);
    return `Drive '${name}' deleted`;
  });
}

async function syncCache(name) {
  await act(`sync cache '${name}'`, async () => {
    const r = await api("POST", `/v1/caches/${encodeURIComponent(name)}/sync`);
    return `Cache '${name}' synced: ${bytes(r.written_back_bytes)} written back in ${r.duration_ms} ms`;
  });
}

// ---------------------------------------------------------------- bench

async function loadBench() {
  let latest;
  try {
    latest = await api("GET", "/v1/bench/latest");
  } catch (e) {
    if (e.status === 404) {
      $("#bench-empty").hidden = false;
      $("#bench-body").hidden = true;
      state.benchKey = null;
      return;
    }
    throw e;
  }
  const r = latest.report;
  const key = `${r.started_at} ${r.profile} ${latest.svg.length}`;
  if (key === state.benchKey) return;
  state.benchKey = key;
  $("#bench-empty").hidden = true;
  $("#bench-body").hidden = false;
  $("#bench-when").textContent = `(profile ${r.profile}, ${r.started_at})`;
  $("#bench-targets").textContent = "Targets: " + r.targets.map((t) => `${t.name} (${t.kind}, ${t.path})`).join(" · ");
  const rows = r.results.map((x) => {
    const tr = el("tr");
    tr.dataset.target = x.target;
    tr.dataset.test = x.test;
    const l = x.lat_us;
    for (const v of [x.test, x.target, number(x.iops), number(x.mib_s, 1), number(l.mean, 1), number(l.p50, 1), number(l.p99, 1), number(l.p99_9, 1), number(l.max, 1)]) {
      tr.append(el("td", v));
    }
    for (let i = 2; i < 9; i++) tr.cells[i].className = "num";
    return tr;
  });
  $("#bench-table tbody").replaceChildren(...rows);
  const img = $("#bench-plot");
  if (img.src) URL.revokeObjectURL(img.src);
  // As an image from a blob: the SVG is drawn, never run (no script in
  // an <img>), and the CSP allows only blob: images besides our own.
  img.src = URL.createObjectURL(new Blob([latest.svg], { type: "image/svg+xml" }));
}

// ---------------------------------------------------------------- start

function makeCharts() {
  const fig = (m) => document.querySelector(`figure[data-metric="${m}"]`);
  const c = state.charts;
  c.iops = new LineChart(fig("iops"), { format: (v) => number(v) });
  c.mibs = new LineChart(fig("mibs"), { format: (v) => number(v, v < 10 ? 1 : 0) });
  c.latency = new LineChart(fig("latency"), { format: (v) => number(v, v < 10 ? 1 : 0), emptyText: "no I/O yet" });
  c.hits = new LineChart(fig("hits"), { format: (v) => `${number(v, v >= 99 && v < 100 ? 1 : 0)}%`, max: 100, emptyText: "no cache requests yet" });
  c.dirty = new LineChart(fig("dirty"), { format: (v) => number(v, v < 10 ? 1 : 0), emptyText: "no persistent drives or caches" });
  c.lag = new LineChart(fig("lag"), { format: (v) => number(v, v < 10 ? 1 : 0), emptyText: "no persistent drives or caches" });
}

async function start() {
  makeCharts();
  $("#logout").addEventListener("click", logout);
  $("#create-drive").addEventListener("submit", (e) => {
    e.preventDefault();
    createDrive(e.target);
  });
  try {
    await loadWhoami();
    await refreshInventory();
  } catch (e) {
    if (e.status !== 401) notice("error", `Cannot read the daemon's state: ${e.message}`);
    return;
  }
  startEvents();
  loadBench().catch((e) => notice("error", `Cannot read the benchmark results: ${e.message}`));
  window.setInterval(() => refreshInventory().catch(() => {}), INVENTORY_MS);
  window.setInterval(() => loadBench().catch(() => {}), BENCH_MS);
}

document.addEventListener("DOMContentLoaded", start);
