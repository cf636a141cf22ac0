#!/usr/bin/env python3
"""The animation of chapter 0, "一个请求的一生", from a real trace.

    python tools/animate.py record   # a real run: server with --trace, four requests -> trace.json
    python tools/animate.py voice    # script.json -> each sentence spoken (espeak-ng) and measured
                                     #   -> narration.json, narration.mp3
    python tools/animate.py data     # trace.json + script.json + narration.json
                                     #   -> data.js, subtitles.vtt, video.html
    python tools/animate.py video    # frames (chromium) + narration.mp3 -> video.mp4

Everything lives in book/assets/request-life/. `record` needs the model (models/), `data`
only Python, `voice` espeak-ng and ffmpeg, `video` ffmpeg and chromium plus a CJK font.

Time: the player and the video run on "play time". script.json cuts the trace into scenes,
each starting at an event it names; inside a scene, trace time is stretched linearly onto its
play seconds, so a 0.3 ms message and a one-second decode step can both be watched. A scene
lasts as long as its narration takes to say (or the script's `seconds`, when that is longer):
`voice` speaks each sentence on its own and keeps how long it lasts and where its speech
starts in it (narration.json), so each subtitle cue starts where its sentence is heard.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "book" / "assets" / "request-life"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
LANES = {"api-server": "api", "tokenizer-0": "tokenizer", "scheduler-rank0": "scheduler"}
FRAME_SIZE = (960, 864)  # the stage's 720 x 648 viewBox, scaled by 4/3
NUM_PAGES = 2048  # the KV pool the recorded server had (record passes it as --num-pages)


# ------------------------------------------------------------------------------ the trace


@dataclass(frozen=True)
class Event:
    t: float  # seconds since the first event
    lane: str  # api | tokenizer | scheduler
    name: str
    dur: float  # seconds; 0 for an instant
    args: dict[str, Any]


def load_events(trace: dict[str, Any]) -> list[Event]:
    """The trace's events on the lanes the player draws, in time order, from t = 0."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    timed = [e for e in trace["traceEvents"] if e["ph"] in ("i", "X")
             and names.get(e["pid"]) in LANES]
    if not timed:
        raise ValueError("the trace has no events of the api-server, tokenizer-0 and "
                         "scheduler-rank0 processes")
    origin = min(e["ts"] for e in timed)
    events = [Event(round((e["ts"] - origin) / 1e6, 6), LANES[names[e["pid"]]], e["name"],
                    round(e.get("dur", 0) / 1e6, 6), e.get("args", {})) for e in timed]
    return sorted(events, key=lambda e: e.t)


def find(events: list[Event], selector: dict[str, Any]) -> Event:
    """The event a scene starts at: {"name": ..., "nth": k, and any args to match}."""
    nth = selector.get("nth", 0)
    want = {k: v for k, v in selector.items() if k not in ("name", "nth", "lane")}
    found = [e for e in events if e.name == selector["name"]
             and ("lane" not in selector or e.lane == selector["lane"])
             and all(e.args.get(k) == v for k, v in want.items())]
    if nth >= len(found):
        raise ValueError(f"scene anchor {selector}: the trace has {len(found)} such events")
    return found[nth]


# ------------------------------------------------------------------------------ scenes, cues


@dataclass(frozen=True)
class Scene:
    id: str
    title: str
    text: str  # the narration, which is also the subtitle
    t0: float  # trace time where the scene starts
    t1: float  # ... and where the next one starts
    p0: float  # play time where the scene starts
    p1: float
    lines: tuple  # (start, end, sentence): its subtitle cues; each starts where it is heard
    said: tuple  # play time where each sentence's audio (with its leading silence) is placed


def _value(event: Event, field: str) -> str:
    if field in ("t", "dur"):
        return f"{getattr(event, field):.1f}"
    value = event.args[field]
    return str(sum(value) if isinstance(value, list) else value)


def narration(text: str, marks: dict[str, Event]) -> str:
    """The text with each {mark.field} replaced by that event's value, so the numbers said
    are the recorded ones: a field of its args (a list is summed), or t / dur in seconds."""
    def replace(m: re.Match) -> str:
        name, field = m.group(1), m.group(2)
        if name not in marks:
            raise ValueError(f"{{{name}.{field}}}: no mark named {name!r}")
        return _value(marks[name], field)
    return re.sub(r"\{(\w+)\.(\w+)\}", replace, text)


