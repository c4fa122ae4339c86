// One item at a time: keys 1..9 (or the buttons) answer, s skips, u undoes the last answer. A held key
// answers once (repeats are ignored), and while a request is out no other is sent. Rendered with
// textContent only, so nothing an item says can run as code.
"use strict";
const section = document.getElementById("labeler");
const task = section.dataset.task;
const status = document.getElementById("status");
const csrf = document.querySelector("meta[name=csrf-token]").content;
let current = null;
let busy = false;

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function figure(cls, imageUrl, alt, heading, lines) {
  const fig = el("figure", null, {class: cls});
  if (imageUrl) fig.append(el("img", null, {src: imageUrl, alt, width: 256, height: 256}));
  const caption = el("figcaption");
  caption.append(heading);
  for (const line of lines) caption.append(line);
  fig.append(caption);
  return fig;
}

function render(item, original) {
  current = item;
  const box = document.getElementById("item");
  const choices = document.getElementById("choices");
  box.replaceChildren();
  choices.replaceChildren();
  if (!item) {
    box.append(el("p", "Nothing left to label in this task. Thank you!", {id: "done"}));
    return;
  }
  box.dataset.itemId = item.item_id;
  const lines = [el("p", item.description, {id: "description"})];
  if (item.model_score !== null) lines.push(el("p", "Model score: " + item.model_score.toFixed(3), {id: "score"}));
  const mine = figure("item", item.thumbnail_url, "thumbnail", el("h2", item.title, {id: "title"}), lines);
  if (original) {
    const pair = el("div", null, {class: "pair"});
    const theirs = figure("original", original.thumbnail_url, "matched original",
      el("h2", "Matched original: " + original.title, {id: "original-title"}),
      [el("p", "Similarity " + original.similarity.toFixed(3), {id: "similarity"})]);
    pair.append(mine, theirs);
    box.append(pair);
  } else {
    box.append(mine);
  }
  if (item.labels) {
    item.labels.forEach((label, i) => {
      const button = el("button", null, {type: "button", class: "big", "data-label": label});
      button.append(el("kbd", String(i + 1)), " " + label);
      button.addEventListener("click", () => send("answers", {item_id: item.item_id, label}));
      choices.append(button);
    });
  } else {
    const text = el("textarea", null, {id: "free-text", rows: 3, cols: 60});
    text.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && text.value.trim()) {
        e.preventDefault();
        send("answers", {item_id: item.item_id, label: text.value.trim()});
      }
      e.stopPropagation();
    });
    const button = el("button", "Send", {type: "button", class: "big"});
    button.addEventListener("click", () => {
      if (text.value.trim()) send("answers", {item_id: item.item_id, label: text.value.trim()});
    });
    choices.append(text, button);
    text.focus();
  }
}

function signInAgain(message) {
  status.replaceChildren(message + " ");
  const back = location.pathname + location.search;
  status.append(el("a", "Sign in again", {href: "/login?next=" + encodeURIComponent(back), id: "sign-in-again"}));
  current = null;
}

async function showProgress() {
  const response = await fetch(`/api/tasks/${encodeURIComponent(task)}/progress`, {cache: "no-store"});
  if (!response.ok) return;
  const p = await response.json();
  let gold = "gold score: after your first 10 answers";
  if (p.scored_through > 0) {
    gold = p.gold_scored
      ? `gold score ${Math.round(100 * p.gold_accuracy)}% (${p.gold_correct} of ${p.gold_scored}, counted through answer ${p.scored_through})`
      : `gold score: no gold questions in your first ${p.scored_through} answers`;
  }
  document.getElementById("progress").textContent = `Done ${p.done} · about ${p.remaining} left · ${gold}`;
}

async function send(action, body) {
  if (busy) return;
  busy = true;
  try {
    const response = await fetch(`/api/tasks/${encodeURIComponent(task)}/${action}`, {
      method: action === "next" ? "GET" : "POST",
      cache: "no-store",  // never an earlier answer from the browser's cache (Back, Forward)
      headers: {"content-type": "application/json", "x-csrf-token": csrf},
      body: action === "next" ? undefined : JSON.stringify(body || {}),
    });
    const data = await response.json();
    if (response.status === 401) return signInAgain("Your session has ended.");
    if (response.status === 503 && action === "next") {
      status.textContent = "Busy, retrying ...";
      setTimeout(() => send("next"), 500);
      return;
    }
    if (response.status === 409 && (action === "answers" || action === "skip")) {
      // the page showed an item that is no longer yours to answer (Back, another tab): show the current one
      status.textContent = data.detail + " Showing your current item.";
      setTimeout(() => send("next"), 0);
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
    render(data.item, data.original);
    showProgress();
  } catch (error) {
    status.textContent = "Network problem: " + error;
  } finally {
    busy = false;
  }
}

document.addEventListener("keydown", (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey || e.repeat) return;  // a held key answers once
  if (e.key === "u") return send("undo");
  if (!current) return;
  if (e.key === "s") return send("skip", {item_id: current.item_id});
  const index = Number(e.key) - 1;
  if (current.labels && index >= 0 && index < current.labels.length) {
    send("answers", {item_id: current.item_id, label: current.labels[index]});
  }
});
document.getElementById("skip").addEventListener("click", () => current && send("skip", {item_id: current.item_id}));
document.getElementById("undo").addEventListener("click", () => send("undo"));
// Back or Forward may restore this page from the browser's memory with a stale item: ask again
window.addEventListener("pageshow", (e) => { if (e.persisted) send("next"); });

send("next");
