// Evergreen over /evergreen/ws, JSON text frames (protobuf's JSON mapping of
// SessionMessage), as docs/evergreen.md documents them. One socket is one session.
//
// A conversation: turn k sends its user text as node u<k> and a node c<k> whose children
// are every earlier turn's nodes (u1, r1, ..., u<k>) by id only, with a GENERATE action
// writing r<k>: earlier prompts and responses are reused, not resent. The response
// streams back as r<k>'s fragments. An ABORT ends the session (its code and reason are
// shown); the next turn opens a new session and sends the earlier turns once more, the
// model's replies as chunks with role `model`.

import { wsUrl } from "./connection.js";

const $ = (id) => document.getElementById(id);
const STRUCT = "type.googleapis.com/google.protobuf.Struct";

const state = {
  ws: null,
  opening: null, // Promise of an open socket
  present: new Set(), // node ids the current session holds
  turns: [], // {k, user, response, done, failed, body, decoder}
  nextTurn: 1,
};

function showError(text) {
  $("eg-error").textContent = text;
  $("eg-error").hidden = !text;
}

function setStatus(text) {
  $("eg-socket").textContent = text;
}

function base64(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary);
}

function unbase64(data) {
  const binary = atob(data || "");
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

function leaf(id, text, role) {
  const metadata = { mimetype: "text/plain" };
  if (role) metadata.role = role;
  return { id, chunkFragment: { metadata, data: base64(text) } };
}

function openSocket() {
  if (state.opening) return state.opening;
  state.opening = new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl("/evergreen/ws"));
    ws.addEventListener("open", () => {
      state.ws = ws;
      state.present = new Set();
      setStatus("session open");
      resolve(ws);
    });
    ws.addEventListener("message", (event) => onMessage(JSON.parse(event.data)));
    ws.addEventListener("close", (event) => {
      if (state.ws === ws || state.ws === null) {
        state.ws = null;
        state.opening = null;
      }
      const reason = event.reason ? `: ${event.reason}` : "";
      setStatus(`session ended (close ${event.code}${reason}); the next turn opens a new one`);
      for (const turn of state.turns) {
        if (!turn.done && !turn.failed) {
          turn.failed = true;
          renderTurn(turn);
        }
      }
      $("eg-send").disabled = false;
      reject(new Error(`the Evergreen socket closed (code ${event.code})`));
    });
  });
  state.opening.catch(() => {});
  return state.opening;
}

function onMessage(message) {
  for (const action of message.actions || []) {
    if (action.name === "ABORT") {
      const status = ((action.configs || [])[0] || {}).value || {};
      showError(`ABORT ${status.code}: ${status.message}`);
    }
  }
  for (const fragment of message.nodeFragments || []) {
    const turn = state.turns.find((t) => `r${t.k}` === fragment.id);
    if (!turn || !fragment.chunkFragment) continue;
    const final = !fragment.continued;
    turn.response += turn.decoder.decode(unbase64(fragment.chunkFragment.data), { stream: !final });
    turn.fragments += 1;
    if (final) {
      turn.done = true;
      state.present.add(fragment.id);
      $("eg-send").disabled = false;
    }
    renderTurn(turn);
  }
}

function renderTurn(turn) {
  let item = turn.element;
  if (!item) {
    item = document.createElement("div");
    item.className = "turn";
    item.dataset.turn = turn.k;
    const user = document.createElement("div");
    user.className = "message user";
    user.innerHTML = '<span class="role">user</span><span class="content"></span>';
    user.querySelector(".content").textContent = turn.user;
    const model = document.createElement("div");
    model.className = "message assistant";
    model.innerHTML = '<span class="role">model</span><span class="content"></span>';
    const meta = document.createElement("p");
    meta.className = "meta";
    item.append(user, model, meta);
    $("eg-log").append(item);
    turn.element = item;
  }
  item.querySelector(".assistant .content").textContent = turn.response;
  item.querySelector(".assistant").classList.toggle("streaming", !turn.done && !turn.failed);
  const phase = turn.failed ? "failed" : turn.done ? "done" : "streaming";
  item.dataset.state = phase;
  item.querySelector(".meta").textContent =
    `${phase} · ${turn.fragments} fragments of r${turn.k} · sent ${turn.sent.join(", ")}; reused ${turn.reused.length ? turn.reused.join(", ") : "nothing"}`;
}

async function send(event) {
  event.preventDefault();
  const text = $("eg-input").value;
  if (!text.trim()) return;
  if (state.turns.some((turn) => !turn.done && !turn.failed)) return;
  showError("");
  let ws;
  try {
    ws = await openSocket();
  } catch (error) {
    showError(error.message);
    return;
  }
  const history = state.turns.filter((turn) => turn.done);
  const k = state.nextTurn++;
  const fragments = [];
  const children = [];
  const sent = [];
  const reused = [];
  for (const turn of history) {
    for (const [id, body, role] of [[`u${turn.k}`, turn.user, ""], [`r${turn.k}`, turn.response, "model"]]) {
      children.push(id);
      if (state.present.has(id)) {
        reused.push(id);
      } else {
        // A new session after an abort or a restart: the earlier turns once more.
        fragments.push(leaf(id, body, role));
        state.present.add(id);
        sent.push(id);
      }
    }
  }
  fragments.push(leaf(`u${k}`, text, ""));
  children.push(`u${k}`);
  fragments.push({ id: `c${k}`, childIds: children });
  for (const id of [`u${k}`, `c${k}`]) {
    state.present.add(id);
    sent.push(id);
  }
  const config = {
    max_tokens: Number($("eg-max-tokens").value),
    temperature: Number($("eg-temperature").value),
  };
  const action = {
    name: "GENERATE",
    inputs: [{ name: "prompt", id: `c${k}` }],
    outputs: [{ name: "response", id: `r${k}` }],
    configs: [{ "@type": STRUCT, value: config }],
  };
  const target = $("eg-target").value;
  if (target) action.targetSpec = { id: target };
  const turn = { k, user: text, response: "", done: false, failed: false, fragments: 0, sent, reused, decoder: new TextDecoder() };
  state.turns.push(turn);
  renderTurn(turn);
  $("eg-send").disabled = true;
  ws.send(JSON.stringify({ actions: [action], nodeFragments: fragments }));
  $("eg-input").value = "";
}

function newSession() {
  if (state.ws) state.ws.close(1000);
  state.ws = null;
  state.opening = null;
  state.turns = [];
  state.present = new Set();
  $("eg-log").replaceChildren();
  $("eg-send").disabled = false;
  showError("");
  setStatus("no session");
}

export function setupEvergreen() {
  $("eg-form").addEventListener("submit", send);
  $("eg-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("eg-form").requestSubmit();
  });
  $("eg-new").addEventListener("click", newSession);
}
