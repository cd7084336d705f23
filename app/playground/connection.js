// How the page reaches the server: the API key (a bearer header for HTTP, `?token=` for
// websockets, which cannot carry headers from a browser), OpenAI-shaped HTTP errors, the
// server's health, and a websocket that reconnects after the server comes back.

const keyField = () => document.getElementById("api-key");

export function apiKey() {
  return keyField().value.trim();
}

// A new key applies when the field changes (blur or Enter).
export function onKeyChange(listener) {
  keyField().addEventListener("change", listener);
  document.getElementById("key-form").addEventListener("submit", (event) => event.preventDefault());
}

export function apiFetch(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  return fetch(path, { ...init, headers });
}

export async function postJson(path, body, init = {}) {
  return apiFetch(path, {
    ...init,
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

// An OpenAI error body `{"error": {message, type, code, param}}` as one line, as sent.
export function describeOpenAIError(status, body) {
  const error = body && body.error;
  if (!error) return `HTTP ${status}: ${JSON.stringify(body)}`;
  const code = error.code ? ` ${error.code}` : "";
  const param = error.param ? ` (param ${error.param})` : "";
  return `HTTP ${status} ${error.type || "error"}${code}: ${error.message}${param}`;
}

// A non-2xx response's error, read as OpenAI shapes it (or its text, if not JSON).
export async function responseError(response) {
  const text = await response.text();
  try {
    return describeOpenAIError(response.status, JSON.parse(text));
  } catch {
    return `HTTP ${response.status}: ${text}`;
  }
}

export async function getJson(path) {
  const response = await apiFetch(path);
  if (!response.ok) throw new Error(await responseError(response));
  return response.json();
}

export function wsUrl(path) {
  const url = new URL(path, window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const key = apiKey();
  if (key) url.searchParams.set("token", key);
  return url.toString();
}

// A websocket that opens on demand and, when the connection drops without the protocol
// having closed it on purpose, reconnects with backoff (the server restarted, say).
// `handlers`: onOpen(), onMessage(data), onClose(event, willRetry).
// `retryable(event)` says whether a close is a dropped connection rather than a
// deliberate close by the server (an auth failure, an abort).
export class ReconnectingSocket {
  constructor(path, handlers, retryable) {
    this.path = path;
    this.handlers = handlers;
    this.retryable = retryable;
    this.ws = null;
    this.delay = 500;
    this.timer = null;
    this.wanted = false;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    this.wanted = true;
    clearTimeout(this.timer);
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) return;
    const ws = new WebSocket(wsUrl(this.path));
    this.ws = ws;
    ws.addEventListener("open", () => {
      this.delay = 500;
      this.handlers.onOpen();
    });
    ws.addEventListener("message", (event) => this.handlers.onMessage(event.data));
    ws.addEventListener("close", (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      const retry = this.wanted && this.retryable(event);
      this.handlers.onClose(event, retry ? this.delay : null);
      if (retry) {
        this.timer = setTimeout(() => this.connect(), this.delay);
        this.delay = Math.min(this.delay * 2, 5000);
      }
    });
  }

  // Open once more now (a new key, or the user asked), dropping any pending retry.
  reconnect() {
    this.close();
    this.connect();
  }

  close() {
    this.wanted = false;
    clearTimeout(this.timer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000);
  }

  send(frame) {
    this.ws.send(JSON.stringify(frame));
  }
}

// Poll /health (open even with --api-key) and report up/down changes.
export function watchHealth(onChange) {
  let up = null;
  const check = async () => {
    let now = false;
    try {
      now = (await fetch("/health", { cache: "no-store" })).ok;
    } catch {
      now = false;
    }
    if (now !== up) {
      up = now;
      onChange(up);
    }
    setTimeout(check, up ? 5000 : 1000);
  };
  check();
}
