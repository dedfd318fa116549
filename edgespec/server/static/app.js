// edgespec's chat page: a client of this server's /v1/chat/completions (docs/web.md). No build step, no framework.
// Safety: model and user text goes into the page as text (textContent) or, for the rendered markdown, through
// DOMPurify; the server's Content-Security-Policy allows scripts from this server only.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const KEY_STORE = "edgespec.apiKey";
const CONV_STORE = "edgespec.conversations";
const SETTINGS_STORE = "edgespec.settings";
const NUMBERS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "seed"];

const state = {
  conversations: [],   // [{id, title, messages: [{role, content, sources?, stats?, error?}]}]
  current: null,
  busy: false,
  controllers: [],     // AbortControllers of the requests in flight (Stop aborts them: the server cancels)
  slots: 1,
  hasDraft: false,
  model: null,         // the model the page asks for (/v1/models' first: the pinned one, else the first served by name)
  live: new Set(),     // the answers streaming now: each one's redraw (the sources toggle asks them to redraw)
};

// ------------------------------------------------------------------------------------------ storage
function load(store, key, fallback) {
  try { const v = JSON.parse(store.getItem(key)); return v === null ? fallback : v; } catch { return fallback; }
}
function save() {
  try { localStorage.setItem(CONV_STORE, JSON.stringify(state.conversations)); }
  catch { notice("This browser's storage is full: the conversation is not kept."); }
}
function apiKey() { return sessionStorage.getItem(KEY_STORE) || localStorage.getItem(KEY_STORE) || ""; }

// ------------------------------------------------------------------------------------------ API
async function api(path, options = {}, retry = true) {
  const headers = Object.assign({}, options.headers || {});
  const key = apiKey();
  if (key) headers["Authorization"] = "Bearer " + key;
  const res = await fetch(path, Object.assign({}, options, { headers }));
  if (res.status === 401 && retry) {
    await askKey();
    return api(path, options, false);
  }
  return res;
}

function askKey() {
  const dialog = $("#key-dialog"), form = $("#key-form");
  return new Promise((resolve) => {
    form.onsubmit = (ev) => {
      ev.preventDefault();
      const key = form.apikey.value.trim();
      sessionStorage.setItem(KEY_STORE, key);
      if (form.remember.checked) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
      dialog.close();
      resolve();
    };
    if (!dialog.open) dialog.show();
    form.apikey.focus();
  });
}

async function errorText(res) {
  try { const j = await res.json(); return (j.error && j.error.message) || JSON.stringify(j); }
  catch { return res.status + " " + res.statusText; }
}

// One streamed chat completion: onPiece(text, source) per token, returns {stats, finish, error}.
async function streamChat(messages, opts, onPiece, signal) {
  const body = Object.assign({ messages, stream: true, show_sources: true }, state.model ? { model: state.model } : {}, opts);
  const res = await api("/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
  });
  if (!res.ok) return { error: await errorText(res) };
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "", out = { stats: null, finish: null, error: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return out;
        const j = JSON.parse(data);
        if (j.error) { out.error = j.error.message || "error"; continue; }
        if (j.edgespec) out.stats = { timings: j.timings, edgespec: j.edgespec };
        const choice = j.choices && j.choices[0];
        if (!choice) continue;
        if (choice.finish_reason) out.finish = choice.finish_reason;
        const delta = choice.delta || {};
        if (choice.sources) for (const [text, source] of choice.sources) onPiece(text, source);
        else if (delta.content) onPiece(delta.content, "target");
      }
    }
  }
  return out;
}

function requestOptions(overrides = {}) {
  const s = settings();
  const o = { max_tokens: s.max_tokens || 512 };
  for (const k of NUMBERS) if (k !== "max_tokens" && s[k] !== null) o[k] = s[k];
  if (s.drafter && s.drafter !== "auto") o.drafter = s.drafter;
  return Object.assign(o, overrides);
}

// ------------------------------------------------------------------------------------------ settings
function settings() {
  const p = $("#settings-panel"), out = { system: p.querySelector("[name=system]").value,
                                         drafter: p.querySelector("[name=drafter]").value };
  for (const k of NUMBERS) {
    const v = p.querySelector(`[name=${k}]`).value.trim();
    out[k] = v === "" || !isFinite(Number(v)) ? null : Number(v);
  }
  return out;
}
function restoreSettings() {
  const saved = load(localStorage, SETTINGS_STORE, {});
  const p = $("#settings-panel");
  for (const [k, v] of Object.entries(saved)) {
    const el = p.querySelector(`[name="${CSS.escape(k)}"]`);
    if (el && v !== null && v !== undefined) el.value = v;
  }
  p.addEventListener("change", () => localStorage.setItem(SETTINGS_STORE, JSON.stringify(settings())));
}

