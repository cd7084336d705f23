// Salience over /salience/ws, JSON frames as docs/salience.md documents them: calls by a
// client-chosen id, unary responses, Generate event streams ending with `done`, errors
// `{code, message}`, cancel `{id, cancel: true}`.
//
// The page keeps its own view of each session it opened or forked: the tokens with
// whatever the protocol told about them (sampled logprob, top-k alternatives, readout).
// Its offset is that view's length, which the server must agree with (a Generate with
// another offset is refused): after a reconnect, DumpSession checks it.

import { getJson, postJson, responseError, ReconnectingSocket } from "./connection.js";
import { logprobColour, signedColour, tokenText, visible } from "./tokens.js";

const $ = (id) => document.getElementById(id);
const FINISH = {
  FINISH_REASON_EOS: "EOS",
  FINISH_REASON_LENGTH: "length",
  FINISH_REASON_CANCELLED: "cancelled",
  FINISH_REASON_STOP_STRING: "stop string",
};

class CallError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.code = code;
  }
}

const state = {
  socket: null,
  nextId: 1,
  calls: new Map(), // id -> {resolve, reject} (unary) or {event, fail} (Generate)
  sessions: new Map(), // session id -> {id, model, maxLen, tokens: [cell]}
  current: null,
  manifest: { concepts: [], layers: [] },
  model: "",
  running: null, // id of the running Generate
  selected: null, // selected token position
};

function showError(text) {
  $("sal-error").textContent = text;
  $("sal-error").hidden = !text;
}

function setSocketStatus(text) {
  $("sal-socket").textContent = text;
}

function callId(prefix) {
  return `${prefix}${state.nextId++}`;
}

function onMessage(data) {
  const frame = JSON.parse(data);
  const call = state.calls.get(frame.id);
  if (!call) {
    // Not ours to match: the handshake's UNAUTHENTICATED comes under id "".
    if (frame.error) showError(`${frame.error.code}: ${frame.error.message}`);
    return;
  }
  if (frame.error) {
    state.calls.delete(frame.id);
    call.reject(new CallError(frame.error.code, frame.error.message));
  } else if (frame.event) {
    call.event(frame.event);
    if (frame.event.done) state.calls.delete(frame.id);
  } else {
    state.calls.delete(frame.id);
    call.resolve(frame.response);
  }
}

function onClose(event, retryIn) {
  const why = event.reason ? ` ${event.reason}` : "";
  setSocketStatus(
    retryIn === null
      ? `socket closed (${event.code}${why})`
      : `socket closed (${event.code}), reconnecting in ${retryIn / 1000} s…`,
  );
  for (const call of state.calls.values()) call.reject(new Error(`the socket closed (code ${event.code})`));
  state.calls.clear();
}

async function onOpen() {
  setSocketStatus("socket open");
  try {
    const manifest = await call("GetReadoutManifest", {});
    state.manifest = { concepts: manifest.concepts || [], layers: manifest.layers || [] };
    renderManifest();
    const session = currentSession();
    if (session) await resync(session);
  } catch (error) {
    // A socket that closed under the call said why itself (an error frame, its status).
    if (error instanceof CallError) showError(error.message);
  }
}

function call(method, request) {
  const id = callId("c");
  return new Promise((resolve, reject) => {
    if (!state.socket.isOpen) {
      reject(new Error("the Salience socket is not open"));
      return;
    }
    state.calls.set(id, { resolve, reject, event() {} });
    state.socket.send({ id, method, request });
  });
}

function currentSession() {
  return state.current ? state.sessions.get(state.current) : null;
}

// -- the session list ----------------------------------------------------------------

function addSession(session) {
  state.sessions.set(session.id, session);
  const option = new Option(`${session.id.slice(0, 12)}${session.forkOf ? ` (fork at ${session.forkAt})` : ""}`, session.id);
  $("sal-sessions").append(option);
  choose(session.id);
}

function choose(id) {
  state.current = id;
  state.selected = null;
  $("sal-sessions").value = id || "";
  $("sal-dump-out").textContent = "";
  render();
}

async function openSession() {
  showError("");
  try {
    const response = await call("OpenSession", { model: state.model });
    addSession({ id: response.sessionId, model: state.model, maxLen: response.maxModelLen || 0, tokens: [] });
  } catch (error) {
    showError(error.message);
  }
}

