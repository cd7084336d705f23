// OpenAI chat completions, streamed over SSE (fetch + the body's stream reader, since
// EventSource cannot POST). The model list comes from /v1/models; the conversation is
// kept here and resent whole each turn, as the OpenAI protocol requires.

import { describeOpenAIError, getJson, postJson, responseError } from "./connection.js";
import { sseData } from "./sse.js";

const $ = (id) => document.getElementById(id);

let history = [];
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
  try {
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
  }
  const parts = [];
  if (finish) parts.push(`finish: ${finish}`);
  if (usage) {
    parts.push(`usage: ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion = ${usage.total_tokens} tokens`);
  }
  $("chat-meta").textContent = parts.join(" · ");
}

export function setupChat() {
  $("chat-form").addEventListener("submit", send);
  $("chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("chat-form").requestSubmit();
  });
  $("chat-stop-stream").addEventListener("click", () => controller && controller.abort());
  $("chat-clear").addEventListener("click", () => {
    history = [];
    $("chat-log").replaceChildren();
    $("chat-meta").textContent = "";
    showError("");
  });
}
