// The job list's row actions: the API call behind each button; a rerun opens the new job, any
// other action reloads the list so every row shows the API's state, never one computed here.
"use strict";

(function () {
  const result = document.getElementById("action-result");
  document.querySelector("table.jobs").addEventListener("click", async function (event) {
    const button = event.target.closest("button.action");
    if (!button || button.disabled) return;
    const row = button.closest("tr");
    const reason = row.querySelector("input[name=reason]");
    const body = { reason: reason ? reason.value : "" };
    if (button.dataset.fromStage) body.from_stage = button.dataset.fromStage;
    if (button.dataset.action === "reject" && !body.reason) { result.textContent = "Reject needs a reason."; return; }
    button.disabled = true;
    const outcome = await window.RelevoActions.post(row.dataset.jobId, button.dataset.action, body);
    if (!outcome.ok) { result.textContent = window.RelevoActions.refused(button, outcome); return; }
    if (button.dataset.action === "rerun" && outcome.answer.job_id) {
      window.location.assign("/jobs/" + encodeURIComponent(outcome.answer.job_id));
      return;
    }
    window.location.reload();
  });
})();