// ------------------------------------------------------------------------------------------ conversations
function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  state.conversations.unshift(c);
  state.current = c;
  save();
  renderAll();
}
function renderList() {
  const ul = $("#conversations");
  ul.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement("li");
    if (c === state.current) li.className = "current";
    const open = button(c.title, "open", () => { state.current = c; renderAll(); closeMenu(); });
    open.title = c.title;
    const rename = button("✎", "small", () => {
      const t = prompt("Rename the conversation", c.title);
      if (t !== null && t.trim()) { c.title = t.trim().slice(0, 200); save(); renderList(); }
    });
    rename.name = "rename"; rename.title = "Rename";
    const del = button("✕", "small", () => {
      if (!confirm(`Delete "${c.title}"?`)) return;
      state.conversations = state.conversations.filter((x) => x !== c);
      if (state.current === c) state.current = state.conversations[0] || null;
      if (!state.current) newConversation(); else { save(); renderAll(); }
    });
    del.name = "delete"; del.title = "Delete";
    li.append(open, rename, del);
    ul.append(li);
  }
}
function button(text, cls, onclick) {
  const b = document.createElement("button");
  b.type = "button"; b.className = cls; b.textContent = text; b.addEventListener("click", onclick);
  return b;
}

// ------------------------------------------------------------------------------------------ messages
function renderAll() {
  renderList();
  $("#title").textContent = state.current ? state.current.title : "edgespec";
  const box = $("#messages");
  box.replaceChildren();
  if (!state.current) return;
  const msgs = state.current.messages;
  msgs.forEach((m, i) => {
    if (m.role === "user") box.append(userMessage(m, i === msgs.length - 1 || i === msgs.length - 2));
    else if (m.race) box.append(raceView(m));
    else {
      const view = assistantMessage();
      view.restore(m);
      box.append(view.el);
    }
  });
  addActions();
  box.scrollTop = box.scrollHeight;
}

function userMessage(m) {
  const el = document.createElement("div");
  el.className = "message user";
  el.textContent = m.content;
  return el;
}

// An assistant answer. While it streams, its tokens are appended as span[data-source] (batched per animation frame;
// the "sources" toggle shows them, coloured) and, when the sources are hidden, its markdown is rendered again from the
// text so far: sanitized each time, at most once per RENDER_MS and never more than a fifth of the time (a slow render
// waits longer), so a long answer streams without dropping frames. At the end it is rendered once more, whole.
const RENDER_MS = 50;
function assistantMessage(label) {
  const el = document.createElement("div");
  el.className = "message assistant";
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = label || "assistant";
  const tokens = document.createElement("div");
  tokens.className = "tokens";
  const md = document.createElement("div");
  md.className = "markdown";
  const stats = document.createElement("div");
  stats.className = "stats";
  el.append(role, tokens, md, stats);
  let pending = [], scheduled = false, text = "", sources = [];
  let shown = -1, lastRender = -Infinity, renderCost = 0, timer = 0;
  const schedule = () => { if (!scheduled) { scheduled = true; requestAnimationFrame(flush); } };
  const render = (final) => {
    const t0 = performance.now();
    renderMarkdown(md, text, final);
    lastRender = performance.now();
    renderCost = lastRender - t0;
    shown = text.length;
  };
  const flush = () => {
    scheduled = false;
    const box = $("#messages");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    if (pending.length) {
      const frag = document.createDocumentFragment();
      for (const [t, s] of pending) {
        const span = document.createElement("span");
        span.dataset.source = s;
        span.textContent = t;
        frag.append(span);
      }
      pending = [];
      tokens.append(frag);
    }
    if (shown !== text.length && !document.body.classList.contains("show-sources")) {
      const wait = lastRender + Math.max(RENDER_MS, 4 * renderCost) - performance.now();
      if (wait <= 0) render(false);
      else if (!timer) timer = setTimeout(() => { timer = 0; schedule(); }, wait);
    }
    if (atBottom) box.scrollTop = box.scrollHeight;
  };
  state.live.add(schedule);
  return {
    el,
    get text() { return text; },
    get sources() { return sources; },
    piece(t, s) {
      const src = s === "draft" || s === "lookup" ? s : "target";
      text += t; sources.push([t, src]); pending.push([t, src]);
      schedule();
    },
    finish(result) {
      state.live.delete(schedule);
      clearTimeout(timer);
      shown = text.length;  // the flush below appends the last tokens; the markdown is rendered here, whole
      flush();
      render(true);
      el.classList.add("rendered");
      if (result.error) {
        const err = document.createElement("div");
        err.className = "error-text";
        err.textContent = result.error;
        el.append(err);
      }
      stats.textContent = statsLine(result);
    },
    restore(m) {
      for (const [t, s] of m.sources || [[m.content, "target"]]) this.piece(t, s);
      this.finish({ stats: m.stats, finish: m.finish, error: m.error, seconds: m.seconds });
    },
    record(result) {
      return { role: "assistant", content: text, sources, stats: result.stats, finish: result.finish,
               error: result.error || undefined, seconds: result.seconds };
    },
  };
}

