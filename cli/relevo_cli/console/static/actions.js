// The console's action call, shared by its pages: POST /jobs/{id}/actions/{name} with a JSON body.
// A refusal is the API's: the button stays disabled and its tooltip says why.
"use strict";

window.RelevoActions = {
  post: function (jobId, name, body) {
    return window.RelevoActions.postTo("/jobs/" + encodeURIComponent(jobId) + "/actions/" + encodeURIComponent(name), body);
  },
  postTo: async function (url, body) {
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
    });
    const answer = await response.json().catch(function () { return {}; });
    return { ok: response.ok, status: response.status, answer: answer };
  },
  refused: function (button, outcome) {
    button.disabled = true;
    button.title = outcome.answer.message || ("refused (" + outcome.status + ")");
    return button.textContent + " refused: " + button.title;
  },
};
