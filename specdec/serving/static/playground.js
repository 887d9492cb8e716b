// specdec playground: streams a request with per-token provenance
// (stream_options.include_speculation) and colours each token by where it came from.
// Plain browser JavaScript, no build step and nothing fetched from elsewhere: the page
// only talks to the server that served it, through the same OpenAI API as any client,
// so --api-key guards it exactly like the API.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const KEY = "specdec-api-key";

const state = {
  key: sessionStorage.getItem(KEY) || "",
  model: null,
  drafter: false,
  kMax: 0,
  history: [], // chat turns so far: {role, content}
  controller: null, // AbortController of the request in flight
};

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

function mode() {
  return document.querySelector("input[name=mode]:checked").value;
}

function showError(message) {
  const box = $("#error");
  box.textContent = message || "";
  box.hidden = !message;
}

// ---- connecting (and the API key) ------------------------------------------------------

async function connect() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (err) {
    $("#server-info").textContent = "The server does not answer.";
    return;
  }
  if (response.status === 401) {
    $("#key-form").hidden = false;
    $("#compose").hidden = true;
    $("#server-info").textContent = "API key needed.";
    $("#api-key").focus();
    if (state.key) showError("That API key was refused.");
    return;
  }
  const card = (await response.json()).data[0];
  const spec = card.speculation || {};
  state.model = card.id;
  state.drafter = Boolean(spec.drafter);
  state.kMax = spec.k_max || 0;
  $("#key-form").hidden = true;
  $("#compose").hidden = false;
  showError("");
  $("#server-info").textContent = state.drafter
    ? `${card.id} · drafter on, up to ${state.kMax} draft tokens per pass`
    : `${card.id} · no drafter: plain decoding only`;
  for (const id of ["#compare", "#speculate"]) {
    $(id).disabled = !state.drafter;
    if (!state.drafter) $(id).checked = false;
  }
  document.body.dataset.ready = "true";
}

$("#key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("#api-key").value.trim();
  sessionStorage.setItem(KEY, state.key);
  connect();
});

// ---- one streamed request into one result panel ----------------------------------------

function requestBody(speculate) {
  const number = (id) => Number($(id).value);
  const body = {
    model: state.model,
    max_tokens: number("#max_tokens"),
    temperature: number("#temperature"),
    top_p: number("#top_p"),
    top_k: number("#top_k"),
    stream: true,
    stream_options: { include_usage: true, include_speculation: true },
  };
  if ($("#seed").value !== "") body.seed = number("#seed");
  if (state.drafter) body.speculate = speculate;
  const prompt = $("#prompt").value;
  if (mode() === "chat") body.messages = [...state.history, { role: "user", content: prompt }];
  else body.prompt = prompt;
  return body;
}

function newPanel(title, speculate) {
  const panel = $("#run-template").content.firstElementChild.cloneNode(true);
  $(".run-title", panel).textContent = title;
  panel.dataset.speculate = String(speculate);
  $("#runs").append(panel);
  return panel;
}

class Run {
  constructor(panel) {
    this.panel = panel;
    this.output = $(".output", panel);
    this.text = "";
    this.tokens = new Map(); // index -> {el, source, step, window}
    this.steps = new Map(); // step (> 0) -> {window, kept}
    this.block = null; // {step, el}: the accepted run being drawn
    this.usage = null;
  }

