"""Chapter 0's animation: the committed trace, cut into scenes by the committed script and laid
out by the committed narration, gives exactly the committed player data and subtitles, with
timings that add up; the narration is Mandarin all through (espeak-ng's own phoneme trace,
committed in narration.json, has no word read through another language's fallback) and each
cue starts where its sentence is heard; and the player, in headless Chromium at the width it
has in chapter 0's column, draws no label under 11 px and keeps the colours its SVG names.

The narration checks read committed data (espeak-ng and ffmpeg are needed only to make it:
tools/animate.py voice); the player checks need Chromium (make test installs it)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from processes import ROOT

CHAPTER = None  # the book's animation (tools/animate.py), not a chapter: runs only in `make test`

ASSETS = ROOT / "book" / "assets" / "request-life"
# The player's iframe in chapter 0's page, inside a 1280 px window: mkdocs-material's column
# leaves it 686 px (688 with its border), measured from the built site in Chromium.
COLUMN_PX = 686
NARROW_PX = 358  # the same iframe on a 390 px phone


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


animate = _load("animate")
narration = _load("narration")


def _voice() -> dict:
    return json.loads((ASSETS / "narration.json").read_text(encoding="utf-8"))


def test_committed_data_and_subtitles_are_what_the_trace_script_and_voice_give():
    events, scenes, script, requests, recorded_on = animate.load(ASSETS)
    assert (ASSETS / "data.js").read_text(encoding="utf-8") == \
        animate.player_data(events, scenes, script, requests, recorded_on)
    assert (ASSETS / "subtitles.vtt").read_text(encoding="utf-8") == animate.webvtt(scenes)
    assert (ASSETS / "video.html").read_text(encoding="utf-8") == animate.video_tag(scenes)


def test_scenes_follow_the_trace_and_tile_about_three_minutes_of_play():
    events, scenes, script, _, _ = animate.load(ASSETS)
    assert scenes[0].p0 == 0 and 150 <= scenes[-1].p1 <= 200  # about three minutes
    for a, b in zip(scenes, scenes[1:]):
        assert a.p1 == b.p0 and a.t1 == b.t0 and a.t0 <= b.t0
    assert scenes[-1].t1 == max(e.t + e.dur for e in events)
    for s, spec in zip(scenes, script["scenes"]):  # no shorter than the script asks
        assert s.p1 - s.p0 >= spec["seconds"] - 1e-6
        assert str(spec["chapter"]) in script["chapters"]
        assert (ROOT / "book" / f"{script['chapters'][str(spec['chapter'])][1]}.md").exists()


def test_subtitle_cues_cover_each_scene_in_order_and_say_its_narration():
    _, scenes, _, _, _ = animate.load(ASSETS)
    cues = animate.cues(scenes)
    assert 0 < cues[0][0] < 1 and cues[-1][1] == round(scenes[-1].p1, 3)
    for (a0, a1, _), (b0, _, _) in zip(cues, cues[1:]):
        assert a0 < a1 == b0
    spoken = "".join(text for _, _, text in cues)
    assert re.sub(r"\s", "", spoken) == re.sub(r"\s", "", "".join(s.text for s in scenes))


def test_vtt_timestamps_parse_back_to_the_cues():
    _, scenes, _, _, _ = animate.load(ASSETS)
    stamps = re.findall(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})",
                        animate.webvtt(scenes))
    parsed = [(int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000,
               int(h2) * 3600 + int(m2) * 60 + int(s2) + int(ms2) / 1000)
              for h, m, s, ms, h2, m2, s2, ms2 in stamps]
    assert parsed == [(a, b) for a, b, _ in animate.cues(scenes)]


def test_narration_numbers_come_from_the_trace():
    events, scenes, script, requests, recorded_on = animate.load(ASSETS)
    admit = animate.find(events, {"name": "admit", "uid": 1})
    batch = next(s for s in scenes if s.id == "batch")
    assert f"请求 1 命中 {admit.args['hit']} 个 token" in batch.text
    assert "{" not in "".join(s.text for s in scenes)
    # "空闲列表一页也没拿回": every page a request gave back went into the prefix cache.
    returned = [e.args for e in events if e.name == "pages_returned"]
    assert "空闲列表一页也没拿回" in next(s for s in scenes if s.id == "finish01").text
    assert returned and sum(a["freed"] for a in returned) == 0


def test_a_scene_anchored_before_the_one_ahead_of_it_is_refused():
    events, _, script, _, _ = animate.load(ASSETS)
    broken = json.loads(json.dumps(script))
    broken["scenes"][1], broken["scenes"][2] = broken["scenes"][2], broken["scenes"][1]
    with pytest.raises(ValueError, match="before the scene ahead of it"):
        animate.build_scenes(events, broken, _voice())


def test_an_anchor_the_trace_lacks_is_named():
    events, _, _, _, _ = animate.load(ASSETS)
    with pytest.raises(ValueError, match="admit.*0 such events"):
        animate.find(events, {"name": "admit", "uid": 99})


def test_a_narration_of_other_sentences_is_refused():
    events, _, script, _, _ = animate.load(ASSETS)
    changed = json.loads(json.dumps(script))
    changed["scenes"][0]["text"] += "多说一句。"
    with pytest.raises(ValueError, match="run tools/animate.py voice"):
        animate.build_scenes(events, changed, _voice())


def test_the_requests_are_the_scripts_in_order_with_the_uids_the_server_gave():
    events, _, script, requests, _ = animate.load(ASSETS)
    assert [r["content"] for r in requests] == [r["content"] for r in script["requests"]]
    assert [r["uid"] for r in requests] == \
        [e.args["uid"] for e in events if e.name == "http_request"]


def test_the_committed_trace_draws_one_arrow_per_message():
    trace = json.loads((ASSETS / "trace.json").read_text(encoding="utf-8"))["traceEvents"]
    ends = {(e["cat"], e["name"], e["id"]): e for e in trace if e["ph"] == "f"}
    starts = [e for e in trace if e["ph"] == "s"]
    sends = [e for e in trace if e["ph"] == "i" and e["args"].get("dir") == "send"]
    assert len(starts) == len(ends) == len(sends) > 0
    for s in starts:
        f = ends[s["cat"], s["name"], s["id"]]
        assert f["pid"] != s["pid"] and f["ts"] > s["ts"] and f["bp"] == "e"


# ------------------------------------------------------------------------------ the voice


def test_the_committed_narration_is_of_this_script_as_the_voices_are_given_it():
    events, _, script, _, _ = animate.load(ASSETS)
    voice = _voice()
    assert voice["voices"] == [narration.ZH_VOICE, narration.EN_VOICE]
    assert voice["rate"] == narration.RATE
    assert [x["text"] for x in voice["sentences"]] == animate.script_sentences(events, script)
    for x in voice["sentences"]:
        assert x["ssml"] == narration.ssml(x["text"])
        assert not re.search(r"[\u4e00-\u9fff]", x["ssml"])  # every character as pinyin
    assert (ASSETS / "narration.mp3").stat().st_size > 100_000


def test_no_word_of_the_narration_is_read_through_another_languages_fallback():
    """espeak-ng's transcription marks a switch to another language's rules, `(en)`; every
    Mandarin syllable it says ends with `_|`. None of the first, and one of the second for
    each pinyin syllable (so each Chinese character) of the sentence."""
    sentences = _voice()["sentences"]
    assert sum(len(narration.fallbacks(x["phonemes"])) for x in sentences) == 0
    for x in sentences:
        assert narration.syllables(x["phonemes"]) == narration.pinyin_syllables(x["text"]), x
    chars = sum(len(re.findall(r"[\u4e00-\u9fff]", x["text"])) for x in sentences)
    assert sum(narration.pinyin_syllables(x["text"]) for x in sentences) >= chars > 300


def test_the_fallback_count_sees_the_switches_of_the_cmn_voice():
    # `espeak-ng -x -v cmn "请求 0 到达 API Server"`: 请 and 求 spelled in English.
    cmn = "(en)kI55NTr'i:55_| k,I55;@55t'u:55(cmn)_| l'i35N_| (en)deI33@11fo@11_| " \
          "da11tu:11(cmn)_| ,ei53ph,i53'ai51_| (en)s3:11v311(cmn)_|"
    assert len(narration.fallbacks(cmn)) == 3
    assert narration.fallbacks("tS;h'i21N_| tS;h'iou35_| l'i35N_|") == []


def test_numbers_and_latin_terms_are_said_as_a_reader_says_them():
    assert [narration.numeral(n) for n in ("0", "7", "10", "21", "37", "105", "3.5")] == \
        ["零", "七", "十", "二十一", "三十七", "一百零五", "三点五"]
    assert narration.segments("装进 TokenizeMsg 发给 tokenizer。") == \
        [("zh", "zhuang1 jin4"), ("en", "tokenize message"), ("zh", "fa1 gei3"),
         ("en", "tokenizer.")]
    assert narration.segments("分到 uid 0，第 7 行还回去") == \
        [("zh", "fen1 dao4"), ("en", "U I D"), ("zh", "ling2, di4 qi1 hang2 huan2 hui2 qu4")]
    with pytest.raises(ValueError, match="no reading"):
        narration.segments("一个 Foo。")


def test_each_cue_starts_within_0_3_s_of_its_sentences_speech():
    """Against where speech starts in the laid-out narration track (measured by voice from
    the signal), and against where each sentence was placed plus its own leading silence."""
    _, scenes, _, _, _ = animate.load(ASSETS)
    voice = _voice()
    cues = animate.cues(scenes)
    offsets = voice["measured"]["cue_minus_speech_start"]
    assert len(offsets) == len(cues) and max(abs(x) for x in offsets) <= 0.3
    placed = [a for s in scenes for a in s.said]
    for (start, _, _), a, x in zip(cues, placed, voice["sentences"]):
        assert abs(start - (a + x["onset"])) <= 0.3
        assert a + x["seconds"] <= next(s.p1 for s in scenes if a in s.said) + 1e-6


# ------------------------------------------------------------------------------ the player

LABELS = """(() => {
  const svg = document.getElementById('stage'), scrub = document.getElementById('scrub');
  const out = {sizes: [], chips: [], replies: []};
  for (const v of [0, 300, 560, 700, 800, 999]) {
    scrub.value = v; scrub.dispatchEvent(new Event('input'));
    const k = svg.getScreenCTM().a;
    for (const t of svg.querySelectorAll('text')) {
      const cs = getComputedStyle(t);
      if (cs.display === 'none' || !t.textContent.trim()) continue;
      out.sizes.push([parseFloat(cs.fontSize) * k, t.textContent]);
      if (t.classList.contains('chip')) out.chips.push([cs.fill, t.getAttribute('fill')]);
      if (t.classList.contains('reply')) out.replies.push([cs.fill, t.getAttribute('fill')]);
    }
  }
  for (const el of document.querySelectorAll('#controls *, #info *'))
    out.sizes.push([parseFloat(getComputedStyle(el).fontSize), el.id || el.tagName]);
  out.sizes.sort((a, b) => a[0] - b[0]);
  out.sizes = out.sizes.slice(0, 3);
  out.steps = [];
  scrub.value = 0; scrub.dispatchEvent(new Event('input'));
  const step = document.getElementById('step-next');
  const said = () => document.getElementById('event').textContent;
  for (let i = 0; i < 3; i++) { step.click(); out.steps.push(said()); }
  document.getElementById('step-prev').click();
  out.steps.push(said());
  out.link = document.getElementById('chapter').getAttribute('href');
  return out;
})()"""


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _in_chromium(url: str, width: int, expression: str, height: int = 900):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "make test installs chromium (Makefile: browser)"
    with tempfile.TemporaryDirectory() as profile:
        tools = animate._DevTools(chromium, profile)
        try:
            target = tools.call("Target.createTarget", url="about:blank")["targetId"]
            tools.session = tools.call("Target.attachToTarget", targetId=target,
                                       flatten=True)["sessionId"]
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                       deviceScaleFactor=1, mobile=False)
            tools.call("Page.navigate", url=url)
            tools.wait_for("Page.loadEventFired")
            result = tools.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                awaitPromise=True)
            assert "exceptionDetails" not in result, result
            return result["result"]["value"]
        finally:
            tools.close()


@pytest.mark.parametrize("width", [COLUMN_PX, NARROW_PX])
def test_the_player_draws_every_label_at_11_px_or_more_in_its_colours(width):
    got = _in_chromium((ASSETS / "index.html").as_uri(), width, LABELS)
    assert got["sizes"][0][0] >= 11, got["sizes"]
    # A uid's digit stays white on its coloured square; a reply keeps its request's colour.
    assert got["chips"] and all(fill == _rgb(want) for fill, want in got["chips"])
    assert got["replies"] and all(fill == _rgb(want) for fill, want in got["replies"])
    # Stepping walks the trace's events one at a time, and back.
    numbers = [int(re.match(r"事件 (\d+)/", s).group(1)) for s in got["steps"]]
    assert numbers[:3] == sorted(set(numbers[:3])) and numbers[3] < numbers[2]
    assert re.fullmatch(r"\.\./\.\./ch\d\d_\w+/index\.html", got["link"])


def test_the_videos_subtitles_load_in_a_page_opened_from_disk(tmp_path: Path):
    page = tmp_path / "page.html"
    page.write_text(f'<meta charset="utf-8">{(ASSETS / "video.html").read_text()}',
                    encoding="utf-8")
    count = _in_chromium(page.as_uri(), 800, """new Promise((done) => {
      const t = document.querySelector('video').textTracks[0]; t.mode = 'hidden';
      const wait = (n) => t.cues && t.cues.length ? done(t.cues.length)
        : n ? setTimeout(() => wait(n - 1), 100) : done(0);
      wait(50);
    })""")
    _, scenes, _, _, _ = animate.load(ASSETS)
    assert count == len(animate.cues(scenes))
