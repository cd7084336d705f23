// OpenAI chat, streamed over SSE (fetch + the body's stream reader, since EventSource
// cannot POST), by either API: Chat Completions, the conversation kept here and resent
// whole each turn; or the Responses API, the conversation stored by the server and each
// turn sent as its new message with the last response's id (previous_response_id). The
// model list comes from /v1/models.

import { describeOpenAIError, getJson, postJson, responseError } from "./connection.js";
import { sseData } from "./sse.js";

const $ = (id) => document.getElementById(id);

let history = [];
let lastResponseId = null; // the Responses API's conversation, stored by the server
let controller = null;

function showError(text) {
  const box = $("chat-error");
  box.textContent = text;
  box.hidden = !text;
}

function addMessage(role, text) {
  const item = document.createElement("div");
  item.className = `message ${role}`;
  const who = document.createElement("span");
  who.className = "role";
  who.textContent = role;
  const body = document.createElement("span");
  body.className = "content";
  body.textContent = text;
  item.append(who, body);
  $("chat-log").append(item);
  return body;
}

export async function loadModels() {
  const select = $("chat-model");
  const target = $("eg-target");
  try {
    const models = await getJson("/v1/models");
    for (const box of [select, target]) {
      const chosen = box.value;
      box.replaceChildren();
      for (const card of models.data) {
        const option = new Option(card.parent ? `${card.id} (LoRA on ${card.parent})` : card.id, card.id);
        box.append(option);
      }
      if (chosen && models.data.some((card) => card.id === chosen)) box.value = chosen;
    }
    showError("");
    return models.data;
  } catch (error) {
    showError(`GET /v1/models: ${error.message}`);
    return [];
  }
}

function responsesRequest(text) {
  const body = {
    model: $("chat-model").value,
    input: text,
    stream: true,
    max_output_tokens: Number($("chat-max-tokens").value),
    temperature: Number($("chat-temperature").value),
    top_p: Number($("chat-top-p").value),
  };
  if (lastResponseId) body.previous_response_id = lastResponseId;
  if ($("chat-seed").value !== "") body.seed = Number($("chat-seed").value);
  const stop = $("chat-stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) body.stop = stop;
  return body;
}

// One Responses API turn: the text as it streams, then the finished response.
async function* responsesTurn(body, signal) {
  const response = await postJson("/v1/responses", body, { signal });
  if (!response.ok) throw new Error(await responseError(response));
  for await (const data of sseData(response)) {
    const event = JSON.parse(data);
    if (event.type === "response.output_text.delta") yield { delta: event.delta };
    else if (event.type === "error") showError(describeOpenAIError(200, { error: event }));
    else if (["response.completed", "response.incomplete", "response.failed"].includes(event.type)) {
      yield { done: event.response };
    }
  }
}

function request(text) {
  const body = {
    model: $("chat-model").value,
    messages: [...history, { role: "user", content: text }],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("chat-max-tokens").value),
    temperature: Number($("chat-temperature").value),
    top_p: Number($("chat-top-p").value),
  };
  if ($("chat-seed").value !== "") body.seed = Number($("chat-seed").value);
  const stop = $("chat-stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) body.stop = stop;
  return body;
}

async function send(event) {
  event.preventDefault();
  const text = $("chat-input").value;
  if (!text.trim() || controller) return;
  showError("");
  $("chat-meta").textContent = "";
  const body = request(text);
  addMessage("user", text);
  const out = addMessage("assistant", "");
  out.parentElement.classList.add("streaming");
  controller = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop-stream").disabled = false;
  let reply = "";
  let finish = null;
  let usage = null;
  let responseId = null;
  try {
    if ($("chat-api").value === "responses") {
      for await (const part of responsesTurn(responsesRequest(text), controller.signal)) {
        if (part.delta) {
          reply += part.delta;
          out.textContent = reply;
          continue;
        }
        const done = part.done;
        const why = done.incomplete_details ? ` (${done.incomplete_details.reason})` : "";
        finish = done.status + why;
        if (done.usage) {
          usage = {
            prompt_tokens: done.usage.input_tokens,
            completion_tokens: done.usage.output_tokens,
            total_tokens: done.usage.total_tokens,
          };
        }
        if (done.status !== "failed") lastResponseId = done.id;
        responseId = done.id;
      }
      $("chat-input").value = "";
      return;
    }
    const response = await postJson("/v1/chat/completions", body, { signal: controller.signal });
    if (!response.ok) throw new Error(await responseError(response));
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        // An error after the stream started arrives inside it, then [DONE].
        showError(describeOpenAIError(200, chunk));
        continue;
      }
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        if (choice.delta && choice.delta.content) {
          reply += choice.delta.content;
          out.textContent = reply;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    history = [...body.messages, { role: "assistant", content: reply }];
    $("chat-input").value = "";
  } catch (error) {
    if (error.name === "AbortError") finish = "stopped by you";
    else showError(error.message);
  } finally {
    out.parentElement.classList.remove("streaming");
    controller = null;
    $("chat-send").disabled = false;
    $("chat-stop-stream").disabled = true;
    const parts = [];
    if (finish) parts.push(`finish: ${finish}`);
    if (usage) {
      parts.push(`usage: ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion = ${usage.total_tokens} tokens`);
    }
    if (responseId) parts.push(`response: ${responseId}`);
    $("chat-meta").textContent = parts.join(" · ");
  }
}

export function setupChat() {
  $("chat-form").addEventListener("submit", send);
  // Each API keeps its own conversation: switching starts a new one.
  $("chat-api").addEventListener("change", () => $("chat-clear").click());
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("chat-form").requestSubmit();
  });
  $("chat-stop-stream").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => {
    history = [];
    lastResponseId = null;
    $("chat-log").replaceChildren();
    $("chat-meta").textContent = "";
    showError("");
  });
}