// The markdown of `text` into `el`, each piece of HTML sanitized by DOMPurify first. Rendered again as an answer
// streams, only what changed is redone: the text's top-level blocks (paragraphs, lists, code blocks) whose source is
// unchanged since the last render keep their elements, so a render costs about the last block's size, not the
// answer's. Code blocks that name a language highlight.js knows are highlighted at once; the `final` render adds the
// copy buttons and highlights the others (guessing their language is slow: one block per task, after the answer).
const BLOCKS = new WeakMap();  // element -> [{raw, nodes}] of its last render
const PURIFY = { USE_PROFILES: { html: true } };
function renderMarkdown(el, text, final = true) {
  if (!window.DOMPurify || !window.marked) { el.textContent = text; return; }
  const tokens = marked.lexer(text, { gfm: true, breaks: false });
  const old = BLOCKS.get(el) || [], blocks = [];
  let i = 0;
  if (!old.length) el.replaceChildren();
  const reuse = !final || !Object.keys(tokens.links).length;  // a reference link may be defined after its use
  while (reuse && i < tokens.length && i < old.length && old[i].raw === tokens[i].raw) blocks.push(old[i++]);
  for (const b of old.slice(i)) for (const n of b.nodes) n.remove();
  for (; i < tokens.length; i++) {
    const one = [tokens[i]];
    one.links = tokens.links;
    const tpl = document.createElement("template");
    tpl.innerHTML = DOMPurify.sanitize(marked.parser(one, { gfm: true, breaks: false }), PURIFY);
    for (const a of tpl.content.querySelectorAll("a")) { a.target = "_blank"; a.rel = "noopener noreferrer"; }
    for (const code of tpl.content.querySelectorAll("pre > code")) {
      const lang = (/\blanguage-(\S+)/.exec(code.className) || [])[1];
      if (window.hljs && lang && hljs.getLanguage(lang)) highlight(code);
    }
    blocks.push({ raw: tokens[i].raw, nodes: [...tpl.content.childNodes] });
    el.append(tpl.content);
  }
  BLOCKS.set(el, blocks);
  if (!final) return;
  for (const code of el.querySelectorAll("pre > code")) {
    if (!code.dataset.highlighted) highlightLater(code);
    const copy = button("copy", "copy", async () => {
      try { await navigator.clipboard.writeText(code.textContent); copy.textContent = "copied"; }
      catch { copy.textContent = "copy failed"; }
      setTimeout(() => { copy.textContent = "copy"; }, 1500);
    });
    copy.name = "copy";
    code.parentElement.append(copy);
  }
}

// The languages highlight.js guesses among for a code block that names none (fewer guesses, faster), compiled while
// the page is idle after it loads rather than in the first answer's highlighting.
const GUESS = ["python", "javascript", "typescript", "bash", "shell", "c", "cpp", "csharp", "java", "go", "rust", "json",
               "yaml", "sql", "xml", "css", "markdown", "diff"];
function prepareHighlighting() {
  if (!window.hljs) return;
  hljs.configure({ languages: GUESS });
  (window.requestIdleCallback || setTimeout)(() => hljs.highlightAuto("x = 1"));
}
function highlight(code) {
  try { hljs.highlightElement(code); } catch { /* an unknown language stays plain */ }
}
const toHighlight = [];
function highlightLater(code) {
  if (!window.hljs) return;
  toHighlight.push(code);
  if (toHighlight.length === 1) setTimeout(highlightNext, 0);
}
function highlightNext() {
  const code = toHighlight[0];
  if (code.isConnected && !code.dataset.highlighted) highlight(code);
  toHighlight.shift();
  if (toHighlight.length) setTimeout(highlightNext, 0);
}

