// The page around the engine: input, time, drawing. Every decision and
// every state comes from charonSimCore (package tiers in WebAssembly); this
// file never decides anything.
"use strict";
(function () {
  const $ = (s) => document.querySelector(s);
  const lanes = [0, 1].map((i) => ({
    i, el: $("#lane" + i), loaded: false, events: [], periods: [], last: null, state: null,
  }));
  let simNow = Date.now(), speed = 1, lastFrame = performance.now(), compare = false;
  let readyResolve;
  const ready = new Promise((r) => (readyResolve = r));

  const core = () => window.charonSimCore;
  const call = (f, ...args) => JSON.parse(core()[f](...args));

  // fmtDur writes ms, rounded to the millisecond, as a duration Go parses
  // ("1s", "1m30.5s", "59m", "500ms", "unbounded").
  function fmtDur(ms) {
    if (ms < 0) return "unbounded";
    ms = Math.round(ms);
    if (ms === 0) return "0s";
    if (ms < 1000) return ms + "ms";
    let s = "";
    const h = Math.floor(ms / 3600000); ms -= h * 3600000;
    const m = Math.floor(ms / 60000); ms -= m * 60000;
    if (h) s += h + "h";
    if (m) s += m + "m";
    if (ms) s += String(ms / 1000) + "s";
    return s;
  }

  function load(yaml, i = 0) {
    const r = call("load", i, yaml, simNow);
    const err = $("#error" + i);
    if (r.error) {
      err.textContent = r.error;
      return { error: r.error };
    }
    err.textContent = "";
    const l = lanes[i];
    Object.assign(l, { loaded: true, events: [], periods: [], last: null, state: r.state });
    $("#yaml" + i).value = r.yaml;
    l.el.querySelector(".leaf").textContent = r.state.leaf;
    if (i === 0) fillForm(r.state);
    draw();
    return { ok: true, yaml: r.yaml };
  }

  function request(hits) {
    hits = Math.max(1, Math.floor(hits || Number($("#hits").value) || 1));
    let first = null;
    for (const l of lanes) {
      if (!l.loaded || (l.i === 1 && !compare)) continue;
      const d = call("request", l.i, hits, simNow);
      l.last = d;
      l.events.push(d);
      if (l.events.length > 5000) l.events.splice(0, 1000);
      if (first === null) first = d;
    }
    refresh();
    return first;
  }

  function advance(ms) {
    simNow += Number(ms) || 0;
    refresh();
    return state();
  }

  function laneState(l) {
    if (!l.loaded) return null;
    const s = call("state", l.i, simNow);
    return Object.assign(s, { last: l.last, axis: l.axis || [] });
  }

  function state() {
    const s = laneState(lanes[0]) || { error: "no configuration loaded" };
    if (compare) s.compare = laneState(lanes[1]);
    return s;
  }

  // refresh reads the lanes' states, records tier periods and redraws.
  function refresh() {
    for (const l of lanes) {
      if (!l.loaded) continue;
      l.state = call("state", l.i, simNow);
      l.state.tiers.forEach((t, k) => {
        if (!t.enteredAt) return;
        const ps = (l.periods[k] = l.periods[k] || []);
        const p = ps.find((p) => p.enteredAt === t.enteredAt);
        if (p) Object.assign(p, t);
        else ps.push({ enteredAt: t.enteredAt, activeUntil: t.activeUntil, cooldownUntil: t.cooldownUntil });
      });
    }
    draw();
  }

  function draw() {
    $("#clock").textContent = new Date(simNow).toISOString().replace("T", " ").replace("Z", " UTC") + (speed === 0 ? " (paused)" : speed > 1 ? " x" + speed : "");
    for (const l of lanes) {
      l.el.hidden = l.i === 1 && !compare;
      if (l.loaded && l.state && !l.el.hidden) drawLane(l);
    }
  }

  function drawLane(l) {
    const c = l.el.querySelector("canvas"), g = c.getContext("2d");
    const s = l.state;
    const rows = Math.max(1, s.tiers.length);
    const labelW = 170, top = 8, axis = 22;
    const rowH = (c.height - top - axis) / rows;
    const span = 10000 * Math.max(1, speed);
    const x0 = simNow - span * 0.95, plotW = c.width - labelW - 10;
    const X = (t) => labelW + ((t - x0) / span) * plotW;
    const rowY = (tier) => top + (rows - Math.min(Math.max(tier, 1), rows)) * rowH + rowH / 2;
    g.fillStyle = "#0d0e11";
    g.fillRect(0, 0, c.width, c.height);
    // Bands: active (green) and cooldown (blue) periods of each tier.
    l.periods.forEach((ps, k) => {
      const y = rowY(k + 1) - rowH / 2 + 2;
      for (const p of ps || []) {
        const endA = p.activeUntil || simNow + span;
        g.fillStyle = "rgba(60, 180, 90, 0.28)";
        g.fillRect(X(p.enteredAt), y, Math.max(1, X(endA) - X(p.enteredAt)), rowH - 4);
        if (p.cooldownUntil > p.activeUntil) {
          g.fillStyle = "rgba(70, 120, 230, 0.30)";
          g.fillRect(X(p.activeUntil), y, Math.max(1, X(p.cooldownUntil) - X(p.activeUntil)), rowH - 4);
        }
      }
    });
    // Row labels and window fill.
    for (let k = 0; k < rows; k++) {
      const tier = k + 1, y = rowY(tier);
      const t = s.tiers[k];
      let label, hits, limit;
      if (t) {
        label = "tier " + tier + ": " + t.limit + " / " + fmtDur(t.window);
        hits = t.hits; limit = t.limit;
      } else {
        label = s.kind === "token_bucket" ? "credits" : "window";
        hits = s.used; limit = s.capacity;
      }
      g.fillStyle = tier === s.tier ? "#ffd34d" : "#aaa";
      g.font = "12px system-ui, sans-serif";
      g.fillText(label + (t ? " (" + t.phase + ")" : ""), 6, y - 4);
      g.fillStyle = "#333";
      g.fillRect(6, y + 2, labelW - 20, 6);
      g.fillStyle = "#4caf50";
      g.fillRect(6, y + 2, (labelW - 20) * Math.min(1, limit ? hits / limit : 0), 6);
      g.fillStyle = "#888";
      g.fillText(hits + " / " + limit, 6, y + 20);
      g.strokeStyle = "#222";
      g.beginPath(); g.moveTo(labelW, y + rowH / 2); g.lineTo(c.width, y + rowH / 2); g.stroke();
    }
    // Requests: white dots for grants, red crosses for rejections.
    for (const e of l.events) {
      const x = X(e.at);
      if (x < labelW) continue;
      const y = rowY(e.tier);
      if (e.ok) {
        g.fillStyle = "#ffffff";
        g.beginPath(); g.arc(x, y, 4, 0, 2 * Math.PI); g.fill();
      } else {
        g.strokeStyle = "#ff3b3b"; g.lineWidth = 2;
        g.beginPath(); g.moveTo(x - 4, y - 4); g.lineTo(x + 4, y + 4); g.moveTo(x + 4, y - 4); g.lineTo(x - 4, y + 4); g.stroke();
        g.lineWidth = 1;
      }
    }
    // Now, and the time axis.
    g.strokeStyle = "#ffd34d";
    g.beginPath(); g.moveTo(X(simNow), top); g.lineTo(X(simNow), c.height - axis); g.stroke();
    g.fillStyle = "#888";
    l.axis = [];
    for (let k = 0; k <= 4; k++) {
      const t = x0 + (span * k) / 4;
      const label = axisLabel(Math.round(t - simNow));
      l.axis.push(label);
      // The right edge's label ends at the edge.
      g.textAlign = k === 4 ? "right" : "left";
      g.fillText(label, k === 4 ? c.width - 2 : X(t) - 10, c.height - 6);
    }
    g.textAlign = "left";
    const retry = s.retryNever ? "never" : fmtDur(s.retryAfter);
    const where = s.kind !== "tiers" ? "" : s.tier === 0 ? "no tier active · " : "tier " + s.tier + " · ";
    const st = l.el.querySelector(".stats");
    st.querySelector(".status").textContent =
      where + "remaining " + s.remaining + (s.remaining === 0 ? " · retry_after " + retry : " · reset_after " + fmtDur(s.resetAfter)) +
      (s.hardLimit ? " · hard " + s.domainHits + "/" + s.hardLimit : "") + (s.globalLimit ? " · global " + s.resourceHits + "/" + s.globalLimit : "");
    st.querySelector(".summary").textContent = s.summary;
  }

  // axisLabel words an offset from now in ms: "-5s", "now", "+500ms".
  function axisLabel(ms) {
    if (ms === 0) return "now";
    return (ms < 0 ? "-" : "+") + fmtDur(Math.abs(ms));
  }

  function frame(t) {
    simNow += (t - lastFrame) * speed;
    lastFrame = t;
    if (speed > 0) refresh();
    requestAnimationFrame(frame);
  }

  // --- The configuration form (lane A): it writes YAML, which the engine
  // validates exactly as `charon config check` does.
  function tierRow(t) {
    const tr = document.createElement("tr");
    tr.innerHTML = '<td><input class="limit" type="number" min="1"></td><td><input class="window"></td>' +
      '<td><input class="active"></td><td><input class="cooldown"></td><td><input class="skip" type="checkbox"></td>' +
      '<td><button type="button" class="del" aria-label="remove tier">×</button></td>';
    tr.querySelector(".limit").value = t.limit;
    tr.querySelector(".window").value = fmtDur(t.window);
    tr.querySelector(".active").value = fmtDur(t.active);
    tr.querySelector(".cooldown").value = fmtDur(t.cooldown);
    tr.querySelector(".skip").checked = t.skippable;
    tr.querySelector(".del").onclick = () => tr.remove();
    return tr;
  }

  function fillForm(s) {
    const kind = s.kind === "token_bucket" ? "bucket" : s.kind === "fixed_window" ? "fixed" : "tiers";
    $("#kind").value = kind;
    showKind();
    if (kind === "tiers") {
      const body = $("#tiersForm tbody");
      body.replaceChildren(...s.tiers.map(tierRow));
      $("#hard").value = s.hardLimit;
      $("#global").value = s.globalLimit;
    }
  }

  function showKind() {
    const k = $("#kind").value;
    $("#tiersForm").hidden = k !== "tiers";
    $("#bucketForm").hidden = k !== "bucket";
    $("#fixedForm").hidden = k !== "fixed";
  }

  function formYAML() {
    const k = $("#kind").value;
    let y = "key: user\n";
    if (k === "bucket") {
      y += "token_bucket: {capacity: " + $("#capacity").value + ", refill: " + $("#refill").value + ", per: " + $("#per").value + "}\n";
    } else if (k === "fixed") {
      y += "rate_limit: {unit: " + $("#unit").value + ", requests_per_unit: " + $("#rpu").value + ", algorithm: fixed_window}\n";
    } else {
      y += "tiers:\n";
      for (const tr of $("#tiersForm tbody").children) {
        const v = (c) => tr.querySelector(c).value.trim() || "0";
        y += "  - {limit: " + v(".limit") + ", window: " + v(".window") + ", active: " + v(".active") +
          ", cooldown: " + v(".cooldown") + ", skippable: " + tr.querySelector(".skip").checked + "}\n";
      }
      if (Number($("#hard").value) > 0) y += "hard_limit: " + $("#hard").value + "\n";
      if (Number($("#global").value) > 0) y += "global_limit: " + $("#global").value + "\n";
    }
    return y;
  }

  // --- Input.
  let holdTimer = null;
  function startHold() {
    request();
    stopHold();
    holdTimer = setInterval(() => request(), 1000 / Number($("#rate").value));
  }
  function stopHold() {
    clearInterval(holdTimer);
    holdTimer = null;
  }

  function setSpeed(x) {
    speed = x;
    for (const b of document.querySelectorAll("[data-speed]")) b.classList.toggle("on", Number(b.dataset.speed) === x);
    draw();
  }

  // typing reports whether a key pressed on el is text being typed (a text
  // or number field, the YAML boxes, a select): there Space is the field's.
  // Anywhere else, a button just clicked included, Space sends requests.
  function typing(el) {
    if (/^(TEXTAREA|SELECT)$/.test(el.tagName) || el.isContentEditable) return true;
    return el.tagName === "INPUT" && !/^(button|checkbox|radio|range|submit|reset)$/.test(el.type);
  }

  function wire() {
    // Capture, so that a focused button neither misses Space nor takes it
    // as a click (which would reload a pattern or send one more request).
    document.addEventListener("keydown", (e) => {
      if (e.code !== "Space" || typing(e.target)) return;
      e.preventDefault();
      if (!e.repeat) startHold();
    }, true);
    document.addEventListener("keyup", (e) => {
      if (e.code !== "Space") return;
      if (!typing(e.target)) e.preventDefault();
      stopHold();
    }, true);
    const send = $("#send");
    send.addEventListener("mousedown", startHold);
    for (const ev of ["mouseup", "mouseleave"]) send.addEventListener(ev, stopHold);
    send.addEventListener("keydown", (e) => { if (e.key === "Enter") request(); });
    $("#rate").oninput = () => ($("#rateOut").textContent = $("#rate").value);
    for (const b of document.querySelectorAll("[data-speed]")) b.onclick = () => setSpeed(Number(b.dataset.speed));
    $("#skip").onclick = () => {
      const next = lanes.filter((l) => l.loaded && l.state && l.state.next > simNow).map((l) => l.state.next);
      if (next.length) advance(Math.min(...next) - simNow);
    };
    $("#kind").onchange = showKind;
    $("#addTier").onclick = () => $("#tiersForm tbody").append(tierRow({ limit: 10, window: 1000, active: 5000, cooldown: 15000, skippable: false }));
    $("#apply").onclick = () => load(formYAML(), 0);
    $("#load0").onclick = () => load($("#yaml0").value, 0);
    $("#load1").onclick = () => load($("#yaml1").value, 1);
    $("#compare").onchange = (e) => {
      compare = e.target.checked;
      if (compare && !lanes[1].loaded) load($("#yaml1").value || $("#yaml0").value, 1);
      draw();
    };
    const nav = $("#patterns");
    for (const p of call("patterns")) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = p.name;
      b.title = p.description;
      b.onclick = () => load(p.yaml, 0);
      nav.append(b);
    }
    load(call("patterns")[0].yaml, 0);
    $("#yaml1").value = call("patterns")[1].yaml;
    $("#loading").remove();
    requestAnimationFrame((t) => { lastFrame = t; requestAnimationFrame(frame); });
  }

  // asJSON lets an answer be used as an object or read with JSON.parse.
  function asJSON(v) {
    if (v && typeof v === "object") Object.defineProperty(v, "toString", { value: () => JSON.stringify(v) });
    return v;
  }

  // window.charonSim: what scripts and tests drive. It is set once the
  // engine is ready (ready resolves then too).
  const api = {
    ready,
    load: (yaml, lane) => load(String(yaml), lane === 1 ? 1 : 0),
    request: (hits) => asJSON(request(hits)),
    advance: (ms) => asJSON(advance(ms)),
    state: () => asJSON(state()),
    setSpeed,
    compare: (on) => { $("#compare").checked = !!on; $("#compare").onchange({ target: $("#compare") }); },
    patterns: () => call("patterns"),
  };

  window.charonSimReady = () => { wire(); window.charonSim = api; readyResolve(); };
  // notBuilt says, in the page, why there is no engine and how to get one.
  function notBuilt(why) {
    const p = $("#loading");
    p.className = "missing";
    p.textContent = why + " The simulator's engine (package tiers compiled to WebAssembly, 6.8 MB) is built by " +
      "make, not by go build or go install alone: from a checkout, run make build (bin/charon), or make sim-wasm " +
      "before go build ./cmd/charon or go install ./cmd/charon. Everything else this server does works without it.";
  }
  if (!window.Go) {
    notBuilt("This charon was built without the simulator's engine (wasm_exec.js is missing).");
    return;
  }
  const go = new Go();
  const fetchEngine = () => fetch("charon.wasm").then((r) => {
    if (!r.ok) throw new Error("charon.wasm: " + r.status);
    return r;
  });
  const module = WebAssembly.instantiateStreaming
    ? fetchEngine().then((r) => WebAssembly.instantiateStreaming(r, go.importObject))
    : fetchEngine().then((r) => r.arrayBuffer()).then((b) => WebAssembly.instantiate(b, go.importObject));
  module.then((r) => go.run(r.instance)).catch((e) => notBuilt("The engine did not load (" + e.message + ")."));
})();
