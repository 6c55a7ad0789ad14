// The live page of the debug port: GET ../top every two seconds, drawn by
// hand (tables and an SVG chart), no library, no network beyond the port.
"use strict";
(() => {
  const $ = (s) => document.querySelector(s);
  const state = { rules: [], selected: null, domain: "", ready: false, error: "" };
  window.charonUI = state;
  const key = (v) => v.domain + " " + v.rule;
  const perSecond = (xs, secs) => (xs && xs.length > 1 && secs > 0 ? xs[xs.length - 2] / secs : 0);
  const fmt = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) e.append(k);
    return e;
  }

  function ruleName(v) {
    return (v.rule || "(unnamed)") + (v.name ? " " + v.name : "");
  }

  function drawRules() {
    const body = $("#rules tbody");
    body.replaceChildren();
    for (const v of state.rules) {
      const r = v.rates, s = r.step_seconds;
      const tr = el("tr", { "data-key": key(v) },
        el("td", {}, (state.domain ? "" : v.domain + " ") + ruleName(v)),
        el("td", { class: "value" }, v.resource),
        el("td", { class: "num granted", "data-label": "granted" }, fmt(perSecond(r.granted, s))),
        el("td", { class: "num rejected", "data-label": "rejected" }, fmt(perSecond(r.rejected, s))),
        el("td", { class: "num shadow", "data-label": "shadow" }, fmt(perSecond(r.shadow, s))));
      if (key(v) === state.selected) tr.classList.add("selected");
      tr.addEventListener("click", () => { state.selected = key(v); draw(); });
      body.append(tr);
    }
  }

  function drawChart(v) {
    const svg = $("#chart"), W = 600, H = 180, top = 10, bottom = 20;
    svg.replaceChildren();
    if (!v) return;
    const r = v.rates, s = r.step_seconds || 1, n = r.granted.length;
    const series = { granted: r.granted, rejected: r.rejected, shadow: r.shadow };
    let max = 1;
    for (const xs of Object.values(series)) for (const x of xs) max = Math.max(max, x / s);
    const y = (x) => top + (H - top - bottom) * (1 - x / s / max);
    const x = (i) => (W * i) / Math.max(n - 1, 1);
    const ns = "http://www.w3.org/2000/svg";
    const add = (tag, attrs, text) => {
      const e = document.createElementNS(ns, tag);
      for (const [k, val] of Object.entries(attrs)) e.setAttribute(k, val);
      if (text !== undefined) e.textContent = text;
      svg.append(e);
    };
    for (const f of [0, 0.5, 1]) {
      add("line", { class: "grid", x1: 0, x2: W, y1: y(f * max * s), y2: y(f * max * s) });
      add("text", { x: 4, y: y(f * max * s) - 2 }, fmt(f * max));
    }
    add("text", { x: 4, y: H - 4 }, "-5 min");
    add("text", { x: W - 30, y: H - 4 }, "now");
    for (const [name, xs] of Object.entries(series)) {
      // The last step is still filling: drawn up to the one before.
      const pts = xs.slice(0, n - 1).map((val, i) => x(i) + "," + y(val)).join(" ");
      add("polyline", { class: name, points: pts });
    }
  }

  function drawOffenders(id, w, v) {
    const body = $("#" + id + " tbody");
    body.replaceChildren();
    $("#" + id + "-window").textContent = w && w.total ? "of " + w.total + " hits" : "";
    if (!w || !w.items) return;
    for (const it of w.items) {
      let link = "";
      if (it.descriptor) {
        link = el("a", { href: "../explain?domain=" + encodeURIComponent(v.domain) + "&descriptor=" + encodeURIComponent(it.descriptor), title: it.descriptor }, "explain");
      }
      body.append(el("tr", {}, el("td", { class: "value", title: it.value }, it.value === "" ? "(all)" : it.value),
        el("td", { class: "num" }, String(it.count)), el("td", { class: "num" }, String(it.error)), el("td", {}, link)));
    }
  }

  function draw() {
    drawRules();
    const v = state.rules.find((r) => key(r) === state.selected);
    $("#rule-title").textContent = v ? v.domain + "  " + ruleName(v) + "  (" + v.resource + ")" : "No limited descriptor seen yet";
    drawChart(v);
    drawOffenders("rejected", v && v.rejected, v);
    drawOffenders("granted", v && v.granted, v);
  }

  async function refresh() {
    try {
      const q = "?n=10" + (state.domain ? "&domain=" + encodeURIComponent(state.domain) : "");
      const resp = await fetch("../top" + q, { cache: "no-store" });
      if (!resp.ok) throw new Error(resp.status + " " + (await resp.text()).trim());
      const ans = await resp.json();
      state.rules = ans.rules || [];
      // The rules come with the most rejected first: open on it.
      if (!state.rules.some((v) => key(v) === state.selected)) state.selected = state.rules.length ? key(state.rules[0]) : null;
      const sel = $("#domain"), have = new Set([...sel.options].map((o) => o.value));
      for (const v of state.rules) if (!have.has(v.domain)) { sel.append(el("option", { value: v.domain }, v.domain)); have.add(v.domain); }
      state.error = "";
      $("#status").textContent = "updated " + new Date(ans.at).toLocaleTimeString() + ", epoch " + ans.epoch_seconds + " s";
      draw();
    } catch (e) {
      state.error = String(e);
      $("#status").textContent = "error: " + e.message;
    }
    state.ready = true;
  }

  $("#domain").addEventListener("change", (e) => { state.domain = e.target.value; refresh(); });
  refresh();
  setInterval(refresh, 2000);
})();
