// The fleet page's actions: pause, drain and resume an agent, pause and resume a region's dispatch
// (POST /agents/{id}/…, /regions/{region}/…, the stack's admins). The page is read again after
// each, so it shows the API's state, never one computed here.
"use strict";

(function () {
  const result = document.getElementById("action-result");
  document.querySelector("main").addEventListener("click", async function (event) {
    const button = event.target.closest("button.fleet-action");
    if (!button || button.disabled) return;
    const body = {
      note: document.getElementById("fleet-note").value,
      timeout_sec: Number(document.getElementById("fleet-timeout").value),
    };
    if (button.dataset.region) body.region = button.dataset.region;
    const url = "/" + (button.dataset.kind === "region" ? "regions" : "agents") + "/" +
      encodeURIComponent(button.dataset.target) + "/" + button.dataset.action;
    button.disabled = true;
    const outcome = await window.RelevoActions.postTo(url, body);
    if (!outcome.ok) { result.textContent = window.RelevoActions.refused(button, outcome); return; }
    window.location.reload();
  });
})();