# The narration's layout in a scene: silence before its first sentence, between two, after
# the last (the scene's pictures keep moving while nothing is said).
LEAD, GAP, TAIL = 0.5, 0.35, 1.0


def build_scenes(events: list[Event], script: dict[str, Any],
                 voice: dict[str, Any]) -> list[Scene]:
    """Scenes with their trace and play intervals and their cues. Anchors must follow the
    trace's order. `voice` (narration.json) says how long each sentence lasts when spoken
    and where in that its speech starts; it must be of these very sentences."""
    end = max(e.t + e.dur for e in events)
    marks = {name: find(events, selector) for name, selector in script["marks"].items()}
    starts = [0.0 if s["at"] == "start" else find(events, s["at"]).t for s in script["scenes"]]
    for a, b, s in zip(starts, starts[1:], script["scenes"][1:]):
        if b < a:
            raise ValueError(f"scene {s['id']} starts at {b:.3f} s, before the scene ahead "
                             f"of it ({a:.3f} s)")
    spoken = iter(voice["sentences"])
    scenes, p = [], 0.0
    for i, s in enumerate(script["scenes"]):
        t1 = starts[i + 1] if i + 1 < len(starts) else end
        text = narration(s["text"], marks)
        said, heard, at = [], [], p + LEAD
        for sentence in sentences(text):
            v = next(spoken, None)
            if v is None or v["text"] != sentence.strip():
                raise ValueError(f"narration.json does not say {sentence.strip()!r} (it has "
                                 f"{v and v['text']!r}): run tools/animate.py voice")
            said.append(round(at, 3))
            heard.append(round(at + v["onset"], 3))
            at += v["seconds"] + GAP
        p1 = round(max(p + s["seconds"], at - GAP + TAIL), 3)
        bounds = heard[1:] + [p1]
        lines = tuple((a, b, x.strip()) for a, b, x in zip(heard, bounds, sentences(text)))
        scenes.append(Scene(s["id"], s["title"], text, starts[i], t1, p, p1, lines,
                            tuple(said)))
        p = p1
    if next(spoken, None) is not None:
        raise ValueError("narration.json says more than the script: run tools/animate.py voice")
    return scenes


def sentences(text: str) -> list[str]:
    """The subtitle lines of a narration: its sentences (kept with their punctuation)."""
    return [s for s in re.findall(r"[^。！？]+[。！？]?", text.strip()) if s.strip()]


def cues(scenes: list[Scene]) -> list[tuple[float, float, str]]:
    """One cue per sentence, from where it is heard to where the next one is heard (the
    last to the end)."""
    lines = [line for s in scenes for line in s.lines]
    return [(a, b2 if k + 1 < len(lines) else b, x)
            for k, ((a, b, x), (b2, _, _)) in enumerate(zip(lines, lines[1:] + lines[-1:]))]


