// The live page of the debug port: GET ../top every two seconds, drawn by
// hand (tables and an SVG chart), no library, no network beyond the port.
//
// A port with --debug-token-file answers this page's files without the
// token, and nothing else: the page asks for the token once (its form, or
// the URL's fragment #token=…, which a browser never sends), keeps it in
// this tab's session storage and sends it as Authorization: Bearer on each
// of its own requests. It never puts it in a URL and never logs it.
"use strict";
(() => {
  const $ = (s) => document.querySelector(s);
  // asked counts the times the form was shown.
  const state = { rules: [], selected: null, domain: "", ready: false, error: "", login: false, asked: 0 };
  window.charonUI = state;
  const tokenKey = "charon-debug-token";
  const token = () => sessionStorage.getItem(tokenKey) || "";

  // takeFragmentToken moves #token=… from the address into the session,
  // and out of the tab's history.
  function takeFragmentToken() {
    const p = new URLSearchParams(location.hash.slice(1));
    const t = p.get("token");
    if (t === null) return;
    p.delete("token");
    const rest = p.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    if (t.trim()) sessionStorage.setItem(tokenKey, t.trim());
  }

  // get fetches url from the port, with the token when there is one.
  function get(url) {
    const headers = {};
    if (token()) headers.Authorization = "Bearer " + token();
    return fetch(url, { cache: "no-store", headers });
  }

  // refused answers a 401 to a request that carried the token sent ("" for
  // none) with the form, saying why, unless the form is up already or the
  // token changed since the request left.
  function refused(sent) {
    if (state.login || sent !== token()) return;
    sessionStorage.removeItem(tokenKey);
    askToken(sent !== "");
  }

  function askToken(wrong) {
    state.login = true;
    state.asked++;
    $("#login-message").textContent = wrong
      ? "The debug port refused that token. Check it against the file given to --debug-token-file and enter it again."
      : "";
    $("#login").hidden = false;
    $("main").hidden = true;
    $("#forget").hidden = true;
    $("#status").textContent = "";
    $("#token").focus();
  }
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
        link = el("a", { class: "explain", href: "../explain?domain=" + encodeURIComponent(v.domain) + "&descriptor=" + encodeURIComponent(it.descriptor), title: it.descriptor }, "explain");
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
    if (state.login) return;
    try {
      const q = "?n=10" + (state.domain ? "&domain=" + encodeURIComponent(state.domain) : "");
      const sent = token();
      const resp = await get("../top" + q);
      if (resp.status === 401) {
        refused(sent);
        return;
      }
      if (!resp.ok) throw new Error(resp.status + " " + (await resp.text()).trim());
      const ans = await resp.json();
      state.rules = ans.rules || [];
      // The rules come with the most rejected first: open on it.
      if (!state.rules.some((v) => key(v) === state.selected)) state.selected = state.rules.length ? key(state.rules[0]) : null;
      const sel = $("#domain"), have = new Set([...sel.options].map((o) => o.value));
      for (const v of state.rules) if (!have.has(v.domain)) { sel.append(el("option", { value: v.domain }, v.domain)); have.add(v.domain); }
      state.error = "";
      $("#status").textContent = "updated " + new Date(ans.at).toLocaleTimeString() + ", epoch " + ans.epoch_seconds + " s";
      $("#forget").hidden = !token();
      draw();
    } catch (e) {
      state.error = String(e);
      $("#status").textContent = "error: " + e.message;
    } finally {
      state.ready = true;
    }
  }

  // With a token, an explain link is fetched with it and shown in the page:
  // a navigation could not carry the header. Without, it is a plain link.
  $(".offenders").addEventListener("click", async (e) => {
    const a = e.target.closest("a.explain");
    if (!a || !token() || e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    const out = $("#explanation pre");
    $("#explanation").hidden = false;
    out.textContent = "loading…";
    try {
      const sent = token();
      const resp = await get(a.href);
      if (resp.status === 401) {
        out.textContent = "";
        refused(sent);
        return;
      }
      out.textContent = (resp.ok ? "" : resp.status + " ") + (await resp.text());
    } catch (err) {
      out.textContent = "error: " + err.message;
    }
  });
  $("#explanation-close").addEventListener("click", () => { $("#explanation").hidden = true; });

  $("#login").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("#token").value.trim();
    $("#token").value = "";
    if (!/^[\x20-\x7e]+$/.test(t)) {
      $("#login-message").textContent = "A token is printable ASCII (letters, digits, punctuation): enter the content of the file given to --debug-token-file.";
      return;
    }
    sessionStorage.setItem(tokenKey, t);
    state.login = false;
    $("#login").hidden = true;
    $("main").hidden = false;
    $("#status").textContent = "loading…";
    refresh();
  });
  $("#forget").addEventListener("click", () => {
    sessionStorage.removeItem(tokenKey);
    askToken(false);
  });
  $("#domain").addEventListener("change", (e) => { state.domain = e.target.value; refresh(); });
  takeFragmentToken();
  refresh();
  setInterval(refresh, 2000);
})();
