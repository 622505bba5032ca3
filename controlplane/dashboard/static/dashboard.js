// The control plane's dashboard: it polls the admin server's JSON
// endpoints (the same ones curl reads) and draws them. Nothing here
// computes a weight: every number on the page is one the control plane
// published or observed.
"use strict";

(function () {
  const REFRESH_MS = 2000;
  const CHART_HEIGHT = 220;

  const state = {
    fleet: null,     // {name, engines: [{id, region, gpu}], frontends: [{node, region}], priorities: [name]}
    hist: null,      // the history so far, column-major as GET /history gives it
    charts: {},      // uPlot instances by name
    open: null,      // the explained cell: {node, cls, engine}
  };

  const $ = (sel) => document.querySelector(sel);

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("data-") || k === "title" || k === "colspan") e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c);
    return e;
  }

  async function getJSON(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) {
      const body = (await r.text()).trim();
      const err = new Error(path + ": " + r.status + (body ? " (" + body + ")" : ""));
      err.status = r.status;
      throw err;
    }
    return r.json();
  }

  // Number formatting: "–" for what was not observed (null in the JSON).
  const num = (v, digits) => (v === null || v === undefined || !isFinite(v)) ? "–" : v.toFixed(digits);
  const pct = (v) => (v === null || v === undefined || !isFinite(v)) ? "–" : (100 * v).toFixed(1) + "%";

  // Colours: one hue per region, engines of a region in shades of it.
  const HUES = [212, 28, 140, 282, 355, 52, 185, 320];
  function engineColours(engines) {
    const regions = [];
    for (const e of engines) if (!regions.includes(e.region)) regions.push(e.region);
    const seen = {};
    return engines.map((e) => {
      const r = regions.indexOf(e.region);
      const k = (seen[e.region] = (seen[e.region] || 0) + 1) - 1;
      return `hsl(${HUES[r % HUES.length]}, 70%, ${Math.min(28 + 11 * k, 72)}%)`;
    });
  }

  // ---- weights heatmap ----

  // ids in the fleet's order (order: the fleet's ids), unknown ones last
  // by name.
  function inOrder(order, ids) {
    const rank = (id) => { const i = order.indexOf(id); return i < 0 ? Infinity : i; };
    return [...ids].sort((a, b) => (rank(a) - rank(b)) || (a < b ? -1 : a > b ? 1 : 0));
  }
  const orderedEngines = (ids) => inOrder(state.fleet ? state.fleet.engines.map((e) => e.id) : [], ids);
  const orderedNodes = (ids) => inOrder(state.fleet ? state.fleet.frontends.map((f) => f.node) : [], ids);

  function cellStyle(w) {
    // White at 0, deep blue at 1; the number is printed in the cell too.
    const light = 97 - 60 * Math.max(0, Math.min(1, w));
    return { background: `hsl(214, 75%, ${light}%)`, color: light < 60 ? "#fff" : "#111" };
  }

  // observedShed is what ext_proc reported it shed of a node's class, per
  // priority (/signals demand, over the demand window): the planned shed
  // plus its local in-flight guardrail's 429s.
  function observedShed(sig, node, cls) {
    const out = [];
    for (const [k, d] of Object.entries((sig && sig.demand) || {})) {
      const [n, c, p] = k.split("/");
      if (n === node && c === cls && d.requests_per_s > 0 && d.shed_per_s > 0) out.push([p, d.shed_per_s / d.requests_per_s]);
    }
    return out.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }

  function renderWeights(w, sig) {
    const box = $("#heatmaps");
    box.setAttribute("data-at", w.at);
    const classes = new Set();
    for (const nd of Object.values(w.nodes)) for (const c of Object.keys(nd.classes)) classes.add(c);
    const nodes = orderedNodes(Object.keys(w.nodes));
    const frag = document.createDocumentFragment();
    for (const cls of [...classes].sort()) {
      const engines = new Set();
      for (const n of nodes) {
        const cd = w.nodes[n].classes[cls];
        if (cd) for (const id of Object.keys(cd.weights || {})) engines.add(id);
      }
      const ids = orderedEngines(engines);
      const head = el("tr", {}, el("th", { text: "frontend \\ engine" }));
      for (const id of ids) {
        const meta = state.fleet && state.fleet.engines.find((e) => e.id === id);
        head.append(el("th", { class: "engine-col", text: id, title: meta ? `${meta.region}, ${meta.gpu}` : id }));
      }
      head.append(el("th", { text: "shed planned", title: "fraction of each priority's demand the control plane tells ext_proc to shed (429), from the allocation" }));
      head.append(el("th", {
        text: "shed observed",
        title: "fraction of each priority's requests ext_proc answered 429, as it reports them (over the demand window): the planned shed plus its local in-flight guardrail's. Above the planned fraction, the rest is the guardrail: more requests in flight at the frontend than its local limit (engines slower than planned, a burst)",
      }));
      const body = el("tbody");
      for (const n of nodes) {
        const cd = w.nodes[n].classes[cls];
        if (!cd) continue;
        const row = el("tr", {}, el("th", { class: "node", text: n },
          cd.held_by_deadband ? el("span", { class: "badge", text: "held", title: `the deadband kept these weights (the optimizer proposed a change of ${(100 * cd.tv_distance_proposed).toFixed(1)}% total variation)` }) : ""));
        for (const id of ids) {
          if (!(id in (cd.weights || {}))) {
            row.append(el("td", { class: "na", text: "", title: `${id} does not serve class ${cls}` }));
            continue;
          }
          const share = cd.weights[id];
          const td = el("td", {
            class: "cell", text: share > 0 ? pct(share) : "·",
            "data-node": n, "data-class": cls, "data-engine": id, "data-weight": String(share),
            title: `${n} → ${id} (class ${cls}): share ${pct(share)}, Envoy weight ${cd.envoy_weights[id]}` +
              `${cd.envoy_priority[id] ? " at priority " + cd.envoy_priority[id] + " (standby)" : ""}, health ${cd.engine_health[id]}. Click for the reasons.`,
          });
          Object.assign(td.style, cellStyle(share));
          if (cd.engine_health[id] && cd.engine_health[id] !== "healthy") td.classList.add("unhealthy");
          const o = state.open;
          if (o && o.node === n && o.cls === cls && o.engine === id) td.classList.add("selected");
          td.addEventListener("click", () => openExplain(n, cls, id));
          row.append(td);
        }
        const shed = Object.entries(cd.shed_by_priority || {}).filter(([, f]) => f > 0)
          .map(([p, f]) => `${p} ${pct(f)}`).join(", ");
        row.append(el("td", { class: "shed planned", "data-node": n, "data-class": cls, text: shed || "·" }));
        const obs = observedShed(sig, n, cls).map(([p, f]) => `${p} ${pct(f)}`).join(", ");
        row.append(el("td", { class: "shed observed", "data-node": n, "data-class": cls, text: obs || "·" }));
        body.append(row);
      }
      frag.append(el("div", { class: "heatmap-wrap" },
        el("h3", { text: "class " + cls }),
        el("table", { class: "heatmap", "data-class": cls }, el("thead", {}, head), body)));
    }
    box.replaceChildren(frag);
  }

  // ---- explanation of one weight ----

  const TERMS = [
    ["network_ms", "round trip", "network time from the frontend to the engine's region"],
    ["latency_ms", "latency", "the request's time to first token at the engine's solved load (queueing and penalty included): what the plan charges"],
    ["outlier_cost_ms", "outlier cost", "charge for a misbehaving engine: penalty-cost-ms × its penalty"],
    ["congestion_ms", "congestion", "extra latency one more request imposes on the requests already there"],
    ["capacity_price_ms", "capacity price", "the engine's capacity constraint's price: > 0 only when it is at its headroom"],
    ["stability_ms", "stability", "charge for moving traffic (its KV cache is elsewhere): + where the engine gains share, − where it loses it"],
  ];

  // The open explanation is in the address (#explain/NODE/CLASS/ENGINE), so
  // a link or a reload shows the same one.
  function explainHash(o) {
    return o ? "#explain/" + [o.node, o.cls, o.engine].map(encodeURIComponent).join("/") : "";
  }

  function hashExplain() {
    const parts = location.hash.split("/");
    if (parts.length !== 4 || parts[0] !== "#explain") return null;
    const [node, cls, engine] = parts.slice(1).map(decodeURIComponent);
    return { node, cls, engine };
  }

  function openExplain(node, cls, engine) {
    state.open = { node, cls, engine };
    history.replaceState(null, "", location.pathname + location.search + explainHash(state.open));
    for (const td of document.querySelectorAll("td.cell.selected")) td.classList.remove("selected");
    const td = document.querySelector(`td.cell[data-node="${CSS.escape(node)}"][data-class="${CSS.escape(cls)}"][data-engine="${CSS.escape(engine)}"]`);
    if (td) td.classList.add("selected");
    const panel = $("#explain");
    panel.hidden = false;
    $("#explain-title").textContent = `${engine} for ${node}, class ${cls}`;
    refreshExplain().catch(showError);
  }

  async function refreshExplain() {
    const o = state.open;
    if (!o) return;
    const x = await getJSON(`../explain?node=${encodeURIComponent(o.node)}&class=${encodeURIComponent(o.cls)}`);
    if (state.open !== o) return; // another cell was clicked meanwhile
    const c = ((x.nodes || {})[o.node] || {})[o.cls];
    const panel = $("#explain");
    panel.setAttribute("data-node", o.node);
    panel.setAttribute("data-class", o.cls);
    panel.setAttribute("data-engine", o.engine);
    panel.setAttribute("data-at", x.at);
    const body = $("#explain-body");
    if (!c) {
      body.replaceChildren(el("p", { text: `The last cycle has no decision for ${o.node} / ${o.cls}.` }));
      return;
    }
    const flow = c.flow || {};
    const e = (c.explanations || []).find((w) => w.engine === o.engine);
    const published = (c.weights || {})[o.engine], proposed = (c.proposed || {})[o.engine];
    const summary = el("p", { class: "explain-summary" },
      `Published share ${pct(published)}; the optimizer proposed ${pct(proposed)}` +
      (c.held_by_deadband ? " (held: the change was within the deadband)" : "") +
      `. Demand ${num(c.demand_per_s, 2)} req/s of this class from ${o.node}; allocator ${x.allocator}` +
      (x.fallback_reason ? ` (fallback: ${x.fallback_reason})` : "") + ".");
    const out = [summary];
    if (e) {
      const rows = el("tbody");
      let sum = 0;
      for (const [key, label, help] of TERMS) {
        sum += e[key];
        rows.append(el("tr", { title: help }, el("th", { text: label }), el("td", { class: "ms", text: num(e[key], 2) + " ms" }), el("td", { class: "muted", text: help })));
        if (key === "latency_ms") {
          rows.append(el("tr", { class: "sub" }, el("th", { text: "" }), el("td", {}),
            el("td", { class: "muted", text: `TTFT ${num(e.ttft_ms, 1)} ms, TBOT ${num(e.tbot_ms, 2)} ms, of which queueing ${num(e.queueing_ms, 1)} ms and penalty ${num(e.penalty_ms, 1)} ms` })));
        }
      }
      rows.append(el("tr", { class: "total" }, el("th", { text: "= marginal cost" }), el("td", { class: "ms", text: num(sum, 2) + " ms" }),
        el("td", { class: "muted", text: "of one more request of this flow at this engine" })));
      rows.append(el("tr", { class: "price", "data-price": String(flow.price_ms) }, el("th", { text: "flow price" }),
        el("td", { class: "ms", text: num(flow.price_ms, 2) + " ms" }),
        el("td", { class: "muted", text: "the cheapest engine's marginal cost: every engine with traffic costs this much at the optimum, engines without cost more" })));
      out.push(el("table", { class: "terms" }, rows));
      out.push(el("p", { class: "muted" },
        `This engine takes ${num(e.rate_per_s, 2)} req/s of the flow (share ${pct(e.weight)}; last cycle ${pct(e.last_weight)}), at ${pct(e.utilization)} of its available capacity.`));
    } else {
      out.push(el("p", { class: "no-traffic", "data-price": String(flow.price_ms) },
        `The optimizer sends none of this flow to ${o.engine}: one request there would cost at least the flow's price, ` +
        `${num(flow.price_ms, 2)} ms (the engines with traffic are cheaper).`));
    }
    body.replaceChildren(...out);
  }

  // ---- engine table ----

  function renderEngines(sig) {
    const views = {};
    for (const v of sig.cycle_view || []) views[v.id] = v;
    const tbody = $("#engines tbody");
    const rows = [];
    for (const e of orderedEngines((sig.engines || []).map((e) => e.id)).map((id) => sig.engines.find((e) => e.id === id))) {
      const v = views[e.id] || {};
      const meta = (state.fleet && state.fleet.engines.find((m) => m.id === e.id)) || {};
      const up = e.state === "up";
      rows.push(el("tr", { "data-engine": e.id },
        el("th", { text: e.id }),
        el("td", { text: meta.region || "" }),
        el("td", { text: meta.gpu || "" }),
        el("td", { class: "state-" + e.state, text: e.state, title: e.last_error || "" }),
        el("td", { text: v.health || "–" }),
        el("td", { class: "n", text: up ? num(e.running, 1) : "–" }),
        el("td", { class: "n", text: up ? num(e.waiting, 1) : "–" }),
        el("td", { class: "n", text: up ? pct(e.kv_usage) : "–" }),
        el("td", { class: "n", text: num(e.ttft_ms, 0) }),
        el("td", { class: "n", text: num(e.tbot_ms, 1) }),
        el("td", { class: "n", text: up ? num(e.requests_per_s, 2) : "–" }),
        el("td", { class: "n", text: up ? pct(e.prefix_cache_hit_rate) : "–" }),
        el("td", { class: "n", text: v.id ? `${pct(v.observed_utilization)} / ${pct(v.planned_utilization)}` : "–",
          title: v.id ? `our traffic ${pct(v.own_utilization)} (the plan, or more where ext_proc saw Envoy send more while shedding); background load ${pct(v.background_load)} = observed − ours − 10% noise floor` : "" }),
        el("td", { class: "n" + (v.penalty > 0 ? " penalized" : ""), text: v.id ? pct(v.penalty) : "–", title: v.penalty_why || "" }),
        el("td", { class: "n", text: v.profile_correction ? num(v.profile_correction, 2) : "–", title: v.profile_correction_why || "" })));
    }
    tbody.replaceChildren(...rows);
  }

  // ---- charts over time ----

  function mergeHistory(h) {
    const cur = state.hist;
    if (!cur || cur.capacity !== h.capacity || cur.engines.length !== h.engines.length) {
      state.hist = h;
      return;
    }
    const cat = (a, b) => a.concat(b).slice(-h.capacity);
    cur.at = cat(cur.at, h.at);
    cur.engines.forEach((e, j) => {
      for (const k of Object.keys(e)) if (Array.isArray(e[k])) e[k] = cat(e[k], h.engines[j][k]);
    });
    cur.frontends.forEach((f, i) => {
      for (const k of Object.keys(f)) if (Array.isArray(f[k])) f[k] = cat(f[k], h.frontends[i][k]);
    });
    cur.priorities.forEach((p, k) => { p.shed_per_s = cat(p.shed_per_s, h.priorities[k].shed_per_s); });
  }

  function chart(name, series, data, fmt) {
    const box = $("#chart-" + name);
    const width = Math.max(300, box.clientWidth);
    let u = state.charts[name];
    if (u && u.series.length !== series.length + 1) {
      u.destroy();
      u = null;
    }
    if (!u) {
      const opts = {
        width, height: CHART_HEIGHT,
        // From 0, and at least to 1: an idle chart has a scale, not ticks that all read 0.
        scales: { x: { time: true }, y: { range: (u, lo, hi) => [0, Math.max(hi || 0, 1) * 1.05] } },
        series: [{}].concat(series.map((s) => ({
          label: s.label, stroke: s.colour, width: s.width || 1.5, dash: s.dash,
          points: { show: false }, value: (u, v) => (v === null ? "–" : fmt(v)),
        }))),
        axes: [{}, { size: 56, values: (u, vals) => vals.map(fmt) }],
        legend: { live: true },
        cursor: { drag: { x: true, y: false } },
      };
      u = state.charts[name] = new uPlot(opts, data, box);
    } else {
      u.setData(data);
    }
  }

  function renderCharts() {
    const h = state.hist;
    if (!h || !h.at.length) return;
    $("#history-capacity").textContent = h.capacity + " cycles";
    const colours = engineColours(h.engines);
    const eng = h.engines.map((e, j) => ({ label: e.id, colour: colours[j] }));
    chart("ttft", eng, [h.at].concat(h.engines.map((e) => e.ttft_ms)), (v) => v.toFixed(0));
    chart("load", eng, [h.at].concat(h.engines.map((e) => e.utilization.map((v) => (v === null ? null : 100 * v)))), (v) => v.toFixed(0));
    const demand = h.at.map((_, k) => h.frontends.reduce((s, f) => s + (f.demand_per_s[k] || 0), 0));
    const shedColours = ["#b40000", "#e07000", "#c9a400", "#777"];
    const shed = [{ label: "demand (all frontends)", colour: "#333", width: 2, dash: [6, 4] }]
      .concat(h.priorities.map((p, k) => ({ label: "shed " + p.name, colour: shedColours[Math.min(k, shedColours.length - 1)] })));
    chart("shed", shed, [h.at, demand].concat(h.priorities.map((p) => p.shed_per_s)), (v) => v.toFixed(1));
  }

  window.addEventListener("resize", () => {
    for (const [name, u] of Object.entries(state.charts)) {
      u.setSize({ width: Math.max(300, $("#chart-" + name).clientWidth), height: CHART_HEIGHT });
    }
  });

  // ---- the refresh loop ----

  function showError(err) {
    const s = $("#status");
    s.textContent = String(err.message || err);
    s.className = "error";
  }

  async function refresh() {
    const since = state.hist && state.hist.at.length ? state.hist.at[state.hist.at.length - 1] : null;
    const h = await getJSON(since === null ? "../history" : `../history?since=${since}`);
    if (!state.fleet) {
      state.fleet = { name: h.fleet, engines: h.engines.map(({ id, region, gpu }) => ({ id, region, gpu })), frontends: h.frontends.map(({ node, region }) => ({ node, region })) };
      $("#fleet").textContent = "fleet " + h.fleet;
    }
    mergeHistory(h);
    renderCharts();
    const sig = await getJSON("../signals");
    try {
      const w = await getJSON("../weights");
      renderWeights(w, sig);
      const at = new Date(w.at);
      $("#cycle").textContent = `weights of the cycle at ${at.toLocaleTimeString()}`;
    } catch (err) {
      if (err.status !== 503) throw err; // 503: warming up, no cycle yet
      $("#cycle").textContent = "warming up: no cycle yet";
    }
    renderEngines(sig);
    if (state.open) await refreshExplain();
    const s = $("#status");
    s.textContent = "updated " + new Date().toLocaleTimeString();
    s.className = "muted";
  }

  async function loop() {
    try {
      await refresh();
    } catch (err) {
      showError(err);
    }
    setTimeout(loop, REFRESH_MS);
  }

  $("#explain-close").addEventListener("click", () => {
    state.open = null;
    history.replaceState(null, "", location.pathname + location.search);
    $("#explain").hidden = true;
    for (const td of document.querySelectorAll("td.cell.selected")) td.classList.remove("selected");
  });
  const linked = hashExplain();
  if (linked) openExplain(linked.node, linked.cls, linked.engine);
  loop();
})();
