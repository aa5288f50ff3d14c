// The trainguard web page: vanilla JS, no build step, nothing fetched but the server's own API.
//
// Routes (in the URL fragment): #/ the jobs list, #/jobs/<id> one job. A token given as
// #token=... (or ...?token=... after a route) is kept in sessionStorage and sent as
// "Authorization: Bearer ..." on every API request. Only the visible view polls: every
// second while something runs, slower once everything shown is terminal.
"use strict";

(() => {
  const TOKEN_KEY = "trainguard.token";
  const LIVE_MS = 1000; // a view with something running
  const IDLE_LIST_MS = 3000; // the jobs list when every job is terminal (new ones may come)
  const IDLE_JOB_MS = 15000; // a terminal job: a slow refresh only
  const RETRY_MS = 3000; // after an error
  const REQUEST_TIMEOUT_MS = 10000;
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "INTERRUPTED"]);
  const CANCELLABLE = new Set(["QUEUED", "PENDING", "RUNNING", "RESTARTING"]);
  const RESUMABLE = new Set(["INTERRUPTED", "CANCELLED"]); // control.py RESUMABLE
  const BADPUT_COLOURS = {
    productive: "#2f9e62",
    startup: "#8ea4bd",
    detection: "#e3a21a",
    hang_waiting: "#e0702f",
    restart: "#7d5bc6",
    work_lost: "#d64545",
    queueing: "#4f86e8",
    other: "#c9ced6",
  };
  const SPARE_COLOURS = ["#1aa3a3", "#b5579c", "#7a8b2f", "#9c6b3c"];
  const ATTEMPT_COLOURS = ["#4f86e8", "#2f9e62", "#7d5bc6", "#e0702f", "#1aa3a3", "#b5579c"];

  const $ = (sel, root = document) => root.querySelector(sel);

  // ------------------------------------------------------------------ formatting

  function esc(v) {
    if (v === null || v === undefined) return "";
    return String(v)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      .replace(/'/g, "&#39;");
  }

  const pad = (n) => String(n).padStart(2, "0");

  function fmtClock(s) {
    if (s === null || s === undefined) return "—";
    const d = new Date(s * 1000);
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    if (d.toDateString() === new Date().toDateString()) return time;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
  }

  function fmtDur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "—";
    if (s < 0) s = 0;
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 10) return `${s.toFixed(1)} s`;
    if (s < 60) return `${Math.round(s)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} m ${pad(Math.floor(s % 60))} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} m`;
    return `${Math.floor(s / 86400)} d ${pad(Math.floor((s % 86400) / 3600))} h`;
  }

  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "—";
    if (ms < 10) return `${ms.toFixed(1)} ms`;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    return fmtDur(ms / 1000);
  }

  const fmtPct = (x) => `${(x * 100).toFixed(x > 0 && x < 0.1 ? 1 : 0)}%`;
  const nowS = () => Date.now() / 1000;
  const slug = (v) => String(v || "none").toLowerCase().replace(/[^a-z0-9_]+/g, "-");
  const label = (key) => key.replace(/_s$/, "").replace(/_/g, " ");
  const basename = (p) => String(p || "").split("/").pop();

  function badge(state, testid) {
    const t = testid ? ` data-testid="${testid}"` : "";
    return `<span class="badge st-${slug(state)}"${t}>${esc(state || "—")}</span>`;
  }

  function classBadge(cls) {
    if (!cls) return '<span class="muted">—</span>';
    return `<span class="badge fc fc-${slug(cls)}">${esc(cls.replace(/_/g, " "))}</span>`;
  }

  const dash = (v) => (v === null || v === undefined || v === "" ? '<span class="muted">—</span>' : esc(v));

  // ------------------------------------------------------------------ the token

  function getToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (_) {
      return "";
    }
  }

  function setToken(token) {
    try {
      if (token) sessionStorage.setItem(TOKEN_KEY, token);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (_) {
      /* storage off: the token lives as long as this page */
    }
    memoryToken = token;
  }

  let memoryToken = "";

  /** Take `token=...` out of the fragment (so it is not left in the address bar). */
  function takeTokenFromHash() {
    const raw = location.hash.replace(/^#/, "");
    const m = raw.match(/(^|[?&])token=([^&]*)/);
    if (!m) return;
    let token = m[2];
    try {
      token = decodeURIComponent(token);
    } catch (_) {
      /* keep it as given */
    }
    setToken(token);
    let route = raw.replace(/(^|[?&])token=[^&]*/, "$1").replace(/[?&]+$/, "").replace(/^[?&]+/, "");
    if (!route.startsWith("/")) route = "/";
    history.replaceState(null, "", `${location.pathname}${location.search}#${route}`);
  }

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status; // 0: the server could not be reached
    }
  }

  async function api(path, { method = "GET", body } = {}) {
    const headers = { Accept: "application/json" };
    const token = getToken() || memoryToken;
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    if (typeof AbortSignal !== "undefined" && AbortSignal.timeout) {
      init.signal = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    }
    let resp;
    try {
      resp = await fetch(path, init); // relative: works behind a path prefix too
    } catch (e) {
      const why = e && e.name === "TimeoutError" ? "no answer in 10 s" : (e && e.message) || e;
      throw new ApiError(0, `cannot reach the trainguard server (${why})`);
    }
    const text = await resp.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = undefined;
    }
    if (!resp.ok) {
      let detail = data && data.detail;
      if (data && Array.isArray(data.problems) && data.problems.length) {
        detail = data.problems.join("; ");
      } else if (Array.isArray(detail)) {
        // FastAPI's own validation errors
        detail = detail
          .map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`)
          .join("; ");
      }
      throw new ApiError(resp.status, String(detail || `${resp.status} ${resp.statusText}`));
    }
    if (data === undefined) {
      throw new ApiError(resp.status, `${path}: the server's answer is not JSON`);
    }
    return data;
  }

  const jobPath = (id, rest = "") => `api/jobs/${encodeURIComponent(id)}${rest}`;

  // ------------------------------------------------------------------ banners

  function setConn(kind, text) {
    const el = $("#conn");
    el.className = `conn conn-${kind}`;
    el.textContent = text;
  }

  function showError(err, what) {
    const banner = $("#error");
    const form = $("#token-form");
    let msg;
    if (err.status === 401) {
      msg = getToken()
        ? `The server refused the token: ${err.message}`
        : `This server needs a token: ${err.message}`;
      setConn("auth", "token needed");
      form.hidden = false;
    } else if (err.status === 0) {
      msg = `${err.message[0].toUpperCase()}${err.message.slice(1)}. Is \`trainguard server\` running? Retrying every ${RETRY_MS / 1000} s.`;
      setConn("down", "offline");
    } else {
      msg = `${what ? `${what}: ` : ""}${err.message}${err.status > 0 ? ` (HTTP ${err.status})` : ""}`;
      setConn("down", "error");
    }
    if (lastOk && err.status !== 401) msg += ` Showing what the page had at ${fmtClock(lastOk)}.`;
    banner.textContent = msg;
    banner.dataset.status = String(err.status);
    banner.hidden = false;
    $("#view").classList.add("stale");
  }

  function clearError() {
    $("#error").hidden = true;
    $("#error").textContent = "";
    $("#token-form").hidden = true;
    $("#view").classList.remove("stale");
  }

  let noticeTimer = null;

  function showNotice(text, kind = "ok") {
    const el = $("#notice");
    el.textContent = text;
    el.className = `banner banner-notice notice-${kind}`;
    el.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => (el.hidden = true), kind === "ok" ? 6000 : 15000);
  }

  // ------------------------------------------------------------------ rendering helpers

  /** Replace a container's HTML only when it changed; keep which <details> were open. */
  function setHTML(el, html) {
    if (!el || el._html === html) return;
    const open = new Set();
    const closed = new Set();
    el.querySelectorAll("details[data-key]").forEach((d) => (d.open ? open : closed).add(d.dataset.key));
    el.innerHTML = html;
    el._html = html;
    el.querySelectorAll("details[data-key]").forEach((d) => {
      if (open.has(d.dataset.key)) d.open = true;
      else if (closed.has(d.dataset.key)) d.open = false;
    });
  }

  // ------------------------------------------------------------------ polling

  let gen = 0; // bumped on every route change: answers for an older view are dropped
  let view = null; // { refresh(g) -> next delay in ms, or null to stop }
  let timer = null;
  let inflight = false;
  let again = false;
  let lastOk = null; // when the visible view last refreshed without an error

  async function tick(g) {
    if (g !== gen || !view) return;
    if (inflight) {
      again = true;
      return;
    }
    clearTimeout(timer);
    if (document.hidden) return; // visibilitychange starts it again
    inflight = true;
    let next = RETRY_MS;
    try {
      next = await view.refresh(g);
      if (g === gen) {
        lastOk = nowS();
        clearError();
        setConn(next === LIVE_MS ? "live" : "idle", `${next === LIVE_MS ? "live" : "idle"} · ${fmtClock(nowS())}`);
      }
    } catch (e) {
      if (g === gen) {
        const err = e instanceof ApiError ? e : new ApiError(-1, `page error: ${e && e.message}`);
        if (!(e instanceof ApiError)) console.error(e);
        showError(err, view.what);
        next = err.status === 401 ? null : RETRY_MS; // a wrong token stays wrong: wait for one
      }
    } finally {
      inflight = false;
    }
    if (again) {
      again = false;
      setTimeout(kick, 0);
      return;
    }
    if (g === gen && next !== null && next !== undefined) timer = setTimeout(() => tick(g), next);
  }

  function kick() {
    tick(gen);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) kick();
  });

  // ------------------------------------------------------------------ routing

  function route() {
    takeTokenFromHash();
    gen += 1;
    clearTimeout(timer);
    const path = location.hash.replace(/^#/, "") || "/";
    const m = path.match(/^\/jobs\/([^/?&]+)/);
    let id = null;
    if (m) {
      try {
        id = decodeURIComponent(m[1]);
      } catch (_) {
        id = m[1];
      }
    }
    lastOk = null;
    view = id ? jobView(id) : path.startsWith("/nodes") ? nodesView() : jobsView();
    kick();
  }

  window.addEventListener("hashchange", route);

  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("#token-input");
    setToken(input.value.trim());
    input.value = "";
    $("#token-form").hidden = true;
    kick();
  });

  // ================================================================== the jobs list

  function jobsView() {
    document.title = "jobs — trainguard";
    const root = $("#view");
    root.innerHTML = `
      <section class="card">
        <div class="card-head">
          <h1>Jobs</h1>
          <span class="queue-summary" id="queue-summary" data-testid="queue-summary"></span>
        </div>
        <div id="jobs-body" data-testid="jobs"><p class="muted">loading…</p></div>
      </section>
      <section class="card" id="queue-card" hidden>
        <h2>Queue</h2>
        <div id="queue-body" data-testid="queue"></div>
      </section>`;
    root.classList.remove("stale");

    return {
      what: "jobs",
      async refresh(g) {
        const [jobs, queue] = await Promise.all([api("api/jobs?limit=200"), api("api/queue")]);
        if (g !== gen) return null;
        setHTML($("#jobs-body"), renderJobs(jobs));
        setHTML($("#queue-summary"), renderQueueSummary(queue));
        $("#queue-card").hidden = !queue.queued.length;
        setHTML($("#queue-body"), renderQueue(queue));
        return jobs.some((j) => !TERMINAL.has(j.state)) ? LIVE_MS : IDLE_LIST_MS;
      },
    };
  }

  function renderJobs(jobs) {
    if (!jobs.length) {
      return `<p class="empty" data-testid="no-jobs">No jobs yet. Submit one with
        <code>trainguard submit --server ${esc(location.origin)} -- python train.py</code>.</p>`;
    }
    const now = nowS();
    const rows = jobs.map((j) => {
      const end = j.ended_at_s || now;
      let note = "";
      if (j.state === "QUEUED" && j.queued_reason) note = `<span class="queued-reason">${esc(j.queued_reason)}</span>`;
      else if (j.error_message) note = `<span class="err-text" title="${esc(j.error_message)}">${esc(j.error_code ? `[${j.error_code}] ` : "")}${esc(j.error_message)}</span>`;
      else if (j.queued_reason) note = `<span class="queued-reason">${esc(j.queued_reason)}</span>`;
      return `<tr data-testid="job-row" data-job-id="${esc(j.id)}" class="row-link">
        <td><a href="#/jobs/${encodeURIComponent(j.id)}" data-testid="job-link" class="job-name">${esc(j.name)}</a>
            <div class="mono small muted">${esc(j.id)}</div></td>
        <td>${badge(j.state, "job-row-state")}</td>
        <td class="num" data-testid="job-row-step">${dash(j.last_step)}</td>
        <td class="num" data-testid="job-row-attempts">${esc(j.attempts)}</td>
        <td class="nowrap">${fmtClock(j.created_at_s)}</td>
        <td class="nowrap num">${fmtDur(end - j.created_at_s)}</td>
        <td class="note" data-testid="job-row-note">${note}</td>
      </tr>`;
    });
    return `<table class="tbl jobs-table">
      <thead><tr><th>Job</th><th>State</th><th class="num">Step</th><th class="num">Attempts</th>
        <th>Created</th><th class="num">Duration</th><th>Queued reason / error</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>`;
  }

  function renderQueueSummary(q) {
    const parts = [];
    const quota = q.quota || {};
    const used = q.used || {};
    const gib = (b) => `${(b / 2 ** 30).toFixed(b >= 10 * 2 ** 30 ? 0 : 1)} GiB`;
    if (quota.cpus !== null && quota.cpus !== undefined) parts.push(`CPUs ${used.cpus ?? 0} / ${quota.cpus}`);
    if (quota.gpus !== null && quota.gpus !== undefined) parts.push(`GPUs ${used.gpus ?? 0} / ${quota.gpus}`);
    if (quota.memory_b) parts.push(`memory ${gib(used.memory_b || 0)} / ${gib(quota.memory_b)}`);
    if (!parts.length) parts.push("no quota");
    parts.push(`${q.running} running`, `${q.queued.length} queued`);
    return parts.map((p) => `<span class="pill">${esc(p)}</span>`).join("");
  }

  function renderQueue(q) {
    if (!q.queued.length) return "";
    const now = nowS();
    const rows = q.queued.map(
      (j, i) => `<tr data-testid="queue-row">
        <td class="num">${i + 1}</td>
        <td><a href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.name)}</a> <span class="mono small muted">${esc(j.id)}</span></td>
        <td class="num">${esc(j.priority ?? 0)}</td>
        <td class="nowrap">${fmtDur(now - j.queued_at_s)}</td>
        <td class="queued-reason">${esc(j.reason)}</td></tr>`,
    );
    return `<table class="tbl"><thead><tr><th class="num">#</th><th>Job</th><th class="num">Priority</th>
      <th>Waiting</th><th>Reason</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  }

  // ================================================================== the node ledger

  function nodesView() {
    document.title = "nodes — trainguard";
    const root = $("#view");
    root.innerHTML = `
      <section class="card">
        <div class="card-head"><h1>Nodes</h1>
          <span class="muted small">machine-blamed failures across jobs; a node on probation is avoided until a node check passes or it is released</span></div>
        <div id="nodes-body" data-testid="nodes"><p class="muted">loading…</p></div>
      </section>`;
    root.classList.remove("stale");
    $("#nodes-body").addEventListener("click", async (ev) => {
      const button = ev.target.closest("[data-release]");
      if (!button) return;
      button.disabled = true;
      const node = button.dataset.release;
      try {
        await api(`api/nodes/${encodeURIComponent(node)}/release`, { method: "POST", body: {} });
        showNotice(`node ${node} released`);
      } catch (e) {
        showNotice(`release failed: ${e.message}${e.status > 0 ? ` (HTTP ${e.status})` : ""}`, "error");
      }
      kick();
    });
    return {
      what: "nodes",
      async refresh(g) {
        const nodes = await api("api/nodes");
        if (g !== gen) return null;
        setHTML($("#nodes-body"), renderNodes(nodes));
        return IDLE_LIST_MS;
      },
    };
  }

  function renderNodes(nodes) {
    if (!nodes.length) return `<p class="empty" data-testid="no-nodes">No node has a machine-blamed failure yet.</p>`;
    const rows = nodes.map((n) => {
      const probation = n.state === "probation";
      const history = n.history.map((h) => `<li data-testid="node-event">${fmtClock(h.at_s)} <b>${esc(h.kind)}</b>
        ${h.job_id ? `<a href="#/jobs/${encodeURIComponent(h.job_id)}" class="mono">${esc(h.job_id)}</a>${h.attempt != null ? ` attempt ${esc(h.attempt)}` : ""}${h.replica ? ` ${esc(h.replica)}` : ""}:` : ""}
        ${esc(h.reason || "")}${h.matched_line && !(h.reason || "").includes(h.matched_line) ? ` <code>${esc(h.matched_line)}</code>` : ""}</li>`);
      return `<tr data-testid="node-row" data-node="${esc(n.node)}">
        <td class="mono">${esc(n.node)}</td>
        <td data-testid="node-state">${badge(probation ? "probation" : "ok")}${probation ? ' <span class="small muted">needs check</span>' : ""}</td>
        <td class="num">${esc(n.faults)}</td><td class="num">${esc(n.jobs)}</td>
        <td class="note">${esc((probation ? n.reason : n.last_fault) || "")}${n.note ? ` <span class="muted">(${esc(n.note)})</span>` : ""}
          <details data-key="node-${esc(n.node)}"><summary>history (${n.history_rows})</summary><ul>${history.join("")}</ul></details></td>
        <td>${probation ? `<button type="button" data-release="${esc(n.node)}" data-testid="node-release">Release</button>` : ""}</td>
      </tr>`;
    });
    return `<table class="tbl nodes-table"><thead><tr><th>Node</th><th>State</th><th class="num">Faults</th>
      <th class="num">Jobs</th><th>Why</th><th></th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
  }

  // ================================================================== one job

  function jobView(id) {
    document.title = `${id} — trainguard`;
    const root = $("#view");
    root.classList.remove("stale");
    root.innerHTML = `
      <div class="crumbs"><a href="#/">Jobs</a> <span class="muted">/</span> <span class="mono">${esc(id)}</span></div>
      <section class="card job-head" data-testid="job-head">
        <div class="job-title">
          <h1 id="job-name" data-testid="job-name">${esc(id)}</h1>
          <span id="job-state-slot"></span>
          <span class="spacer"></span>
          <button type="button" id="btn-cancel" class="btn btn-danger" data-testid="cancel" disabled>Cancel</button>
          <button type="button" id="btn-resume" class="btn" data-testid="resume" disabled>Resume</button>
        </div>
        <div id="job-facts"></div>
        <div id="job-error"></div>
      </section>
      <section class="card"><h2>Replicas</h2><div id="sec-replicas" data-testid="replicas"></div></section>
      <div class="grid2">
        <section class="card"><h2>Goodput</h2><div id="sec-goodput" data-testid="goodput"></div></section>
        <section class="card"><h2>Progress</h2><div id="sec-progress" data-testid="progress"></div></section>
      </div>
      <section class="card"><h2>Restarts</h2><div id="sec-timeline"></div></section>
      <section class="card"><h2>Faults <span class="h-sub">grouped by fingerprint</span></h2><div id="sec-faults" data-testid="faults"></div></section>
      <section class="card"><h2>Stack snapshots</h2><div id="sec-stacks" data-testid="stacks"></div></section>
      <section class="card">
        <div class="card-head">
          <h2>Log</h2>
          <span class="spacer"></span>
          <label class="ctl">replica <select id="log-replica" data-testid="log-replica"></select></label>
          <label class="ctl">attempt <select id="log-attempt" data-testid="log-attempt"><option value="">latest</option></select></label>
          <label class="ctl">lines <select id="log-lines" data-testid="log-lines">
            <option>50</option><option selected>200</option><option>1000</option><option>5000</option></select></label>
        </div>
        <div id="log-meta" class="small muted" data-testid="log-meta"></div>
        <pre id="log" class="log" data-testid="log-tail"></pre>
      </section>
      <section class="card">
        <details data-key="history" id="history-details" open>
          <summary><h2 class="inline">History</h2> <span class="h-sub" id="history-count"></span></summary>
          <div id="sec-history" data-testid="history"></div>
        </details>
      </section>`;

    // events: the newest EVENTS_KEPT seen; each poll asks only for those after the last one
    const st = { id, job: null, replica: "", attempt: "", lines: "200", logKey: "", events: [], eventsMore: false };

    const onLogControl = () => {
      st.replica = $("#log-replica").value;
      st.attempt = $("#log-attempt").value;
      st.lines = $("#log-lines").value;
      kick();
    };
    ["#log-replica", "#log-attempt", "#log-lines"].forEach((s) => $(s).addEventListener("change", onLogControl));

    $("#sec-replicas").addEventListener("click", (ev) => {
      const row = ev.target.closest("[data-replica]");
      if (!row) return;
      st.replica = row.dataset.replica;
      $("#log-replica").value = st.replica;
      st.attempt = "";
      $("#log-attempt").value = "";
      kick();
      $("#log").scrollIntoView({ behavior: "smooth", block: "nearest" });
    });

    $("#sec-timeline").addEventListener("click", (ev) => {
      const link = ev.target.closest("[data-snapshot-at]");
      if (!link) return;
      const snap = document.querySelector(`[data-snapshot-key="${link.dataset.snapshotAt}"]`);
      if (snap) snap.scrollIntoView({ behavior: "smooth", block: "start" });
    });

    const act = async (what, button) => {
      button.disabled = true;
      try {
        const answer = await api(jobPath(id, `/${what}`), { method: "POST", body: {} });
        showNotice(answer.message || `${what}: ${answer.state}`);
      } catch (e) {
        showNotice(`${what} failed: ${e.message}${e.status > 0 ? ` (HTTP ${e.status})` : ""}`, "error");
      }
      kick();
    };
    $("#btn-cancel").addEventListener("click", (ev) => act("cancel", ev.currentTarget));
    $("#btn-resume").addEventListener("click", (ev) => act("resume", ev.currentTarget));

    return {
      what: `job ${id}`,
      async refresh(g) {
        const logQuery = new URLSearchParams({ tail: st.lines });
        if (st.replica) logQuery.set("replica", st.replica);
        if (st.attempt !== "") logQuery.set("attempt", st.attempt);
        const [job, records, faults, stacks, goodput, history, log] = await Promise.all([
          api(jobPath(id)),
          api(jobPath(id, "/records")),
          api(jobPath(id, "/records?aggregate=true")),
          api(jobPath(id, "/stacks")),
          api(jobPath(id, "/goodput")),
          api(jobPath(id, st.events.length ? `/history?after=${st.events[st.events.length - 1].id}` : "/history")),
          // no replica has run yet (queued): say so in the log panel, not as an error
          api(jobPath(id, `/logs?${logQuery}`)).catch((e) => {
            if (e.status === 404) return { missing: e.message };
            throw e;
          }),
        ]);
        if (g !== gen) return null;
        st.job = job;
        keepEvents(st, history);
        renderHead(job);
        syncLogControls(st, job);
        setHTML($("#sec-replicas"), renderReplicas(job, st.replica || (log && log.replica)));
        setHTML($("#sec-goodput"), renderGoodput(goodput));
        setHTML($("#sec-progress"), renderProgress(job, history, records));
        setHTML($("#sec-faults"), renderFaults(faults));
        setHTML($("#sec-timeline"), renderTimeline(job, records, stacks));
        setHTML($("#sec-stacks"), renderStacks(stacks));
        setHTML($("#sec-history"), renderHistory(job, history));
        $("#history-count").textContent = `${history.transitions.length} transitions, ${st.eventsMore ? "the latest " : ""}${st.events.length} events`;
        renderLog(st, log);
        return TERMINAL.has(job.state) ? IDLE_JOB_MS : LIVE_MS;
      },
    };
  }

  function renderHead(job) {
    document.title = `${job.state} · ${job.name} — trainguard`;
    $("#job-name").textContent = job.name;
    setHTML($("#job-state-slot"), badge(job.state, "job-state"));
    $("#btn-cancel").disabled = !CANCELLABLE.has(job.state);
    $("#btn-resume").disabled = !RESUMABLE.has(job.state);
    $("#btn-cancel").title = CANCELLABLE.has(job.state) ? "stop the job (its replicas get SIGTERM, then SIGKILL after the grace period)" : `a ${job.state} job cannot be cancelled`;
    $("#btn-resume").title = RESUMABLE.has(job.state) ? "queue the job again; it goes on from its latest checkpoint" : "only a cancelled or interrupted job can be resumed";

    const now = nowS();
    const end = job.ended_at_s || now;
    const p = job.progress || {};
    let metrics = "";
    if (p.metrics && typeof p.metrics === "object") {
      metrics = Object.entries(p.metrics)
        .filter(([k]) => k !== "step")
        .slice(0, 4)
        .map(([k, v]) => `${esc(k)} ${esc(typeof v === "number" ? +v.toPrecision(4) : JSON.stringify(v))}`)
        .join(" · ");
    }
    const pools = ((job.spec && job.spec.worker_pools) || [])
      .map((w) => `${w.replicas}× ${w.role}: ${(w.command || []).join(" ")}`)
      .join("\n");
    const facts = [
      ["Step", `<span data-testid="job-step">${dash(p.step)}</span>${metrics ? ` <span class="muted small">${metrics}</span>` : ""}${p.at_s && !TERMINAL.has(job.state) ? ` <span class="muted small">(${fmtDur(now - p.at_s)} ago)</span>` : ""}`],
      ["Attempts", `<span data-testid="job-attempts">${esc(job.attempts)}</span>`],
      ["Restarts", `<span data-testid="job-restarts">${esc(job.restarts)}</span>`],
      ["Created", fmtClock(job.created_at_s)],
      [job.ended_at_s ? "Took" : "Running for", fmtDur(end - job.created_at_s)],
      ["Priority", dash(job.priority)],
      ["Master pid", dash(job.master_pid)],
      ["ID", `<span class="mono">${esc(job.id)}</span>`],
    ];
    if (job.queued_reason) facts.splice(0, 0, ["Queued", `<span class="queued-reason" data-testid="job-queued-reason">${esc(job.queued_reason)}</span>`]);
    setHTML(
      $("#job-facts"),
      `<dl class="facts">${facts.map(([k, v]) => `<div><dt>${k}</dt><dd>${v}</dd></div>`).join("")}</dl>
       ${pools ? `<div class="command mono small" title="${esc(pools)}">${esc(pools)}</div>` : ""}`,
    );
    setHTML(
      $("#job-error"),
      job.error_message
        ? `<div class="job-error" data-testid="job-error"><b>${esc(job.error_code || "error")}</b> ${esc(job.error_message)}</div>`
        : "",
    );
  }

  function syncLogControls(st, job) {
    const names = job.replicas.map((r) => r.name);
    const sel = $("#log-replica");
    const have = Array.from(sel.options).map((o) => o.value);
    if (names.join() !== have.join()) {
      sel.innerHTML = names.map((n) => `<option value="${esc(n)}">${esc(n)}</option>`).join("");
    }
    if (!st.replica && names.length) st.replica = names[0];
    if (st.replica && names.includes(st.replica)) sel.value = st.replica;

    const att = $("#log-attempt");
    const wanted = ["", ...Array.from({ length: job.attempts }, (_, i) => String(i))];
    const current = Array.from(att.options).map((o) => o.value);
    if (wanted.join() !== current.join()) {
      att.innerHTML = wanted.map((v) => `<option value="${v}">${v === "" ? "latest" : v}</option>`).join("");
      att.value = st.attempt;
    }
  }

  function renderLog(st, log) {
    const pre = $("#log");
    const meta = $("#log-meta");
    if (!log || log.missing) {
      pre.textContent = "";
      pre.classList.add("empty-log");
      meta.textContent = log && log.missing ? `no log yet: ${log.missing}` : "no log yet";
      return;
    }
    pre.classList.remove("empty-log");
    meta.textContent = `${log.replica}, attempt ${log.attempt} · ${log.path}${log.exists ? "" : " (no such file yet)"}`;
    const text = log.text || (log.exists ? "(empty)" : "");
    if (pre.textContent === text) return;
    const key = `${log.replica}/${log.attempt}`;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24 || st.logKey !== key;
    pre.textContent = text;
    st.logKey = key;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  // ------------------------------------------------------------------ replicas

  function renderReplicas(job, selected) {
    if (!job.replicas.length) {
      return `<p class="empty">No replica has started yet${job.state === "QUEUED" ? " (the job is queued)" : ""}.</p>`;
    }
    const now = nowS();
    const rows = job.replicas.map((r) => {
      const exit = r.exit_code === null || r.exit_code === undefined ? "" : String(r.exit_code);
      const exitText = [exit, r.signal ? `(${r.signal})` : ""].filter(Boolean).join(" ");
      const ran = r.started_at_s ? fmtDur((r.ended_at_s || now) - r.started_at_s) : "—";
      const sel = r.name === selected ? " selected" : "";
      return `<tr data-testid="replica-row" data-replica="${esc(r.name)}" class="row-link${sel}" title="show ${esc(r.name)}'s log">
        <td class="mono">${esc(r.name)}</td>
        <td class="num">${esc(r.rank)}</td>
        <td>${badge(r.state, "replica-state")}</td>
        <td class="num">${esc(r.attempt)}${r.restart ? `<span class="muted small">.${esc(r.restart)}</span>` : ""}</td>
        <td class="num mono">${dash(r.pid)}</td>
        <td class="nowrap">${exitText ? esc(exitText) : '<span class="muted">—</span>'}</td>
        <td>${classBadge(r.failure_class)}</td>
        <td class="num nowrap">${ran}</td>
      </tr>`;
    });
    return `<table class="tbl replicas-table">
      <thead><tr><th>Replica</th><th class="num">Rank</th><th>State</th><th class="num">Attempt</th>
        <th class="num">PID</th><th>Exit</th><th>Failure</th><th class="num">Ran</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>
      <p class="small muted">The replicas of attempt ${esc(Math.max(0, job.attempts - 1))}, the latest. Click one to see its log.</p>`;
  }

  // ------------------------------------------------------------------ goodput

  function renderGoodput(g) {
    const total = g.total_s || 0;
    if (total <= 0) return `<p class="empty">No time recorded yet.</p>`;
    const parts = [["productive", g.productive_s || 0]];
    let spare = 0;
    const colours = { ...BADPUT_COLOURS };
    for (const [key, v] of Object.entries(g.badput || {})) {
      const name = key.replace(/_s$/, "");
      if (!colours[name]) colours[name] = SPARE_COLOURS[spare++ % SPARE_COLOURS.length];
      parts.push([name, v || 0]);
    }
    const sum = parts.reduce((a, [, v]) => a + v, 0) || 1;
    let x = 0;
    const rects = parts
      .filter(([, v]) => v > 0)
      .map(([name, v]) => {
        const w = (v / sum) * 1000;
        const r = `<rect x="${x.toFixed(2)}" y="0" width="${w.toFixed(2)}" height="28" fill="${colours[name]}" data-part="${esc(name)}"><title>${esc(label(name))}: ${fmtDur(v)} (${fmtPct(v / total)})</title></rect>`;
        x += w;
        return r;
      })
      .join("");
    const legend = parts
      .map(([name, v]) => {
        const zero = v <= 0 ? " zero" : "";
        return `<tr class="gp-row${zero}" data-testid="goodput-row" data-part="${esc(name)}">
          <td><span class="swatch" style="background:${colours[name]}"></span>${esc(label(name))}</td>
          <td class="gp-mini"><span style="width:${((v / sum) * 100).toFixed(1)}%;background:${colours[name]}"></span></td>
          <td class="num nowrap">${fmtDur(v)}</td>
          <td class="num">${fmtPct(v / total)}</td></tr>`;
      })
      .join("");
    const note = g.has_progress
      ? ""
      : `<p class="small muted">No training steps reported (sdk.report / sdk.heartbeat with a step): the time cannot be called productive.</p>`;
    return `<div class="gp-top">
        <span class="gp-big" data-testid="goodput-value">${fmtPct(g.goodput || 0)}</span>
        <span class="muted">goodput · ${fmtDur(g.productive_s)} productive of ${fmtDur(total)} · ${esc(g.failures)} failure${g.failures === 1 ? "" : "s"}</span>
      </div>
      <svg class="gp-bar" data-testid="goodput-chart" viewBox="0 0 1000 28" preserveAspectRatio="none" role="img"
        aria-label="goodput: productive time against each kind of badput">${rects}</svg>
      <table class="gp-legend">${legend}</table>
      ${note}
      ${g.advice && g.advice.text ? `<p class="advice small" data-testid="goodput-advice">${esc(g.advice.text)}</p>` : ""}`;
  }

  // ------------------------------------------------------------------ progress chart

  function renderProgress(job, history, records) {
    const steps = history.progress || [];
    if (!steps.length) {
      return `<p class="empty">No steps seen yet: none in the first rank's output that trainguard can read (give a <code>progress</code> pattern), and no <code>sdk.report({"step": n, ...})</code>.</p>`;
    }
    const W = 640;
    const H = 200;
    const L = 44;
    const R = 12;
    const T = 12;
    const B = 26;
    const t0 = Math.min(job.created_at_s, steps[0].at_s);
    const t1 = Math.max(job.ended_at_s || nowS(), steps[steps.length - 1].at_s, t0 + 1);
    const maxStep = Math.max(1, ...steps.map((s) => s.step));
    const X = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
    const Y = (s) => H - B - (s / maxStep) * (H - T - B);
    const byAttempt = new Map();
    for (const s of steps) {
      if (!byAttempt.has(s.attempt)) byAttempt.set(s.attempt, []);
      byAttempt.get(s.attempt).push(s);
    }
    let lines = "";
    let legend = "";
    for (const [attempt, rows] of byAttempt) {
      const colour = ATTEMPT_COLOURS[attempt % ATTEMPT_COLOURS.length];
      const pts = rows.map((s) => `${X(s.at_s).toFixed(1)},${Y(s.step).toFixed(1)}`).join(" ");
      lines += `<polyline points="${pts}" fill="none" stroke="${colour}" stroke-width="2" stroke-linejoin="round"/>`;
      lines += rows
        .filter((s) => s.checkpoint)
        .map((s) => `<circle cx="${X(s.at_s).toFixed(1)}" cy="${Y(s.step).toFixed(1)}" r="3" fill="#fff" stroke="${colour}" stroke-width="1.5"><title>checkpoint ${esc(s.checkpoint)} at step ${s.step}</title></circle>`)
        .join("");
      legend += `<span class="lg"><span class="swatch" style="background:${colour}"></span>attempt ${attempt}</span>`;
    }
    const marks = records
      .map((r) => {
        const x = X(r.at_s).toFixed(1);
        return `<line x1="${x}" x2="${x}" y1="${T}" y2="${H - B}" class="restart-line"><title>restart ${esc(r.round)}: ${esc(r.failure_class)} on ${esc(r.replica)}</title></line>
          <text x="${(+x + 3).toFixed(1)}" y="${T + 9}" class="restart-label">restart ${esc(r.round)}</text>`;
      })
      .join("");
    const grid = [0, 0.5, 1]
      .map((f) => {
        const s = Math.round(maxStep * f);
        return `<line x1="${L}" x2="${W - R}" y1="${Y(s)}" y2="${Y(s)}" class="grid"/>
          <text x="${L - 6}" y="${Y(s) + 4}" text-anchor="end" class="axis">${s}</text>`;
      })
      .join("");
    const xticks = [0, 0.25, 0.5, 0.75, 1]
      .map((f) => {
        const t = t0 + f * (t1 - t0);
        const anchor = f === 0 ? "start" : f === 1 ? "end" : "middle";
        const d = t - t0;
        const text = d < 60 ? `${d.toFixed(d < 10 && t1 - t0 < 20 ? 1 : 0)} s` : fmtDur(d);
        return `<text x="${X(t)}" y="${H - 8}" text-anchor="${anchor}" class="axis">${text}</text>`;
      })
      .join("");
    return `<svg class="progress-chart" data-testid="progress-chart" viewBox="0 0 ${W} ${H}" role="img" aria-label="training step over time, per attempt">
        ${grid}${marks}${lines}${xticks}
        <text x="${L}" y="${T - 2}" class="axis">step</text>
      </svg>
      <div class="legend small">${legend}<span class="lg"><span class="swatch restart-swatch"></span>restart</span>
        <span class="lg"><span class="swatch ckpt-swatch"></span>checkpoint</span></div>`;
  }

  // ------------------------------------------------------------------ faults

  function renderFaults(faults) {
    if (!faults.length) return `<p class="empty" data-testid="no-faults">No failures recorded.</p>`;
    const rows = faults.map(
      (f) => `<tr data-testid="fault-row">
        <td class="num"><b>${esc(f.count)}×</b></td>
        <td>${classBadge(f.failure_class)}<div class="small muted">${esc(f.rule)}</div></td>
        <td class="mono small">${esc((f.replicas || []).join(", "))}</td>
        <td class="num">${esc(f.root_causes)}</td>
        <td class="nowrap small">${fmtClock(f.first_at_s)}${f.last_at_s !== f.first_at_s ? `<br>${fmtClock(f.last_at_s)}` : ""}</td>
        <td class="example"><div class="mono small">${esc(f.example)}</div><div class="tiny muted mono">${esc(f.fingerprint)}</div></td>
      </tr>`,
    );
    return `<table class="tbl faults-table"><thead><tr><th class="num">Count</th><th>Class / rule</th>
      <th>Replicas</th><th class="num" title="times it was the root cause">Root</th><th>Seen</th><th>Example</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>`;
  }

  // ------------------------------------------------------------------ restart timeline

  const PHASES = [
    ["detect_ms", "detect", "#e3a21a"],
    ["stop_ms", "stop", "#d64545"],
    ["schedule_ms", "schedule", "#7d5bc6"],
    ["start_ms", "start", "#4f86e8"],
    ["first_output_ms", "first output", "#2f9e62"],
  ];

  function renderTimeline(job, records, stacks) {
    if (!records.length) {
      const live = !TERMINAL.has(job.state);
      return `<p class="empty" data-testid="no-restarts">No restarts${live ? " so far" : ""}.</p>`;
    }
    const items = records.map((r) => {
      const phases = PHASES.filter(([k]) => r[k] !== null && r[k] !== undefined);
      const total = phases.reduce((a, [k]) => a + r[k], 0) || 1;
      const bar = phases
        .map(([k, name, colour]) => `<span style="width:${Math.max(1.5, (r[k] / total) * 100).toFixed(1)}%;background:${colour}" title="${name} ${fmtMs(r[k])}"></span>`)
        .join("");
      const chips = phases
        .map(([k, name, colour]) => `<span class="phase"><span class="swatch" style="background:${colour}"></span>${name} <b>${fmtMs(r[k])}</b></span>`)
        .join("");
      // /stacks items carry no id to match r.snapshot_id: take the latest one before it
      const snap = r.snapshot_id
        ? stacks.filter((s) => s.at_s <= r.at_s + 1).sort((a, b) => b.at_s - a.at_s)[0]
        : null;
      const extra = [];
      if (r.cascade) extra.push(`<div><span class="k">cascade</span> ${esc(r.cascade)}</div>`);
      if (r.isolated) extra.push(`<div><span class="k">isolated</span> ${esc(r.isolated)}</div>`);
      if (r.matched_line && !(r.error_message || "").includes(r.matched_line)) extra.push(`<div><span class="k">matched</span> <span class="mono">${esc(r.matched_line)}</span></div>`);
      if (snap) extra.push(`<div><span class="k">stacks</span> <button type="button" class="linkish" data-snapshot-at="${snapKey(snap)}">stack dump of attempt ${esc(snap.attempt)}</button></div>`);
      return `<li class="tl-item fcb-${slug(r.failure_class)}" data-testid="restart-record">
        <div class="tl-dot"></div>
        <div class="tl-body">
          <div class="tl-head">
            <span class="tl-time nowrap" title="${esc(new Date(r.at_s * 1000).toISOString())}">${fmtClock(r.at_s)} <span class="muted">+${fmtDur(r.at_s - job.created_at_s)}</span></span>
            <b>restart ${esc(r.round)}</b>
            <span class="mono" data-testid="restart-replica">${esc(r.replica || "—")}</span>
            <span data-testid="restart-class">${classBadge(r.failure_class)}</span>
            <span class="small muted">rule ${esc(r.rule || "—")}${r.error_code ? ` · code ${esc(r.error_code)}` : ""}${r.error_source ? ` · from ${esc(r.error_source)}` : ""}</span>
          </div>
          <div class="tl-msg" data-testid="restart-message">${esc(r.error_message)}</div>
          <div class="tl-decision"><span class="k">decision</span> ${esc(r.decision)}</div>
          <div class="phases">${chips}</div>
          <div class="phase-bar" title="time to the next attempt, by phase">${bar}</div>
          ${extra.join("")}
        </div>
      </li>`;
    });
    return `<ol class="timeline" data-testid="timeline">${items.join("")}</ol>`;
  }

  // ------------------------------------------------------------------ stack snapshots

  const snapKey = (s) => `${s.attempt}-${Math.round(s.at_s * 1000)}`;

  function renderFrames(frames) {
    if (!frames || !frames.length) return `<p class="small muted">no frames</p>`;
    return `<ol class="frames">${frames
      .map(
        (f) => `<li class="${f.native ? "native" : "py"}"><span class="fn">${esc(f.name)}</span>
          <span class="loc" title="${esc(f.filename)}">${esc(basename(f.filename))}${f.line !== null && f.line !== undefined ? `:${esc(f.line)}` : ""}</span></li>`,
      )
      .join("")}</ol>`;
  }

  function renderStacks(stacks) {
    if (!stacks.length) {
      return `<p class="empty" data-testid="no-stacks">No stack dumps. They are taken when a hang is detected, before its replicas are stopped.</p>`;
    }
    const items = [...stacks].reverse().map((s, idx) => {
      const culprits = new Set(s.culprits || []);
      const report = s.report || {};
      const chip = (name) =>
        culprits.has(name) ? `<span class="chip culprit">${esc(name)}</span>` : `<span class="chip">${esc(name)}</span>`;
      // the snapshot's own list of culprits: one data-testid="culprit" per culprit replica
      const culpritChip = (name) => `<span class="chip culprit" data-testid="culprit">${esc(name)}</span>`;
      const diag = (report.replicas || [])
        .map(
          (d) => `<tr class="${d.culprit ? "culprit" : ""}" data-testid="stack-replica" data-replica="${esc(d.replica)}">
            <td class="mono">${esc(d.replica)}${d.culprit ? ' <span class="culprit-tag">culprit</span>' : ""}</td>
            <td class="num">${esc(d.rank)}</td>
            <td><span class="badge sk-${slug(d.state)}">${esc(d.state)}</span></td>
            <td>${dash(d.pace ?? d.progress)}</td>
            <td class="small">${esc(d.reason)}</td></tr>`,
        )
        .join("");
      const groups = (report.groups || [])
        .map((grp, gi) => {
          const hasCulprit = (grp.replicas || []).some((r) => culprits.has(r));
          const threads = grp.count === 1 ? "1 thread" : `${grp.count} threads`;
          return `<details class="stack-group${hasCulprit ? " culprit" : ""}" data-key="${snapKey(s)}-g${gi}"${gi < 2 && idx === 0 ? " open" : ""}>
            <summary>${threads} in ${(grp.replicas || []).map(chip).join(" ")}${grp.unique ? ' <span class="tag">unique</span>' : ""}
              <span class="small muted">${esc(firstPyFrame(grp.frames))}</span></summary>
            ${renderFrames(grp.frames)}
          </details>`;
        })
        .join("");
      const failed = (s.snapshots || [])
        .filter((x) => !x.ok)
        .map((x) => `<li><span class="mono">${esc(x.replica)}</span>: ${esc(x.tool)} failed: ${esc(x.error)}</li>`)
        .join("");
      const tools = [...new Set((s.snapshots || []).map((x) => x.tool))].join(", ");
      return `<article class="snap" data-testid="snapshot" data-snapshot-key="${snapKey(s)}">
        <div class="snap-head">
          <span class="badge fc fc-${slug(s.kind)}">${esc(s.kind)}</span>
          <b>attempt ${esc(s.attempt)}</b>
          <span class="muted">${fmtClock(s.at_s)} · took ${fmtMs(s.duration_ms)}${tools ? ` · ${esc(tools)}` : ""}</span>
          <span class="spacer"></span>
          ${culprits.size ? `<span class="small">culprit${culprits.size > 1 ? "s" : ""}:</span> ${[...culprits].map(culpritChip).join(" ")}` : '<span class="small muted">no culprit named</span>'}
        </div>
        <p class="snap-summary" data-testid="snapshot-summary">${esc(s.summary)}</p>
        ${diag ? `<table class="tbl diag"><thead><tr><th>Replica</th><th class="num">Rank</th><th>State</th><th>Pace</th><th>Why</th></tr></thead><tbody>${diag}</tbody></table>` : ""}
        ${groups ? `<div class="groups"><div class="small muted">identical stacks, grouped (innermost frame first)</div>${groups}</div>` : ""}
        ${failed ? `<ul class="snap-failed small">${failed}</ul>` : ""}
      </article>`;
    });
    return items.join("");
  }

  function firstPyFrame(frames) {
    const f = (frames || []).find((x) => !x.native) || (frames || [])[0];
    if (!f) return "";
    return `${f.name} (${basename(f.filename)}${f.line !== null && f.line !== undefined ? `:${f.line}` : ""})`;
  }

  // ------------------------------------------------------------------ history

  const EVENTS_KEPT = 500;

  // Add a page of /history's events to those the view holds (a page with older events left
  // out after ours is a gap: start again from it); the history shows what the view holds.
  function keepEvents(st, history) {
    if (st.events.length && !history.events_more) {
      st.events = st.events.concat(history.events);
    } else {
      st.events = history.events;
      st.eventsMore = history.events_more;
    }
    if (st.events.length > EVENTS_KEPT) {
      st.events = st.events.slice(-EVENTS_KEPT);
      st.eventsMore = true;
    }
    history.events = st.events;
  }

  function renderHistory(job, history) {
    const rows = [
      ...history.transitions.map((t) => ({
        at: t.at_s,
        html: `<td>${t.from_state ? `${badge(t.from_state)} → ` : ""}${badge(t.to_state)}</td><td class="small">${esc(t.reason)}</td>`,
      })),
      ...history.events.map((e) => ({
        at: e.at_s,
        html: `<td><span class="tag">${esc(e.kind)}</span> <span class="mono small">${esc(e.replica || "")}</span></td><td class="small">${esc(e.text)}</td>`,
      })),
    ].sort((a, b) => a.at - b.at);
    if (!rows.length) return `<p class="empty">Nothing yet.</p>`;
    return `<table class="tbl history-table"><tbody>${rows
      .map((r) => `<tr><td class="nowrap small">${fmtClock(r.at)} <span class="muted">+${fmtDur(r.at - job.created_at_s)}</span></td>${r.html}</tr>`)
      .join("")}</tbody></table>`;
  }

  // ------------------------------------------------------------------ start

  route();
})();