async function closeSession() {
  const session = currentSession();
  if (!session) return;
  showError("");
  try {
    await call("CloseSession", { sessionId: session.id });
  } catch (error) {
    showError(error.message);
    return;
  }
  state.sessions.delete(session.id);
  $("sal-sessions").querySelector(`option[value="${session.id}"]`).remove();
  choose([...state.sessions.keys()].at(-1) || null);
}

// After a reconnect, the server's session must still be the page's view of it.
async function resync(session) {
  try {
    const dump = await call("DumpSession", { sessionId: session.id });
    const tokens = dump.tokens || [];
    const same = tokens.length === session.tokens.length && tokens.every((id, i) => id === session.tokens[i].id);
    if (!same) {
      session.tokens = tokens.map((id, position) => ({ id, position }));
      render();
    }
  } catch (error) {
    if (!(error instanceof CallError)) throw error;
    showError(`session ${session.id}: ${error.message}`);
  }
}

async function dump() {
  const session = currentSession();
  if (!session) return;
  showError("");
  try {
    const response = await call("DumpSession", { sessionId: session.id });
    const tokens = response.tokens || [];
    $("sal-dump-out").textContent = `${tokens.length} tokens: ${JSON.stringify(tokens)}`;
    $("sal-dump-out").closest("details").open = true;
  } catch (error) {
    showError(error.message);
  }
}

async function fork() {
  const session = currentSession();
  const at = state.selected;
  if (!session || at === null) return;
  showError("");
  try {
    const response = await call("ForkSession", { sessionId: session.id, atPosition: at });
    addSession({
      id: response.sessionId,
      model: session.model,
      maxLen: session.maxLen,
      tokens: session.tokens.slice(0, at).map((cell) => ({ ...cell })),
      forkOf: session.id,
      forkAt: at,
    });
  } catch (error) {
    showError(error.message);
  }
}

// -- Generate ------------------------------------------------------------------------

async function tokenize(text, addSpecial) {
  const response = await postJson("/tokenize", { model: state.model, prompt: text, add_special_tokens: addSpecial });
  if (!response.ok) throw new Error(`/tokenize: ${await responseError(response)}`);
  return (await response.json()).tokens;
}

async function generate(event) {
  event.preventDefault();
  const session = currentSession();
  if (!session || state.running) {
    if (!session) showError("Open a session first.");
    return;
  }
  showError("");
  $("sal-meta").textContent = "";
  const text = $("sal-text").value;
  let append = [];
  try {
    if (text) append = await tokenize(text, session.tokens.length === 0);
  } catch (error) {
    showError(error.message);
    return;
  }
  const offset = session.tokens.length;
  const maxTokens = Number($("sal-max-tokens").value);
  const start = $("sal-score-prompt").checked ? offset : offset + append.length;
  const end = offset + append.length + maxTokens;
  const request = {
    sessionId: session.id,
    appendTokens: append,
    offset,
    maxTokens,
    temperature: Number($("sal-temperature").value),
    topK: Number($("sal-top-k").value),
    logprobTopK: Number($("sal-logprob-k").value),
  };
  if (end > start) request.logprobsRanges = [{ start, end }];
  if (end > start && $("sal-readouts").checked && state.manifest.concepts.length) {
    request.readoutRanges = [{ start, end }];
  }
  const id = callId("g");
  const before = session.tokens;
  session.tokens = [...before, ...append.map((tokenId, i) => ({ id: tokenId, position: offset + i }))];
  let decoded = 0;
  state.running = id;
  $("sal-generate").disabled = true;
  $("sal-cancel").disabled = false;
  render();
  const finished = new Promise((resolve) => {
    state.calls.set(id, {
      event(generateEvent) {
        if (generateEvent.token) {
          const token = generateEvent.token;
          const cell = {
            id: token.id || 0,
            position: token.position || 0,
            prefill: Boolean(token.isPrefill),
            logprob: token.hasSampledLogprob ? token.sampledLogprob || 0 : null,
            top: (token.logprobs || []).map((alt) => ({ id: alt.id || 0, logprob: alt.logprob || 0 })),
            readout: token.readout || null,
          };
          if (!cell.prefill) decoded += 1;
          session.tokens[cell.position] = cell;
          renderCell(session, cell);
        } else {
          const done = generateEvent.done;
          session.tokens.length = done.totalTokens || 0;
          $("sal-meta").textContent =
            `finish: ${FINISH[done.finishReason] || done.finishReason || "unspecified"} · ` +
            `${done.promptTokens || 0} prompt + ${done.completionTokens || 0} completion = ${done.totalTokens || 0} tokens`;
          resolve();
        }
      },
      resolve,
      reject(error) {
        // The session is as it was, unless decoded tokens had already streamed.
        if (decoded === 0) session.tokens = before;
        showError(error.message);
        resolve();
      },
    });
  });
  state.socket.send({ id, method: "Generate", request });
  if (text) $("sal-text").value = "";
  await finished;
  state.running = null;
  $("sal-generate").disabled = false;
  $("sal-cancel").disabled = true;
  render();
}