function statsLine(r) {
  const parts = [];
  if (r.stats && r.stats.timings) {
    const t = r.stats.timings, e = r.stats.edgespec || {};
    parts.push(`${t.predicted_n} tokens`, `${Number(t.predicted_per_second).toFixed(1)} tok/s`);
    if (e.n_drafted) {
      parts.push(`μ ${Number(e.mu).toFixed(2)}`, `acceptance ${(100 * e.acceptance).toFixed(0)}%`,
                 `drafted/accepted ${e.n_drafted}/${e.n_accepted}`);
    }
    const used = Object.entries(e.sources || {}).filter(([k]) => k !== "plain").sort((a, b) => b[1] - a[1]);
    parts.push(`drafter ${e.drafter || "?"}` + (used.length ? ` (used: ${used.map(([k, n]) => `${k} ×${n}`).join(", ")})` : ""));
  }
  if (r.seconds) parts.push(`${r.seconds.toFixed(2)} s`);
  if (r.finish && r.finish !== "stop") parts.push(r.finish === "length" ? "cut at max tokens" : r.finish);
  return parts.join(" · ");
}

// ------------------------------------------------------------------------------------------ sending
function history(msgs) {
  const s = settings(), out = [];
  if (s.system.trim()) out.push({ role: "system", content: s.system });
  for (const m of msgs) {
    if (m.race) out.push({ role: "assistant", content: m.columns[0].content });
    else if (!m.error || m.content) out.push({ role: m.role, content: m.content });
  }
  return out;
}

async function send(text) {
  if (state.busy) return;
  const conv = state.current;
  if (text !== null) {
    if (!text.trim()) return;
    conv.messages.push({ role: "user", content: text });
    if (conv.title === "New chat") conv.title = text.trim().split("\n")[0].slice(0, 60);
  }
  setBusy(true);
  save();
  renderAll();
  const msgs = history(conv.messages);
  try {
    if ($("[name=race]").checked) conv.messages.push(await race(msgs));
    else conv.messages.push(await answer(msgs));
  } finally {
    setBusy(false);
    save();
    renderAll();
  }
}

async function run(view, msgs, opts) {
  const ctl = new AbortController();
  state.controllers.push(ctl);
  const t0 = performance.now();
  let result;
  try {
    result = await streamChat(msgs, opts, (t, s) => view.piece(t, s), ctl.signal);
  } catch (e) {
    result = { error: ctl.signal.aborted ? null : String(e), finish: ctl.signal.aborted ? "stopped" : null };
  }
  result.seconds = (performance.now() - t0) / 1000;
  if (ctl.signal.aborted) result.finish = "stopped";
  view.finish(result);
  return result;
}

async function answer(msgs) {
  const view = assistantMessage();
  $("#messages").append(view.el);
  const result = await run(view, msgs, requestOptions());
  return view.record(result);
}

// Race: the same prompt, settings and seed, speculative and plain. On two slots both run at once; on one they would
// queue (the second waits for the first), so they run one after the other and each is timed on its own.
async function race(msgs) {
  const seed = settings().seed ?? Math.floor(Math.random() * 2 ** 31);
  const el = raceView(null);
  $("#messages").append(el);
  const [specView, plainView] = el.views;
  const spec = requestOptions({ seed }), plain = requestOptions({ seed, speculative: false });
  delete plain.drafter;
  let rs, rp;
  if (state.slots >= 2) [rs, rp] = await Promise.all([run(specView, msgs, spec), run(plainView, msgs, plain)]);
  else {
    rs = await run(specView, msgs, spec);
    rp = state.stopped ? { finish: "stopped" } : await run(plainView, msgs, plain);
    if (state.stopped) plainView.finish(rp);
  }
  const rec = { role: "assistant", race: true, seed, parallel: state.slots >= 2,
                columns: [specView.record(rs), plainView.record(rp)] };
  return rec;
}

function raceView(rec) {
  const el = document.createElement("div");
  el.className = "race";
  const cols = document.createElement("div");
  cols.className = "columns";
  const spec = assistantMessage("speculative"), plain = assistantMessage("plain (no drafting)");
  cols.append(spec.el, plain.el);
  const speed = document.createElement("p");
  speed.className = "speedup";
  el.append(cols, speed);
  el.views = [spec, plain];
  if (rec) {
    spec.restore(rec.columns[0]);
    plain.restore(rec.columns[1]);
    const a = rec.columns[0].seconds, b = rec.columns[1].seconds;
    const how = rec.parallel ? "both at once on two slots" : "one after the other (one slot: they would queue)";
    const whole = rec.columns.every((c) => c.finish !== "stopped" && !c.error);
    speed.textContent = a && b && whole
      ? `speculative ${a.toFixed(2)} s, plain ${b.toFixed(2)} s: ${(b / a).toFixed(2)}× wall-clock speedup (${how}, seed ${rec.seed})`
      : `seed ${rec.seed}, ${how}`;
    speed.dataset.speedup = a && b && whole ? (b / a).toFixed(3) : "";
  }
  return el;
}

