// The player of "一个请求的一生": replays data.js (a real trace cut into scenes by
// tools/animate.py) as an SVG. Play time P runs through the scenes; each scene stretches its
// part of the trace onto its seconds, so every event has a play time and the picture at P is
// the trace's state after all events played by then. The narration (narration.mp3) is laid
// out on the same play time, so the player plays it in step. ?t=SECONDS renders one still
// frame (the video's frames are screenshots of it, made by showFrame).
(function () {
  "use strict";
  const D = window.REQUEST_LIFE;
  const svg = document.getElementById("stage");
  const W = 720, H = 648;
  const UID_COLORS = ["#1e88e5", "#43a047", "#8e24aa", "#e53935", "#00897b", "#6d4c41"];
  const MSG_COLORS = { HTTP: "#455a64", TokenizeMsg: "#3949ab", UserMsg: "#00796b",
    DetokenizeMsg: "#6d4c41", UserReply: "#ef6c00", AbortMsg: "#c62828", SSE: "#2e7d32" };
  // The top band's boxes, and where a message's pill is centred when it leaves or reaches
  // one: the client's right edge, the middle of the API server and the tokenizer, and just
  // inside the scheduler (where a message it has not read yet waits).
  const COL = { client: [4, 224], api: [234, 324], tokenizer: [334, 430], scheduler: [440, 716] };
  const PORT = { client: 224, api: 279, tokenizer: 382, scheduler: 478 };
  const LANE_NAMES = { client: "客户端", api: "API Server", tokenizer: "tokenizer", scheduler: "调度器" };
  const ROUTE = { TokenizeMsg: ["api", "tokenizer"], UserMsg: ["tokenizer", "scheduler"],
    DetokenizeMsg: ["scheduler", "tokenizer"], UserReply: ["tokenizer", "api"] };
  const TRAVEL = 0.6; // play seconds a message takes to cross, however short its real flight
  const CELL = 5; // px per KV page in the page table (page_size 1: one token)
  const TCELL = 3; // ... in the radix tree

  const scenes = D.scenes;
  const total = scenes[scenes.length - 1].p1;
  const events = D.events.map(([t, lane, name, dur, args], i) => ({ i, t, lane, name, dur, args }));

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
  const prompt = {};
  for (const e of events) if (e.name === "queued") prompt[e.args.uid] = e.args.prompt_tokens;

  // Messages as flights: the k-th send of (type, uid) towards a lane meets the k-th receipt
  // of it there. HTTP requests and SSE writes travel between the client and the API server.
  const flights = [];
  const sends = {};
  for (const e of events) {
    const uid = e.args.uid;
    if (e.name === "http_request") flights.push({ name: "HTTP", uid, from: "client", to: "api", p0: e.p, p1: e.p, t0: e.t, t1: e.t });
    if (e.name === "sse_write") flights.push({ name: "SSE", uid, from: "api", to: "client", p0: e.p, p1: e.p, t0: e.t, t1: e.t, label: JSON.stringify(e.args.text) });
    if (e.args.dir === "send") {
      const to = e.name === "AbortMsg" ? (e.lane === "api" ? "tokenizer" : "scheduler") : (ROUTE[e.name] || [])[1];
      if (!to) continue;
      const key = `${e.name}/${uid}/${to}`;
      (sends[key] = sends[key] || []).push({ name: e.name, uid, from: e.lane, to, p0: e.p, p1: total, t0: e.t, t1: null });
    }
  }
  const received = {};
  for (const e of events) {
    if (e.args.dir !== "recv") continue;
    const key = `${e.name}/${e.args.uid}/${e.lane}`;
    const k = received[key] = (received[key] || 0) + 1;
    const f = (sends[key] || [])[k - 1];
    if (f) { f.p1 = e.p; f.t1 = e.t; }
  }
  for (const list of Object.values(sends)) flights.push(...list);

  // Everything that happened up to play time P.
  function stateAt(P) {
    const st = { clients: {}, waiting: [], rows: {}, radix: [], step: null, busy: {}, last: null };
    for (const r of D.requests) st.clients[r.uid] = { text: "", state: "未发出", tokens: 0 };
    for (const e of events) {
      if (e.p > P) break;
      st.last = e;
      const a = e.args, uid = a.uid, c = st.clients[uid];
      switch (e.name) {
        case "http_request": c.state = "等第一个 token"; break;
        case "sse_write": c.text += a.text; c.state = "接收中"; break;
        case "http_done": c.state = a.finish_reason === "stop" ? "✓ EOS" : "✓ max_tokens"; break;
        case "AbortMsg": if (e.lane === "api") c.state = "✂ 断开"; break;
        case "queued": st.waiting.push(uid); break;
        case "admit":
          st.waiting = st.waiting.filter((u) => u !== uid);
          // Its pages come with the step that computes it, which starts right after.
          st.rows[uid] = { row: a.row, hit: a.hit, own: 0, cached: a.hit, tokens: 0 };
          break;
        case "prefill": case "decode":
          a.uids.forEach((u, i) => {
            if (st.rows[u]) { st.rows[u].own += a.pages[i]; st.rows[u].tokens += a.tokens[i]; }
          });
          if (P < e.pEnd) st.step = e;
          break;
        case "pages_returned": {
          let node = st.radix.find((n) => n.uid === uid);
          if (!node) st.radix.push(node = { uid, hit: st.rows[uid] ? st.rows[uid].hit : 0, own: 0, locked: true, freed: 0 });
          node.own += a.to_cache;
          node.freed += a.freed;
          if (st.rows[uid]) st.rows[uid].cached += a.to_cache;
          if (a.finished) node.locked = false;
          break;
        }
        case "finish": delete st.rows[uid]; break;
        case "abort": st.waiting = st.waiting.filter((u) => u !== uid); break;
      }
      if (e.args.dir === "recv" || e.args.dir === "send") st.busy[e.lane] = e.p;
    }
    // The pool: pages in the tree (locked while a running request holds its path), pages a
    // running request holds that are not in the tree yet, and the free list: the rest.
    const tree = st.radix.reduce((n, x) => n + x.own, 0);
    const locked = st.radix.filter((x) => x.locked).reduce((n, x) => n + x.own, 0);
    const held = Object.values(st.rows).reduce((n, r) => n + r.hit + r.own - r.cached, 0);
    const freed = st.radix.reduce((n, x) => n + x.freed, 0);
    st.pool = { tree, locked, held, freed, free: D.pool.pages - tree - held };
    return st;
  }

  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  const T = (x, y, s, cls = "", extra = "") => `<text x="${x}" y="${y}" class="${cls}" ${extra}>${esc(s)}</text>`;
  const tip = (s) => `data-tip="${esc(s)}"`;
  const rowY = (uid) => 70 + uid * 40;
  const color = (uid) => UID_COLORS[uid % UID_COLORS.length];
  const sec = (t) => `${t.toFixed(4)} 秒`;
  // A uid as a coloured square with its digit.
  const chip = (x, y, uid, info) => `<g ${tip(info)}><rect x="${x}" y="${y}" width="20" height="18" rx="3" fill="${color(uid)}"/>`
    + T(x + 10, y + 14, uid, "chip", 'fill="#ffffff" text-anchor="middle"') + "</g>";

  const cjk = (c) => /[\u2e80-\uffff]/.test(c);
  const widthOf = (s) => [...s].reduce((n, c) => n + (cjk(c) ? 2 : 1), 0);
  function wrap(text, width) {
    const lines = [];
    let line = "";
    for (const ch of text) {
      if (line.length && widthOf(line) + (cjk(ch) ? 2 : 1) > width) { lines.push(line); line = ""; }
      line += ch;
    }
    if (line) lines.push(line);
    return lines;
  }
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

  function drawTop(st, P) {
    let out = "";
    const names = { client: "客户端", api: "API Server", tokenizer: "tokenizer", scheduler: "调度器 + Engine" };
    for (const [lane, [x0, x1]] of Object.entries(COL)) {
      const busy = lane === "scheduler" ? !!st.step : (st.busy[lane] !== undefined && P - st.busy[lane] < 0.4);
      out += `<rect class="box${busy ? " busy" : ""}" x="${x0}" y="22" width="${x1 - x0}" height="204" rx="8"/>`;
      out += T(x0 + 8, 42, names[lane], "lane-title");
    }
    for (const uid of Object.keys(st.clients).map(Number)) {
      const c = st.clients[uid], y = rowY(uid), req = D.requests.find((r) => r.uid === uid);
      out += chip(10, y - 14, uid, `uid ${uid} 的客户端\n问：${req.content}\nmax_tokens ${req.max_tokens}${req.read_chunks ? `，读 ${req.read_chunks} 块就断开` : ""}\n${c.text ? `已收到：“${c.text}”` : c.state}`);
      out += T(36, y, clip(req.content, 27), "small");
      const state = c.state === "接收中" ? "" : c.state, room = state ? 22 - state.length : 23;
      const shown = c.text.length > room ? "…" + c.text.slice(1 - room) : c.text;
      out += T(36, y + 16, shown ? `“${shown}”${state ? " " + state : ""}` : c.state, "reply", `fill="${color(uid)}"`);
    }
    // The scheduler: its waiting queue and the step it is computing.
    const sx = 522;
    out += T(sx, 68, "等待队列", "small");
    st.waiting.forEach((u, i) => { out += chip(sx + 54 + i * 24, 54, u, `uid ${u} 在等待队列里：已读到、还没准入`); });
    if (!st.waiting.length) out += T(sx + 54, 68, "（空）", "small");
    if (st.step) {
      const s = st.step, f = (P - s.p) / Math.max(1e-9, s.pEnd - s.p);
      const tokens = s.args.tokens.reduce((a, b) => a + b, 0);
      out += T(sx, 96, `正在算 ${s.name}`, "small");
      out += T(sx, 114, `${s.args.uids.length} 个请求 · ${tokens} 个 token`, "small");
      out += `<rect x="${sx}" y="122" width="186" height="10" fill="#eceff1"/><rect x="${sx}" y="122" width="${186 * f}" height="10" class="${s.name}"/>`;
      out += T(sx, 150, `这一步真实用时 ${s.dur.toFixed(2)} 秒`, "small");
      s.args.uids.forEach((u, i) => { out += chip(sx + i * 24, 158, u, `uid ${u} 在这一步的 batch 里：${s.args.tokens[i]} 个 token，新分 ${s.args.pages[i]} 页`); });
    } else {
      out += T(sx, 96, "空闲：等消息", "small");
    }
    out += T(COL.scheduler[1] - 8, 42, `真实时间 ${traceAt(P).toFixed(3)} 秒`, "small", 'text-anchor="end"');
    return out;
  }

  function drawFlights(P) {
    let out = "", parked = 0;
    for (const f of flights) {
      const arrive = Math.max(f.p1, f.p0 + TRAVEL);
      if (P < f.p0 || P >= arrive) continue;
      const k = Math.min(1, (P - f.p0) / TRAVEL);
      if (k === 1 && f.to === "scheduler") parked++;
      const xs = PORT[f.from], xe = PORT[f.to], right = xe > xs;
      const x = xs + (xe - xs) * k, y = rowY(f.uid) + (right ? -7 : 9);
      const label = clip(f.label ? `SSE ${f.label}` : f.name, 16);
      const w = label.length * 7.3 + 12;
      const info = `${f.name}${f.label ? " " + f.label : ""} · uid ${f.uid}\n${LANE_NAMES[f.from]} → ${LANE_NAMES[f.to]}\n`
        + (f.t1 === null ? `发出于 ${sec(f.t0)}，对方还没读`
          : f.t1 === f.t0 ? `真实时间 ${sec(f.t0)}` : `发出 ${sec(f.t0)}，读到 ${sec(f.t1)}：路上 ${((f.t1 - f.t0) * 1000).toFixed(2)} 毫秒`)
        + "\n（trace 没有记录消息的字节数）";
      out += `<g class="pill" ${tip(info)}><rect x="${x - w / 2}" y="${y - 9}" width="${w}" height="18" rx="8" fill="${MSG_COLORS[f.name]}" stroke="${color(f.uid)}" stroke-width="2"/>`
        + T(x, y + 4, label, "pill-text", 'fill="#fff" text-anchor="middle"') + "</g>";
    }
    if (parked) out += T(PORT.scheduler - 30, 220, "未读：调度器算完这一步才读", "note");
    return out;
  }

  function drawMemory(st) {
    let out = T(4, 252, "页表的行与每个请求的 KV 页（一页一个 token）", "section");
    const rows = Object.entries(st.rows).sort((a, b) => b[1].row - a[1].row);
    rows.forEach(([uid, r], i) => {
      const y = 262 + i * 28, x0 = 78, n = r.hit + r.own;
      const info = `uid ${uid} · 页表第 ${r.row} 行\n命中前缀缓存 ${r.hit} 页（共享，不用再算）\n自己的 ${r.own} 页（${r.tokens} 个 token 算到这一步）\n其中已插进前缀缓存：${r.cached} 页`;
      out += `<g ${tip(info)}>` + T(4, y + 13, `行 ${r.row}`, "small");
      out += `<rect x="${x0}" y="${y}" width="${r.hit * CELL}" height="16" fill="${color(uid)}" class="cell-shared"/>`;
      out += `<rect x="${x0 + r.hit * CELL}" y="${y}" width="${r.own * CELL}" height="16" fill="${color(uid)}"/>`;
      for (let k = 1; k < n; k++) out += `<line x1="${x0 + k * CELL}" y1="${y}" x2="${x0 + k * CELL}" y2="${y + 16}" stroke="#fff" stroke-width="0.6"/>`;
      out += `<line x1="${x0}" y1="${y + 20}" x2="${x0 + r.cached * CELL}" y2="${y + 20}" stroke="#37474f" stroke-width="2"/>`;
      out += T(x0 + n * CELL + 6, y + 13, `${r.hit} + ${r.own} 页`, "small") + "</g>";
    });
    if (!rows.length) out += T(4, 278, "（没有运行中的请求）", "small");
    out += T(4, 384, "浅色：命中的共享页　下划线：已插进前缀缓存", "small");

    // The prefix cache as a trie: each request's path leaves the trunk where its hit ends.
    const rx = 470;
    out += T(rx, 252, "前缀缓存（radix tree）", "section");
    st.radix.forEach((n, j) => {
      const y = 262 + j * 28;
      if (j > 0) out += `<line x1="${rx + n.hit * TCELL}" y1="278" x2="${rx + n.hit * TCELL}" y2="${y + 8}" stroke="#90a4ae" stroke-width="1.5"/>`;
      const info = `uid ${n.uid} 插进树里的 ${n.own} 页（从第 ${n.hit} 个 token 分出）\n${n.locked ? "锁定：它还在运行，这些页不能驱逐" : "可回收：没人用了；内存紧时驱逐，才回空闲列表"}`;
      out += `<g ${tip(info)}><rect x="${rx + n.hit * TCELL}" y="${y}" width="${n.own * TCELL}" height="16" fill="${color(n.uid)}" ${n.locked ? "" : 'class="evictable"'}/>`;
      out += T(rx + (n.hit + n.own) * TCELL + 6, y + 13, `+${n.own} ${n.locked ? "锁定" : "可回收"}`, "small") + "</g>";
    });
    return out;
  }

  // The KV pool: its capacity as one bar, the free list its unshaded part.
  function drawPool(st) {
    const x0 = 4, x1 = 716, y = 410, w = x1 - x0, N = D.pool.pages, p = st.pool;
    const X = (n) => x0 + w * n / N;
    let out = T(x0, y - 6, `KV 池 ${N} 页（--num-pages）：运行中请求自己的 ${p.held} · 前缀缓存 ${p.tree}（锁定 ${p.locked}，可回收 ${p.tree - p.locked}）· 空闲列表 ${p.free}`, "small");
    const parts = [[p.held, "#546e7a", `运行中的请求还没插进树的页：${p.held}`],
      [p.locked, "#ef6c00", `前缀缓存里锁定的页：${p.locked}`],
      [p.tree - p.locked, "#ffb74d", `前缀缓存里可回收的页：${p.tree - p.locked}（驱逐时回到空闲列表）`]];
    let at = 0;
    out += `<rect x="${x0}" y="${y}" width="${w}" height="16" fill="#e8f5e9" stroke="#a5d6a7" ${tip(`空闲列表：${p.free} 页（容量 ${N}）`)}/>`;
    for (const [n, fill, info] of parts) {
      if (n > 0) out += `<rect x="${X(at)}" y="${y}" width="${Math.max(1, X(at + n) - X(at))}" height="16" fill="${fill}" ${tip(info)}/>`;
      at += n;
    }
    out += T(x0, y + 32, p.freed ? `已还回空闲列表 ${p.freed} 页（与树里重复的页）` :
      "请求结束后页不回空闲列表：留在前缀缓存里，可回收；池子紧了才驱逐回去", "note");
    return out;
  }

  function drawTimeline(P) {
    const x0 = 4, x1 = 716, y = 472, w = x1 - x0;
    const X = (p) => x0 + w * p / total;
    let out = T(x0, y - 6, "每一步的 batch（橙 = prefill，灰 = decode；彩色 = 参与的请求）", "small");
    out += `<rect x="${x0}" y="${y}" width="${w}" height="64" fill="#f5f7f8"/>`;
    for (const s of scenes) out += `<line x1="${X(s.p0)}" y1="${y}" x2="${X(s.p0)}" y2="${y + 64}" stroke="#cfd8dc"/>`;
    for (const e of events) {
      if ((e.name !== "prefill" && e.name !== "decode") || e.p > P) continue;
      const xa = X(e.p), xb = Math.max(xa + 3, X(Math.min(e.pEnd, P)));
      const info = `${e.name}：uid ${e.args.uids.join("、")}，${e.args.tokens.reduce((a, b) => a + b, 0)} 个 token，真实用时 ${e.dur.toFixed(2)} 秒`;
      out += `<g ${tip(info)}><rect x="${xa}" y="${y + 2}" width="${xb - xa - 1}" height="8" class="${e.name}"/>`;
      e.args.uids.forEach((u, i) => { out += `<rect x="${xa}" y="${y + 13 + i * 12}" width="${Math.max(2, xb - xa - 1)}" height="10" fill="${color(u)}"/>`; });
      out += "</g>";
    }
    out += `<line class="playhead" x1="${X(P)}" y1="${y - 2}" x2="${X(P)}" y2="${y + 66}"/>`;
    return out;
  }

  function sceneAt(P) { return scenes.find((s) => P < s.p1) || scenes[scenes.length - 1]; }

  function drawSubtitle(P) {
    const scene = sceneAt(P);
    const cue = D.cues.find(([a, b]) => P >= a && P < b) || (P < D.cues[0][0] ? null : D.cues[D.cues.length - 1]);
    let out = `<rect class="subtitle-bg" x="0" y="548" width="${W}" height="${H - 548}"/>`;
    out += T(10, 568, `${scenes.indexOf(scene) + 1}/${scenes.length} · ${scene.title}`, "scene-title");
    out += T(W - 10, 568, `第 ${scene.chapter} 章 · ${D.chapters[scene.chapter][0]}`, "scene-title", 'text-anchor="end"');
    if (cue) wrap(cue[2], 80).slice(0, 2).forEach((line, i) => { out += T(W / 2, 596 + i * 26, line, "subtitle", 'text-anchor="middle"'); });
    return out;
  }

  // What the last event up to P was, in words (the step buttons walk these).
  function describe(e) {
    if (!e) return "还没有事件";
    const a = e.args, who = LANE_NAMES[e.lane], u = `uid ${a.uid}`;
    switch (e.name) {
      case "http_request": return `${who} 收到 HTTP 请求，分给它 ${u}`;
      case "sse_write": return `${who} 写出一个 SSE 事件给 ${u} 的客户端：${JSON.stringify(a.text)}`;
      case "http_done": return `${who} 结束 ${u} 的响应（${a.finish_reason}）`;
      case "queued": return `${who} 读到 ${u} 的 UserMsg，放进等待队列（提示词 ${a.prompt_tokens} 个 token）`;
      case "admit": return `${who} 准入 ${u}：页表第 ${a.row} 行，前缀缓存命中 ${a.hit} 个 token，要分 ${a.pages} 页`;
      case "prefill": case "decode": return `${who} 发出一步 ${e.name}：${a.uids.map((x) => "uid " + x).join("、")}，共 ${a.tokens.reduce((x, y) => x + y, 0)} 个 token（真实用时 ${e.dur.toFixed(2)} 秒）`;
      case "pages_returned": return `${u} 的 ${a.to_cache} 页插进前缀缓存${a.freed ? `，${a.freed} 页还回空闲列表` : ""}${a.finished ? "；它结束了，路径解锁" : ""}`;
      case "finish": return `${who} 结束 ${u}，页表第 ${a.row} 行空出来`;
      case "abort": return `${who} 中止 ${u}（它正在 ${a.state === "running" ? "运行" : "等待"}）`;
    }
    if (a.dir) return `${who} ${a.dir === "send" ? "发出" : "收到"} ${e.name}（${u}）`;
    return `${who} · ${e.name}`;
  }

  let P = 0, playing = false, last = null, sound = true;
  const $ = (id) => document.getElementById(id);
  const playButton = $("play"), scrub = $("scrub"), clock = $("clock"), speed = $("speed");
  const audio = $("voice");
  const fmt = (s) => `${Math.floor(s / 60)}:${String(Math.floor(s % 60)).padStart(2, "0")}`;

  function render() {
    const st = stateAt(P);
    svg.innerHTML = drawTop(st, P) + drawFlights(P) + drawMemory(st) + drawPool(st) + drawTimeline(P) + drawSubtitle(P);
    scrub.value = String(Math.round(1000 * P / total));
    clock.textContent = `${fmt(P)} / ${fmt(total)}`;
    playButton.textContent = playing ? "暂停" : "播放";
    $("event").textContent = st.last ? `事件 ${st.last.i + 1}/${events.length} · 真实时间 ${st.last.t.toFixed(4)} 秒 · ${describe(st.last)}` : `事件 0/${events.length}`;
    const scene = sceneAt(P), [title, page] = D.chapters[scene.chapter];
    const link = $("chapter");
    link.textContent = `这一幕在第 ${scene.chapter} 章 · ${title}`;
    link.href = `../../${page}/index.html`;
  }
  function syncAudio() {
    if (!audio) return;
    if (!playing || !sound) { audio.pause(); return; }
    audio.playbackRate = Number(speed.value);
    if (Math.abs(audio.currentTime - P) > 0.3) audio.currentTime = P;
    if (audio.paused) audio.play().catch(() => { /* no sound; the clock drives */ });
  }
  function tick(now) {
    if (!playing) return;
    if (audio && sound && !audio.paused && Math.abs(audio.currentTime - P) < 1) P = Math.min(total, audio.currentTime);
    else if (last !== null) P = Math.min(total, P + (now - last) / 1000 * Number(speed.value));
    last = now;
    if (P >= total) { playing = false; syncAudio(); }
    render();
    requestAnimationFrame(tick);
  }
  function setPlaying(on) {
    playing = on; last = null;
    if (on) { if (P >= total) P = 0; requestAnimationFrame(tick); }
    syncAudio();
    render();
  }
  function seek(p) { P = Math.min(total, Math.max(0, p)); if (audio) audio.currentTime = P; render(); }
  // Next scene; back to this scene's start, or to the one before when already there.
  function jump(direction) {
    let i = scenes.findIndex((s) => P < s.p1 - 1e-6);
    if (i < 0) i = scenes.length - 1;
    if (!(direction < 0 && P - scenes[i].p0 > 1)) i = Math.min(scenes.length - 1, Math.max(0, i + direction));
    seek(scenes[i].p0);
  }
  // One event forward or back (paused): to the play time of the next or previous event.
  function step(direction) {
    setPlaying(false);
    const times = events.map((e) => e.p);
    const t = direction > 0 ? times.find((p) => p > P + 1e-6) : [...times].reverse().find((p) => p < P - 1e-6);
    seek(t === undefined ? (direction > 0 ? total : 0) : t);
  }
  playButton.onclick = () => setPlaying(!playing);
  $("next").onclick = () => jump(1);
  $("prev").onclick = () => jump(-1);
  $("step-next").onclick = () => step(1);
  $("step-prev").onclick = () => step(-1);
  $("sound").onclick = () => { sound = !sound; $("sound").textContent = sound ? "声音：开" : "声音：关"; syncAudio(); };
  speed.onchange = syncAudio;
  scrub.oninput = () => { seek(total * Number(scrub.value) / 1000); syncAudio(); };
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") return;
    if (e.code === "Space") { e.preventDefault(); setPlaying(!playing); }
    if (e.code === "ArrowRight") e.shiftKey ? jump(1) : step(1);
    if (e.code === "ArrowLeft") e.shiftKey ? jump(-1) : step(-1);
  });

  // Details of what the pointer is on (or a tap touched): messages, pages, chips, steps.
  const box = $("tip");
  function showTip(e) {
    const el = e.target.closest && e.target.closest("[data-tip]");
    if (!el) { box.hidden = true; return; }
    box.textContent = el.getAttribute("data-tip");
    box.hidden = false;
    const r = document.getElementById("player").getBoundingClientRect();
    const x = Math.min(e.clientX - r.left + 12, r.width - box.offsetWidth - 4);
    box.style.left = `${Math.max(4, x)}px`;
    box.style.top = `${e.clientY - r.top + 14}px`;
  }
  svg.addEventListener("mousemove", showTip);
  svg.addEventListener("click", showTip);
  svg.addEventListener("mouseleave", () => { box.hidden = true; });

  // For tools/animate.py's frames: show play time p and nothing but the stage, without the
  // subtitle's text (the video has it as a subtitle track; burnt in too, a page showing the
  // track would show every line twice).
  window.showFrame = (p) => { document.body.classList.add("frame", "video"); playing = false; P = p; render(); };
  const still = new URLSearchParams(location.search).get("t");
  if (still !== null) { document.body.classList.add("frame"); P = Number(still); }
  render();
})();
