"""Chapter 0's animation: the committed trace, cut into scenes by the committed script, gives
exactly the committed player data and subtitles, with timings that add up. No espeak-ng,
ffmpeg or chromium needed (tools/animate.py video uses them; these checks do not)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

from processes import ROOT

CHAPTER = None  # the book's animation (tools/animate.py), not a chapter: runs only in `make test`

ASSETS = ROOT / "book" / "assets" / "request-life"


def _animate():
    spec = importlib.util.spec_from_file_location("animate", ROOT / "tools" / "animate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["animate"] = module
    spec.loader.exec_module(module)
    return module


animate = _animate()


def test_committed_data_and_subtitles_are_what_the_trace_and_script_give():
    events, scenes, script, requests, recorded_on = animate.load(ASSETS)
    assert (ASSETS / "data.js").read_text(encoding="utf-8") == \
        animate.player_data(events, scenes, script, requests, recorded_on)
    assert (ASSETS / "subtitles.vtt").read_text(encoding="utf-8") == animate.webvtt(scenes)


def test_scenes_follow_the_trace_and_tile_about_two_minutes_of_play():
    events, scenes, _, _, _ = animate.load(ASSETS)
    assert scenes[0].p0 == 0 and 110 <= scenes[-1].p1 <= 130  # about two minutes
    for a, b in zip(scenes, scenes[1:]):
        assert a.p1 == b.p0 and a.t1 == b.t0 and a.t0 <= b.t0
    assert scenes[-1].t1 == max(e.t + e.dur for e in events)


def test_subtitle_cues_cover_each_scene_in_order_and_say_its_narration():
    _, scenes, _, _, _ = animate.load(ASSETS)
    cues = animate.cues(scenes)
    assert cues[0][0] == 0 and cues[-1][1] == round(scenes[-1].p1, 3)
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


def test_a_scene_anchored_before_the_one_ahead_of_it_is_refused():
    events, _, script, _, _ = animate.load(ASSETS)
    broken = json.loads(json.dumps(script))
    broken["scenes"][1], broken["scenes"][2] = broken["scenes"][2], broken["scenes"][1]
    try:
        animate.build_scenes(events, broken)
    except ValueError as e:
        assert "before the scene ahead of it" in str(e)
    else:
        raise AssertionError("scenes out of the trace's order were accepted")


def test_an_anchor_the_trace_lacks_is_named():
    events, _, _, _, _ = animate.load(ASSETS)
    try:
        animate.find(events, {"name": "admit", "uid": 99})
    except ValueError as e:
        assert "admit" in str(e) and "0 such events" in str(e)
    else:
        raise AssertionError("a missing anchor was accepted")


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
