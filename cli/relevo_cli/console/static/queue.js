// The queue page: Promote, Set priority and Cancel job on each queued job; the page reloads after
// an action so positions are the API's, never computed here.
"use strict";

(function () {
  const result = document.getElementById("action-result");
  document.querySelector("table.queue").addEventListener("click", async function (event) {
    const button = event.target.closest("button.action");
    if (!button || button.disabled) return;
    const row = button.closest("tr");
    const body = {};
    if (button.dataset.action === "priority") body.priority = Number(row.querySelector("input[name=priority]").value);
    button.disabled = true;
    const outcome = await window.RelevoActions.post(row.dataset.jobId, button.dataset.action, body);
    if (!outcome.ok) { result.textContent = window.RelevoActions.refused(button, outcome); return; }
    window.location.reload();
  });
})();
