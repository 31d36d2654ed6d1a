// Approve / execute / propose / diagnose / acknowledge / resolve buttons: the only writes the dashboard makes,
// each with the saved API token.
"use strict";

function vigilToken() {
  return window.localStorage.getItem("vigil-token") || "";
}

// The token goes two places: local storage, which writes send in the Authorization header, and a cookie,
// which page loads, the map's fetches and its event stream carry (the server takes the cookie for reads only).
function vigilKeepToken(token) {
  window.localStorage.setItem("vigil-token", token);
  const secure = window.location.protocol === "https:" ? "; Secure" : "";
  const age = token ? "" : "; Max-Age=0";
  document.cookie = "vigil_token=" + encodeURIComponent(token) + "; Path=/; SameSite=Strict" + secure + age;
}

function vigilSaveToken(event) {
  event.preventDefault();
  vigilKeepToken(document.getElementById("token").value);
  document.getElementById("token").value = "";
  return false;
}

function vigilSignIn(event) {
  event.preventDefault();
  vigilKeepToken(document.getElementById("sign-in-token").value);
  window.location.reload();
  return false;
}

async function vigilPost(url, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: {"Authorization": "Bearer " + vigilToken(), "Content-Type": "application/json"},
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(data.detail || ("HTTP " + response.status));
  }
  return data;
}

function vigilShow(text, isError) {
  const box = document.getElementById("action-message");
  if (!box) { return; }
  box.textContent = text;
  box.className = isError ? "message error" : "message";
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest(
    "button.approve, button.execute, button.propose, button.diagnose, button.set-status");
  if (!button) { return; }
  button.disabled = true;
  try {
    if (button.classList.contains("approve")) {
      const action = await vigilPost("/api/v1/actions/" + button.dataset.action + "/approve");
      vigilShow("approved " + action.kind + " " + action.target, false);
    } else if (button.classList.contains("execute")) {
      const action = await vigilPost("/api/v1/actions/" + button.dataset.action + "/execute?dry_run=true");
      vigilShow(action.result, false);
    } else if (button.classList.contains("set-status")) {
      const incident = await vigilPost("/api/v1/incidents/" + button.dataset.incident + "/status",
        {status: button.dataset.status});
      vigilShow(incident.id + " " + incident.status, false);
    } else if (button.classList.contains("diagnose")) {
      await vigilDiagnoseAgain(button);
      return;  // no reload: the panels are swapped in when the rerun is done
    } else {
      const action = await vigilPost("/api/v1/actions", {
        kind: button.dataset.kind, target: button.dataset.target,
        incident_id: button.dataset.incident, reason: button.dataset.reason,
      });
      vigilShow("proposed " + action.kind + " " + action.target, false);
    }
    window.setTimeout(() => window.location.reload(), 400);
  } catch (err) {
    vigilShow(err.message, true);
    button.disabled = false;
  }
});

// An incident page opened while the server diagnoses the incident (in the background, or a rerun asked for with
// Diagnose again): ask the diagnosis' status until it is done or failed, then swap in the diagnosis, causes and
// plan panels as the server renders them now (the rest of the page, and whatever the reader scrolled to, stays).
// An incident gone (404, 410) or a refusal (401, 403) ends the asking with a message; a server error or no answer
// is asked again after a longer wait each time, a bounded number of times.
const vigilDiagnosisPoll = Object.assign(
  {everyMs: 1000, slowMs: 3000, slowAfterMs: 30000, retries: 5, backoffMs: 2000, maxBackoffMs: 30000},
  window.vigilDiagnosisPoll || {});

function vigilDiagnosisStopped(section, state, text) {
  const note = document.createElement("p");
  note.className = "empty error";
  note.id = "diagnosis-stopped";
  note.setAttribute("role", "status");
  note.textContent = text;
  for (const old of section.querySelectorAll("#diagnosis-pending, #diagnosis-stopped")) { old.remove(); }
  section.appendChild(note);
  document.body.dataset.diagnosis = state;
}

// One asking loop per page. Diagnose again pressed while the page already asks (a first diagnosis pending, a
// retry due) marks it asked again rather than starting a second loop on the same status: the loop asks once more
// after its last status whenever a press came after that status was asked for.
const vigilAsking = {running: false, again: false};

function vigilAwaitDiagnosis(section) {
  vigilAsking.again = true;
  if (vigilAsking.running) { return; }
  vigilAsking.running = true;
  vigilFollowDiagnosis(section).finally(() => { vigilAsking.running = false; });
}