function cancel() {
  if (state.running && state.socket.isOpen) state.socket.send({ id: state.running, cancel: true });
}

// -- rendering -----------------------------------------------------------------------

function describe(session, cell) {
  const lines = [`position ${cell.position} · token ${cell.id}${cell.prefill ? " · prompt" : ""}`];
  lines.push(cell.logprob === null || cell.logprob === undefined ? "no logprob" : `logprob ${cell.logprob.toFixed(4)}`);
  return lines.join(" · ");
}

async function showDetail(session, cell) {
  const box = $("sal-detail");
  const text = await tokenText(session.model, cell.id).catch(() => "?");
  const head = `${JSON.stringify(text)} · ${describe(session, cell)}`;
  box.replaceChildren(document.createTextNode(head));
  if (cell.top && cell.top.length) {
    const list = document.createElement("ol");
    list.className = "alternatives";
    for (const alt of cell.top) {
      const item = document.createElement("li");
      const altText = await tokenText(session.model, alt.id).catch(() => "?");
      item.textContent = `${JSON.stringify(altText)} (${alt.id}) ${alt.logprob.toFixed(4)}`;
      if (alt.id === cell.id) item.className = "sampled";
      list.append(item);
    }
    box.append(list);
  }
}

function cellButton(session, cell) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "tok";
  button.dataset.position = cell.position;
  button.dataset.tokenId = cell.id;
  const hasLogprob = cell.logprob !== null && cell.logprob !== undefined;
  if (hasLogprob) {
    button.dataset.logprob = String(cell.logprob);
    button.style.background = logprobColour(cell.logprob);
  }
  if (cell.prefill) button.classList.add("prefill");
  // One tab stop for the whole strip (the selected cell, else the first); arrows move.
  button.tabIndex = cell.position === (state.selected ?? 0) ? 0 : -1;
  if (state.selected === cell.position) button.setAttribute("aria-pressed", "true");
  else button.setAttribute("aria-pressed", "false");
  button.textContent = "\u2026";
  tokenText(session.model, cell.id)
    .then((text) => {
      button.textContent = visible(text);
      button.setAttribute("aria-label", `${JSON.stringify(text)}, ${describe(session, cell)}`);
    })
    .catch(() => {});
  const detail = () => showDetail(session, cell);
  button.addEventListener("mouseenter", detail);
  button.addEventListener("focus", detail);
  button.addEventListener("click", () => {
    state.selected = state.selected === cell.position ? null : cell.position;
    for (const other of $("sal-tokens").querySelectorAll("button.tok")) {
      other.setAttribute("aria-pressed", String(Number(other.dataset.position) === state.selected));
    }
    $("sal-fork").disabled = state.selected === null;
    $("sal-fork").textContent =
      state.selected === null ? "Fork before selected token" : `Fork before token ${state.selected}`;
  });
  return button;
}

// Arrow keys, Home and End move between token cells.
function moveFocus(event) {
  const step = { ArrowRight: 1, ArrowLeft: -1, Home: -Infinity, End: Infinity }[event.key];
  if (step === undefined || !event.target.classList.contains("tok")) return;
  event.preventDefault();
  const cells = [...$("sal-tokens").querySelectorAll("button.tok")];
  const here = cells.indexOf(event.target);
  const next = cells[Math.max(0, Math.min(cells.length - 1, here + step))];
  if (next) {
    event.target.tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
  }
}

function renderCell(session, cell) {
  if (session.id !== state.current) return;
  const strip = $("sal-tokens");
  const item = document.createElement("span");
  item.setAttribute("role", "listitem");
  item.dataset.position = cell.position;
  item.append(cellButton(session, cell));
  // The strip holds positions 0, 1, ... in order: position p is child p.
  const existing = strip.children[cell.position];
  if (existing) existing.replaceWith(item);
  else strip.append(item);
  $("sal-offset").value = session.tokens.length;
  scheduleHeatmap();
}

