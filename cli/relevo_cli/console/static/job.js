// The job page: its log (the last lines first, then live over Server-Sent Events from the next
// seq), the log controls, and the action buttons. The console's own code; no framework.
"use strict";

(function () {
  const RECONNECT_MS = 1000;
  const panel = document.getElementById("job-panel");
  const details = document.getElementById("job-details");
  const jobId = panel.dataset.jobId;
  const logEl = document.getElementById("log-lines");
  const MAX_LINES = Number(logEl.dataset.maxLines);  // the server's LOG_MAX_LINES
  const connection = document.getElementById("connection");
  const gateNote = document.getElementById("gate-note");
  const earlier = document.getElementById("log-earlier");
  const tail = JSON.parse(logEl.dataset.tail);
  // A stage with shards: each shard's label (its index, or its matrix combination) by stage and
  // shard index; a chunk carries the index.
  const shardLabels = JSON.parse(logEl.dataset.shardLabels || "{}");

  // A line's place in the log is where it starts: its chunk, named by the API's cursors before
  // and after it, and the index of its start among the chunk's newline-separated parts (part 0 may
  // instead end the previous chunk's line). A cursor is the chunk's seq for a job without shards,
  // and for a job with shards each partition's place (a string, docs/jobs.md), which only the API
  // compares: the page never compares seqs of different partitions. The page opens on whole chunks
  // (the server read them back from the end of the log); the cursor before the first is the tail's.
  let nextSeq = tail.chunks.length ? (tail.before_seq === null ? 0 : tail.before_seq) : tail.next_seq;  // where a stream resumes...
  let nextPart = 0;                // ...and the first part of that chunk not shown yet
  let nextAfter = null;            // ...and the cursor after that chunk, while nextPart > 0
  let firstSeq = nextSeq;          // the first line shown (the cursor before its chunk): "Load earlier" pages back from here
  let firstPart = 0;
  let firstAfter = null;           // the cursor after the first line's chunk
  let openLine = null;             // the last line, while its chunk did not end it with a newline
  let source = null;
  let retry = null;
  let status = null;               // the job's status as the last state event said
  const saidBanners = new Set();   // the ids of the end banners shown: each once, however often a stream says it

  function setConnection(state) {
    connection.textContent = state;
    connection.dataset.state = state;
  }

  function atBottom() {
    return logEl.scrollTop + logEl.clientHeight >= logEl.scrollHeight - 4;
  }

  // A chunk's cursor after it: its `next` (an older API's pages have seqs only).
  function cursorAfter(chunk) {
    return chunk.next !== undefined ? chunk.next : chunk.seq + 1;
  }

  // The chunks of one read, each with the cursor before it: the cursor the read started from for
  // the first, the one after the chunk before it for each other (a read's chunks follow each other).
  function placed(chunks, start) {
    let before = start;
    return chunks.map(function (chunk) {
      const entry = { chunk: chunk, before: typeof chunk.next === "string" ? before : chunk.seq, after: cursorAfter(chunk) };
      before = entry.after;
      return entry;
    });
  }

  function newLine(entry, part, text) {
    const chunk = entry.chunk;
    const line = document.createElement("span");
    line.className = "line";
    line.dataset.seq = String(chunk.seq);
    line.dataset.before = String(entry.before);
    line.dataset.after = String(entry.after);
    line.dataset.part = String(part);
    if (chunk && chunk.stage) {
      // Which stage attempt (or shard) printed it; the first line of each run of its lines is
      // marked (a CSS label, not text): the shards of a stage print side by side.
      const shard = chunk.shard === undefined || chunk.shard === null ? null : String(chunk.shard);
      const name = shard === null ? chunk.stage : chunk.stage + "[" + ((shardLabels[chunk.stage] || {})[shard] || shard) + "]";
      line.dataset.owner = name + "#" + chunk.attempt;
      line.dataset.where = name + (chunk.attempt > 1 ? " · attempt " + chunk.attempt : "") + (chunk.agent_id ? " · on " + chunk.agent_id : "");
      if (shard !== null) line.dataset.shard = shard;
    }
    line.textContent = text;
    return line;
  }

  // A line starts a stage attempt's output when the line before it is another's (or none).
  function markStart(line) {
    if (line === null || !line.dataset.owner) return;
    const before = line.previousElementSibling;
    line.classList.toggle("stage-start", before === null || before.dataset.owner !== line.dataset.owner);
  }

  function setEarlier(enabled) {
    earlier.disabled = !enabled;
    if (enabled) earlier.removeAttribute("title"); else earlier.title = "the log starts here";
  }

  // A cursor as a line's data holds it: a plain seq is a number again.
  function cursorOf(text) {
    return /^[0-9]+$/.test(text) ? Number(text) : text;
  }

  // Where the first line shown starts, read again whenever the top of the log changes.
  function markFirst() {
    const first = logEl.firstElementChild;
    if (first === null) return;
    firstSeq = cursorOf(first.dataset.before);
    firstPart = Number(first.dataset.part);
    firstAfter = cursorOf(first.dataset.after);
  }

  // The newest MAX_LINES lines are kept: the oldest go, and "Load earlier" brings them back.
  function trim() {
    if (logEl.childElementCount <= MAX_LINES) return;
    while (logEl.childElementCount > MAX_LINES) logEl.firstElementChild.remove();
    markFirst();
    markStart(logEl.firstElementChild);
    setEarlier(true);
  }

  // Earlier lines loaded onto a full log push out the newest: the page stops following the end,
  // which resumes (Reconnect) from the first line no longer shown.
  function dropNewest() {
    let dropped = null;
    while (logEl.childElementCount > MAX_LINES) {
      dropped = logEl.lastElementChild;
      dropped.remove();
    }
    if (dropped === null) return;
    nextSeq = cursorOf(dropped.dataset.before);
    nextPart = Number(dropped.dataset.part);
    nextAfter = cursorOf(dropped.dataset.after);
    openLine = null;  // the line dropped began after a newline: the one above it is whole
    stopStream();
    setConnection("paused: earlier lines shown, Reconnect follows the end");
  }

  // Where a stage attempt's output ended (`── build succeeded on mac-1 after 8s ──`): a line of
  // its own, with the cursor it follows (so the log's first line may be one), each id once.
  function appendBanners(marks, cursor) {
    for (const mark of marks || []) {
      if (saidBanners.has(mark.id)) continue;
      saidBanners.add(mark.id);
      const line = document.createElement("span");
      line.className = "banner";  // not a `.line`: a line of the output is one the stage printed
      line.dataset.mark = mark.id;
      line.dataset.before = String(cursor);
      line.dataset.after = String(cursor);
      line.dataset.part = "0";
      line.textContent = "── " + mark.text + " ──";
      logEl.appendChild(line);
      openLine = null;  // a banner ends the line before it
    }
    showEmpty();
  }

  // An empty log is a short box saying so, not a tall empty one.
  function showEmpty() {
    logEl.classList.toggle("empty", logEl.childElementCount === 0);
  }

  // Chunk text appended after what is shown, from its part `fromPart` on (the parts before it are
  // shown already): a chunk may end in the middle of a line.
  function appendText(entry, fromPart) {
    const parts = entry.chunk.text.split("\n");
    parts.forEach(function (part, index) {
      if (index < fromPart) return;
      const last = index === parts.length - 1;
      if (last && part === "") { openLine = null; return; }
      if (openLine !== null && index === 0) {
        openLine.textContent += part;
      } else {
        openLine = newLine(entry, index, part);
        logEl.appendChild(openLine);
        markStart(openLine);
      }
      if (!last) openLine = null;
    });
  }

  function appendChunks(chunks) {
    const follow = atBottom();
    for (const entry of placed(chunks, nextSeq)) {
      // A job with shards reads its log by cursor (a string: each shard's place, docs/jobs.md): a
      // page starts at the cursor asked for, its first chunk the one resumed (from nextPart on),
      // and each chunk's `next` is the cursor after it.
      const chunk = entry.chunk;
      const byCursor = typeof chunk.next === "string";
      if (!byCursor && chunk.seq < nextSeq) continue;  // already shown: never twice
      appendBanners(chunk.marks, entry.before);
      appendText(entry, byCursor || chunk.seq === nextSeq ? nextPart : 0);
      nextSeq = entry.after;
      nextPart = 0;
      nextAfter = null;
    }
    trim();
    showEmpty();
    if (follow) logEl.scrollTop = logEl.scrollHeight;
  }

  function showGate(waitingStage) {
    gateNote.hidden = !waitingStage;
    gateNote.textContent = waitingStage ? "Waiting for approval before " + waitingStage + ": Approve or Reject above." : "";
  }

  // A selector finding the same control in a freshly rendered panel.
  function controlSelector(element) {
    if (element.id) return "#" + CSS.escape(element.id);
    if (!element.dataset.action) return null;
    const stage = element.dataset.fromStage;
    return "button[data-action=\"" + CSS.escape(element.dataset.action) + "\"]" +
      (stage ? "[data-from-stage=\"" + CSS.escape(stage) + "\"]" : ":not([data-from-stage])");
  }

  // The panel follows the job's state; what the reader typed as a reason, what the last action
  // answered and the control the keyboard is on stay as they were (a state event follows every
  // action, and comes with every reconnect, too).
  // The panel (summary, stages, actions, above the log) and the details (steps, handoff,
  // artifacts, below it) come in one answer, each part for its own section.
  // Refreshes run one after another (a state event's and the `done` event's can overlap), so
  // an older answer never lands over a newer one; each call's promise settles once its own
  // refresh is in.
  let refreshing = Promise.resolve();
  function refreshPanel() {
    refreshing = refreshing.then(replacePanel, replacePanel);
    return refreshing;
  }

  async function replacePanel() {
    const response = await fetch("/jobs/" + encodeURIComponent(jobId) + "/panel", { credentials: "same-origin" });
    if (!response.ok) return;
    const parsed = document.createElement("template");
    parsed.innerHTML = await response.text();
    const reason = document.getElementById("action-reason");
    const typed = reason ? reason.value : "";
    const result = document.getElementById("action-result");
    const answered = result ? result.textContent : "";
    const within = [panel, details].find(function (part) { return part.contains(document.activeElement); });
    const focused = within ? controlSelector(document.activeElement) : null;
    for (const part of parsed.content.querySelectorAll("[data-part]")) {
      const section = document.getElementById(part.dataset.part);
      if (section) section.replaceChildren(...part.childNodes);
    }
    const again = document.getElementById("action-reason");
    if (again) again.value = typed;
    const resultAgain = document.getElementById("action-result");
    if (resultAgain) resultAgain.textContent = answered;
    const control = focused ? within.querySelector(focused) : null;
    if (control) control.focus();
  }

  function stopStream() {
    if (source !== null) source.close();
    source = null;
    clearTimeout(retry);
  }

  function connect() {
    stopStream();
    setConnection("connecting");
    source = new EventSource("/jobs/" + encodeURIComponent(jobId) + "/stream?from_seq=" + encodeURIComponent(nextSeq));
    source.addEventListener("log", function (event) { appendChunks(JSON.parse(event.data).chunks); });
    source.addEventListener("marks", function (event) {
      const follow = atBottom();
      appendBanners(JSON.parse(event.data).marks, nextSeq);
      trim();
      if (follow) logEl.scrollTop = logEl.scrollHeight;
    });
    source.addEventListener("state", function (event) {
      // Live from the stream's first event (always a state), not from its opening: the server
      // sends it once it has read the log and the job, and lines follow from then on.
      if (connection.dataset.state !== "live") setConnection("live");
      const state = JSON.parse(event.data);
      showGate(state.waiting_stage);
      // The panel was rendered before the stream opened: the first state may already differ.
      refreshPanel();
      status = state.status;
    });
    // An upload under way: each stage's Transfer cell says what the agent last reported.
    source.addEventListener("progress", function (event) {
      const transfers = JSON.parse(event.data).transfers;
      for (const [stage, text] of Object.entries(transfers)) {
        const cell = details.querySelector("tr[data-stage=\"" + CSS.escape(stage) + "\"] td.transfer");
        if (cell) cell.textContent = text;
      }
    });
    source.addEventListener("done", function (event) {
      source.close();
      source = null;
      // "ended" once the panel shows the ending too: what the page says then is final.
      const ended = "ended (" + JSON.parse(event.data).status + ")";
      const show = function () { setConnection(ended); };
      refreshPanel().then(show, show);
    });
    source.addEventListener("refused", function (event) {
      source.close();
      source = null;
      setConnection("refused: " + JSON.parse(event.data).message);
    });
    source.addEventListener("error", function () {
      // A dropped stream (or one the server ended): resume from the last seq shown.
      if (source === null) return;
      source.close();
      source = null;
      setConnection("reconnecting");
      retry = setTimeout(connect, RECONNECT_MS);
    });
  }

  // The lines just before the first one shown: the chunks before its chunk and, when it does not
  // start its chunk (the lines above it were trimmed), that chunk's own parts before it. The API
  // pages back from a cursor: the one before that chunk, or the one after it to read it too.
  async function loadEarlier() {
    const seq = firstSeq;
    const part = firstPart;
    const after = firstAfter;
    const beforeSeq = part > 0 ? after : seq;
    const response = await fetch("/jobs/" + encodeURIComponent(jobId) + "/logs?before_seq=" + encodeURIComponent(beforeSeq), { credentials: "same-origin" });
    if (!response.ok) return;
    const page = await response.json();
    if (seq !== firstSeq || part !== firstPart) return;  // trimmed meanwhile: this page no longer joins the top
    const fragment = document.createDocumentFragment();
    let line = null;
    const entries = placed(page.chunks, page.before_seq === null ? 0 : page.before_seq);
    entries.forEach(function (entry, at) {
      // Read to the cursor after the first line's chunk: the page's last chunk is that chunk.
      const own = part > 0 && at === entries.length - 1 && String(entry.after) === String(after);
      entry.chunk.text.split("\n").forEach(function (text, index, parts) {
        if (own && index >= part) return;  // the first line shown starts here
        if (index === parts.length - 1 && text === "") { line = null; return; }
        if (line !== null && index === 0) { line.textContent += text; } else { line = newLine(entry, index, text); fragment.appendChild(line); markStart(line); }
        if (index < parts.length - 1) line = null;
      });
    });
    // Text after the last newline of the earlier chunks begins the first line already shown (or,
    // with nothing shown, the line the next chunk goes on).
    const first = logEl.firstElementChild;
    if (line !== null && first !== null && first.classList.contains("banner")) {
      // A banner ended the stage before the first line: the earlier line stays a line of its own.
    } else if (line !== null && first !== null) {
      first.textContent = line.textContent + first.textContent;
      first.dataset.seq = line.dataset.seq;
      first.dataset.before = line.dataset.before;
      first.dataset.after = line.dataset.after;
      first.dataset.part = line.dataset.part;
      line.remove();
    } else if (line !== null) {
      openLine = line;
    }
    const shown = logEl.firstElementChild;
    logEl.insertBefore(fragment, logEl.firstChild);
    markStart(shown);  // the line that was first may now follow a line of its own stage
    markFirst();
    if (page.before_seq === null) setEarlier(false);
    dropNewest();
  }

  async function act(button) {
    const result = document.getElementById("action-result");
    const reasonInput = document.getElementById("action-reason");
    const name = button.dataset.action;
    const body = { reason: reasonInput ? reasonInput.value : "" };
    if (button.dataset.fromStage) body.from_stage = button.dataset.fromStage;
    if (name === "reject" && !body.reason) { result.textContent = "Reject needs a reason."; return; }
    button.disabled = true;
    const outcome = await window.RelevoActions.post(jobId, name, body);
    const answer = outcome.answer;
    if (!outcome.ok) {
      result.textContent = window.RelevoActions.refused(button, outcome);
      return;
    }
    if (name === "delete") { window.location.assign("/"); return; }
    if (name === "rerun" && answer.job_id) {
      window.location.assign("/jobs/" + encodeURIComponent(answer.job_id));
      return;
    }
    await refreshPanel();
    document.getElementById("action-result").textContent = button.textContent + ": done";
  }

  [panel, details].forEach(function (part) {
    part.addEventListener("click", function (event) {
      const button = event.target.closest("button.action");
      if (button && !button.disabled) act(button);
    });
  });
  earlier.addEventListener("click", loadEarlier);
  // Clear empties the view; "Load earlier" then pages back from where it was cleared.
  document.getElementById("log-clear").addEventListener("click", function () {
    logEl.replaceChildren();
    showEmpty();
    openLine = null;
    firstSeq = nextSeq;
    firstPart = nextPart;
    firstAfter = nextAfter;
    setEarlier(String(firstSeq) !== "0" || firstPart > 0);
  });
  document.getElementById("log-reconnect").addEventListener("click", connect);
  document.getElementById("log-fullscreen").addEventListener("click", function () {
    const area = logEl.closest(".log");
    if (document.fullscreenElement) document.exitFullscreen(); else area.requestFullscreen();
  });

  appendChunks(tail.chunks);
  appendBanners(tail.marks, nextSeq);
  logEl.scrollTop = logEl.scrollHeight;
  connect();
})();