async function vigilFollowDiagnosis(section) {
  while (vigilAsking.again) {
    if (!(await vigilDiagnosisSettled(section))) { return; }
    const page = await fetch(window.location.href, {headers: {Accept: "text/html"}});
    if (!page.ok) {
      vigilDiagnosisStopped(section, page.status === 404 || page.status === 410 ? "gone" : "unreachable",
        "The incident page could not be read again (HTTP " + page.status + ").");
      return;
    }
    const fresh = new DOMParser().parseFromString(await page.text(), "text/html");
    for (const id of ["diagnosis", "causes", "plan"]) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) { now.replaceWith(document.importNode(next, true)); }
    }
    const swapped = document.getElementById("diagnosis");
    document.body.dataset.diagnosis = swapped ? swapped.dataset.state : "";
    if (!swapped) { return; }
    section = swapped;
    if (vigilDiagnosing(section.dataset.state)) { vigilAsking.again = true; }
  }
}

// Ask the status until the diagnosis is done, failed or a try of it failed: true, then the panels are read again;
// false when the asking stopped with a message.
async function vigilDiagnosisSettled(section) {
  const incident = section.dataset.incident;
  const started = Date.now();
  let failures = 0;
  let last = section.dataset.state;
  for (;;) {
    const waited = Date.now() - started;
    const pause = failures > 0
      ? Math.min(vigilDiagnosisPoll.backoffMs * 2 ** (failures - 1), vigilDiagnosisPoll.maxBackoffMs)
      : (waited < vigilDiagnosisPoll.slowAfterMs ? vigilDiagnosisPoll.everyMs : vigilDiagnosisPoll.slowMs);
    await new Promise((done) => window.setTimeout(done, pause));
    vigilAsking.again = false;
    let state;
    let attempts;
    let trouble = "";
    try {
      const response = await fetch("/api/v1/incidents/" + encodeURIComponent(incident) + "/diagnosis/status",
        {headers: {Accept: "application/json"}});
      if (response.status === 404 || response.status === 410) {
        vigilDiagnosisStopped(section, "gone", "This incident is no longer stored (HTTP " + response.status +
          "): there is no diagnosis to wait for.");
        return false;
      }
      if (response.status >= 500) {
        trouble = "HTTP " + response.status;
      } else if (!response.ok) {
        vigilDiagnosisStopped(section, "refused", "The server refused to say how the diagnosis stands (HTTP " +
          response.status + "); reload the page to try again.");
        return false;
      } else {
        ({state, attempts} = await response.json());
      }
    } catch (err) {
      trouble = "no answer";
    }
    if (trouble) {
      failures += 1;
      if (failures > vigilDiagnosisPoll.retries) {
        vigilDiagnosisStopped(section, "unreachable", "The server did not say how the diagnosis stands (" +
          trouble + ", " + failures + " times); reload the page to try again.");
        return false;
      }
      document.body.dataset.diagnosisFailures = String(failures);
      continue;
    }
    failures = 0;
    const before = last;
    last = state;
    // a try failed and another is due: the panels say so (its error, when the next runs) - also when the try that
    // failed is another than the panels were read at (a rerun pressed for, or a retry, failing between two asks)
    if (state === "retrying" && (before !== "retrying" || String(attempts) !== section.dataset.attempts)) {
      return true;
    }
    if (!vigilDiagnosing(state)) { return true; }
  }
}

function vigilDiagnosing(state) {
  return state === "pending" || state === "running" || state === "retrying";
}

// Diagnose again: the server claims the rerun and answers at once (202); the page waits for it as for a first one.
async function vigilDiagnoseAgain(button) {
  const started = await vigilPost("/api/v1/incidents/" + button.dataset.incident + "/diagnose");
  vigilShow("diagnosing again (attempt " + started.attempts + ")", false);
  const section = document.getElementById("diagnosis");
  if (!section) { return; }
  section.dataset.state = started.state;
  for (const old of section.querySelectorAll("#diagnosis-pending, #diagnosis-stopped")) { old.remove(); }
  const note = document.createElement("p");
  note.className = "empty pending";
  note.id = "diagnosis-pending";
  note.textContent = "Diagnosis in progress: diagnosing again; the causes and the plan are replaced when it is done.";
  section.appendChild(note);
  document.body.dataset.diagnosis = started.state;
  if (vigilDiagnosing(started.state)) {
    vigilAwaitDiagnosis(section);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const section = document.getElementById("diagnosis");
  if (section && section.dataset.incident) {
    document.body.dataset.diagnosis = section.dataset.state;
    if (vigilDiagnosing(section.dataset.state)) {
      vigilAwaitDiagnosis(section);
    }
  }
});
