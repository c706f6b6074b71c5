// The run page: a project, a ref (listed live by the operator's own `git ls-remote`, or typed),
// a group filtering the projects, the stages as one range of the plan from a "From stage" on (no
// gaps), a priority; the answer is the job and its place in the queue.
"use strict";

(function () {
  const form = document.getElementById("run-form");
  if (!form) return;
  const project = form.dataset.project;
  const boxes = Array.from(form.querySelectorAll("input[name=stage]"));
  const result = document.getElementById("run-result");

  const group = document.getElementById("run-group");
  function reopen(projectId) {
    const query = new URLSearchParams();
    if (group.value) query.set("group", group.value);
    if (projectId) query.set("project", projectId);
    window.location.assign("/run?" + query.toString());
  }
  // A group the selected project is not in: the server selects the first project left.
  group.addEventListener("change", function () { reopen(project); });
  const picker = document.getElementById("run-project");
  if (!picker) return;
  picker.addEventListener("change", function (event) { reopen(event.target.value); });

  // The stages run are one contiguous range of the plan: from the "From stage" on, with no gaps.
  // Stages before it are not run (a new job has no earlier job whose results it could reuse).
  const fromStage = document.getElementById("run-from-stage");
  function first() { return boxes.findIndex(function (box) { return box.value === fromStage.value; }); }
  fromStage.addEventListener("change", function () {
    const start = first();
    boxes.forEach(function (box, at) {
      box.disabled = at < start;
      if (at < start) box.checked = false;
    });
    boxes[start].checked = true;
  });
  // Ticking a stage ticks every earlier one from the first; unticking one unticks every later one.
  boxes.forEach(function (box, index) {
    box.addEventListener("change", function () {
      const start = first();
      boxes.forEach(function (other, at) {
        if (box.checked && at >= start && at < index) other.checked = true;
        if (!box.checked && at > index) other.checked = false;
      });
    });
  });

  async function refreshRefs() {
    const state = document.getElementById("run-refs-state");
    state.textContent = "listing…";
    const response = await fetch("/projects/" + encodeURIComponent(project) + "/refs", { credentials: "same-origin" });
    const answer = await response.json().catch(function () { return { refs: [], error: "refused (" + response.status + ")" }; });
    const list = document.getElementById("run-refs");
    list.replaceChildren();
    for (const ref of answer.refs || []) {
      const option = document.createElement("option");
      option.value = ref.name;
      option.label = ref.kind;
      list.appendChild(option);
    }
    state.textContent = answer.error ? answer.error : (answer.refs.length + " branches and tags");
    state.title = answer.detail || "";
    state.classList.toggle("refusal", Boolean(answer.error));
  }
  document.getElementById("run-refresh-refs").addEventListener("click", refreshRefs);

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const ticked = boxes.filter(function (box) { return box.checked; }).map(function (box) { return box.value; });
    if (!ticked.length) { result.textContent = "Tick at least the from-stage."; return; }
    const body = { ref: document.getElementById("run-ref").value.trim() };
    if (ticked.length < boxes.length) body.stages = ticked;
    const priority = document.getElementById("run-priority").value;
    if (priority !== "") body.priority = Number(priority);
    const response = await fetch("/projects/" + encodeURIComponent(project) + "/run", {
      method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const answer = await response.json().catch(function () { return {}; });
    result.replaceChildren();
    if (!response.ok) { result.textContent = "Refused: " + (answer.message || response.status); return; }
    const link = document.createElement("a");
    link.href = "/jobs/" + encodeURIComponent(answer.job_id);
    link.textContent = answer.job_id;
    link.id = "run-job";
    result.append("Job ", link, " " + (answer.outcome || "queued") +
      (answer.queue_position ? " (position " + answer.queue_position + " in the queue)" : ""));
  });
  refreshRefs();
})();
