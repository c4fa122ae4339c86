// One item at a time: keys 1..9 answer, s skips, u undoes the last answer. Rendered with
// textContent only, so nothing an item says can run as code.
"use strict";
const section = document.getElementById("labeler");
const task = section.dataset.task;
const status = document.getElementById("status");
let current = null;
let busy = false;

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function render(item) {
  current = item;
  const box = document.getElementById("item");
  box.replaceChildren();
  if (!item) {
    box.append(el("p", "Nothing left to label in this task. Thank you!", {id: "done"}));
    return;
  }
  box.dataset.itemId = item.item_id;
  if (item.thumbnail_url) box.append(el("img", null, {src: item.thumbnail_url, alt: "thumbnail", width: 256, height: 256}));
  box.append(el("h2", item.title, {id: "title"}));
  box.append(el("p", item.description, {id: "description"}));
  if (item.model_score !== null) box.append(el("p", "Model score: " + item.model_score.toFixed(3), {id: "score"}));
  if (item.labels) {
    const row = el("p", null, {id: "choices"});
    item.labels.forEach((label, i) => {
      const button = el("button", (i + 1) + " " + label, {type: "button", "data-label": label});
      button.addEventListener("click", () => send("answers", {item_id: item.item_id, label}));
      row.append(button);
    });
    box.append(row);
  } else {
    const text = el("textarea", null, {id: "free-text", rows: 3, cols: 60});
    text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && text.value.trim()) {
        e.preventDefault();
        send("answers", {item_id: item.item_id, label: text.value.trim()});
      }
      e.stopPropagation();
    });
    box.append(text);
    text.focus();
  }
}

async function send(action, body) {
  if (busy) return;
  busy = true;
  try {
    const response = await fetch(`/api/tasks/${encodeURIComponent(task)}/${action}`, {
      method: action === "next" ? "GET" : "POST",
      headers: {"content-type": "application/json"},
      body: action === "next" ? undefined : JSON.stringify(body || {}),
    });
    const data = await response.json();
    if (response.status === 503 && action === "next") {
      status.textContent = "Busy, retrying ...";
      setTimeout(() => send("next"), 500);
      return;
    }
    if (!response.ok) {
      status.textContent = data.detail || ("error " + response.status);
      return;
    }
    status.textContent = {answers: "Saved.", skip: "Skipped.", undo: "Answer taken back: answer again.", next: ""}[action];
    if (data.retry) {  // saved, but the next item could not be claimed yet
      setTimeout(() => send("next"), 200);
      return;
    }
    render(data.item);
  } catch (error) {
    status.textContent = "Network problem: " + error;
  } finally {
    busy = false;
  }
}

document.addEventListener("keydown", (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === "u") return send("undo");
  if (!current) return;
  if (e.key === "s") return send("skip", {item_id: current.item_id});
  const index = Number(e.key) - 1;
  if (current.labels && index >= 0 && index < current.labels.length) {
    send("answers", {item_id: current.item_id, label: current.labels[index]});
  }
});

send("next");
