// The playground of `biglm serve`: draws an answer's canvas after every model call, from the server's public API
// (GET /v1/decoding for the settings, POST /v1/completions/steps or /v1/chat/completions/steps for the steps).
"use strict";

const $ = (id) => document.getElementById(id);
let fields = [];    // GET /v1/decoding's fields: name, kind, choices, optional, default, help
let frames = [];    // the steps.call events of the last answer: each holds the slots its call changed
let shown = -1;     // index of the frame on the canvas
let slots = [];     // the canvas of frames[shown]: per slot its token, text, state, confidence, rejected draft
let running = null; // the AbortController of the answer decoding

function setState(state, text) {
  document.body.dataset.state = state;
  $("status").textContent = text;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
  setState("error", "refused");
}

// ----- settings: one input per decoding field, the server's defaults filled in

// A list (the stop strings) is written one item a line, with \n, \t, \r and \\ for a newline, a tab, a carriage
// return and a backslash, so that an item can hold any of them ("\n" stops at the first newline).
const escapes = { n: "\n", t: "\t", r: "\r", "\\": "\\" };
const escapeItem = (text) => text.replace(/[\\\n\t\r]/g, (c) =>
  "\\" + Object.keys(escapes).find((k) => escapes[k] === c));
const unescapeItem = (line) => line.replace(/\\([ntr\\])/g, (_, c) => escapes[c]);

function asText(value) {
  if (value === null || value === undefined) return "";
  if (Array.isArray(value)) return value.map(escapeItem).join("\n");
  return String(value);
}

function buildSettings() {
  const box = $("settings");
  box.textContent = "";
  for (const f of fields) {
    const row = document.createElement("label");
    row.className = "field";
    row.title = f.help;
    const name = document.createElement("span");
    name.textContent = f.name;
    row.appendChild(name);
    let input;
    if (f.kind === "choice" || f.kind === "bool") {
      input = document.createElement("select");
      const options = f.kind === "bool" ? [true, false] : f.choices;
      if (f.optional) options.unshift(null);
      for (const value of options) {
        const option = document.createElement("option");
        option.value = JSON.stringify(value);
        option.textContent = value === null ? "(unset)" : String(value);
        input.appendChild(option);
      }
    } else if (f.kind === "list") {
      input = document.createElement("textarea");
      input.rows = 2;
      input.placeholder = "one per line; \\n for a newline";
    } else {
      input = document.createElement("input");
      input.type = "text";
      input.placeholder = f.optional ? "(unset)" : "";
    }
    input.id = "set-" + f.name;
    input.dataset.name = f.name;
    row.appendChild(input);
    box.appendChild(row);
  }
  resetSettings();
}

function resetSettings() {
  for (const f of fields) {
    const input = $("set-" + f.name);
    if (input.tagName === "SELECT") input.value = JSON.stringify(f.default);
    else input.value = asText(f.default);
  }
}

// The value of a field's input as the request sends it; a value the server will judge is sent as typed (a number
// when it reads as one), so a bad one is refused by the server with its own message. A list's items are kept as
// written (spaces included); empty lines are none.
function readField(f) {
  const input = $("set-" + f.name);
  if (input.tagName === "SELECT") return JSON.parse(input.value);
  if (f.kind === "list") {
    return input.value.split("\n").map((l) => l.replace(/\r$/, "")).filter((l) => l !== "").map(unescapeItem);
  }
  const text = input.value.trim();
  if (text === "") return f.optional ? null : "";
  if ((f.kind === "int" || f.kind === "float") && !isNaN(Number(text))) return Number(text);
  return text;
}

// The request's decoding fields: those whose input differs from the server's default, each as typed; a field left
// at its default is not sent, so the page asks what curl with the same changes asks (on a drafting model, changing
// the strategy alone gets that strategy, without the default's drafts), and a prompt alone is the API's default.
function decodingFields() {
  const values = {};
  for (const f of fields) {
    const value = readField(f);
    if (JSON.stringify(value) !== JSON.stringify(f.default)) values[f.name] = value;
  }
  return values;
}

// ----- the canvas

// A token's text with control characters drawn: a newline as ↵, the others as their control pictures (U+2400..).
const visible = (text) => text.replace(/[\u0000-\u001f\u007f]/g, (c) =>
  c === "\n" ? "\u21b5" : String.fromCharCode(c === "\u007f" ? 0x2421 : 0x2400 + c.charCodeAt(0)));

function describe(slot, i) {
  let text = `slot ${i + 1}: ` + (slot.token === null ? "masked" : JSON.stringify(slot.text));
  if (slot.confidence !== null) text += ` \u00b7 confidence ${slot.confidence.toFixed(3)}`;
  text += ` \u00b7 ${slot.state}`;
  if (slot.rejected !== null) text += ` \u00b7 draft ${JSON.stringify(slot.rejected_text)} rejected`;
  return text;
}

const blank = () => ({ token: null, text: null, state: "masked", confidence: null, rejected: null,
                       rejected_text: null });

// The slots `into` with an event's row written in (the slots its call changed); a row of another length starts
// from a blank canvas.
function apply(into, row) {
  if (into.length !== row.length) into = Array.from({ length: row.length }, blank);
  row.slots.forEach((s, j) => {
    into[s] = { token: row.tokens[j], text: row.text[j], state: row.states[j], confidence: row.confidence[j],
                rejected: row.rejected[j], rejected_text: row.rejected_text[j] };
  });
  return into;
}

