"use strict";
(function () {
  const KEY = "backfill.console.key";
  const POLL_MS = 3000;
  const $ = (id) => document.getElementById(id);
  const state = { key: sessionStorage.getItem(KEY), session: null, view: null, cursor: [], samples: new Map(),
                  busy: false, lastBusy: null, pendingFile: null, lines: null };

  // ---- small helpers (text only: server data never becomes markup) ----
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
    return node;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    for (const child of children) node.append(child);
    return node;
  }
  function usd(v) {
    if (v === null || v === undefined) return "–";
    const n = Number(v), size = Math.abs(n);
    return "$" + n.toFixed(size >= 1 ? 2 : size >= 0.001 || size === 0 ? 4 : 6);  // a few micro-dollars are not $0.0000
  }
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 16) + " UTC" : "–");
  function left(seconds) {
    if (seconds <= 0) return "due";
    const hrs = Math.floor(seconds / 3600), mins = Math.floor((seconds % 3600) / 60);
    return hrs ? hrs + " h " + mins + " min" : mins ? mins + " min" : Math.ceil(seconds) + " s";
  }
  function say(text, error) { $("status").textContent = text || ""; $("status").className = error ? "error" : ""; }
  const ENDED = ["completed", "failed", "expired", "cancelled"];

  // ---- the one way to the server: the key goes in a header, never in a URL ----
  async function api(method, path, body, as, extra) {
    const headers = { ...(extra || {}), Authorization: "Bearer " + state.key };
    let payload;
    if (body instanceof FormData) payload = body;
    else if (body !== undefined) { headers["Content-Type"] = "application/json"; payload = JSON.stringify(body); }
    let response;
    try {
      response = await fetch(path, { method, headers, body: payload, credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer" });
    } catch (error) {
      return { ok: false, status: 0, body: { error: { message: "The server did not answer: " + error.message } }, headers: new Headers() };
    }
    if (response.status === 401 && state.session) { signOut("Your key was refused (revoked?): signed out."); }
    let parsed = null;
    if (response.status === 304) parsed = null;  // a conditional GET: what the caller holds is still the answer
    else if (as === "blob") parsed = response.ok ? await response.blob() : await response.json().catch(() => null);
    else if (as === "text") parsed = await response.text();
    else parsed = await response.json().catch(() => null);
    return { ok: response.ok, status: response.status, body: parsed, headers: response.headers };
  }
  const failure = (answer) => ((answer.body && answer.body.error && answer.body.error.message) || "HTTP " + answer.status);

  // ---- sign in and out ----
  async function signIn(key) {
    state.key = key;
    const answer = await api("GET", "/v1/console/whoami");
    if (!answer.ok) { state.key = null; say("Sign-in failed: " + failure(answer), true); return false; }
    state.session = answer.body;
    sessionStorage.setItem(KEY, key);
    $("nav").hidden = false; $("sign-out").hidden = false; $("nav-admin").hidden = !answer.body.is_admin;
    fillUploadChoices();
    return true;
  }
  function signOut(message) {
    sessionStorage.removeItem(KEY);
    state.key = null; state.session = null; state.samples.clear(); state.pendingFile = null; state.lines = null; window.BackfillControls.forget();
    $("nav").hidden = true; $("sign-out").hidden = true; $("key").value = "";
    for (const id of ["batch-table", "file-table", "hook-table"]) $(id).tBodies[0].replaceChildren();
    for (const id of ["batch-errors", "batch-preview", "hook-secret", "hook-deliveries", "admin-overview", "finance-chart", "finance-table", "finance-adapters", "upload-result", "batch-trial", "batch-workflow"]) $(id).replaceChildren();
    show("signin");
    say(message || "Signed out: the key is forgotten.");
  }
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (await signIn($("key").value.trim())) { $("key").value = ""; say(""); if (!location.hash || location.hash === "#/") location.hash = "#/batches"; route(); }
  });
  $("sign-out").addEventListener("click", () => signOut());

  // ---- views ----
  function show(name) {
    for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== "view-" + name;
    for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === name || (name === "batch" && link.dataset.view === "batches"));
    state.view = name;
  }
  async function route() {
    if (!state.session) { show("signin"); return; }
    const [, name, id] = (location.hash || "#/batches").split("/");
    const views = { batches: loadBatches, batch: () => loadBatch(decodeURIComponent(id || "")), upload: () => {}, files: loadFiles,
                    webhooks: loadHooks, finance: loadFinance, admin: loadAdmin };
    const view = views[name] ? name : "batches";
    show(view);
    say("");
    if (view === "batches") state.cursor = [];
    await views[view]();
    document.title = "Backfill · " + view;
  }
  window.addEventListener("hashchange", route);

  // ---- batches ----
  function bar(counts, width, wide) {
    const total = Math.max(counts.total, 1), w = width || 140;
    const done = (counts.completed / total) * w, failed = (counts.failed / total) * w;
    return s("svg", { width: w, height: 10, viewBox: "0 0 " + w + " 10", role: "img", class: wide ? "bar wide" : "bar", preserveAspectRatio: "none",
                      "aria-label": counts.completed + " done, " + counts.failed + " failed of " + counts.total,
                      "data-done": counts.completed, "data-failed": counts.failed, "data-total": counts.total },
      s("rect", { class: "rest", x: 0, y: 0, width: w, height: 10, rx: 3 }),
      s("rect", { class: "done", x: 0, y: 0, width: done.toFixed(1), height: 10 }),
      s("rect", { class: "failed", x: done.toFixed(1), y: 0, width: failed.toFixed(1), height: 10 }));
  }
  // spent against a cap or budget: a bar that turns red past 90 %, with its numbers as data-* for tests
  function meter(spent, cap, label) {
    const w = 300, share = cap > 0 ? Math.min(spent / cap, 1) : 1, level = cap > 0 && spent / cap >= 0.9 ? "over" : "spent";
    return s("svg", { viewBox: "0 0 " + w + " 10", class: "bar wide meter", role: "img", preserveAspectRatio: "none", "aria-label": label,
                      "data-spent": spent, "data-cap": cap },
      s("rect", { class: "rest", x: 0, y: 0, width: w, height: 10, rx: 3 }), s("rect", { class: level, x: 0, y: 0, width: (share * w).toFixed(1), height: 10, rx: 3 }));
  }
  const pct = (part, whole) => (whole > 0 ? Math.round((part / whole) * 100) + "%" : "–");
  const percent = (value) => Number(Number(value).toFixed(1)) + "%";  // "50.00" and 0.5 * 100 both read "50%"
  const figure = (n) => Number(n).toLocaleString("en-US");  // 1,522
  const workflow = window.BackfillWorkflow(h, usd, figure);  // a batch's trial, checks and attempts (workflow.js)
  // the discount, in one format whether or not anything was billed yet: "50% (24h)", then what it saved
  function discount(b) {
    const cost = b.cost, rate = state.session.completion_windows[b.completion_window];
    const share = cost && cost.discount_pct !== undefined ? cost.discount_pct : rate === undefined ? null : Number(rate) * 100;
    const text = (share === null ? "–" : percent(share)) + " (" + b.completion_window + ")";
    return cost && Number(cost.discount_usd) > 0 ? text + " · " + usd(cost.discount_usd) + " saved" : text;
  }
  const shownStatus = (b) => (b.paused_at && !ENDED.includes(b.status) ? "paused" : b.status);
  function timeLeft(b) {
    if (ENDED.includes(b.status)) return "ended";
    return b.expires_at === null || b.expires_at === undefined ? "no deadline" : left(b.expires_at - Date.now() / 1000);
  }
  function batchRow(b) {
    const c = b.request_counts, cost = b.cost || {};
    const theirs = b.tenant !== undefined && b.tenant !== state.session.tenant;  // an admin key's list: another tenant's
    return h("tr", { "data-batch": b.id, "data-tenant": b.tenant },
      h("td", {}, theirs ? h("code", {}, b.id) : h("a", { href: "#/batch/" + encodeURIComponent(b.id) }, h("code", {}, b.id)), " ",
        b.tenant !== undefined ? h("span", { class: "badge tenant" }, b.tenant) : null, " ",
        h("small", { class: "note" }, b.endpoint_label + (b.retry_of ? " · retry of " + b.retry_of.slice(-8) : "")
          + (b.priority ? " · priority " + b.priority : "") + (b.max_cost_usd !== null && b.max_cost_usd !== undefined ? " · cap " + usd(b.max_cost_usd) : ""))),
      h("td", { "data-label": "Status" }, h("span", { class: "badge " + shownStatus(b) }, shownStatus(b))),
      h("td", { class: "progress" }, bar(c), h("small", {}, " " + figure(c.completed) + " done · " + figure(c.failed) + " failed · " + figure(c.total))),
      h("td", { "data-label": "Left" }, timeLeft(b)),
      h("td", { class: "num", "data-label": "Cost" }, usd(cost.billed_usd)),
      h("td", { class: "num discount", "data-label": "Discount" }, discount(b)));
  }
  async function loadBatches() {
    const params = new URLSearchParams({ limit: "20" });
    if ($("filter-status").value) params.set("status", $("filter-status").value);
    if ($("filter-q").value.trim()) params.set("q", $("filter-q").value.trim());
    const after = state.cursor[state.cursor.length - 1];
    if (after) params.set("after", after);
    const answer = await api("GET", "/v1/console/batches?" + params);
    if (!answer.ok) { say("Batches: " + failure(answer), true); return; }
    const rows = answer.body.data;
    $("batch-table").tBodies[0].replaceChildren(...rows.map(batchRow));
    $("batches-empty").hidden = rows.length > 0;
    $("batches-scope").hidden = !state.session.is_admin;
    $("page-next").disabled = !answer.body.has_more; $("page-next").dataset.last = answer.body.last_id || "";
    $("page-first").disabled = state.cursor.length === 0;
    say("Batches updated " + new Date().toLocaleTimeString());
  }
  $("batch-filter").addEventListener("submit", (event) => { event.preventDefault(); state.cursor = []; loadBatches(); });
  $("page-next").addEventListener("click", () => { state.cursor.push($("page-next").dataset.last); loadBatches(); });
  $("page-first").addEventListener("click", () => { state.cursor = []; loadBatches(); });

  // ---- one batch ----
  function tile(label, value, id) { return h("div", { class: "tile", id: id || null }, h("small", {}, label), h("b", {}, value)); }
  function spendCap(b) {
    if (b.max_cost_usd === null || b.max_cost_usd === undefined) return [];
    const spent = Number((b.cost && b.cost.billed_usd) || 0), cap = Number(b.max_cost_usd);
    return [h("p", { class: "note" }, h("b", {}, "Spend cap: "), usd(spent) + " billed so far of " + usd(cap) + " (" + pct(spent, cap) + ")",
      spent >= cap ? " · reached: unrun lines end as budget_exceeded" : ""), meter(spent, cap, usd(spent) + " of a " + usd(cap) + " cap")];
  }
  function chart(points) {
    const w = 420, hgt = 140, pad = 28;
    const total = Math.max(1, ...points.map((p) => p.total));
    const t0 = points[0].t, span = Math.max(1, points[points.length - 1].t - t0);
    const x = (t) => pad + ((t - t0) / span) * (w - pad - 8), y = (v) => hgt - 18 - (v / total) * (hgt - 30);
    const path = (key) => points.map((p, i) => (i ? "L" : "M") + x(p.t).toFixed(1) + " " + y(p[key]).toFixed(1)).join(" ");
    return h("div", {}, s("svg", { viewBox: "0 0 " + w + " " + hgt, role: "img", id: "counts-chart", "aria-label": "Done and failed lines over time" },
      s("line", { class: "axis", x1: pad, x2: w - 8, y1: hgt - 18, y2: hgt - 18 }),
      s("text", { x: 2, y: y(total) + 4 }, String(total)), s("text", { x: 2, y: hgt - 14 }, "0"),
      s("text", { x: pad, y: hgt - 2 }, new Date(t0 * 1000).toLocaleTimeString()),
      s("text", { x: w - 70, y: hgt - 2 }, new Date((t0 + span) * 1000).toLocaleTimeString()),
      s("path", { class: "line-done", d: path("done") }), s("path", { class: "line-failed", d: path("failed") })),
      h("div", { class: "legend" }, h("span", {}, h("i", { class: "done" }), "done"), h("span", {}, h("i", { class: "failed" }), "failed")));
  }
  function costBlock(cost) {
    if (!cost) return h("p", { class: "note" }, "No line has completed yet.");
    const rows = [["Billed", usd(cost.billed_usd)], ["List price", usd(cost.list_usd)], ["Discount", percent(cost.discount_pct) + " · " + usd(cost.discount_usd)],
                  ["Compute cost", usd(cost.compute_usd)], ["GPU seconds", cost.gpu_seconds], ["Tokens in / out", cost.input_tokens + " / " + cost.output_tokens]];
    const w = 300, max = Math.max(Number(cost.list_usd), Number(cost.billed_usd), Number(cost.compute_usd), 1e-9);
    const bars = [["list", "list price", cost.list_usd], ["billed", "billed", cost.billed_usd], ["done", "compute", cost.compute_usd]];
    return h("div", {}, s("svg", { viewBox: "0 0 " + w + " 66", role: "img", class: "cost-chart", "aria-label": "List price, billed and compute cost" },
      ...bars.map(([cls, label, v], i) => s("g", {}, s("rect", { class: cls, x: 70, y: i * 22, height: 16, width: ((Number(v) / max) * (w - 80)).toFixed(1) }),
        s("text", { x: 0, y: i * 22 + 12 }, label)))),
      h("table", {}, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", { class: "num" }, String(v)))))));
  }
  function errorGroups(b) {
    const groups = b.failures.map((g) => ({ ...g, source: "lines" }));
    const byCode = new Map();
    for (const e of b.errors) {
      const g = byCode.get(e.code) || { code: e.code, count: 0, lines: [], source: "validation" };
      g.count += 1; g.lines.push({ line: e.line, custom_id: null, message: e.message }); byCode.set(e.code, g);
    }
    const all = [...byCode.values(), ...groups];
    if (!all.length) return h("p", { class: "note" }, b.request_counts.failed ? "Failed lines will be listed once recorded." : "No failed lines.");
    return h("div", { id: "error-groups" }, all.map((g) => h("details", { open: all.length <= 3, "data-code": g.code },
      h("summary", {}, h("b", {}, g.code), " · " + figure(g.count) + (g.count === 1 ? " line" : " lines") + (g.source === "validation" ? " (validation: the batch did not run)" : ""),
        g.lines.length < g.count ? h("span", { class: "note shown" }, " · the first " + g.lines.length + " listed; every line is in the error file") : null),
      h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Line"), h("th", {}, "custom_id"), h("th", {}, "Message"))),
        h("tbody", {}, g.lines.map((l) => h("tr", { class: "error-line" }, h("td", {}, l.line === null ? "–" : String(l.line)), h("td", {}, h("code", {}, l.custom_id || "–")), h("td", {}, l.message || "")))))),
    ));
  }
  // what the retries of this batch did (from their counts): its failed lines below are its own attempts
  function retried(b, link) {
    const r = b.retried;
    if (!r || !b.retries.length) return [];
    const failed = b.request_counts.failed, latest = b.retries[b.retries.length - 1];
    const parts = [h("b", {}, "Retried: "), figure(r.succeeded) + " of the " + figure(failed) + " failed lines below succeeded in a retry",
      r.failing ? ", " + figure(r.failing) + " still failing" : ", none is still failing", " (latest retry ", link(latest), ")."];
    if (r.running_retry) parts.push(" A retry is running (", link(r.running_retry), "): its lines count here as they succeed.");
    return [h("p", { class: "note", id: "retried-note", "data-succeeded": r.succeeded, "data-failing": r.failing }, ...parts,
      " ", h("button", { type: "button", class: "plain", "data-download": "merged", onclick: () => download("/v1/batches/" + encodeURIComponent(b.id) + "/results?merged=true", b.id + "_merged.jsonl") }, "Download merged results"),
      h("span", { class: "note" }, " (each line once, its latest attempt)"))];
  }
  async function firstLines(path, count, maxChars = 65536) {
    const response = await fetch(path, { headers: { Authorization: "Bearer " + state.key }, credentials: "omit", cache: "no-store" });
    if (!response.ok || !response.body) return null;
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let text = "";
    while (text.split("\n").length <= count && text.length < maxChars) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    reader.cancel().catch(() => {});
    return text.split("\n").filter(Boolean).slice(0, count);
  }
  async function preview(b) {
    const live = await window.BackfillControls.results(b, api, 5);
    let lines = live ? live.text.split("\n").filter(Boolean).slice(0, 5) : null;
    if (!lines && b.output_file_id) lines = await firstLines("/v1/files/" + encodeURIComponent(b.output_file_id) + "/content", 5);
    if (!lines && b.results_path && ENDED.includes(b.status)) lines = await firstLines(b.results_path, 5);
    if (!lines || !lines.length) return h("p", { class: "note" }, ENDED.includes(b.status) ? "No results." : "Results appear here as lines finish.");
    const answers = lines.map(answerOf).filter(Boolean);
    const raw = h("pre", { id: "results-preview" }, lines.map((l) => { try { return JSON.stringify(JSON.parse(l), null, 1); } catch { return l; } }).join("\n\n"));
    return h("div", {}, answers.length ? h("div", { id: "results-answers" }, answers) : null, raw);
  }
  // Every result line's attempts, a page of LINES_PAGE at a time (GET {lines_path}?limit=&after=, the results route's
  // own cursor, in the order lines finished), paged as the batch list is: a stack of the cursors before this page.
  // Each poll names the page it holds (If-None-Match): a batch that has not moved answers 304, no body.
  const LINES_PAGE = 10;
  async function attemptsPage(b) {
    if (!state.lines || state.lines.batch !== b.id) state.lines = { batch: b.id, cursor: [], held: null };
    const paging = state.lines, after = paging.cursor[paging.cursor.length - 1];
    const path = b.lines_path + "?limit=" + LINES_PAGE + (after ? "&after=" + encodeURIComponent(after) : "");
    const last = paging.held && paging.held.path === path ? paging.held : null;
    const answer = await api("GET", path, undefined, "text", last ? { "If-None-Match": last.etag } : undefined);
    let view = answer.status === 304 && last ? last.view : null;
    if (!view && answer.ok) {
      const items = answer.body.split("\n").filter(Boolean).map((l) => { try { return JSON.parse(l); } catch { return null; } });
      view = { items, next: answer.headers.get("X-Next-After"), more: answer.headers.get("X-Has-More") === "true",
               incomplete: answer.headers.get("X-Incomplete") === "true" };
      const etag = answer.headers.get("ETag");
      paging.held = etag ? { path, etag, view } : null;
    }
    $("lines-first").disabled = paging.cursor.length === 0;
    $("lines-next").disabled = !(view && view.more);
    $("lines-next").dataset.next = (view && view.next) || "";
    if (!view) return h("p", { class: "note" }, "Lines: " + failure(answer));
    const first = paging.cursor.length * LINES_PAGE + 1, upto = first + view.items.length - 1;
    const range = h("p", { class: "note", id: "lines-range", "data-first": first, "data-last": upto },
      view.items.length ? "Lines " + figure(first) + "–" + figure(upto) + " of those finished" + (view.incomplete && !view.more ? "; more come as the batch runs" : "") + "."
        : view.incomplete ? "No line has finished yet." : "No result lines.");
    return h("div", {}, range, workflow.attempts(view.items, !!b.checks)
      || (view.items.length ? h("p", { class: "note" }, "No line on this page was drawn again or cut.") : null));
  }
  $("lines-next").addEventListener("click", () => { if (state.lines && $("lines-next").dataset.next) { state.lines.cursor.push($("lines-next").dataset.next); refresh(true); } });
  $("lines-first").addEventListener("click", () => { if (state.lines) { state.lines.cursor = []; refresh(true); } });
  // a result line whose answer called tools or thought: its calls, then its reasoning folded (null for others)
  function answerOf(l) {
    let item; try { item = JSON.parse(l); } catch { return null; }
    const body = (item.response && item.response.body) || (item.result && item.result.message) || {};
    const calls = [], thoughts = [];
    for (const c of body.choices || []) {  // chat completions
      for (const t of (c.message && c.message.tool_calls) || []) calls.push([t.function.name, t.function.arguments]);
      if (c.message && c.message.reasoning_content) thoughts.push(c.message.reasoning_content);
    }
    for (const o of Array.isArray(body.output) ? body.output : []) {  // responses
      if (o.type === "function_call") calls.push([o.name, o.arguments]);
      if (o.type === "reasoning") thoughts.push((o.content || o.summary || []).map((p) => p.text).join("\n"));
    }
    for (const block of Array.isArray(body.content) ? body.content : []) {  // a Messages answer's content blocks
      if (block.type === "tool_use") calls.push([block.name, JSON.stringify(block.input)]);
      if (block.type === "thinking") thoughts.push(block.thinking);
    }
    if (!calls.length && !thoughts.length) return null;
    return h("div", { class: "result-answer" }, h("p", {}, h("code", {}, item.custom_id || "–")),
      calls.map(([name, args]) => h("p", { class: "tool-call" }, h("b", {}, "Calls "), h("code", {}, name + "(" + args + ")"))),
      thoughts.map((t) => h("details", { class: "reasoning" }, h("summary", {}, "Reasoning · " + figure(t.length) + " characters"), h("pre", {}, t))));
  }
  // ---- the lines sent: their images (data URLs shown; remote URLs named, never fetched by this page) ----
  const IMAGE_LINES = 5, INPUT_PREVIEW_CHARS = 4 * 1024 * 1024, RASTER = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$/;
  function mediaOf(value, found, depth) {  // every image and document part of a line, in order (any protocol)
    if (!value || typeof value !== "object" || depth > 16 || found.length >= 16) return found;
    if (Array.isArray(value)) { for (const item of value) mediaOf(item, found, depth + 1); return found; }
    const url = value.type === "image_url" ? (typeof value.image_url === "string" ? value.image_url : value.image_url && value.image_url.url)
      : value.type === "input_image" ? value.image_url || (value.file_id && "file " + value.file_id)
      : value.type === "image" && value.source ? (value.source.type === "base64" ? "data:" + value.source.media_type + ";base64," + value.source.data : value.source.url || value.source.file_id)
      : null;
    if (typeof url === "string") found.push({ image: url });
    else if (["document", "input_file", "file"].includes(value.type)) found.push({ document: value.filename || (value.file && value.file.filename) || (value.source && value.source.type) || value.type });
    else for (const child of Object.values(value)) mediaOf(child, found, depth + 1);
    return found;
  }
  function mediaItem(item, n) {
    if (item.document) return h("span", { class: "doc" }, "document: " + item.document);
    if (RASTER.test(item.image)) return h("img", { class: "thumb", src: item.image, alt: "image " + n });
    return h("code", { class: "image-url", title: "fetched by the worker; this page does not load it" }, item.image.slice(0, 120));
  }
  async function inputMedia(b) {
    const lines = await firstLines("/v1/files/" + encodeURIComponent(b.input_file_id) + "/content", 20, INPUT_PREVIEW_CHARS);
    const shown = [];
    for (const l of lines || []) {
      let item; try { item = JSON.parse(l); } catch { continue; }
      const found = mediaOf(item.body || item.params, [], 0);
      if (found.length) shown.push(h("div", { class: "line-media" }, h("p", {}, h("code", {}, item.custom_id || "–")), found.map((m, i) => mediaItem(m, i + 1))));
      if (shown.length >= IMAGE_LINES) break;
    }
    return shown.length ? h("div", { id: "images-sent" }, shown) : h("p", { class: "note" }, "None of the first lines carries an image or a document.");
  }
  async function download(path, name) {
    const answer = await api("GET", path, undefined, "blob");
    if (!answer.ok) { say("Download: " + failure(answer), true); return; }
    const url = URL.createObjectURL(answer.body);
    const link = h("a", { href: url, download: name });
    document.body.append(link); link.click(); link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    say("Downloaded " + name);
  }
  async function presigned(path, where) {
    const answer = await api("GET", path);
    where.replaceChildren(answer.ok ? h("a", { href: answer.body.url, target: "_blank", rel: "noopener noreferrer" }, "Presigned link (valid " + answer.body.expires_in + " s)")
                                    : h("span", { class: "note" }, failure(answer)));
  }
  function downloads(b) {
    const items = [];
    const file = (label, id, name) => {
      const slot = h("span", {});
      items.push(h("p", {}, h("button", { type: "button", class: "plain", "data-download": label, onclick: () => download("/v1/files/" + encodeURIComponent(id) + "/content", name) }, "Download " + label),
        " ", h("button", { type: "button", class: "plain", onclick: () => presigned("/v1/files/" + encodeURIComponent(id) + "/content_url", slot) }, "Presigned URL"), " ", slot));
    };
    if (b.output_file_id) file("output", b.output_file_id, b.id + "_output.jsonl");
    if (b.error_file_id) file("errors", b.error_file_id, b.id + "_errors.jsonl");
    if (b.results_path && ENDED.includes(b.status))
      items.push(h("p", {}, h("button", { type: "button", class: "plain", "data-download": "results", onclick: () => download(b.results_path, b.id + "_results.jsonl") }, "Download results")));
    file("input", b.input_file_id, b.id + "_input.jsonl");
    return h("div", {}, items);
  }
  async function manifest(b) {
    if (!b.has_manifest) return h("p", { class: "note" }, "Written when the batch ends.");
    const answer = await api("GET", "/v1/batches/" + encodeURIComponent(b.id) + "/manifest");
    return answer.ok ? h("details", {}, h("summary", {}, "manifest.json"), h("pre", {}, JSON.stringify(answer.body, null, 1))) : h("p", { class: "note" }, failure(answer));
  }
  async function loadBatch(id, quiet) {
    const answer = await api("GET", "/v1/console/batches/" + encodeURIComponent(id));
    if (!answer.ok) { say("Batch: " + failure(answer), true); $("batch-title").textContent = "Batch not found"; return; }
    // A page's first load clears the last batch's outcome now, before its awaits: a control pressed while the
    // preview and media still load keeps its outcome on screen.
    if (!quiet) $("control-outcome").replaceChildren();
    const b = answer.body, c = b.request_counts;
    const samples = state.samples.get(b.id) || [];
    const last = samples[samples.length - 1];
    if (!last || last.done !== c.completed || last.failed !== c.failed || samples.length < 2) samples.push({ t: Date.now() / 1000, done: c.completed, failed: c.failed, total: c.total });
    state.samples.set(b.id, samples.slice(-240));
    $("batch-title").replaceChildren(h("code", {}, b.id), " ", h("span", { class: "badge " + shownStatus(b), id: "batch-status" }, shownStatus(b)));
    const link = (id) => h("a", { href: "#/batch/" + encodeURIComponent(id) }, h("code", {}, id));
    $("batch-summary").replaceChildren(...[tile("Model", b.model || "–"), tile("Endpoint", b.endpoint), tile("Window", b.completion_window),
      tile("Created", when(b.created_at)), tile("Time left", timeLeft(b), "batch-left"), tile("Priority", String(b.priority), "batch-priority"),
      tile("Metadata", Object.keys(b.metadata).length ? JSON.stringify(b.metadata) : "–"),
      b.retry_of ? tile("Retry of", link(b.retry_of), "batch-retry-of") : null,
      b.retries.length ? tile("Retries", b.retries.flatMap((id, i) => (i ? [" ", link(id)] : [link(id)])), "batch-retries") : null].filter(Boolean));
    $("batch-progress").replaceChildren(bar(c, 600, true), h("p", { class: "note", id: "batch-counts" }, figure(c.completed) + " done · " + figure(c.failed) + " failed · " + figure(c.total) + " lines"));
    $("batch-cap").replaceChildren(...spendCap(b));
    $("batch-workflow").replaceChildren(workflow.settings(b));
    $("trial-card").hidden = !b.trial;
    $("batch-trial").replaceChildren(b.trial ? workflow.trial(b) : "");
    window.BackfillControls.render($("batch-controls"), b, api, (outcome) => {
      $("control-outcome").replaceChildren(outcome.text, outcome.batch ? link(outcome.batch) : "");
      refresh(true);
    });
    $("batch-chart").replaceChildren(chart(state.samples.get(b.id)));
    $("batch-cost").replaceChildren(costBlock(b.cost));
    $("batch-errors").replaceChildren(...retried(b, link), errorGroups(b));
    $("attempts-card").hidden = !(b.checks || b.status === "expired");  // redraws need checks; cuts, an expiry
    if (!$("attempts-card").hidden) $("batch-attempts").replaceChildren(await attemptsPage(b));
    if (!quiet || !ENDED.includes(b.status) || !$("batch-preview").dataset.ended) {
      $("batch-preview").replaceChildren(await preview(b));
      $("batch-downloads").replaceChildren(downloads(b));
      $("batch-manifest").replaceChildren(await manifest(b));
      $("batch-preview").dataset.ended = ENDED.includes(b.status) ? "1" : "";
    }
    if ($("batch-media").dataset.batch !== b.id) {  // the lines sent never change: read once per batch
      $("batch-media").dataset.batch = b.id;
      $("batch-media").replaceChildren(await inputMedia(b));
    }
    say("Batch updated " + new Date().toLocaleTimeString());
  }

  // ---- upload ----
  function fillUploadChoices() {
    const ep = $("upload-endpoint"), win = $("upload-window");
    ep.replaceChildren(...state.session.endpoints.map((e) => h("option", { value: e }, e)));
    win.replaceChildren(...Object.entries(state.session.completion_windows).map(([name, rate]) => h("option", { value: name }, name + " (" + Math.round(Number(rate) * 100) + "% off)")));
  }
  const drop = $("drop");
  for (const name of ["dragenter", "dragover"]) drop.addEventListener(name, (e) => { e.preventDefault(); drop.classList.add("over"); });
  for (const name of ["dragleave", "drop"]) drop.addEventListener(name, (e) => { e.preventDefault(); drop.classList.remove("over"); });
  drop.addEventListener("drop", (e) => { if (e.dataTransfer.files.length) { state.pendingFile = e.dataTransfer.files[0]; drop.firstChild.textContent = "Chosen: " + state.pendingFile.name + ". "; } });
  drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); $("upload-file").click(); } });
  $("upload-file").addEventListener("change", () => { state.pendingFile = $("upload-file").files[0] || null; });
  let checked = null;
  function metadata() {
    const text = $("upload-metadata").value.trim();
    if (!text) return undefined;
    const value = JSON.parse(text);
    if (typeof value !== "object" || Array.isArray(value) || value === null) throw new Error("metadata must be a JSON object");
    return value;
  }
  $("upload-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("upload-create").hidden = true; checked = null;
    const file = state.pendingFile;
    if (!file) { say("Choose or drop a .jsonl file first.", true); return; }
    try { metadata(); } catch (error) { say("Metadata: " + error.message, true); return; }
    const form = new FormData(); form.append("purpose", "batch"); form.append("file", file, file.name);
    say("Uploading " + file.name + "…");
    const uploaded = await api("POST", "/v1/files", form);
    if (!uploaded.ok) { say("Upload: " + failure(uploaded), true); return; }
    const choice = { input_file_id: uploaded.body.id, endpoint: $("upload-endpoint").value, completion_window: $("upload-window").value };
    if ($("upload-cap").value.trim()) choice.max_cost_usd = $("upload-cap").value.trim();
    const estimate = await api("POST", "/v1/batches/estimate", choice);
    const result = $("upload-result");
    if (!estimate.ok) { result.replaceChildren(h("p", { class: "problems", id: "upload-refused" }, failure(estimate))); say("The file cannot make a batch.", true); return; }
    const e = estimate.body, bad = e.skipped_lines;
    const parts = [h("div", { class: "tiles" }, tile("Valid lines", String(e.requests)), tile("Bad lines", String(bad)), tile("Estimated cost", usd(e.cost.billed_usd)),
      tile("List price", usd(e.cost.list_usd)), tile("Discount", percent(e.cost.discount_pct)), tile("Finishes by", when(e.finish_at)), tile("Fits window", e.fits_window ? "yes" : "no"))];
    if (bad) {
      parts.push(h("div", { class: "problems", id: "upload-problems" }, h("p", {}, bad + " bad " + (bad === 1 ? "line" : "lines") + ": fix " + (bad === 1 ? "it" : "them") + " before creating the batch" + (e.problems.length < bad ? " (first " + e.problems.length + " shown)" : "") + "."),
        h("ul", {}, e.problems.map((p) => h("li", { "data-line": p.line }, h("b", {}, "Line " + (p.line === null ? "?" : p.line)), " · " + p.code + ": " + p.message)))));
    }
    if (e.windows && e.windows.length) parts.push(windowMenu(e.windows, choice));
    result.replaceChildren(...parts);
    checked = choice;
    $("upload-create").hidden = false; $("upload-create").disabled = bad > 0;
    say(bad ? "Found " + bad + " bad lines." : "The file is valid: review the estimate and create the batch.", bad > 0);
  });
  // every window the server offers: its deadline, admission's predicted finish, its price; "Use" picks it for the create
  function windowMenu(windows, choice) {
    const rows = windows.map((w) => h("tr", { "data-window": w.completion_window, class: w.completion_window === choice.completion_window ? "chosen" : null },
      h("td", {}, w.completion_window), h("td", {}, w.deadline_at === null ? "none" : when(w.deadline_at)), h("td", {}, when(w.finish_at)),
      h("td", { class: "num" }, usd(w.price.billed_usd)), h("td", { class: "num" }, percent(w.price.discount_pct)),
      h("td", {}, w.admitted ? (w.warning ? "yes, at risk" : "yes") : h("span", { title: w.reason ? w.reason.message : "" }, "no: " + (w.reason ? w.reason.code : "refused"))),
      h("td", {}, h("button", { type: "button", class: "plain", disabled: !w.admitted, onclick: (event) => {
        choice.completion_window = w.completion_window; $("upload-window").value = w.completion_window;
        for (const row of event.target.closest("tbody").rows) row.classList.toggle("chosen", row.dataset.window === w.completion_window);
        say("Window " + w.completion_window + ": " + usd(w.price.billed_usd) + ", finishing by " + when(w.finish_at) + ".");
      } }, "Use"))));
    return h("table", { id: "upload-menu", "aria-label": "Every window: deadline, predicted finish, price" },
      h("thead", {}, h("tr", {}, ["Window", "Deadline", "Predicted finish", "Billed", "Discount", "Admitted", ""].map((t, i) => h("th", { class: i === 3 || i === 4 ? "num" : null }, t)))),
      h("tbody", {}, rows));
  }
  $("upload-create").addEventListener("click", async () => {
    if (!checked) return;
    const created = await api("POST", "/v1/batches", { ...checked, metadata: metadata() });
    if (!created.ok) { say("Create: " + failure(created), true); return; }
    checked = null; $("upload-create").hidden = true; $("upload-result").replaceChildren(); state.pendingFile = null; $("upload-file").value = ""; $("upload-cap").value = "";
    location.hash = "#/batch/" + encodeURIComponent(created.body.id);
  });

  // ---- files ----
  async function loadFiles(after) {
    const answer = await api("GET", "/v1/files?limit=20" + (after ? "&after=" + encodeURIComponent(after) : ""));
    if (!answer.ok) { say("Files: " + failure(answer), true); return; }
    const rows = answer.body.data.map((f) => h("tr", {}, h("td", {}, h("code", {}, f.id)), h("td", {}, f.filename), h("td", {}, f.purpose), h("td", { class: "num" }, String(f.bytes)), h("td", {}, when(f.created_at)),
      h("td", {}, h("button", { type: "button", class: "plain", onclick: async () => {
        if (!window.confirm("Delete " + f.id + " (" + f.filename + ")?")) return;
        const gone = await api("DELETE", "/v1/files/" + encodeURIComponent(f.id));
        say(gone.ok ? "Deleted " + f.id : "Delete: " + failure(gone), !gone.ok); loadFiles();
      } }, "Delete"))));
    const body = $("file-table").tBodies[0];
    if (after) body.append(...rows); else body.replaceChildren(...rows);
    $("files-more").disabled = !answer.body.has_more; $("files-more").dataset.last = answer.body.last_id || "";
  }
  $("files-more").addEventListener("click", () => loadFiles($("files-more").dataset.last));

  // ---- webhooks ----
  async function loadHooks() {
    const answer = await api("GET", "/v1/webhooks?limit=100");
    if (!answer.ok) { say("Webhooks: " + failure(answer), true); return; }
    $("hook-table").tBodies[0].replaceChildren(...answer.body.data.map((w) => h("tr", {}, h("td", {}, h("code", {}, w.id)), h("td", {}, w.url), h("td", {}, w.event_types.length + " events"),
      h("td", {}, h("button", { type: "button", class: "plain", onclick: () => loadDeliveries(w.id) }, "Deliveries"), " ",
        h("button", { type: "button", class: "plain", onclick: async () => {
          if (!window.confirm("Delete the endpoint " + w.url + "?")) return;
          const gone = await api("DELETE", "/v1/webhooks/" + encodeURIComponent(w.id)); say(gone.ok ? "Deleted " + w.id : failure(gone), !gone.ok); loadHooks();
        } }, "Delete")))));
  }
  async function loadDeliveries(id) {
    const answer = await api("GET", "/v1/webhooks/" + encodeURIComponent(id) + "/deliveries?limit=50");
    const where = $("hook-deliveries");
    if (!answer.ok) { where.replaceChildren(h("p", { class: "note" }, failure(answer))); return; }
    if (!answer.body.data.length) { where.replaceChildren(h("p", { class: "note" }, "No deliveries yet.")); return; }
    where.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Event"), h("th", {}, "Status"), h("th", {}, "Attempts"), h("th", {}, "Created"))),
      h("tbody", {}, answer.body.data.map((d) => h("tr", {}, h("td", {}, String(d.event.type || "")), h("td", {}, d.status),
        h("td", { class: "attempts" }, d.attempts.map((a) => String(a.status_code ?? a.error ?? "–")).join(", ") || "none yet"), h("td", {}, when(d.created_at)))))));
  }
  $("hook-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const created = await api("POST", "/v1/webhooks", { url: $("hook-url").value.trim() });
    if (!created.ok) { say("Register: " + failure(created), true); return; }
    $("hook-url").value = "";
    $("hook-secret").replaceChildren(h("div", { class: "secret" }, h("p", {}, "Signing secret for " + created.body.url + ", shown once: store it now."), h("code", { id: "hook-secret-value" }, created.body.signing_secret),
      " ", h("button", { type: "button", class: "plain", onclick: () => $("hook-secret").replaceChildren() }, "I stored it")));
    loadHooks();
  });

  // ---- finance ----
  function budgetLine(b) {
    const spent = Number(b.spent_usd);
    if (b.monthly_budget_usd === null) return [h("p", {}, usd(spent) + " billed this month · no monthly budget set (an admin sets one).")];
    const cap = Number(b.monthly_budget_usd);
    return [h("p", {}, h("b", {}, usd(spent)), " of " + usd(cap) + " this month (" + pct(spent, cap) + ") · " + usd(Number(b.remaining_usd)) + " left"),
      meter(spent, cap, usd(spent) + " of a " + usd(cap) + " monthly budget")];
  }
  async function loadBudgets() {
    const own = await api("GET", "/v1/organization/budgets");
    $("finance-budget").replaceChildren(...(own.ok ? budgetLine(own.body) : [h("p", { class: "note" }, failure(own))]));
    $("budgets-card").hidden = !state.session.is_admin;
    if (!state.session.is_admin) return;
    const all = await api("GET", "/v1/console/budgets");
    if (!all.ok) { $("finance-budgets").replaceChildren(h("p", { class: "note" }, failure(all))); return; }
    $("finance-budgets").replaceChildren(all.body.data.length ? h("table", { id: "budget-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "Tenant"), h("th", { class: "num" }, "Spent"), h("th", { class: "num" }, "Budget"), h("th", { class: "meter-cell" }, "This month"))),
      h("tbody", {}, all.body.data.map((b) => h("tr", { "data-tenant": b.tenant || b.tenant_id }, h("td", {}, b.tenant || b.tenant_id),
        h("td", { class: "num" }, usd(Number(b.spent_usd))), h("td", { class: "num" }, b.monthly_budget_usd === null ? "none" : usd(Number(b.monthly_budget_usd))),
        h("td", { class: "meter-cell" }, b.monthly_budget_usd === null ? "–" : meter(Number(b.spent_usd), Number(b.monthly_budget_usd), pct(Number(b.spent_usd), Number(b.monthly_budget_usd)) + " of the budget"))))))
      : h("p", { class: "note" }, "No tenant has a budget or spend this month."));
  }
  async function loadFinance() {
    await loadBudgets();
    const start = Math.floor(Date.now() / 86400000 - 13) * 86400;
    const answer = await api("GET", "/v1/organization/costs?start_time=" + start);
    if (!answer.ok) { say("Finance: " + failure(answer), true); return; }
    const days = answer.body.data.map((b) => ({ day: new Date(b.start_time * 1000).toISOString().slice(5, 10),
      list: b.results.reduce((a, r) => a + Number(r.list_usd), 0), billed: b.results.reduce((a, r) => a + Number(r.billed_usd), 0) }));
    const w = 640, hgt = 180, max = Math.max(1e-9, ...days.map((d) => d.list)), step = (w - 40) / Math.max(days.length, 1);
    const y = (v) => hgt - 20 - (v / max) * (hgt - 34);
    const every = Math.ceil(days.length / 5);
    $("finance-chart").replaceChildren(s("svg", { viewBox: "0 0 " + w + " " + hgt, role: "img", id: "spend-chart", "aria-label": "Billed and list price per day" },
      s("text", { x: 0, y: 12 }, usd(max)), s("line", { class: "axis", x1: 40, x2: w, y1: hgt - 20, y2: hgt - 20 }),
      ...days.map((d, i) => s("g", {}, s("rect", { class: "list", x: 40 + i * step + 2, y: y(d.list), width: step / 2 - 2, height: hgt - 20 - y(d.list) }),
        s("rect", { class: "billed", x: 40 + i * step + step / 2, y: y(d.billed), width: step / 2 - 2, height: hgt - 20 - y(d.billed) }),
        i % every ? s("g", {}) : s("text", { x: 40 + i * step, y: hgt - 4 }, d.day)))),
      h("div", { class: "legend" }, h("span", {}, h("i", { class: "list" }), "list price"), h("span", {}, h("i", { class: "billed" }), "billed")));
    $("finance-table").replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Day"), h("th", { class: "num" }, "List"), h("th", { class: "num" }, "Billed"), h("th", { class: "num" }, "Saved"))),
      h("tbody", {}, days.filter((d) => d.list > 0).map((d) => h("tr", {}, h("td", {}, d.day), h("td", { class: "num" }, usd(d.list)), h("td", { class: "num" }, usd(d.billed)), h("td", { class: "num" }, usd(d.list - d.billed)))))));
    await loadAdapterCosts(start);
  }
  // Cost per model and LoRA adapter (docs/adapters.md): the costs report grouped by model and adapter, summed over days.
  async function loadAdapterCosts(start) {
    const answer = await api("GET", "/v1/organization/costs?start_time=" + start + "&group_by=model,adapter");
    if (!answer.ok) { $("finance-adapters").replaceChildren(h("p", { class: "note" }, failure(answer))); return; }
    const rows = new Map();
    for (const bucket of answer.body.data) for (const r of bucket.results) {
      const key = JSON.stringify([r.model, r.adapter]);
      const row = rows.get(key) || { model: r.model, adapter: r.adapter, requests: 0, list: 0, billed: 0 };
      row.requests += r.num_model_requests; row.list += Number(r.list_usd); row.billed += Number(r.billed_usd);
      rows.set(key, row);
    }
    const sorted = [...rows.values()].sort((a, b) => b.billed - a.billed || String(a.adapter).localeCompare(String(b.adapter)));
    $("finance-adapters").replaceChildren(sorted.length ? h("table", { id: "adapter-cost-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "Model"), h("th", {}, "Adapter"), h("th", { class: "num" }, "Requests"), h("th", { class: "num" }, "List"), h("th", { class: "num" }, "Billed"))),
      h("tbody", {}, sorted.map((r) => h("tr", { "data-model": r.model, "data-adapter": r.adapter || "" }, h("td", {}, r.model), h("td", {}, r.adapter || h("em", {}, "base")),
        h("td", { class: "num" }, String(r.requests)), h("td", { class: "num" }, usd(r.list)), h("td", { class: "num" }, usd(r.billed))))))
      : h("p", { class: "note" }, "No line finished in these 14 days."));
  }

  // ---- operations (admin keys) ----
  // Horizontal bars, one row per model, its parts stacked; its figure at the end. data-* carry the numbers.
  function hbars(id, rows, max, legend) {
    if (!rows.length) return h("p", { class: "note" }, "No model is served or queued yet.");
    // legible at 360 px; the figure's room fits the longest one (about 7 units a character at 12 px), never cut
    const longest = Math.max(...rows.map((r) => r.label.length));
    const w = 300, rowH = 24, labelW = 100, valueW = Math.min(120, Math.max(40, 10 + 7.5 * longest)), barW = w - labelW - valueW;
    const clip = (name) => (name.length > 15 ? name.slice(0, 14) + "…" : name);
    return h("div", {}, s("svg", { viewBox: "0 0 " + w + " " + (rows.length * rowH + 4), role: "img", id, class: "hbars", "aria-label": rows.map((r) => r.name + ": " + (r.title || r.label)).join("; ") },
      ...rows.map((r, i) => {
        const y = i * rowH + 4;
        let x = labelW;
        const parts = r.parts.map((p) => { const width = (Math.min(p.value, max) / max) * barW; const rect = s("rect", { class: p.cls, x: x.toFixed(1), y, width: width.toFixed(1), height: 14 }); x += width; return rect; });
        const attrs = { "data-model": r.name };
        if (r.total !== null) attrs["data-value"] = r.total;
        return s("g", attrs, s("title", {}, r.name + ": " + (r.title || r.label)), s("text", { x: 0, y: y + 11 }, clip(r.name)),
          s("rect", { class: "rest", x: labelW, y, width: barW, height: 14, rx: 2 }), ...parts, s("text", { x: labelW + barW + 6, y: y + 11 }, r.label));
      })),
      h("div", { class: "legend" }, legend.map(([cls, text]) => h("span", {}, h("i", { class: cls }), text))));
  }
  async function loadAdmin() {
    const answer = await api("GET", "/v1/console/overview");
    if (!answer.ok) { $("admin-overview").replaceChildren(h("p", { class: "note" }, failure(answer))); return; }
    const o = answer.body, previous = state.lastBusy;
    state.lastBusy = { at: o.at, busy: Object.fromEntries(o.models.map((m) => [m.model, m.busy_seconds || 0])) };
    const share = (m) => (previous && o.at > previous.at ? Math.min(1, ((m.busy_seconds || 0) - (previous.busy[m.model] || 0)) / (o.at - previous.at)) : null);
    // the figure is the depth (running + queued); the parts are in the bar's colours, its title and the table
    const depth = o.models.map((m) => { const running = m.open.running || 0, queued = m.open.queued || 0;
      return { name: m.model, total: running + queued, parts: [{ cls: "running", value: running }, { cls: "queued", value: queued }],
               label: figure(running + queued), title: figure(running) + " running + " + figure(queued) + " queued" }; });
    const risk = o.models.map((m) => ({ name: m.model, total: m.at_risk || 0, parts: [{ cls: "failed", value: m.at_risk || 0 }], label: String(m.at_risk ?? "–") }));
    const busyRows = o.models.map((m) => { const v = share(m); return { name: m.model, total: v === null ? null : Math.round(v * 100),
      parts: [{ cls: "done", value: v || 0 }], label: v === null ? "measuring…" : (v * 100).toFixed(0) + "%" }; });
    $("chart-queue").replaceChildren(hbars("queue-chart", depth, Math.max(1, ...depth.map((r) => r.total)), [["running", "running"], ["queued", "queued"]]));
    $("chart-risk").replaceChildren(hbars("risk-chart", risk, Math.max(1, ...risk.map((r) => r.total)), [["failed", "requests that may miss their deadline"]]));
    $("chart-busy").replaceChildren(hbars("busy-chart", busyRows, 1, [["done", "share of the last poll's seconds spent in engine steps"]]));
    // one row per completion window: the median of (actual - predicted finish) over the week's ended batches
    const late = (sec) => (sec === 0 ? "on time" : sec > 0 ? left(sec) + " late" : left(-sec) + " early");
    const finish = (o.finish_errors || []).map((w) => ({ name: w.completion_window, total: w.median_error_seconds,
      parts: [{ cls: w.median_error_seconds > 0 ? "failed" : "done", value: Math.abs(w.median_error_seconds) }], label: late(w.median_error_seconds),
      title: "median " + late(w.median_error_seconds) + ", worst " + late(w.worst_error_seconds) + " over " + w.batches + " batches (" + w.expired + " expired)" }));
    $("chart-finish").replaceChildren(finish.length ? hbars("finish-chart", finish, Math.max(60, ...finish.map((r) => Math.abs(r.total))), [["failed", "later than predicted"], ["done", "earlier"]])
      : h("p", { class: "note" }, "No batch with a predicted finish has ended this week."));
    $("admin-overview").replaceChildren(h("table", { id: "overview-table" }, h("thead", {}, h("tr", {}, ["Model", "Queued", "Running", "At risk", "Slack", "Goodput", "Engine busy"].map((t, i) => h("th", { class: i ? "num" : null }, t)))),
      h("tbody", {}, o.models.map((m) => { const busy = share(m); return h("tr", {}, h("td", {}, m.model), h("td", { class: "num" }, figure(m.open.queued || 0)), h("td", { class: "num" }, figure(m.open.running || 0)),
        h("td", { class: "num" }, String(m.at_risk ?? "–")), h("td", { class: "num" }, m.slack_seconds === null || m.slack_seconds === undefined ? "–" : left(m.slack_seconds)),
        h("td", { class: "num" }, m.goodput === null || m.goodput === undefined ? "–" : (m.goodput * 100).toFixed(1) + "%"),
        h("td", { class: "num" }, busy === null ? "measuring…" : (busy * 100).toFixed(0) + "%")); }))));
  }

  // ---- live updates: one poll at a time per tab, only while visible ----
  // `soon`: after an action, reload once more when the poll in flight (which may predate it) ends
  async function refresh(soon) {
    if (!state.session || document.hidden) return;
    if (state.busy) { state.again = state.again || soon === true; return; }
    state.busy = true;
    try {
      do {
        state.again = false;
        if (state.view === "batches") await loadBatches();
        else if (state.view === "batch") await loadBatch(decodeURIComponent((location.hash.split("/")[2]) || ""), true);
        else if (state.view === "admin") await loadAdmin();
      } while (state.again);
    } finally { state.busy = false; }
  }
  setInterval(refresh, POLL_MS);

  (async () => {
    if (state.key && (await signIn(state.key))) route();
    else { state.key = null; show("signin"); }
  })();
})();
