// The player of "一个请求的一生": replays data.js (a real trace cut into scenes by
// tools/animate.py) as an SVG. Play time P runs through the scenes; each scene stretches its
// part of the trace onto its seconds, so every event has a play time and the picture at P is
// the trace's state after all events played by then. ?t=SECONDS renders one still frame
// (the video's frames are screenshots of it, made by showFrame).
(function () {
  "use strict";
  const D = window.REQUEST_LIFE;
  const svg = document.getElementById("stage");
  const UID_COLORS = ["#1e88e5", "#43a047", "#8e24aa", "#e53935", "#00897b", "#6d4c41"];
  const MSG_COLORS = { HTTP: "#455a64", TokenizeMsg: "#5c6bc0", UserMsg: "#00897b",
    DetokenizeMsg: "#6d4c41", UserReply: "#f9a825", AbortMsg: "#c62828", SSE: "#2e7d32" };
  // Columns of the top band: where each process stands, and the edges messages leave from.
  const COL = { client: [10, 290], api: [330, 450], tokenizer: [490, 620], scheduler: [660, 950] };
  const ROUTE = { TokenizeMsg: ["api", "tokenizer"], UserMsg: ["tokenizer", "scheduler"],
    DetokenizeMsg: ["scheduler", "tokenizer"], UserReply: ["tokenizer", "api"] };
  // Where a message's pill is centred when it leaves or reaches a lane: the edges of the
  // client's and the scheduler's boxes (they hold text), the middle of the two others.
  const PORT = { client: 300, api: 390, tokenizer: 555, scheduler: 650 };
  const TRAVEL = 0.6; // play seconds a message takes to cross, however short its real flight
  const CELL = 6; // px per KV page (page_size 1: one token)

  const scenes = D.scenes;
  const total = scenes[scenes.length - 1].p1;
  const events = D.events.map(([t, lane, name, dur, args]) => ({ t, lane, name, dur, args }));

  // Trace time <-> play time, piecewise linear through the scenes.
  function traceAt(p) {
    for (const s of scenes) {
      if (p < s.p1 || s === scenes[scenes.length - 1]) {
        const f = Math.min(1, Math.max(0, (p - s.p0) / (s.p1 - s.p0)));
        return s.t0 + (s.t1 - s.t0) * f;
      }
    }
  }
  function playAt(t) {
    for (const s of scenes) {
      if (t >= s.t0 && t < s.t1) return s.p0 + (s.p1 - s.p0) * (t - s.t0) / (s.t1 - s.t0);
    }
    return t < scenes[0].t0 ? 0 : total;
  }
  for (const e of events) { e.p = playAt(e.t); e.pEnd = playAt(e.t + e.dur); }

  // Messages as flights: the k-th send of (type, uid) towards a lane meets the k-th receipt
  // of it there. HTTP requests and SSE writes travel between the client and the API server.
  const flights = [];
  const sends = {};
  for (const e of events) {
    const uid = e.args.uid;
    if (e.name === "http_request") flights.push({ name: "HTTP", uid, from: "client", to: "api", p0: e.p, p1: e.p });
    if (e.name === "sse_write") flights.push({ name: "SSE", uid, from: "api", to: "client", p0: e.p, p1: e.p, label: JSON.stringify(e.args.text) });
    if (e.args.dir === "send") {
      const to = e.name === "AbortMsg" ? (e.lane === "api" ? "tokenizer" : "scheduler") : (ROUTE[e.name] || [])[1];
      if (!to) continue;
      const key = `${e.name}/${uid}/${to}`;
      (sends[key] = sends[key] || []).push({ name: e.name, uid, from: e.lane, to, p0: e.p, p1: total });
    }
  }
  const received = {};
  for (const e of events) {
    if (e.args.dir !== "recv") continue;
    const key = `${e.name}/${e.args.uid}/${e.lane}`;
    const k = received[key] = (received[key] || 0) + 1;
    const f = (sends[key] || [])[k - 1];
    if (f) f.p1 = e.p;
  }
  for (const list of Object.values(sends)) flights.push(...list);

  // Everything that happened up to play time P.
  function stateAt(P) {
    const st = { clients: {}, waiting: [], rows: {}, radix: [], step: null, steps: [], busy: {} };
    for (const r of D.requests) st.clients[r.uid] = { text: "", state: "未发出" };
    for (const e of events) {
      if (e.p > P) break;
      const a = e.args, uid = a.uid, c = st.clients[uid];
      switch (e.name) {
        case "http_request": c.state = "等待第一个 token"; break;
        case "sse_write": c.text += a.text; c.state = "接收中"; break;
        case "http_done": c.state = a.finish_reason === "stop" ? "完成（EOS）" : "完成（max_tokens）"; break;
        case "AbortMsg": if (e.lane === "api") c.state = "客户端断开 ✂"; break;
        case "queued": st.waiting.push(uid); break;
        case "admit":
          st.waiting = st.waiting.filter((u) => u !== uid);
          // Its pages come with the step that computes it, which starts right after.
          st.rows[uid] = { row: a.row, hit: a.hit, own: 0, cached: a.hit };
          break;
        case "prefill": case "decode":
          a.uids.forEach((u, i) => { if (st.rows[u]) st.rows[u].own += a.pages[i]; });
          if (P < e.pEnd) st.step = e;
          break;
        case "pages_returned": {
          let node = st.radix.find((n) => n.uid === uid);
          if (!node) st.radix.push(node = { uid, hit: st.rows[uid] ? st.rows[uid].hit : 0, own: 0, locked: true });
          node.own += a.to_cache;
          node.freed = (node.freed || 0) + a.freed;
          if (st.rows[uid]) st.rows[uid].cached += a.to_cache;
          if (a.finished) node.locked = false;
          break;
        }
        case "finish": delete st.rows[uid]; break;
        case "abort": st.waiting = st.waiting.filter((u) => u !== uid); break;
      }
      if (e.args.dir === "recv" || e.args.dir === "send") st.busy[e.lane] = e.p;
    }
    return st;
  }

  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const T = (x, y, s, cls = "", extra = "") => `<text x="${x}" y="${y}" class="${cls}" ${extra}>${esc(s)}</text>`;
  const rowY = (uid) => 74 + uid * 32;
  const color = (uid) => UID_COLORS[uid % UID_COLORS.length];

  function wrap(text, width) {
    const lines = [];
    let line = "";
    for (const ch of text) {
      const w = /[\u2e80-\uffff]/.test(ch) ? 2 : 1;
      if (line.length && [...line].reduce((n, c) => n + (/[\u2e80-\uffff]/.test(c) ? 2 : 1), 0) + w > width) {
        lines.push(line); line = "";
      }
      line += ch;
    }
    if (line) lines.push(line);
    return lines;
  }

  function drawTop(st, P) {
    let out = "";
    const names = { client: "客户端", api: "API Server", tokenizer: "tokenizer /\ndetokenizer", scheduler: "调度器 rank 0 + Engine" };
    for (const [lane, [x0, x1]] of Object.entries(COL)) {
      const busy = lane === "scheduler" ? !!st.step : (st.busy[lane] !== undefined && P - st.busy[lane] < 0.4);
      out += `<rect class="box${busy ? " busy" : ""}" x="${x0}" y="22" width="${x1 - x0}" height="170" rx="8"/>`;
      names[lane].split("\n").forEach((n, i) => { out += T(x0 + 8, 40 + i * 15, n, "lane-title"); });
    }
    for (const uid of Object.keys(st.clients).map(Number)) {
      const c = st.clients[uid], y = rowY(uid), req = D.requests.find((r) => r.uid === uid);
      out += `<circle cx="22" cy="${y - 4}" r="6" fill="${color(uid)}"/>`;
      out += T(32, y, `uid ${uid}：${req.content}`, "small");
      const shown = c.text.length > 30 ? "…" + c.text.slice(-29) : c.text;
      out += T(32, y + 14, shown ? `“${shown}”` : c.state, shown ? "mono" : "small", `fill="${color(uid)}"`);
      if (shown && c.state !== "接收中") out += T(40 + 7 * (shown.length + 2), y + 14, c.state, "small");
    }
    // The scheduler: its waiting queue and the step it is computing.
    const sx = COL.scheduler[0] + 56;
    out += T(sx + 8, 62, "等待队列：", "small");
    st.waiting.forEach((u, i) => { out += `<rect x="${sx + 70 + i * 26}" y="51" width="22" height="16" rx="3" fill="${color(u)}"/>` + T(sx + 76 + i * 26, 63, u, "small", 'fill="#fff"'); });
    if (!st.waiting.length) out += T(sx + 70, 62, "（空）", "small");
    if (st.step) {
      const s = st.step, f = (P - s.p) / Math.max(1e-9, s.pEnd - s.p);
      const tokens = s.args.tokens.reduce((a, b) => a + b, 0);
      out += T(sx + 8, 92, `正在算 ${s.name}：${s.args.uids.length} 个请求，${tokens} 个 token`, "small");
      out += `<rect x="${sx + 8}" y="100" width="220" height="10" fill="#eceff1"/><rect x="${sx + 8}" y="100" width="${220 * f}" height="10" class="${s.name}"/>`;
      out += T(sx + 8, 126, `这一步真实用时 ${s.dur.toFixed(2)} 秒`, "small");
      s.args.uids.forEach((u, i) => { out += `<rect x="${sx + 8 + i * 26}" y="134" width="22" height="16" rx="3" fill="${color(u)}"/>` + T(sx + 14 + i * 26, 146, u, "small", 'fill="#fff"'); });
    } else {
      out += T(sx + 8, 92, "空闲：等消息", "small");
    }
    out += T(sx + 8, 180, `真实时间 ${traceAt(P).toFixed(3)} 秒`, "small");
    return out;
  }

  function drawFlights(P) {
    let out = "";
    for (const f of flights) {
      const arrive = Math.max(f.p1, f.p0 + TRAVEL);
      if (P < f.p0 || P >= arrive) continue;
      const k = Math.min(1, (P - f.p0) / TRAVEL);
      const xs = PORT[f.from], xe = PORT[f.to], right = xe > xs;
      const x = xs + (xe - xs) * k, y = rowY(f.uid) + (right ? -6 : 8);
      const label = f.label ? `SSE ${f.label}` : f.name;
      const w = Math.min(150, label.length * 6.2 + 10);
      out += `<g class="pill"><rect x="${x - w / 2}" y="${y - 8}" width="${w}" height="15" rx="7" fill="${MSG_COLORS[f.name]}" stroke="${color(f.uid)}" stroke-width="2"/>`
        + T(x - w / 2 + 5, y + 3, label.length > 24 ? label.slice(0, 23) + "…" : label) + "</g>";
    }
    return out;
  }

  function drawMemory(st) {
    let out = T(10, 222, "页表的行（请求槽）和每个请求的 KV 页（page_size 1：一页一个 token）", "section");
    const rows = Object.entries(st.rows).sort((a, b) => b[1].row - a[1].row);
    rows.forEach(([uid, r], i) => {
      const y = 236 + i * 36;
      out += T(10, y + 12, `行 ${r.row} · uid ${uid}`, "small");
      const x0 = 84;
      out += `<rect x="${x0}" y="${y}" width="${r.hit * CELL}" height="16" fill="${color(uid)}" class="cell-shared"/>`;
      out += `<rect x="${x0 + r.hit * CELL}" y="${y}" width="${r.own * CELL}" height="16" fill="${color(uid)}"/>`;
      for (let k = 1; k < r.hit + r.own; k++) out += `<line x1="${x0 + k * CELL}" y1="${y}" x2="${x0 + k * CELL}" y2="${y + 16}" stroke="#fff" stroke-width="0.6"/>`;
      out += `<line x1="${x0}" y1="${y + 20}" x2="${x0 + r.cached * CELL}" y2="${y + 20}" stroke="#37474f" stroke-width="2"/>`;
      out += T(x0 + (r.hit + r.own) * CELL + 6, y + 12, `命中 ${r.hit} + 自己的 ${r.own} 页`, "small");
    });
    if (!rows.length) out += T(10, 250, "（没有运行中的请求）", "small");
    out += T(10, 404, "浅色：从前缀缓存命中的页（共享，不用再算）  下划线：已经插进前缀缓存的部分", "small");

    // The prefix cache as a trie: each request's path leaves the trunk where its hit ends.
    const rx = 580;
    out += T(rx, 222, "前缀缓存（radix tree）", "section");
    let cached = 0;
    st.radix.forEach((n, j) => {
      const y = 236 + j * 36;
      cached += n.own;
      if (j > 0) out += `<line x1="${rx + n.hit * CELL}" y1="${236 + 16}" x2="${rx + n.hit * CELL}" y2="${y + 8}" stroke="#90a4ae" stroke-width="1.5"/>`;
      out += `<rect x="${rx + n.hit * CELL}" y="${y}" width="${n.own * CELL}" height="16" fill="${color(n.uid)}" opacity="${n.locked ? 1 : 0.55}"/>`;
      out += T(rx + (n.hit + n.own) * CELL + 6, y + 12, `uid ${n.uid} +${n.own}${n.locked ? " 锁定" : " 可回收"}`, "small");
    });
    out += T(rx, 404, `树里共 ${cached} 页；锁定 = 有请求正在用，可回收 = 没人用、内存紧时可驱逐`, "small");
    return out;
  }

  function drawTimeline(P) {
    const x0 = 20, x1 = 940, y = 428, w = x1 - x0;
    const X = (p) => x0 + w * p / total;
    let out = T(x0, y - 6, "每一步的 batch（橙 = prefill，灰 = decode；彩色小方块 = 参与的请求）", "small");
    out += `<rect x="${x0}" y="${y}" width="${w}" height="70" fill="#f5f7f8"/>`;
    for (const s of scenes) out += `<line x1="${X(s.p0)}" y1="${y}" x2="${X(s.p0)}" y2="${y + 70}" stroke="#cfd8dc"/>`;
    for (const e of events) {
      if ((e.name !== "prefill" && e.name !== "decode") || e.p > P) continue;
      const xa = X(e.p), xb = Math.max(xa + 3, X(Math.min(e.pEnd, P)));
      out += `<rect x="${xa}" y="${y + 2}" width="${xb - xa - 1}" height="8" class="${e.name}"/>`;
      e.args.uids.forEach((u, i) => { out += `<rect x="${xa}" y="${y + 13 + i * 13}" width="${Math.max(2, xb - xa - 1)}" height="11" fill="${color(u)}"/>`; });
    }
    out += `<line class="playhead" x1="${X(P)}" y1="${y - 2}" x2="${X(P)}" y2="${y + 72}"/>`;
    return out;
  }

  function drawSubtitle(P) {
    const scene = scenes.find((s) => P < s.p1) || scenes[scenes.length - 1];
    const cue = D.cues.find(([a, b]) => P >= a && P < b) || D.cues[D.cues.length - 1];
    let out = `<rect class="subtitle-bg" x="0" y="512" width="960" height="88"/>`;
    out += T(14, 530, `${scenes.indexOf(scene) + 1}/${scenes.length} · ${scene.title}`, "scene-title");
    out += T(946, 530, `真实运行：${D.recorded}`, "scene-title", 'text-anchor="end"');
    wrap(cue[2], 86).slice(0, 2).forEach((line, i) => { out += T(480, 556 + i * 26, line, "subtitle", 'text-anchor="middle"'); });
    return out;
  }

  let P = 0, playing = false, last = null;
  const playButton = document.getElementById("play");
  const scrub = document.getElementById("scrub");
  const clock = document.getElementById("clock");
  const fmt = (s) => `${Math.floor(s / 60)}:${String(Math.floor(s % 60)).padStart(2, "0")}`;

  function render() {
    const st = stateAt(P);
    svg.innerHTML = drawTop(st, P) + drawFlights(P) + drawMemory(st) + drawTimeline(P) + drawSubtitle(P);
    scrub.value = String(Math.round(1000 * P / total));
    clock.textContent = `${fmt(P)} / ${fmt(total)}`;
    playButton.textContent = playing ? "暂停" : "播放";
  }
  function tick(now) {
    if (!playing) return;
    if (last !== null) P = Math.min(total, P + (now - last) / 1000 * Number(document.getElementById("speed").value));
    last = now;
    if (P >= total) playing = false;
    render();
    requestAnimationFrame(tick);
  }
  function setPlaying(on) {
    playing = on; last = null;
    if (on) { if (P >= total) P = 0; requestAnimationFrame(tick); }
    render();
  }
  // Next scene; back to this scene's start, or to the one before when already there.
  function jump(direction) {
    let i = scenes.findIndex((s) => P < s.p1 - 1e-6);
    if (i < 0) i = scenes.length - 1;
    if (!(direction < 0 && P - scenes[i].p0 > 1)) i = Math.min(scenes.length - 1, Math.max(0, i + direction));
    P = scenes[i].p0; render();
  }
  playButton.onclick = () => setPlaying(!playing);
  document.getElementById("next").onclick = () => jump(1);
  document.getElementById("prev").onclick = () => jump(-1);
  scrub.oninput = () => { P = total * Number(scrub.value) / 1000; render(); };
  document.addEventListener("keydown", (e) => {
    if (e.code === "Space") { e.preventDefault(); setPlaying(!playing); }
    if (e.code === "ArrowRight") jump(1);
    if (e.code === "ArrowLeft") jump(-1);
  });

  // For tools/animate.py's frames: show play time p and nothing but the stage, without the
  // subtitle's text (the video has it as a subtitle track; burnt in too, a page showing the
  // track would show every line twice).
  window.showFrame = (p) => { document.body.classList.add("frame", "video"); playing = false; P = p; render(); };
  const still = new URLSearchParams(location.search).get("t");
  if (still !== null) { document.body.classList.add("frame"); P = Number(still); }
  render();
})();