function paint(el, slot, i) {
  el.className = "slot " + slot.state;
  el.textContent = slot.token === null ? "\u00a0" : visible(slot.text);
  if (slot.rejected !== null) {
    const s = document.createElement("s");
    s.className = "rejected";
    s.textContent = visible(slot.rejected_text);
    el.appendChild(s);
  }
  if (slot.confidence !== null) el.style.setProperty("--confidence", slot.confidence);
  else el.style.removeProperty("--confidence");
  el.title = describe(slot, i);
  el.dataset.confidence = slot.confidence === null ? "" : String(slot.confidence);
}

// Draw frame `index`: the next frame repaints the slots its call changed; any other is rebuilt from the first.
function draw(index) {
  const frame = frames[index];
  const row = frame.rows[0];
  const canvas = $("canvas");
  if (index === shown + 1 && slots.length === row.length && canvas.childElementCount === row.length) {
    slots = apply(slots, row);
    for (const s of row.slots) paint(canvas.children[s], slots[s], s);
  } else {
    slots = [];
    for (let k = 0; k <= index; k++) slots = apply(slots, frames[k].rows[0]);
    canvas.textContent = "";
    slots.forEach((slot, i) => {
      const el = document.createElement("span");
      paint(el, slot, i);
      canvas.appendChild(el);
    });
  }
  shown = index;
  canvas.dataset.call = String(frame.call);
  $("call").textContent = frame.call;
  $("calls").textContent = Math.max(frame.total_calls, frames.length);
  $("written").textContent = row.written;
  $("new").textContent = row.new_tokens;
  $("slider").max = String(frames.length);
  $("slider").value = String(index + 1);
}

function step(to) {
  if (!frames.length || running) return;
  draw(Math.max(0, Math.min(frames.length - 1, to)));
}

// ----- a request: its events read as server-sent events from a fetch

async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (value) buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
    if (done) return;
  }
}

async function generate(event) {
  event.preventDefault();
  if (running) running.abort();
  const controller = (running = new AbortController());
  const chat = $("chat").checked;
  const text = $("prompt").value;
  const body = { ...decodingFields(), stream: true };
  if (chat) body.messages = text ? [{ role: "user", content: text }] : [];
  else body.prompt = text;
  frames = [];
  shown = -1;
  slots = [];
  $("error").hidden = true;
  $("answer").textContent = "";
  $("canvas").textContent = "";
  $("canvas").dataset.draws = "0";
  $("slider").disabled = true;
  $("per-call").textContent = "-";
  for (const id of ["call", "calls", "written", "new"]) $(id).textContent = "0";
  setState("running", "decoding");
  try {
    const response = await fetch(chat ? "/v1/chat/completions/steps" : "/v1/completions/steps", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      try { message = (await response.json()).error.message; } catch (e) { /* not the API's JSON */ }
      showError(message);
      return;
    }
    let finished = false;
    for await (const item of events(response)) {
      if (item.error) { showError(item.error.message); return; }
      if (item.object === "steps.start") {
        $("calls").textContent = "0";
      } else if (item.object === "steps.call") {
        frames.push(item);
        draw(frames.length - 1);
        $("canvas").dataset.draws = String(Number($("canvas").dataset.draws) + 1);
      } else if (item.object === "steps.done") {
        finished = true;
        $("answer").textContent = item.text;
        $("calls").textContent = item.calls;
        $("calls").dataset.reported = String(item.calls);
        $("per-call").textContent = item.tokens_per_call === null ? "-" : item.tokens_per_call.toFixed(2);
        setState("done", `${item.completion_tokens} tokens in ${item.calls} calls (${item.finish_reason})`);
      }
    }
    if (!finished) showError("the stream ended before the answer finished");
  } catch (e) {
    if (e.name !== "AbortError") showError(String(e));
  } finally {
    if (running === controller) running = null;
    $("slider").disabled = frames.length === 0;
  }
}

async function start() {
  try {
    const response = await fetch("/v1/decoding");
    const info = await response.json();
    if (!response.ok) throw new Error(info.error ? info.error.message : response.statusText);
    fields = info.fields;
    $("model").textContent = `${info.model} \u00b7 window ${info.max_model_len} tokens`;
    buildSettings();
    setState("ready", "ready");
  } catch (e) {
    showError(`cannot read this server's decoding settings (GET /v1/decoding): ${e.message || e}`);
  }
}

$("canvas").addEventListener("mouseover", (e) => {
  const slot = e.target.closest(".slot");
  if (slot) $("slot-info").textContent = slot.title;
});
$("form").addEventListener("submit", generate);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
});
$("reset").addEventListener("click", resetSettings);
$("first").addEventListener("click", () => step(0));
$("prev").addEventListener("click", () => step(shown - 1));
$("next").addEventListener("click", () => step(shown + 1));
$("last").addEventListener("click", () => step(frames.length - 1));
$("slider").addEventListener("input", () => step(Number($("slider").value) - 1));
document.addEventListener("keydown", (e) => {
  if (e.target.tagName === "TEXTAREA" || e.target.tagName === "INPUT" || e.target.tagName === "SELECT") return;
  if (e.key === "ArrowLeft") step(shown - 1);
  if (e.key === "ArrowRight") step(shown + 1);
});
start();