function setBusy(busy) {
  state.busy = busy;
  state.stopped = false;
  if (!busy) state.controllers = [];
  $("button[name=send]").disabled = busy;
  $("button[name=stop]").disabled = !busy;
}

// Edit (the last user message back into the box) and Regenerate (the last answer again) under the last messages.
function addActions() {
  const conv = state.current, msgs = conv.messages, box = $("#messages");
  if (!msgs.length || state.busy) return;
  const actions = document.createElement("div");
  actions.className = "actions";
  const last = msgs[msgs.length - 1];
  if (last.role === "assistant") {
    const regen = button("Regenerate", "", () => { msgs.pop(); send(null); });
    regen.name = "regenerate";
    actions.append(regen);
  }
  const lastUser = msgs.map((m) => m.role).lastIndexOf("user");
  if (lastUser >= 0) {
    const edit = button("Edit last message", "", () => {
      const ta = $("textarea[name=message]");
      ta.value = msgs[lastUser].content;
      msgs.splice(lastUser);
      save();
      renderAll();
      ta.focus();
    });
    edit.name = "edit";
    actions.append(edit);
  }
  box.append(actions);
}

// ------------------------------------------------------------------------------------------ start
function notice(text) { const n = $("#notice"); n.textContent = text; n.hidden = !text; }
function closeMenu() { document.body.classList.remove("menu-open"); }

async function connect() {
  try {
    const res = await api("/v1/models");
    if (!res.ok) { $("#model-line").textContent = await errorText(res); return; }
    const card = (await res.json()).data[0], meta = card.meta || {};
    state.model = card.id;  // the pinned model, or (none pinned) the first the server serves by name
    state.hasDraft = !!meta.draft;
    const draftName = typeof meta.draft === "string" ? meta.draft : meta.draft && meta.draft.id;
    $("#model-line").textContent = `${card.id}` + (draftName ? ` + draft ${draftName}` : "") +
      (meta.drafter ? ` · drafter ${meta.drafter}` : "");
    for (const opt of document.querySelectorAll("select[name=drafter] option")) {
      if (opt.value.startsWith("model") && !state.hasDraft) opt.disabled = true;
    }
    const props = await api("/props");
    if (props.ok) state.slots = (await props.json()).total_slots || 1;
  } catch (e) {
    $("#model-line").textContent = "cannot reach the server: " + e;
  }
}

function start() {
  prepareHighlighting();
  state.conversations = load(localStorage, CONV_STORE, []).filter((c) => c && Array.isArray(c.messages));
  restoreSettings();
  if (!state.conversations.length) newConversation();
  state.current = state.conversations[0];
  renderAll();
  const ta = $("textarea[name=message]");
  $("#composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = ta.value;
    ta.value = "";
    send(text);
  });
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("#composer").requestSubmit(); }
  });
  $("button[name=stop]").addEventListener("click", () => {
    state.stopped = true;
    for (const c of state.controllers) c.abort();
  });
  $("button[name=new]").addEventListener("click", () => { newConversation(); closeMenu(); ta.focus(); });
  $("button[name=settings]").addEventListener("click", () => { const p = $("#settings-panel"); p.hidden = !p.hidden; });
  $("button[name=menu]").addEventListener("click", () => document.body.classList.toggle("menu-open"));
  const sources = $("input[name=sources]");
  sources.checked = localStorage.getItem("edgespec.showSources") === "1";
  document.body.classList.toggle("show-sources", sources.checked);
  sources.addEventListener("change", () => {
    document.body.classList.toggle("show-sources", sources.checked);
    localStorage.setItem("edgespec.showSources", sources.checked ? "1" : "0");
    for (const redraw of state.live) redraw();
  });
  $("input[name=race]").addEventListener("change", (ev) => {
    notice(ev.target.checked && state.slots < 2
      ? "Race: this server has one slot, so the two answers run one after the other (start it with --parallel 2 to race them at once)."
      : "");
  });
  ta.focus();
  connect();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
