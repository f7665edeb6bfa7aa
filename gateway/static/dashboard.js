// llmfleet dashboard: polls dashboard/fleet.json every 2 s, derives token rates from the workers' counters,
// keeps 5 minutes of them for the chart, and streams chat completions in the playground. Plain JS, no
// dependency, no external URL; every text from the server is inserted with textContent, never as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const HISTORY_S = 300;
  const KEY_STORE = "llmfleet.apiKey";
  const $ = (id) => document.getElementById(id);

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  const history = []; // {t (unix s), gen, prompt} tokens per second of the whole fleet
  let previous = null; // after the first poll: worker id -> {heartbeat, gen, prompt, genRate, promptRate}

  // ---- helpers -----------------------------------------------------------------------------------------
  function authHeaders(extra) {
    const headers = Object.assign({}, extra || {});
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    return headers;
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }

  function num(value, className) {
    return el("td", value, "num" + (className ? " " + className : ""));
  }

  function fillBody(table, rows, emptyText, columns) {
    const body = table.tBodies[0];
    body.replaceChildren(...rows);
    if (!rows.length) {
      const td = el("td", emptyText, "empty");
      td.colSpan = columns;
      body.appendChild(row([td]));
    }
  }

  function compact(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
    return String(Math.round(n));
  }

  function rate(n) {
    if (n === null || n === undefined) return "–";
    return n >= 100 ? n.toFixed(0) : n.toFixed(1);
  }

  function duration(s) {
    if (s < 60) return Math.round(s) + " s";
    if (s < 3600) return Math.round(s / 60) + " min";
    if (s < 86400) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }

  function setStatus(kind, text) {
    const pill = $("status");
    pill.textContent = text;
    pill.className = "pill " + (kind === "ok" ? "pill-ok" : kind === "bad" ? "pill-bad" : "pill-wait");
  }

  // ---- rates ---------------------------------------------------------------------------------------------
  // A worker's counters are sampled at its heartbeat, so its rate is the counter delta over the heartbeat
  // delta; the fleet's rate is the sum over workers. A worker that restarted (counter went down) or is new
  // contributes nothing until its second sample.
  function updateRates(fleet) {
    const next = new Map();
    let gen = 0;
    let prompt = 0;
    for (const w of fleet.workers) {
      const s = w.stats || {};
      const cur = { heartbeat: w.heartbeat, gen: s.generated_tokens || 0, prompt: s.prompt_tokens || 0,
                    genRate: 0, promptRate: 0 };
      const old = previous && previous.get(w.id);
      if (old && cur.heartbeat > old.heartbeat && cur.gen >= old.gen && cur.prompt >= old.prompt) {
        const dt = cur.heartbeat - old.heartbeat;
        cur.genRate = (cur.gen - old.gen) / dt;
        cur.promptRate = (cur.prompt - old.prompt) / dt;
      } else if (old && cur.heartbeat === old.heartbeat) {
        cur.genRate = old.genRate;
        cur.promptRate = old.promptRate;
      }
      gen += cur.genRate;
      prompt += cur.promptRate;
      next.set(w.id, cur);
    }
    const first = previous === null;
    previous = next;
    if (first) return null; // one sample gives no rate yet
    history.push({ t: fleet.time, gen, prompt });
    while (history.length && history[0].t < fleet.time - HISTORY_S) history.shift();
    return { gen, prompt };
  }

  // ---- chart ---------------------------------------------------------------------------------------------
  function niceMax(v) {
    if (v <= 5) return 5;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function drawChart(now) {
    const canvas = $("rate-chart");
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const styles = getComputedStyle(document.documentElement);
    const colors = { gen: styles.getPropertyValue("--accent").trim(), prompt: styles.getPropertyValue("--prompt").trim(),
                     line: styles.getPropertyValue("--line").trim(), muted: styles.getPropertyValue("--muted").trim() };
    const left = 44, right = 18, top = 8, bottom = 22;
    const plotW = width - left - right, plotH = height - top - bottom;
    const top_ = niceMax(Math.max(0, ...history.map((p) => Math.max(p.gen, p.prompt))));
    const x = (t) => left + plotW * (1 - (now - t) / HISTORY_S);
    const y = (v) => top + plotH * (1 - v / top_);
    ctx.font = "11px system-ui, sans-serif";
    ctx.lineWidth = 1;
    ctx.fillStyle = colors.muted;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const v = (top_ * i) / 4;
      ctx.strokeStyle = colors.line;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y(v)) + 0.5);
      ctx.lineTo(width - right, Math.round(y(v)) + 0.5);
      ctx.stroke();
      ctx.fillText(v % 1 ? v.toFixed(1) : String(v), left - 6, y(v));
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let m = 5; m >= 0; m--) {
      ctx.fillText(m ? "−" + m + " min" : "now", x(now - m * 60), top + plotH + 6);
    }
    if (history.length < 2) {
      ctx.textBaseline = "middle";
      ctx.fillText("collecting samples…", left + plotW / 2, top + plotH / 2);
      return;
    }
    for (const [name, fill] of [["prompt", false], ["gen", true]]) {
      ctx.beginPath();
      history.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[name])) : ctx.moveTo(x(p.t), y(p[name]))));
      ctx.strokeStyle = colors[name];
      ctx.lineWidth = 2;
      ctx.stroke();
      if (fill) {
        ctx.lineTo(x(history[history.length - 1].t), y(0));
        ctx.lineTo(x(history[0].t), y(0));
        ctx.closePath();
        ctx.globalAlpha = 0.1;
        ctx.fillStyle = colors.gen;
        ctx.fill();
        ctx.globalAlpha = 1;
      }
    }
  }

  // ---- tables --------------------------------------------------------------------------------------------
  function kvCell(w) {
    const td = el("td");
    if (w.kv_usage === null || w.kv_usage === undefined) {
      td.textContent = "–";
      return td;
    }
    const bar = el("span", null, "bar");
    const fill = el("span", null, "bar-fill" + (w.kv_usage > 0.9 ? " high" : ""));
    fill.style.display = "block";
    fill.style.width = (w.kv_usage * 100).toFixed(1) + "%";
    bar.appendChild(fill);
    td.appendChild(bar);
    td.appendChild(el("span", (w.kv_usage * 100).toFixed(1) + "% of " + w.kv_blocks_total + " blocks", "muted"));
    return td;
  }

  function renderWorkers(fleet) {
    const rows = fleet.workers.map((w) => {
      const state = el("td");
      const known = w.state === "ready" || w.state === "draining";
      state.appendChild(el("span", w.state, "state state-" + (known ? w.state : "other")));
      const id = el("td", w.id, "mono worker-id");
      return row([id, el("td", w.model), el("td", w.host), state, num(w.running + " / " + w.slots),
                  num(w.waiting), kvCell(w), num(compact((w.stats || {}).generated_tokens)), num(compact(w.served)),
                  num(duration(w.uptime_s)), num(w.heartbeat_age_s.toFixed(1) + " s ago")]);
    });
    fillBody($("workers"), rows, "No worker is reporting. Start one with: llmfleet worker --model NAME", 11);
    const draining = fleet.workers.filter((w) => w.state !== "ready").length;
    $("workers-note").textContent = fleet.workers.length + " reporting" + (draining ? ", " + draining + " not taking jobs" : "");
  }

  function renderQueues(fleet) {
    const rows = fleet.models.map((m) => row([el("td", m.model), num(m.workers, m.workers ? "" : "status-5"),
                                              num(m.running), num(m.waiting, m.waiting ? "status-4" : "")]));
    fillBody($("queues"), rows, "No model is known yet.", 4);
  }

  function renderErrors(fleet) {
    const rows = fleet.errors.map((e) => {
      const request = el("td", e.request_id ? e.request_id.slice(0, 16) + "…" : "–", "mono");
      if (e.request_id) request.title = e.request_id;
      let code = e.code || e.type || "–";
      if (e.param) code += " · " + e.param;
      if (e.streamed) code += " · mid-stream";
      return row([el("td", clock(e.time)), num(e.status, "status-" + String(e.status)[0]),
                  el("td", code), el("td", e.model || "–"), request,
                  el("td", e.key || "–")]);
    });
    fillBody($("errors"), rows, "No errors recorded.", 6);
    const dropped = (fleet.gateway && fleet.gateway.errors_not_recorded) || 0;
    $("errors-note").textContent = "whole fleet, newest first" +
      (dropped ? " · " + compact(dropped) + " more not listed (this gateway records at most 20 a second)" : "");
  }

  function renderCards(fleet, rates) {
    const live = fleet.workers.filter((w) => w.state === "ready");
    $("card-workers").textContent = live.length;
    $("card-running").textContent = fleet.workers.reduce((a, w) => a + w.running, 0);
    $("card-waiting").textContent = fleet.models.reduce((a, m) => a + m.waiting, 0);
    if (rates) {
      $("card-gen-rate").textContent = rate(rates.gen);
      $("card-prompt-rate").textContent = rate(rates.prompt);
    }
    const used = fleet.workers.reduce((a, w) => a + w.kv_blocks_used, 0);
    const total = fleet.workers.reduce((a, w) => a + w.kv_blocks_total, 0);
    $("card-kv").textContent = total ? ((100 * used) / total).toFixed(1) + "%" : "–";
  }

  function renderModels(fleet) {
    const select = $("pg-model");
    const names = fleet.models.filter((m) => m.workers > 0).map((m) => m.model);
    const current = [...select.options].map((o) => o.value);
    if (names.join("\n") === current.join("\n")) return;
    const chosen = select.value;
    select.replaceChildren(...names.map((name) => el("option", name)));
    if (names.includes(chosen)) select.value = chosen;
  }

  // ---- polling -------------------------------------------------------------------------------------------
  async function poll() {
    try {
      const response = await fetch(new URL("dashboard/fleet.json", document.baseURI), {
        headers: authHeaders(), cache: "no-store" });
      if (response.status === 401) {
        setStatus("bad", apiKey ? "API key refused" : "API key needed");
        return;
      }
      const body = await response.json();
      if (!response.ok) {
        setStatus("bad", (body.error && body.error.code) || "HTTP " + response.status);
        return;
      }
      const rates = updateRates(body);
      renderCards(body, rates);
      renderWorkers(body);
      renderQueues(body);
      renderErrors(body);
      renderModels(body);
      drawChart(body.time);
      setStatus("ok", "live");
      $("updated").textContent = "updated " + clock(body.time);
    } catch (err) {
      setStatus("bad", "gateway unreachable");
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  // ---- playground ----------------------------------------------------------------------------------------
  let controller = null;

  function playgroundStats(text) {
    $("pg-stats").textContent = text;
  }

  // Parse one SSE block ("data: ..." lines); returns the JSON payloads, "[DONE]" as the string.
  function ssePayloads(block) {
    const out = [];
    for (const line of block.split("\n")) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      out.push(data === "[DONE]" ? data : JSON.parse(data));
    }
    return out;
  }

  async function sendChat(event) {
    event.preventDefault();
    const output = $("pg-output");
    const model = $("pg-model").value;
    if (!model) {
      output.textContent = "No model has a live worker.";
      return;
    }
    const body = {
      model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: $("pg-prompt").value }],
      max_tokens: Number($("pg-max-tokens").value) || 128,
      temperature: Number($("pg-temperature").value),
    };
    controller = new AbortController();
    $("pg-send").disabled = true;
    $("pg-stop").disabled = false;
    output.replaceChildren();
    output.dataset.state = "streaming";
    const started = performance.now();
    let first = null;
    let chunks = 0;
    let finish = null;
    let usage = null;
    playgroundStats("waiting for the first token…");
    try {
      const response = await fetch(new URL("v1/chat/completions", document.baseURI), {
        method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
        body: JSON.stringify(body), signal: controller.signal });
      if (!response.ok) {
        const error = await response.json().catch(() => null);
        throw new Error((error && error.error && error.error.message) || "HTTP " + response.status);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const payload of ssePayloads(block)) {
            if (payload === "[DONE]") continue;
            if (payload.error) throw new Error(payload.error.message || payload.error.code || "stream failed");
            if (payload.usage) usage = payload.usage;
            const choice = payload.choices && payload.choices[0];
            if (!choice) continue;
            if (choice.delta && choice.delta.content) {
              if (first === null) first = performance.now();
              chunks += 1;
              output.appendChild(document.createTextNode(choice.delta.content));
              const seconds = (performance.now() - first) / 1000;
              playgroundStats(chunks + " chunks" + (seconds > 0 ? " · " + (chunks / seconds).toFixed(1) + " tok/s" : ""));
            }
            if (choice.finish_reason) finish = choice.finish_reason;
          }
        }
      }
      output.dataset.state = "done";
      const ttft = first === null ? "–" : ((first - started) / 1000).toFixed(2) + " s";
      const tokens = usage ? usage.completion_tokens : chunks;
      const seconds = first === null ? 0 : (performance.now() - first) / 1000;
      playgroundStats("finish: " + (finish || "–") + " · " + tokens + " tokens · first token " + ttft +
                      (seconds > 0 && tokens > 1 ? " · " + ((tokens - 1) / seconds).toFixed(1) + " tok/s" : ""));
    } catch (err) {
      const stopped = err && err.name === "AbortError";
      output.dataset.state = stopped ? "done" : "error";
      if (!stopped) output.appendChild(el("div", "Error: " + err.message, "pg-error"));
      playgroundStats(stopped ? "stopped after " + chunks + " chunks" : "failed");
    } finally {
      controller = null;
      $("pg-send").disabled = false;
      $("pg-stop").disabled = true;
    }
  }

  // ---- start ---------------------------------------------------------------------------------------------
  function start() {
    $("api-key").value = apiKey;
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      apiKey = $("api-key").value.trim();
      if (apiKey) sessionStorage.setItem(KEY_STORE, apiKey);
      else sessionStorage.removeItem(KEY_STORE);
      setStatus("wait", "connecting…");
    });
    $("pg-form").addEventListener("submit", sendChat);
    $("pg-stop").addEventListener("click", () => controller && controller.abort());
    window.addEventListener("resize", () => history.length && drawChart(history[history.length - 1].t));
    drawChart(Date.now() / 1000);
    poll();
  }

  start();
})();