  async send(body, signal) {
    const url = mode() === "chat" ? "/v1/chat/completions" : "/v1/completions";
    this.start = performance.now();
    const response = await fetch(url, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) {
      const err = await response.json().catch(() => null);
      if (response.status === 401) connect();
      throw new Error(err?.error?.message || `HTTP ${response.status}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data: ") && line !== "data: [DONE]") this.chunk(JSON.parse(line.slice(6)));
        }
      }
    }
    this.finish();
  }

  chunk(body) {
    if (body.error) throw new Error(body.error.message);
    if (body.usage) this.usage = body.usage;
    const now = performance.now();
    for (const choice of body.choices || []) {
      const delta = (choice.delta ? choice.delta.content : choice.text) || "";
      const records = choice.speculation ? choice.speculation.tokens : [];
      for (const record of records) this.token(record);
      if (!records.length && delta) this.output.append(delta); // (not expected)
      this.text += delta;
      if (records.length || delta) {
        this.first ??= now;
        this.last = now;
      }
    }
    this.render();
  }

  token(record) {
    const known = this.tokens.get(record.index);
    if (known) { // the rest of a token whose text came in two chunks
      known.el.textContent += record.text;
      return;
    }
    const el = document.createElement("span");
    el.className = "tok " + record.source;
    el.textContent = record.text;
    Object.assign(el.dataset, {
      index: record.index, source: record.source, kind: record.kind,
      step: record.step, window: record.window,
    });
    el.title = `token ${record.index}: ${record.kind}, pass ${record.step}, window ${record.window}`;
    this.tokens.set(record.index, { el, ...record });
    if (record.step > 0) {
      const step = this.steps.get(record.step) || { window: record.window, kept: 0 };
      step.kept += record.source === "draft";
      this.steps.set(record.step, step);
    }
    if (record.source === "draft") { // draft tokens kept in one pass share a block
      if (!this.block || this.block.step !== record.step) {
        const wrap = document.createElement("span");
        wrap.className = "accepted-run";
        this.output.append(wrap);
        this.block = { step: record.step, el: wrap };
      }
      this.block.el.append(el);
    } else {
      this.block = null;
      this.output.append(el);
    }
  }

  stats() {
    const n = this.tokens.size;
    const passes = this.steps.size;
    let kept = 0, drafted = 0;
    for (const s of this.steps.values()) { kept += s.kept; drafted += s.window; }
    const seconds = this.last && this.start ? (this.last - this.start) / 1000 : 0;
    return {
      n, passes, kept, drafted,
      tps: seconds > 0 ? n / seconds : 0,
      mal: passes ? 1 + kept / passes : null,
      rate: drafted ? kept / drafted : null,
      ttft: this.first ? this.first - this.start : null,
    };
  }

  render() {
    const s = this.stats();
    const set = (cls, text) => { $(cls, this.panel).textContent = text; };
    set(".tps", s.tps ? s.tps.toFixed(1) : "–");
    set(".ntok", String(s.n));
    set(".passes", String(s.passes));
    set(".mal", s.mal === null ? "–" : s.mal.toFixed(2));
    set(".rate", s.rate === null ? "–" : (100 * s.rate).toFixed(0) + "%");
    set(".ttft", s.ttft === null ? "–" : s.ttft.toFixed(0) + " ms");
    drawChart($(".chart", this.panel), $(".chart-text", this.panel), this.perPosition());
  }

  perPosition() { // [{drafted, kept}] per draft position, from the passes seen so far
    const positions = [];
    for (const { window, kept } of this.steps.values()) {
      for (let i = 0; i < window; i++) {
        positions[i] ??= { drafted: 0, kept: 0 };
        positions[i].drafted += 1;
        positions[i].kept += i < kept;
      }
    }
    return positions;
  }

  finish() {
    this.render();
    const p = this.panel;
    p.dataset.text = this.text;
    p.dataset.done = "true";
    if (this.usage) {
      p.dataset.usage = JSON.stringify(this.usage);
      const spec = this.usage.speculation || {};
      $(".usage", p).textContent =
        `server: ${this.usage.completion_tokens} tokens, ${spec.target_passes ?? 0} target passes, ` +
        `${spec.accepted_tokens ?? 0} of ${spec.drafted_tokens ?? 0} draft tokens accepted, ` +
        `mean accepted length ${spec.mean_accepted_length ?? 1}`;
    }
  }
}

// ---- the acceptance chart: bars per draft position, drawn by hand in SVG --------------

const SVG = "http://www.w3.org/2000/svg";

function drawChart(svg, caption, positions) {
  svg.replaceChildren();
  const add = (name, attrs, text) => {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el);
    return el;
  };
  const left = 30, top = 8, height = 90, width = 280;
  add("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + height });
  add("line", { class: "axis", x1: left, y1: top + height, x2: left + width, y2: top + height });
  for (const v of [0, 0.5, 1]) {
    add("text", { x: left - 4, y: top + height * (1 - v) + 3, "text-anchor": "end" }, v.toFixed(1));
  }
  const k = Math.max(positions.length, 1);
  const slot = width / k;
  const words = [];
  positions.forEach(({ drafted, kept }, i) => {
    const rate = drafted ? kept / drafted : 0;
    const h = height * rate;
    const bar = add("rect", {
      class: "bar", x: left + i * slot + slot * 0.15, y: top + height - h,
      width: slot * 0.7, height: h,
    });
    const title = document.createElementNS(SVG, "title");
    title.textContent = `position ${i + 1}: ${kept} of ${drafted} accepted`;
    bar.append(title);
    add("text", { x: left + (i + 0.5) * slot, y: top + height + 13, "text-anchor": "middle" }, String(i + 1));
    words.push(`${i + 1}: ${(100 * rate).toFixed(0)}% of ${drafted}`);
  });
  svg.setAttribute("aria-label", positions.length
    ? "Acceptance per draft position. " + words.join("; ")
    : "No draft tokens verified");
  caption.textContent = positions.length ? words.join(" · ") : "no draft tokens verified";
}

// ---- the form ---------------------------------------------------------------------------

function renderChat() {
  const log = $("#chat-log");
  log.replaceChildren();
  if (mode() !== "chat") return;
  for (const m of state.history) {
    const div = document.createElement("div");
    div.className = "msg " + m.role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = m.role === "user" ? "You:" : "Model:";
    div.append(who, m.content);
    log.append(div);
  }
}

function onModeChange() {
  const chat = mode() === "chat";
  $("#prompt-label").textContent = chat ? "Message" : "Prompt";
  renderChat();
}

async function submit(event) {
  event.preventDefault();
  if (!$("#compose").reportValidity() || state.controller) return;
  showError("");
  const compare = $("#compare").checked && state.drafter;
  const plan = compare
    ? [["Speculation off", false], ["Speculation on", true]]
    : [[state.drafter && $("#speculate").checked ? "Speculation on" : "Speculation off",
        state.drafter && $("#speculate").checked]];
  const runs = $("#runs");
  runs.replaceChildren();
  runs.classList.toggle("pair", compare);
  state.controller = new AbortController();
  $("#send").disabled = true;
  $("#stop").disabled = false;
  document.body.dataset.busy = "true";
  const done = [];
  try {
    // One after the other, never together: rows sharing a batch share its pace.
    for (const [title, speculate] of plan) {
      const run = new Run(newPanel(title, speculate));
      await run.send(requestBody(speculate), state.controller.signal);
      done.push(run);
    }
    if (done.length === 2) {
      const [off, on] = done.map((r) => r.stats().tps);
      const p = document.createElement("p");
      p.className = "speedup";
      p.textContent = off > 0 ? `Speculation on: ${(on / off).toFixed(2)}× the tokens/s of off.` : "";
      done[1].panel.append(p);
    }
    if (mode() === "chat" && done.length) {
      state.history.push({ role: "user", content: $("#prompt").value });
      state.history.push({ role: "assistant", content: done[done.length - 1].text });
      $("#prompt").value = "";
      renderChat();
    }
  } catch (err) {
    if (err.name !== "AbortError") showError(err.message);
  } finally {
    state.controller = null;
    $("#send").disabled = false;
    $("#stop").disabled = true;
    document.body.dataset.busy = "false";
  }
}

$("#compose").addEventListener("submit", submit);
$("#compare").addEventListener("change", () => {
  $("#speculate").disabled = $("#compare").checked || !state.drafter;
});
$("#stop").addEventListener("click", () => state.controller && state.controller.abort());
$("#clear").addEventListener("click", () => {
  state.history = [];
  $("#runs").replaceChildren();
  renderChat();
});
$("#prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    $("#compose").requestSubmit();
  }
});
for (const radio of document.querySelectorAll("input[name=mode]")) {
  radio.addEventListener("change", onModeChange);
}

connect();
