// The chat panel: an AG-UI client. A question is POSTed as a RunAgentInput to /api/v1/agent/run; the answer
// streams back as server-sent AG-UI events, and each tool step is drawn as its events arrive. Text from the
// server is only ever set as textContent.
"use strict";

const vigilThread = {id: "thread-" + Math.random().toString(36).slice(2), messages: []};
window.vigilEvents = [];  // every event type received, in order (what the browser test reads)

function vigilEl(tag, className, text) {
  const el = document.createElement(tag);
  if (className) { el.className = className; }
  if (text !== undefined) { el.textContent = text; }
  return el;
}

function vigilHandle(event, view) {
  window.vigilEvents.push(event.type);
  switch (event.type) {
    case "RUN_STARTED":
      view.status.textContent = "working";
      break;
    case "TOOL_CALL_START": {
      const step = vigilEl("li", "step running");
      step.dataset.tool = event.toolCallName;
      step.append(vigilEl("span", "tool", event.toolCallName), vigilEl("code", "args"), vigilEl("span", "state", "running"));
      view.steps.append(step);
      view.calls[event.toolCallId] = step;
      break;
    }
    case "TOOL_CALL_ARGS":
      view.calls[event.toolCallId].querySelector(".args").textContent += event.delta;
      break;
    case "TOOL_CALL_END":
      view.calls[event.toolCallId].querySelector(".state").textContent = "called";
      break;
    case "TOOL_CALL_RESULT": {
      const step = view.calls[event.toolCallId];
      const result = JSON.parse(event.content.endsWith("(cut)") ? "{}" : event.content);
      step.classList.remove("running");
      step.classList.add(result.skipped ? "skipped" : "done");
      step.querySelector(".state").textContent = result.skipped ? "skipped: " + result.skipped : "ok " + (result.id || "");
      const details = vigilEl("details");
      details.append(vigilEl("summary", "", "result"), vigilEl("pre", "", event.content));
      step.append(details);
      break;
    }
    case "TEXT_MESSAGE_START":
      view.answer = vigilEl("div", "answer");
      view.item.append(view.answer);
      break;
    case "TEXT_MESSAGE_CONTENT":
      view.answer.append(vigilEl("p", "line", event.delta.replace(/\n$/, "")));
      view.text += event.delta;
      break;
    case "TEXT_MESSAGE_END":
      vigilThread.messages.push({id: "a-" + vigilThread.messages.length, role: "assistant", content: view.text});
      break;
    case "RUN_FINISHED": {
      const answer = event.result || {};
      for (const proposal of answer.proposals || []) {
        const verdict = proposal.accepted ? "proposed, needs approval" : "refused: " + proposal.why;
        view.item.append(vigilEl("p", "proposal", proposal.action + " " + proposal.target + ": " + verdict));
      }
      if (answer.note) { view.item.append(vigilEl("p", "note", answer.note)); }
      view.status.textContent = "finished (" + (answer.flow || answer.answered_by) + ")";
      break;
    }
    case "RUN_ERROR":
      view.item.append(vigilEl("p", "message error", event.message));
      view.status.textContent = "error";
      break;
    default:
      break;
  }
}

async function vigilAsk(question) {
  const log = document.getElementById("chat-log");
  const item = vigilEl("li", "turn");
  item.append(vigilEl("p", "question", question));
  const view = {item: item, steps: vigilEl("ol", "steps"), calls: {}, answer: null, text: "",
                status: document.getElementById("chat-status")};
  item.append(view.steps);
  log.append(item);
  vigilThread.messages.push({id: "u-" + vigilThread.messages.length, role: "user", content: question});
  const run = {threadId: vigilThread.id, runId: "run-" + Math.random().toString(36).slice(2), state: {},
               messages: vigilThread.messages, tools: [], context: [], forwardedProps: {}};
  const headers = {"Content-Type": "application/json", "Accept": "text/event-stream"};
  const token = window.localStorage.getItem("vigil-token");
  if (token) { headers.Authorization = "Bearer " + token; }
  const response = await fetch("/api/v1/agent/run", {method: "POST", headers: headers, body: JSON.stringify(run)});
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    vigilHandle({type: "RUN_ERROR", message: data.detail || ("HTTP " + response.status)}, view);
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) { break; }
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data) { vigilHandle(JSON.parse(data), view); }
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-question");
  const send = document.getElementById("chat-send");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const question = input.value.trim();
    if (!question) { return; }
    input.value = "";
    send.disabled = true;
    try {
      await vigilAsk(question);
    } finally {
      send.disabled = false;
    }
  });
  for (const example of document.querySelectorAll("button.example")) {
    example.addEventListener("click", () => { input.value = example.textContent; input.focus(); });
  }
});