// Redrawn at most once a frame: a long Generate streams far faster than that.
let heatmapPending = false;
function scheduleHeatmap() {
  if (heatmapPending) return;
  heatmapPending = true;
  requestAnimationFrame(() => {
    heatmapPending = false;
    renderHeatmap();
  });
}

function render() {
  const session = currentSession();
  const strip = $("sal-tokens");
  strip.replaceChildren();
  $("sal-offset").value = session ? session.tokens.length : "–";
  $("sal-max-len").value = session && session.maxLen ? session.maxLen : "–";
  $("sal-fork").disabled = state.selected === null;
  $("sal-dump").disabled = $("sal-close").disabled = !session;
  if (session) {
    for (const cell of session.tokens) if (cell) renderCell(session, cell);
  }
  renderHeatmap();
}

function renderManifest() {
  const { concepts, layers } = state.manifest;
  const select = $("sal-layer");
  const chosen = select.value;
  select.replaceChildren(...layers.map((layer, index) => new Option(`layer ${layer}`, String(index))));
  if (chosen && Number(chosen) < layers.length) select.value = chosen;
  $("sal-manifest").textContent = concepts.length
    ? `GetReadoutManifest: ${concepts.length} concepts (${concepts.join(", ")}) at layers ${layers.join(", ")}`
    : "GetReadoutManifest: no concepts (the server runs without --readout-concepts)";
  $("sal-readouts").disabled = !concepts.length;
  renderHeatmap();
}

// Rows are concepts, columns the tokens that carry a readout, for the chosen layer.
function renderHeatmap() {
  const box = $("sal-heatmap");
  const session = currentSession();
  const { concepts } = state.manifest;
  const layer = Number($("sal-layer").value || 0);
  const cells = session ? session.tokens.filter((cell) => cell && cell.readout && cell.readout.length) : [];
  if (!cells.length || !concepts.length) {
    box.replaceChildren();
    return;
  }
  const values = cells.map((cell) => concepts.map((_, c) => cell.readout[layer * concepts.length + c]));
  const scale = Math.max(...values.flat().map(Math.abs));
  const table = document.createElement("table");
  const caption = document.createElement("caption");
  caption.textContent = `Readouts at layer ${state.manifest.layers[layer]} (red positive, blue negative; largest |value| ${scale.toFixed(3)})`;
  const head = document.createElement("tr");
  head.append(document.createElement("th"));
  for (const cell of cells) {
    const th = document.createElement("th");
    th.scope = "col";
    th.dataset.position = cell.position;
    th.textContent = String(cell.position);
    tokenText(session.model, cell.id).then((text) => (th.textContent = visible(text))).catch(() => {});
    head.append(th);
  }
  table.append(caption, head);
  concepts.forEach((concept, c) => {
    const row = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = concept;
    row.append(th);
    cells.forEach((cell, t) => {
      const td = document.createElement("td");
      const value = values[t][c];
      td.className = "heat";
      td.dataset.position = cell.position;
      td.dataset.concept = concept;
      td.dataset.value = String(value);
      td.title = `${concept} at position ${cell.position}: ${value}`;
      td.style.background = signedColour(value, scale);
      td.textContent = value.toFixed(2);
      row.append(td);
    });
    table.append(row);
  });
  box.replaceChildren(table);
}

export function setupSalience() {
  state.socket = new ReconnectingSocket(
    "/salience/ws",
    { onOpen, onMessage, onClose },
    // 1008: the server refused the key; retrying with the same key cannot help.
    (event) => event.code !== 1008 && event.code !== 1000,
  );
  $("sal-open").addEventListener("click", openSession);
  $("sal-close").addEventListener("click", closeSession);
  $("sal-dump").addEventListener("click", dump);
  $("sal-fork").addEventListener("click", fork);
  $("sal-form").addEventListener("submit", generate);
  $("sal-cancel").addEventListener("click", cancel);
  $("sal-sessions").addEventListener("change", (event) => choose(event.target.value));
  $("sal-layer").addEventListener("change", renderHeatmap);
  $("sal-tokens").addEventListener("keydown", moveFocus);
  render();
  // The base model (Salience serves it only), then (re)connect.
  const connect = async (again) => {
    try {
      state.model = (await getJson("/v1/models")).data.find((card) => !card.parent).id;
    } catch {
      // the socket's own error frame says more
    }
    if (again) state.socket.reconnect();
    else if (!state.socket.isOpen) state.socket.connect();
  };
  return {
    serverUp: () => connect(false),
    keyChanged() {
      showError("");
      connect(true);
    },
  };
}
