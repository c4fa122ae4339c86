// Verdicts by button or key: 1..9 give the selected dispute that label, j/k move the selection, u takes
// back the last verdict given on this page (the dispute is open again). A verdict settles a dispute.
"use strict";
const disputes = document.getElementById("disputes");
const task = disputes.dataset.task;
const csrf = document.querySelector("meta[name=csrf-token]").content;
const count = document.getElementById("open-count");
const lastBox = document.getElementById("last-verdict");
let last = null;  // {article, label} of the newest verdict, to undo it
let selected = null;

function articles() { return [...disputes.querySelectorAll("article.dispute:not([hidden])")]; }

function select(article) {
  if (selected) selected.classList.remove("selected");
  selected = article || null;
  if (selected) { selected.classList.add("selected"); selected.focus({preventScroll: false}); }
}

function problem(article, text) {
  article.append(Object.assign(document.createElement("p"), {className: "error", textContent: text}));
}

async function call(method, path, body) {
  const response = await fetch(`/api/tasks/${encodeURIComponent(task)}/${path}`, {
    method,
    headers: {"content-type": "application/json", "x-csrf-token": csrf},
    body: body ? JSON.stringify(body) : undefined,
  });
  return [response, await response.json()];
}

async function decide(article, label) {
  const item = Number(article.id.replace("dispute-", ""));
  const [response, data] = await call("POST", "verdicts", {item_id: item, label});
  if (!response.ok) return problem(article, data.detail);
  const next = articles()[articles().indexOf(article) + 1];
  article.hidden = true;
  count.textContent = String(Number(count.textContent) - 1);
  last = {article, label};
  document.getElementById("last-verdict-text").textContent = `Verdict "${label}" on item ${item}.`;
  lastBox.hidden = false;
  select(next || articles()[0]);
}

async function undo() {
  if (!last) return;
  const item = Number(last.article.id.replace("dispute-", ""));
  const [response, data] = await call("DELETE", `verdicts/${item}`);
  if (!response.ok) return problem(last.article, data.detail);
  last.article.hidden = false;
  count.textContent = String(Number(count.textContent) + 1);
  select(last.article);
  last = null;
  lastBox.hidden = true;
}

disputes.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-item]");
  if (button) decide(document.getElementById("dispute-" + button.dataset.item), button.dataset.label);
});
document.getElementById("undo-verdict").addEventListener("click", undo);
document.addEventListener("keydown", (e) => {
  if (e.ctrlKey || e.metaKey || e.altKey || e.repeat) return;
  if (e.key === "u") return undo();
  const list = articles();
  const at = list.indexOf(selected);
  if (e.key === "j") return select(list[Math.min(at + 1, list.length - 1)]);
  if (e.key === "k") return select(list[Math.max(at - 1, 0)]);
  if (!selected) return;
  const button = selected.querySelectorAll("button[data-item]")[Number(e.key) - 1];
  if (button) decide(selected, button.dataset.label);
});
select(articles()[0]);
