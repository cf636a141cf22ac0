"""The voice of chapter 0's animation: each subtitle sentence as espeak-ng speaks it.

espeak-ng's Mandarin voice `cmn` reads a Chinese character it has no rule for through its
English fallback, spelling the pinyin ("ye four"). So the narration is not given to it as
Chinese: every Han character becomes a pinyin syllable with its tone (pypinyin), read by the
`cmn-latn-pinyin` voice, which takes pinyin as its input; numbers are written out as Chinese
numerals first; and each Latin term (TokenizeMsg, KV, uid ...) is said the way an engineer
says it, by the English voice, in a span of its own. A sentence is one SSML document whose
spans name their voice explicitly (a span that only says `xml:lang` leaves the voice after it
in English).

`phonemes()` is espeak-ng's own transcription (`-x`) of that document. In it a word the voice
read through another language's fallback is marked with a switch such as `(en)`; every
Mandarin syllable ends with `_|`. `fallbacks()` counts the first, `syllables()` the second:
a narration is intelligible when there are no switches and every pinyin syllable came out as
one Mandarin syllable.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ZH_VOICE = "cmn-latn-pinyin"
EN_VOICE = "en-us"
RATE = 175  # words per minute; for the pinyin voice a word is a syllable

# Latin terms of the script -> what the English voice says (longest match first). Letters
# that are spelled are written apart; a message type is read as its two words.
LEXICON = {
    "API Server": "A P I server",
    "TokenizeMsg": "tokenize message",
    "DetokenizeMsg": "detokenize message",
    "UserMsg": "user message",
    "UserReply": "user reply",
    "AbortMsg": "abort message",
    "SmolLM2": "smol L M 2",
    "max_tokens": "max tokens",
    "--trace": "dash dash trace",
    "tokenizer": "tokenizer",
    "Perfetto": "perfetto",
    "prefill": "pre-fill",
    "decode": "decode",
    "batch": "batch",
    "token": "token",
    "trace": "trace",
    "CPU": "C P U",
    "EOS": "E O S",
    "SSE": "S S E",
    "KV": "K V",
    "uid": "U I D",
}

DIGITS = "零一二三四五六七八九"
NUMERALS = DIGITS + "十百千点"
PAUSES = {"，": ",", "、": ",", "：": ",", "；": ",", "。": ".", "！": ".", "？": "?"}


def numeral(number: str) -> str:
    """An Arabic number as a Chinese reader says it: 37 -> 三十七, 3.5 -> 三点五."""
    whole, _, frac = number.partition(".")
    n = int(whole)
    if n >= 10000:
        raise ValueError(f"{number}: the narration says numbers below 10000")
    if n == 0:
        said = "零"
    else:
        said, gap = "", False
        for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
            d = n // value % 10
            if d:
                said += ("零" if gap and said else "") + DIGITS[d] + unit
                gap = False
            else:
                gap = True
        if said.startswith("一十"):
            said = said[1:]
    return said + ("点" + "".join(DIGITS[int(c)] for c in frac) if frac else "")


def _pinyin(han: str) -> list[str]:
    """Pinyin with tone numbers, one syllable per character, with the readings pypinyin's
    word list gets wrong here: 行 of a table row (第七行, and a clause that starts with it)
    is hang2, 还 of giving back is huan2, and 一 changes its tone before another syllable
    (yi2 before a fourth tone, yi4 before the others) unless it counts (第一, 二十一)."""
    from pypinyin import Style, lazy_pinyin

    out = [s.replace("ü", "v") for s in lazy_pinyin(
        han, style=Style.TONE3, neutral_tone_with_five=True, tone_sandhi=True)]
    for i, ch in enumerate(han):
        before = han[i - 1] if i else ""
        if ch == "一" and before == "第":
            out[i] = "yi1"
        elif ch == "行" and (i == 0 or before in NUMERALS):
            out[i] = "hang2"
        elif ch == "还" and han[i + 1:i + 2] in ("回", "给"):
            out[i] = "huan2"
        elif ch == "一" and out[i] == "yi1" and i + 1 < len(han) and before not in "第" + \
                NUMERALS and han[i + 1] not in NUMERALS:
            out[i] = "yi2" if out[i + 1].endswith("4") else "yi4"
    return out


_TOKEN = re.compile("|".join([*(re.escape(t) for t in sorted(LEXICON, key=len, reverse=True)),
                              r"\d+(?:\.\d+)?", r"[\u4e00-\u9fff]+", r"[，、：；。！？]",
                              r"\s+", r"."]))


def segments(sentence: str) -> list[tuple[str, str]]:
    """The sentence as spans for the voices: ("zh", pinyin) and ("en", words), in order."""
    spans: list[tuple[str, str]] = []

    def add(voice: str, text: str) -> None:
        if spans and spans[-1][0] == voice:
            spans[-1] = (voice, f"{spans[-1][1]} {text}")
        else:
            spans.append((voice, text))

    han = ""
    for m in _TOKEN.finditer(sentence):
        token = m.group(0)
        if re.fullmatch(r"[\u4e00-\u9fff]+|\d+(?:\.\d+)?", token):
            han += numeral(token) if token[0].isdigit() else token
            continue
        if han:
            add("zh", " ".join(_pinyin(han)))
            han = ""
        if token in LEXICON:
            add("en", LEXICON[token])
        elif token in PAUSES:
            if spans:
                spans[-1] = (spans[-1][0], spans[-1][1] + PAUSES[token])
        elif token.isspace():
            continue
        else:
            raise ValueError(f"{sentence!r}: {token!r} has no reading; add it to LEXICON")
    if han:
        add("zh", " ".join(_pinyin(han)))
    return spans


def ssml(sentence: str) -> str:
    voices = {"zh": ZH_VOICE, "en": EN_VOICE}
    body = "".join(f'<voice name="{voices[v]}">{text}</voice>' for v, text in segments(sentence))
    return f"<speak>{body}</speak>"


def speak(document: str, wav: Path) -> None:
    subprocess.run(["espeak-ng", "-m", "-s", str(RATE), "-w", str(wav), document], check=True)


def phonemes(document: str) -> str:
    """espeak-ng's phoneme transcription of an SSML document, one clause a line."""
    out = subprocess.run(["espeak-ng", "-m", "-q", "-x", "-s", str(RATE), document],
                         capture_output=True, text=True, check=True).stdout
    return "\n".join(line.strip() for line in out.splitlines() if line.strip())


def fallbacks(transcription: str) -> list[str]:
    """The switches away from Mandarin in a transcription: each starts a run of words read
    through another language's rules, e.g. "(en)fa55w'055n" for "fa1" spelled in English
    ("(cmn)" marks the way back and is not counted)."""
    return re.findall(r"\((?!cmn\))[a-z]{2,3}(?:-[a-z]+)?\)[^\s(]*", transcription)


def syllables(transcription: str) -> int:
    """Mandarin syllables in a transcription (the pinyin voice ends each with `_|`)."""
    return transcription.count("_|")


def pinyin_syllables(sentence: str) -> int:
    return sum(len(text.replace(",", " ").replace(".", " ").replace("?", " ").split())
               for voice, text in segments(sentence) if voice == "zh")
