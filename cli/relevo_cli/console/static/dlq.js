// The DLQ page: Redrive an entry, Unfreeze a key; the page reloads with the API's answer.
"use strict";

(function () {
  const result = document.getElementById("action-result");
  document.querySelector("main").addEventListener("click", async function (event) {
    const button = event.target.closest("button.dlq-action");
    if (!button || button.disabled) return;
    button.disabled = true;
    const outcome = await window.RelevoActions.postTo(button.dataset.url, {});
    if (!outcome.ok) { result.textContent = window.RelevoActions.refused(button, outcome); return; }
    window.location.reload();
  });
})();
