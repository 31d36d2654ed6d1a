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
      const diagnosis = await vigilPost("/api/v1/incidents/" + button.dataset.incident + "/diagnose");
      vigilShow("diagnosed: " + diagnosis.summary, false);
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

// An incident page opened while the server diagnoses the incident in the background: ask the diagnosis' status
// until it is done or failed, then swap in the diagnosis, causes and plan panels as the server renders them now
// (the rest of the page, and whatever the reader scrolled to, stays).
async function vigilAwaitDiagnosis(section) {
  const incident = section.dataset.incident;
  const started = Date.now();
  for (;;) {
    const waited = Date.now() - started;
    await new Promise((done) => window.setTimeout(done, waited < 30000 ? 1000 : 3000));
    let state;
    try {
      const response = await fetch("/api/v1/incidents/" + encodeURIComponent(incident) + "/diagnosis/status",
        {headers: {Accept: "application/json"}});
      if (!response.ok) { continue; }
      state = (await response.json()).state;
    } catch (err) {
      continue;
    }
    if (state === "pending" || state === "running") { continue; }
    const page = await fetch(window.location.href, {headers: {Accept: "text/html"}});
    const fresh = new DOMParser().parseFromString(await page.text(), "text/html");
    for (const id of ["diagnosis", "causes", "plan"]) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) { now.replaceWith(document.importNode(next, true)); }
    }
    const swapped = document.getElementById("diagnosis");
    document.body.dataset.diagnosis = swapped ? swapped.dataset.state : state;
    if (swapped && (swapped.dataset.state === "pending" || swapped.dataset.state === "running")) {
      vigilAwaitDiagnosis(swapped);
    }
    return;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const section = document.getElementById("diagnosis");
  if (section && section.dataset.incident) {
    document.body.dataset.diagnosis = section.dataset.state;
    if (section.dataset.state === "pending" || section.dataset.state === "running") {
      vigilAwaitDiagnosis(section);
    }
  }
});
