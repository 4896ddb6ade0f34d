// The Agent-Reach dashboard: polls the gateway's JSON API once a second and renders it.
//
// Everything shown comes from agents and callers (descriptions, payloads, answers): it is
// untrusted, so it only ever reaches the page as text (textContent, Text nodes), never as HTML.
// Rows are updated in place by key, so that a focused button keeps its focus across updates.

const POLL_MS = 1000;
const LIMIT = 50;
// a big registry is shown a page at a time (GET /v1/agents?limit=, an extension of the API);
// its status counts are then each a page's total, asked for less often
const AGENTS_PAGE = 500;
const COUNTS_MS = 5000;
const STATUSES = ["healthy", "degraded", "suspect", "down"];
const ROUTABLE = new Set(["healthy", "degraded"]);

const $ = (id) => document.getElementById(id);

// --- small DOM helpers (text only) ---------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("aria-") || key === "role" || key === "title") {
      node.setAttribute(key, String(value));
    } else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child)); // strings become Text nodes
  }
  return node;
}

function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

function statusPill(status) {
  const known = STATUSES.includes(status) || status === "ok";
  return el("span", { class: `pill ${known ? `st-${status}` : "st-error"}` }, status);
}

function updatePill(node, status) {
  const known = STATUSES.includes(status) || status === "ok";
  const cls = `pill ${known ? `st-${status}` : "st-error"}`;
  if (node.className !== cls) node.className = cls;
  setText(node, status);
}

