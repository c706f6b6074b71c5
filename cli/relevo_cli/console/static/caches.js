// A project's Caches page: Delete an entry (the API's DELETE /projects/{id}/caches/entry, needs
// operate); the page reloads with what the API then lists.
"use strict";

(function () {
  const result = document.getElementById("action-result");
  document.querySelector("main").addEventListener("click", async function (event) {
    const button = event.target.closest("button.cache-delete");
    if (!button || button.disabled) return;
    button.disabled = true;
    const outcome = await window.RelevoActions.postTo(button.dataset.url, { key: button.dataset.key, region: button.dataset.region });
    if (!outcome.ok) { result.textContent = window.RelevoActions.refused(button, outcome); return; }
    window.location.reload();
  });
})();
