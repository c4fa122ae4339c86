// A verdict button settles a dispute: the verdict becomes the item's gold label.
"use strict";
const disputes = document.getElementById("disputes");
const task = disputes.dataset.task;

disputes.addEventListener("click", async (e) => {
  const button = e.target.closest("button[data-item]");
  if (!button) return;
  const response = await fetch(`/api/tasks/${encodeURIComponent(task)}/verdicts`, {
    method: "POST",
    headers: {"content-type": "application/json"},
    body: JSON.stringify({item_id: Number(button.dataset.item), label: button.dataset.label}),
  });
  const article = document.getElementById("dispute-" + button.dataset.item);
  if (response.ok) {
    article.remove();
    const count = document.getElementById("open-count");
    count.textContent = String(Number(count.textContent) - 1);
  } else {
    const data = await response.json();
    article.append(Object.assign(document.createElement("p"), {className: "error", textContent: data.detail}));
  }
});