function ms(value) {
  if (value === null || value === undefined) return "–";
  return value < 100 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

function age(seconds) {
  if (!Number.isFinite(seconds)) return "–";
  const s = Math.max(0, seconds);
  if (s < 60) return `${s.toFixed(1)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function clock(ts) {
  const d = new Date(ts * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

// Reconcile tbody's rows with items by key: reuse, update, insert; existing rows keep their
// place (and focus) when new ones come in at the top.
function syncRows(tbody, items, keyOf, create, update) {
  const existing = new Map();
  for (const row of tbody.rows) existing.set(row.dataset.key, row);
  const wanted = new Set();
  let index = 0;
  for (const item of items) {
    const key = keyOf(item);
    wanted.add(key);
    let row = existing.get(key);
    if (!row) {
      row = create(item);
      row.dataset.key = key;
    }
    update(row, item);
    const at = tbody.rows[index];
    if (at !== row) tbody.insertBefore(row, at || null);
    index += 1;
  }
  for (const [key, row] of existing) if (!wanted.has(key)) row.remove();
}

// Token mode: the page is opened once as /dashboard#token=OPERATOR_TOKEN; the token is kept
// for this tab only (sessionStorage) and taken out of the address bar at once.
const TOKEN_KEY = "agent-reach-token";
function takeToken() {
  const given = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
  if (!given) return false;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(given[1]));
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}
takeToken();
// a token given to the open page (only the #fragment changed: the page is not reloaded)
window.addEventListener("hashchange", () => {
  if (takeToken()) poll();
});

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function getJSON(path, init = {}) {
  const response = await fetch(path, {
    cache: "no-store",
    ...init,
    headers: { Accept: "application/json", ...authHeaders(), ...(init.headers || {}) },
  });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return { status: response.status, body };
}

// --- state ---------------------------------------------------------------------------------

const state = {
  agents: [],
  total: 0, // agents registered: more than agents.length when only a page is shown
  counts: null, // by status, when only a page is shown (else counted from agents)
  countsAt: 0,
  at: null,
  inflight: null,
  selectedTrace: null,
};

// --- agents --------------------------------------------------------------------------------

function renderAgents() {
  const now = state.at ?? Date.now() / 1000;
  const tbody = $("agents-body");
  syncRows(
    tbody,
    state.agents,
    (a) => a.endpoint_id,
    (a) => {
      const row = el("tr", { dataset: { endpointId: a.endpoint_id } });
      const idCell = el("td", { class: "agent" }, el("code", { class: "id" }), el("div", { class: "desc" }));
      row.append(
        idCell,
        el("td", { class: "intents" }),
        el("td", {}, statusPill(a.status)),
        el("td", { class: "age" }),
        el("td", { class: "num avg" }),
        el("td", { class: "num p95" }),
        el("td", { class: "num inflight" }),
      );
      return row;
    },
    (row, a) => {
      row.dataset.status = a.status;
      const [idCell, intents, status, heard, avg, p95, inflight] = row.cells;
      setText(idCell.querySelector(".id"), a.endpoint_id);
      const desc = idCell.querySelector(".desc");
      setText(desc, a.description || "");
      desc.hidden = !a.description;
      // an A2A agent registered by its card: the skills no tag was found for, said
      const unmapped = a.a2a ? a.a2a.unmapped_skills : [];
      setText(
        intents,
        a.capabilities.join(", ") + (unmapped.length ? ` · unmapped skills: ${unmapped.join(", ")}` : ""),
      );
      intents.classList.toggle("unmapped", unmapped.length > 0);
      updatePill(status.firstChild, a.status);
      setText(heard, age(now - a.last_seen_at));
      setText(avg, ms(a.avg_latency_ms));
      setText(p95, ms(a.p95_latency_ms));
      const open = state.inflight ? state.inflight.endpoints[a.endpoint_id] || 0 : "n/a";
      setText(inflight, open);
    },
  );
  $("agents-empty").hidden = state.agents.length > 0;
  const partial = state.total > state.agents.length;
  const more = $("agents-more");
  more.hidden = !partial;
  if (partial) {
    setText(
      more,
      `The first ${state.agents.length} of ${state.total} agents by id (their intents below); ` +
        "agent-reach agents lists them all.",
    );
  }

  let counts = state.counts; // a page only: the gateway's counts (null until they come)
  if (!partial) {
    counts = Object.fromEntries(STATUSES.map((s) => [s, 0]));
    for (const a of state.agents) counts[a.status] = (counts[a.status] || 0) + 1;
  }
  const parts = [plural(state.total, "agent")];
  for (const s of STATUSES) parts.push(`${counts ? counts[s] : "?"} ${s}`);
  if (state.inflight) parts.push(`${state.inflight.total} in flight`);
  setText($("summary"), parts.join(" · "));
}

// --- intents -------------------------------------------------------------------------------

function intentsOf(agents) {
  const byIntent = new Map();
  for (const a of agents) {
    for (const tag of a.capabilities) {
      if (!byIntent.has(tag)) byIntent.set(tag, []);
      byIntent.get(tag).push(a);
    }
  }
  return [...byIntent.entries()].sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0));
}

function renderIntents() {
  const intents = intentsOf(state.agents);
  syncRows(
    $("intents-body"),
    intents,
    ([tag]) => tag,
    () => el("tr", {}, el("td", {}, el("code")), el("td", { class: "served" }), el("td")),
    (row, [tag, agents]) => {
      const [name, served, routable] = row.cells;
      setText(name.firstChild, tag);
      const chips = agents.map((a) =>
        el(
          "span",
          { class: `chip st-${a.status}` },
          a.endpoint_id,
          el("span", { class: "chip-status" }, a.status),
        ),
      );
      served.replaceChildren(...chips);
      const n = agents.filter((a) => ROUTABLE.has(a.status)).length;
      setText(routable, `${n} of ${agents.length}`);
      routable.className = n === 0 ? "none" : "";
      row.dataset.routable = String(n);
    },
  );
  $("intents-empty").hidden = intents.length > 0;
  fillOptions($("known-intents"), intents.map(([tag]) => tag));
  fillOptions($("known-agents"), state.agents.map((a) => a.endpoint_id));
  fillSelect($("filter-intent"), intents.map(([tag]) => tag));
}

function fillOptions(datalist, values) {
  const current = [...datalist.options].map((o) => o.value).join("\n");
  if (current === values.join("\n")) return;
  datalist.replaceChildren(...values.map((v) => el("option", { value: v })));
}

function fillSelect(select, values) {
  const chosen = select.value;
  const all = chosen && !values.includes(chosen) ? [...values, chosen] : values;
  const current = [...select.options].slice(1).map((o) => o.value).join("\n");
  if (current === all.join("\n")) return;
  const options = all.map((v) => el("option", { value: v }, v));
  select.replaceChildren(el("option", { value: "" }, "any"), ...options);
  select.value = chosen;
}

// --- recent requests -----------------------------------------------------------------------

function tracesUrl() {
  const params = new URLSearchParams({ limit: String(LIMIT) });
  const intent = $("filter-intent").value;
  const outcome = $("filter-outcome").value;
  if (intent) params.set("intent", intent);
  if (outcome) params.set("outcome", outcome);
  return `v1/traces?${params}`;
}

function renderRequests(traces) {
  syncRows(
    $("requests-body"),
    traces,
    (t) => `${t.ts}|${t.trace_id}|${t.msg_id}`,
    (t) => {
      const button = el(
        "button",
        {
          type: "button",
          class: "link",
          title: t.trace_id,
          "aria-label": `Show the timeline of trace ${t.trace_id}`,
        },
        t.trace_id.length > 14 ? `${t.trace_id.slice(0, 12)}…` : t.trace_id,
      );
      button.addEventListener("click", (event) => {
        event.stopPropagation();
        openTrace(t.trace_id, true);
      });
      const row = el(
        "tr",
        { class: "clickable", dataset: { traceId: t.trace_id, outcome: t.outcome } },
        el("td", { class: "time" }, clock(t.ts)),
        el("td", {}, el("code", {}, t.intent)),
        el("td", {}, statusPill(t.outcome)),
        el("td", {}, t.endpoint_id ? el("code", {}, t.endpoint_id) : "–"),
        el("td", { class: "num" }, ms(t.latency_ms)),
        el("td", { class: "num" }, String(t.attempts)),
        el("td", {}, button),
      );
      row.addEventListener("click", () => openTrace(t.trace_id, false));
      return row;
    },
    (row, t) => {
      row.classList.toggle("selected", t.trace_id === state.selectedTrace);
    },
  );
  $("requests-empty").hidden = traces.length > 0;
}

// --- trace timeline ------------------------------------------------------------------------

const SKIP = new Set(["ts", "kind", "from_domain"]);

function describe(e) {
  // an event of another domain's gateway, merged into the origin's trace (federation)
  const parts = describeLocal(e);
  return e.from_domain ? [`@${e.from_domain}`, ...parts] : parts;
}

function describeLocal(e) {
  switch (e.kind) {
    case "received":
      return [
        e.intent,
        e.sender ? `from ${e.sender}` : null,
        e.recipient_hint ? `hint ${e.recipient_hint}` : null,
        e.timeout_ms ? `timeout ${e.timeout_ms} ms` : null,
      ];
    case "route":
      return [
        e.chosen ? `chose ${e.chosen}` : null,
        e.recipient_hint ? `named by recipient_hint ${e.recipient_hint}` : null,
        e.per_try_timeout_ms ? `per try ${ms(e.per_try_timeout_ms)}` : null,
        e.max_retries !== undefined ? `max retries ${e.max_retries}` : null,
        e.healthy !== undefined
          ? `${e.healthy} healthy, ${e.degraded} degraded, ${e.unavailable} unavailable`
          : null,
      ];
    case "attempt":
      return [
        `#${e.attempt} ${e.endpoint_id}`,
        e.outcome,
        e.status ? `HTTP ${e.status}` : null,
        ms(e.latency_ms),
        e.detail || null,
      ];
    case "answer":
      return e.ok
        ? [`answered by ${e.endpoint_id}`, ms(e.latency_ms)]
        : [`error ${e.error}`, e.detail || null, ms(e.latency_ms)];
    default:
      return Object.entries(e)
        .filter(([k]) => !SKIP.has(k))
        .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`);
  }
}

function eventClass(e) {
  if (e.kind === "attempt") return e.outcome === "ok" ? "ev-ok" : "ev-bad";
  if (e.kind === "answer") return e.ok ? "ev-ok" : "ev-bad";
  return "ev-info";
}

function renderTimeline(traceId, events) {
  const list = $("timeline-events");
  if (!events.length) {
    list.replaceChildren();
    return;
  }
  // attempts are recorded when they end: they started latency_ms earlier
  const startOf = (e) => (e.kind === "attempt" && e.latency_ms ? e.ts - e.latency_ms / 1000 : e.ts);
  const t0 = Math.min(...events.map(startOf));
  const t1 = Math.max(...events.map((e) => e.ts));
  const span = Math.max(t1 - t0, 1e-6);
  const items = events.map((e) => {
    const bar = el("span", { class: "bar" });
    const left = ((startOf(e) - t0) / span) * 100;
    const width = ((e.ts - startOf(e)) / span) * 100;
    // at least 3 px wide, and kept inside the track at its right end
    bar.style.left = `calc(${left.toFixed(2)}% - ${(left * 0.03).toFixed(2)}px)`;
    bar.style.width = `max(${width.toFixed(2)}%, 3px)`;
    const parts = describe(e).filter((p) => p !== null && p !== "");
    return el(
      "li",
      { class: `event ${eventClass(e)}`, dataset: { kind: e.kind } },
      el("span", { class: "offset" }, `+${((e.ts - t0) * 1000).toFixed(1)} ms`),
      el("span", { class: "kind" }, e.kind),
      el("span", { class: "what" }, parts.join(" · ")),
      el("span", { class: "track", "aria-hidden": "true" }, bar),
    );
  });
  list.replaceChildren(...items);
  setText($("timeline-trace"), traceId);
}

async function openTrace(traceId, focus) {
  state.selectedTrace = traceId;
  for (const row of $("requests-body").rows) {
    row.classList.toggle("selected", row.dataset.traceId === traceId);
  }
  $("timeline-hint").hidden = true;
  $("timeline").hidden = false;
  setText($("timeline-trace"), traceId);
  const error = $("timeline-error");
  try {
    const { status, body } = await getJSON(`v1/traces/${encodeURIComponent(traceId)}`);
    if (state.selectedTrace !== traceId) return; // another one was chosen meanwhile
    if (status === 200 && body && Array.isArray(body.events)) {
      error.hidden = true;
      renderTimeline(traceId, body.events);
    } else {
      $("timeline-events").replaceChildren();
      error.hidden = false;
      setText(error, body && body.detail ? `${body.error}: ${body.detail}` : `HTTP ${status}`);
    }
  } catch (exc) {
    error.hidden = false;
    setText(error, `the gateway did not answer (${exc.message || exc})`);
  }
  if (focus) $("timeline-title").focus();
}

// --- the NATS link --------------------------------------------------------------------------

// GET /healthz has "nats" only when the gateway runs with --nats: the element stays hidden
// without it. Disconnected is red, and says why; the details are in its tooltip.
function renderNats(health) {
  const node = $("nats");
  const link = health && health.nats;
  if (!link) {
    node.hidden = true;
    return;
  }
  node.hidden = false;
  const stateName = link.connected ? "connected" : "disconnected";
  if (node.dataset.state !== stateName) node.dataset.state = stateName;
  const parts = [`NATS ${stateName}`];
  if (link.connected && link.server) parts.push(link.server);
  if (link.reconnects) parts.push(plural(link.reconnects, "reconnect"));
  if (link.slow_consumers) parts.push(`${link.slow_consumers} dropped (slow consumer)`);
  if (!link.connected && link.last_error) {
    const error = String(link.last_error);
    parts.push(error.length > 60 ? `${error.slice(0, 59)}…` : error);
  }
  setText(node, parts.join(" · "));
  const details = [
    `server: ${link.server || "none"}`,
    `reconnects: ${link.reconnects}`,
    `slow consumers: ${link.slow_consumers}`,
    `last error: ${link.last_error || "none"}`,
  ].join("\n");
  if (node.title !== details) node.title = details;
}

function natsUnknown() {
  const node = $("nats");
  if (node.hidden) return;
  node.dataset.state = "unknown";
  setText(node, "NATS unknown");
}

// --- federation (GET /v1/federation) --------------------------------------------------------

// Shown only when the gateway is in a federation (--directory): the other domains, how old
// their summaries are (stale ones are not used), the round trip this gateway measured to
// them, and the intents each offers routable now. Endpoints of other domains show as
// agent://NAME@DOMAIN in the requests and the timeline.
function renderDomains(fed) {
  const panel = $("domains-panel");
  if (!fed || !fed.directory) {
    panel.hidden = true;
    return;
  }
  panel.hidden = false;
  const own = fed.directory_ok === false ? `directory unreachable: ${fed.directory_error || "?"}` : "directory ok";
  setText($("domains-self"), `this gateway: domain ${fed.domain} · ${own}`);
  const offered = (p) =>
    Object.entries(p.intents || {})
      .filter(([, c]) => c.healthy + c.degraded > 0)
      .map(([tag]) => tag)
      .sort();
  const stateOf = (p) => (p.stale ? "stale" : p.reachable ? "fresh" : "unreachable");
  syncRows(
    $("domains-body"),
    fed.peers,
    (p) => p.domain,
    (p) =>
      el(
        "tr",
        { dataset: { domain: p.domain } },
        el("td", {}, el("code", {}, p.domain)),
        el("td", { class: "state" }),
        el("td", { class: "num rtt" }),
        el("td", { class: "tags" }),
      ),
    (row, p) => {
      const state = stateOf(p);
      row.dataset.state = state;
      setText(row.querySelector(".state"), `${state} · ${age(p.age_s)}`);
      setText(row.querySelector(".rtt"), p.rtt_ms === null ? "–" : ms(p.rtt_ms));
      const tags = offered(p);
      setText(row.querySelector(".tags"), tags.length ? tags.join(", ") : "none");
      row.title = p.unreachable_reason || "";
    },
  );
  $("domains-empty").hidden = fed.peers.length > 0;
}

// --- polling -------------------------------------------------------------------------------

// A page's total for each status (one short page each): the counts of a registry too big to
// list, at most every COUNTS_MS.
async function refreshCounts() {
  if (state.counts && Date.now() - state.countsAt < COUNTS_MS) return;
  const answers = await Promise.all(
    STATUSES.map((s) => getJSON(`v1/agents?status=${s}&limit=1`)),
  );
  if (answers.every((a) => a.status === 200 && a.body && Number.isInteger(a.body.total))) {
    state.counts = Object.fromEntries(STATUSES.map((s, i) => [s, answers[i].body.total]));
    state.countsAt = Date.now();
  }
}

let timer = null;
let polling = false; // one poll at a time: one asked for meanwhile runs right after
let pollAgain = false;

async function poll() {
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  clearTimeout(timer);
  const live = $("live");
  try {
    const [agents, inflight, traces, health] = await Promise.all([
      getJSON(`v1/agents?limit=${AGENTS_PAGE}`),
      getJSON("v1/inflight"),
      getJSON(tracesUrl()),
      getJSON("healthz"),
    ]);
    if (health.status === 200) renderNats(health.body);
    else natsUnknown();
    // the domains' panel: only for a gateway in a federation (its /healthz says so)
    if (health.status === 200 && health.body && health.body.federation) {
      const fed = await getJSON("v1/federation");
      renderDomains(fed.status === 200 ? fed.body : null);
    } else {
      renderDomains(null);
    }
    if (agents.status === 401 || agents.status === 403) {
      live.dataset.state = "down";
      setText(
        live,
        "this gateway runs in token mode: open the page as /dashboard#token=OPERATOR_TOKEN " +
          "(agent-reach auth token operator --keys DIR)",
      );
      return;
    }
    if (agents.status !== 200 || !agents.body) throw new Error(`/v1/agents answered HTTP ${agents.status}`);
    state.agents = agents.body.agents;
    // a gateway that does not page answers every agent, without a total
    state.total = Number.isInteger(agents.body.total) ? agents.body.total : state.agents.length;
    if (state.total > state.agents.length) await refreshCounts();
    else state.counts = null;
    state.inflight = inflight.status === 200 && inflight.body ? inflight.body : null;
    state.at = state.inflight ? state.inflight.at : null;
    renderAgents();
    renderIntents();
    if (traces.status === 200 && traces.body) renderRequests(traces.body.traces);
    live.dataset.state = "live";
    setText(live, `live · updated ${clock(state.at ?? Date.now() / 1000)}`);
  } catch (exc) {
    live.dataset.state = "down";
    setText(live, `gateway unreachable (${exc.message || exc}); retrying`);
    natsUnknown();
  } finally {
    polling = false;
    if (pollAgain) {
      pollAgain = false;
      poll();
    } else {
      timer = setTimeout(poll, POLL_MS);
    }
  }
}

// --- try a reach ---------------------------------------------------------------------------

function definitionList(pairs) {
  const dl = el("dl", { class: "facts" });
  for (const [term, value] of pairs) {
    if (value === null || value === undefined) continue;
    dl.append(el("dt", {}, term), el("dd", {}, value));
  }
  return dl;
}

function renderAnswer(status, body) {
  const box = $("reach-answer");
  box.hidden = false;
  if (!body) {
    box.replaceChildren(el("h3", {}, "Answer"), el("p", { class: "error" }, `HTTP ${status}, not JSON`));
    return;
  }
  const children = [el("h3", {}, "Answer")];
  if (body.ok) {
    children.push(
      el(
        "p",
        { class: "outcome" },
        statusPill("ok"),
        " answered by ",
        el("code", {}, body.endpoint_id),
        ` in ${ms(body.latency_ms)}`,
      ),
    );
  } else {
    children.push(
      el(
        "p",
        { class: "outcome" },
        statusPill(body.error || "error"),
        ` HTTP ${status}: `,
        body.detail || "",
      ),
    );
    if (body.field) children.push(el("p", { class: "muted" }, `field: ${body.field}`));
  }
  const attempts = Array.isArray(body.attempts) ? body.attempts : [];
  if (attempts.length) {
    children.push(
      el(
        "ol",
        { class: "attempts" },
        ...attempts.map((a) =>
          el("li", {}, el("code", {}, a.endpoint_id), ` ${a.outcome} ${ms(a.latency_ms)}`),
        ),
      ),
    );
  }
  // a scrollable box of JSON, focusable so that keyboard users can scroll it too
  const json = (label, value) =>
    el("pre", { class: "json", tabIndex: 0, "aria-label": label }, JSON.stringify(value, null, 2));
  if (body.ok) children.push(json("result", body.result));
  else if (body.agent_answer !== undefined && body.agent_answer !== null) {
    children.push(json("agent answer", body.agent_answer));
  }
  if (body.trace_id) {
    const show = el("button", { type: "button", class: "small" }, "Show its timeline");
    show.addEventListener("click", () => openTrace(body.trace_id, true));
    children.push(el("p", {}, "trace ", el("code", {}, body.trace_id), " ", show));
  }
  box.replaceChildren(...children);
}

function renderRoute(status, body) {
  const box = $("reach-route");
  box.hidden = false;
  const children = [
    el("h3", {}, "Route explanation"),
    el("p", { class: "muted" }, "the dry run (GET /v1/route) just before sending"),
  ];
  if (!body || !body.ok) {
    const code = (body && body.error) || "error";
    children.push(el("p", {}, statusPill(code), ` HTTP ${status}: `, (body && body.detail) || ""));
    box.replaceChildren(...children);
    return;
  }
  children.push(
    definitionList([
      ["chosen", body.chosen || "none"],
      ["per-try timeout", ms(body.per_try_timeout_ms)],
      ["max retries", String(body.max_retries)],
    ]),
  );
  const rows = body.candidates.map((c) =>
    el(
      "tr",
      {},
      el("td", {}, el("code", {}, c.endpoint_id), c.chosen ? el("span", { class: "tag" }, "chosen") : null),
      el("td", {}, statusPill(c.status)),
      el("td", { class: "num" }, c.confidence.toFixed(2)),
      el("td", { class: "num" }, `${ms(c.avg_latency_ms)} / ${ms(c.p95_latency_ms)}`),
      el("td", {}, c.eligible ? "yes" : "no"),
      el("td", {}, c.reason),
    ),
  );
  const head = ["Candidate", "Status", "Confidence", "Avg / p95", "Eligible", "Reason"];
  children.push(
    el(
      "div",
      { class: "scroll" },
      el(
        "table",
        { class: "candidates" },
        el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, ...rows),
      ),
    ),
  );
  box.replaceChildren(...children);
}

async function tryReach(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const payloadBox = $("f-payload");
  const payloadError = $("f-payload-error");
  let payload;
  try {
    payload = JSON.parse(payloadBox.value.trim() || "{}");
    payloadError.hidden = true;
    payloadBox.removeAttribute("aria-invalid");
  } catch (exc) {
    payloadError.hidden = false;
    setText(payloadError, `not JSON: ${exc.message}`);
    payloadBox.setAttribute("aria-invalid", "true");
    payloadBox.focus();
    return;
  }
  if (!form.reportValidity()) return;
  const intent = $("f-intent").value.trim();
  const hint = $("f-hint").value.trim();
  const timeout = Number($("f-timeout").value);
  const body = { intent, payload, timeout_ms: timeout };
  if (hint) body.recipient_hint = hint;
  const query = new URLSearchParams({ intent, timeout_ms: String(timeout) });
  if (hint) query.set("recipient_hint", hint);

  const send = $("f-send");
  send.disabled = true;
  setText(send, "Sending…");
  try {
    const route = await getJSON(`v1/route?${query}`);
    const answer = await getJSON("v1/send", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    renderAnswer(answer.status, answer.body);
    renderRoute(route.status, route.body);
    poll();
  } catch (exc) {
    renderAnswer(0, { ok: false, error: "gateway_unavailable", detail: String(exc.message || exc) });
  } finally {
    send.disabled = false;
    setText(send, "Send");
  }
}

// --- start ---------------------------------------------------------------------------------

$("reach-form").addEventListener("submit", tryReach);
$("filter-intent").addEventListener("change", poll);
$("filter-outcome").addEventListener("change", poll);
$("timeline-refresh").addEventListener("click", () => {
  if (state.selectedTrace) openTrace(state.selectedTrace, false);
});
poll();