def _stamp(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def webvtt(scenes: list[Scene]) -> str:
    lines = ["WEBVTT", ""]
    for i, (a, b, text) in enumerate(cues(scenes), 1):
        lines += [str(i), f"{_stamp(a)} --> {_stamp(b)}", text, ""]
    return "\n".join(lines)


def player_data(events: list[Event], scenes: list[Scene], script: dict[str, Any],
                requests: list[dict[str, Any]], recorded_on: str) -> str:
    """data.js: what the player needs, as one global (a file:// page can fetch neither JSON
    nor a subtitle file, so the cues travel in it too)."""
    chapters = {s["id"]: s.get("chapter") for s in script["scenes"]}
    data = {"recorded": f"{script['recorded']}，{recorded_on}", "requests": requests,
            "scenes": [{**s.__dict__, "chapter": chapters[s.id]} for s in scenes],
            "cues": cues(scenes), "chapters": script["chapters"], "pool": {"pages": NUM_PAGES},
            "events": [[e.t, e.lane, e.name, e.dur, e.args] for e in events]}
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"// Generated by tools/animate.py data from trace.json, script.json and " \
           f"narration.json.\nwindow.REQUEST_LIFE = {body};\n"


def script_sentences(events: list[Event], script: dict[str, Any]) -> list[str]:
    """Every sentence of the narration, in order, with the trace's numbers in it."""
    marks = {name: find(events, selector) for name, selector in script["marks"].items()}
    return [x.strip() for s in script["scenes"] for x in sentences(narration(s["text"], marks))]


def load(assets: Path = ASSETS) -> tuple[list[Event], list[Scene], dict[str, Any],
                                         list[dict[str, Any]], str]:
    """Events, scenes, the script, the recorded requests by uid, and the day of the run."""
    script = json.loads((assets / "script.json").read_text(encoding="utf-8"))
    trace = json.loads((assets / "trace.json").read_text(encoding="utf-8"))
    voice = json.loads((assets / "narration.json").read_text(encoding="utf-8"))
    events = load_events(trace)
    requests = sorted(trace["otherData"]["requests"], key=lambda r: r["uid"])
    return (events, build_scenes(events, script, voice), script, requests,
            trace["otherData"]["recorded_on"])


def video_tag(scenes: list[Scene]) -> str:
    """video.html, the <video> chapter 0 includes: its subtitles ride in a data: URL, since
    a browser refuses a subtitle file to a page opened from disk (file://)."""
    vtt = base64.b64encode(webvtt(scenes).encode()).decode()
    return ('<video controls preload="metadata" style="width: 100%;" '
            'src="../assets/request-life/video.mp4">\n'
            f'  <track kind="subtitles" srclang="zh" label="中文" default '
            f'src="data:text/vtt;base64,{vtt}">\n</video>\n')


def write_data(assets: Path = ASSETS) -> list[Scene]:
    events, scenes, script, requests, recorded_on = load(assets)
    (assets / "data.js").write_text(player_data(events, scenes, script, requests, recorded_on),
                                    encoding="utf-8")
    (assets / "subtitles.vtt").write_text(webvtt(scenes), encoding="utf-8")
    (assets / "video.html").write_text(video_tag(scenes), encoding="utf-8")
    return scenes


# ------------------------------------------------------------------------------ record


def record(out: Path, script: dict[str, Any]) -> None:
    """Start a server with --trace, send script["requests"] as clients would, stop it, and
    keep the trace with which uid each request got (the server numbers them as they come)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        server = subprocess.Popen(
            [sys.executable, "-m", "minisgl", "--model", str(MODEL), "--port", "0",
             "--trace", str(trace), "--num-pages", str(NUM_PAGES), "--max-seq-len", "512",
             "--max-running-req", "8"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            for line in server.stdout:  # "minisgl: ready, serving ... at http://HOST:PORT/v1 ..."
                print(line, end="")
                if ready := re.search(r"minisgl: ready, .* at (http://\S+)/v1 ", line):
                    break
            else:
                raise SystemExit(f"the server exited ({server.wait()}) before it was ready")
            url = f"{ready.group(1)}/v1/chat/completions"
            uids = asyncio.run(_clients(url, script["requests"]))
            time.sleep(0.5)  # the abort's last messages
        finally:
            server.send_signal(signal.SIGTERM)
            print(server.communicate(timeout=60)[0], end="")
        recorded = json.loads(trace.read_text(encoding="utf-8"))
    recorded["otherData"] = {"requests": [{**r, "uid": uid}
                                          for r, uid in zip(script["requests"], uids)],
                             "recorded_on": datetime.date.today().isoformat()}
    prefills = [e.args["uids"] for e in load_events(recorded) if e.name == "prefill"]
    if uids != list(range(len(uids))) or prefills[:2] != [[0], list(range(1, len(uids)))]:
        raise SystemExit(f"the scenes tell of request 0 prefilled alone while the others "
                         f"wait, then the others in one batch; this run went otherwise "
                         f"(uids {uids}, prefill batches {prefills}): run it again")
    out.write_text(json.dumps(recorded, ensure_ascii=False), encoding="utf-8")


async def _clients(url: str, requests: list[dict[str, Any]]) -> list[int]:
    """The requests as streaming chats, started `delay` seconds apart from one event loop
    (so they reach the server in this order); the uid each one got."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        tasks = []
        for r in requests:
            await asyncio.sleep(r["delay"])
            tasks.append(asyncio.create_task(_chat(client, url, r)))
        return list(await asyncio.gather(*tasks))


async def _chat(client: Any, url: str, request: dict[str, Any]) -> int:
    """One streaming chat; with `read_chunks`, hang up after that many chunks."""
    body = {"model": "m", "messages": [{"role": "user", "content": request["content"]}],
            "max_tokens": request["max_tokens"], "stream": True, "temperature": 0}
    text, chunks, uid = "", 0, -1
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            uid = int(chunk["id"].rsplit("-", 1)[1])  # chatcmpl-<uid>
            text += chunk["choices"][0]["delta"].get("content") or ""
            chunks += 1
            if chunks == request.get("read_chunks"):
                break  # closing the stream: the client is gone
    print(f"uid {uid}: {request['content']!r} -> {text!r}")
    return uid


# ------------------------------------------------------------------------------ video

FPS = 12  # frames per second of play time: a message's 0.6 s crossing is 7 frames
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
LOUD = 300  # |sample| (16-bit) above which a 10 ms window counts as speech


def _duration(path: Path) -> float:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration",
                          "-of", "csv=p=0", str(path)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def _samples(wav: Path) -> tuple[Any, int]:
    import wave

    import numpy as np

    with wave.open(str(wav)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, wav
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


def speech_starts(samples: Any, rate: int, after: float = 0.0) -> float | None:
    """Where speech first starts at or after `after` seconds: the first 10 ms window whose
    loudest sample is over LOUD."""
    window = rate // 100
    for k in range(int(after * rate) // window, len(samples) // window):
        if abs(samples[k * window:(k + 1) * window].astype(int)).max() > LOUD:
            return round(k * window / rate, 3)
    return None


def speak(assets: Path = ASSETS) -> dict[str, Any]:
    """narration.json and narration.mp3: each sentence spoken on its own and measured (its
    length and where its speech starts, from the WAV), espeak-ng's phoneme transcription of
    it, then the whole narration laid out as the scenes place it, and each cue's start
    checked against where speech is heard in that track."""
    import wave

    import numpy as np

    sys.path.insert(0, str(ROOT / "tools"))
    import narration

    script = json.loads((assets / "script.json").read_text(encoding="utf-8"))
    trace = json.loads((assets / "trace.json").read_text(encoding="utf-8"))
    events = load_events(trace)
    said, rate = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(script_sentences(events, script)):
            wav = Path(tmp) / f"s{i:03d}.wav"
            doc = narration.ssml(text)
            narration.speak(doc, wav)
            samples, rate = _samples(wav)
            said.append({"text": text, "ssml": doc, "phonemes": narration.phonemes(doc),
                         "seconds": round(len(samples) / rate, 3),
                         "onset": speech_starts(samples, rate), "wav": samples})
        voice = {"voices": [narration.ZH_VOICE, narration.EN_VOICE], "rate": narration.RATE,
                 "sentences": [{k: v for k, v in x.items() if k != "wav"} for x in said]}
        scenes = build_scenes(events, script, voice)
        track = np.zeros(int(scenes[-1].p1 * rate) + 1, dtype="<i2")
        at = [a for s in scenes for a in s.said]
        for a, x in zip(at, said):
            start = int(round(a * rate))
            track[start:start + len(x["wav"])] = x["wav"][:len(track) - start]
        # Each cue against the signal: the first speech after the sentence before it ended.
        offsets, end = [], 0.0
        for (cue, _, _), a, x in zip(cues(scenes), at, said):
            heard = speech_starts(track, rate, end)
            offsets.append(round(heard - cue, 3))
            end = a + x["seconds"]
        voice["measured"] = {"cue_minus_speech_start": offsets}
        full = Path(tmp) / "narration.wav"
        with wave.open(str(full), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(track.tobytes())
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(full), "-c:a", "libmp3lame",
                        "-b:a", "40k", "-ac", "1", str(assets / "narration.mp3")], check=True)
    (assets / "narration.json").write_text(json.dumps(voice, ensure_ascii=False, indent=1) + "\n",
                                           encoding="utf-8")
    return voice


class _DevTools:
    """Headless Chromium driven over --remote-debugging-pipe (fds 3 and 4): the DevTools
    protocol with nothing to install, NUL-terminated JSON each way."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds() -> None:  # in the child: its ends as fds 3 and 4, kept across exec
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"], preexec_fn=fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._id, self.session = b"", 0, None

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def wait_for(self, event: str) -> None:
        while self._next().get("method") != event:
            pass

    def _next(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def close(self) -> None:
        """Stop Chromium and every process it started. Its helpers (the network service, for
        one) can outlive the browser process and still write into the profile, which the
        caller removes next: the whole session is killed, and waited for until none is left."""
        self.process.terminate()
        self.process.wait(timeout=30)
        os.close(self._write)
        os.close(self._read)
        group = self.process.pid  # start_new_session: the session's and group's id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _live_members(group) and time.monotonic() < deadline:
            time.sleep(0.05)


def _live_members(group: int) -> bool:
    """Whether a process of this process group is still running (a zombie is not: orphans
    whose parent reaps nothing stay zombies)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":  # state, ppid, pgrp
                return True
    return False


def frames(scenes: list[Scene], work: Path, chromium: str) -> int:
    """Screenshots of the player at FPS frames per play second; how many."""
    total = scenes[-1].p1
    count = int(total * FPS)
    with tempfile.TemporaryDirectory() as profile:
        tools = _DevTools(chromium, profile)
        try:
            target = tools.call("Target.createTarget", url="about:blank")["targetId"]
            tools.session = tools.call("Target.attachToTarget", targetId=target,
                                       flatten=True)["sessionId"]
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=FRAME_SIZE[0],
                       height=FRAME_SIZE[1], deviceScaleFactor=1, mobile=False)
            tools.call("Page.navigate", url=(ASSETS / "index.html").as_uri())
            tools.wait_for("Page.loadEventFired")
            for i in range(count):
                tools.call("Runtime.evaluate", expression=f"showFrame({i / FPS})")
                shot = tools.call("Page.captureScreenshot", format="png")["data"]
                (work / f"frame{i:05d}.png").write_bytes(base64.b64decode(shot))
                if i % (10 * FPS) == 0:
                    print(f"frame {i}/{count}", flush=True)
        finally:
            tools.close()
    return count


def render_video(assets: Path = ASSETS) -> Path:
    """video.mp4: the frames, the narration (narration.mp3, as `voice` laid it out) and the
    subtitles as a subtitle track (the frames leave the subtitle bar's text out: the page's
    <track> shows it, as do video players)."""
    scenes = write_data(assets)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = [t for t in ("ffmpeg", "ffprobe") if not shutil.which(t)]
    if missing or not chromium:
        raise SystemExit(f"missing {', '.join(missing + ([] if chromium else ['chromium']))}: "
                         "apt-get install -y ffmpeg chromium fonts-noto-cjk")
    out = assets / "video.mp4"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        frames(scenes, work, chromium)
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-framerate", str(FPS),
                        "-i", str(work / "frame%05d.png"), "-i", str(assets / "narration.mp3"),
                        "-i", str(assets / "subtitles.vtt"),
                        "-map", "0:v", "-map", "1:a", "-map", "2:s",
                        "-c:v", "libx264", "-preset", "medium", "-crf", "28", "-tune", "animation",
                        "-pix_fmt", "yuv420p", "-r", str(FPS),
                        "-c:a", "aac", "-b:a", "48k", "-ac", "1",
                        "-c:s", "mov_text", "-metadata:s:s:0", "language=chi",
                        "-disposition:s:0", "default",
                        "-t", f"{scenes[-1].p1:.3f}", "-movflags", "+faststart", str(out)],
                       check=True)
    return out


# ------------------------------------------------------------------------------ command line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["record", "voice", "data", "video"])
    args = parser.parse_args()
    if args.command == "record":
        script = json.loads((ASSETS / "script.json").read_text(encoding="utf-8"))
        record(ASSETS / "trace.json", script)
    elif args.command == "voice":
        voice = speak()
        offsets = sorted(abs(x) for x in voice["measured"]["cue_minus_speech_start"])
        print(f"{len(offsets)} sentences; cue vs speech start: max {offsets[-1]:.2f} s, "
              f"median {offsets[len(offsets) // 2]:.2f} s -> {ASSETS}/narration.json, .mp3")
    elif args.command == "data":
        scenes = write_data()
        print(f"{len(scenes)} scenes, {scenes[-1].p1:.1f} s -> {ASSETS}/data.js, subtitles.vtt, "
              "video.html")
    else:
        out = render_video()
        print(f"{out}: {_duration(out):.1f} s, {out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
