"""第 13 章：Tokenizer 进程。

一、对话模板：我们的 TokenizeManager 把一段对话变成的 id，与 transformers 的 apply_chat_template 完全相同。
二、增量反解码：一个 token 一个 token 地吐出文字，拼起来等于一次性解码全部 token——
    中文、emoji 这种一个字符跨几个 token 的也一样；随机 token 序列（最刁钻的情况）也一样。
三、停止字符串：流式文本被切在停止串第一次出现之前，即使停止串横跨两个片段。
四、真的进程：起一个 tokenizer 进程（--num-tokenizer 0 的形态：既分词又反解码），
    经 ZMQ 发 TokenizeMsg 收 UserMsg、发 DetokenizeMsg 收 UserReply，结果与进程内相同。
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import (DetokenizeMsg, ExitMsg, TokenizeMsg, UserMsg, UserReply, decode,
                             encode, unbatch)
from minisgl.tokenizer import IncrementalDetokenizer, StopMatcher, TokenizeManager
from minisgl.utils.process import Children
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id

MODEL = Path("models/SmolLM2-135M-Instruct")  # from the repository root or a built tree
CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]
TEXTS = ["你好，世界！", "emoji 🙂🚀 与 café", "日本語のテキスト😀"]


def stream(tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    return [detok.add(i) for i in ids] + [detok.finish()]


def check(label: str, ok: bool) -> bool:
    print(f"  {label}: {'一致' if ok else '不一致'}")
    return ok


def main() -> int:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    full = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ok = True

    print("一、对话模板")
    ours = TokenizeManager(tokenizer).tokenize(CHAT).tolist()
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    hf = tokenizer(text, add_special_tokens=False).input_ids
    print(f"  模板展开后：{text!r}")
    ok &= check(f"{len(ours)} 个 id 与 transformers", ours == hf)

    print("二、增量反解码（拼起来 == 一次性解码）")
    ids = tokenizer(TEXTS[0]).input_ids
    pieces = stream(tokenizer, ids)
    print("  逐个 token：" + "  ".join(f"{i}->{tokenizer.decode([i])!r}" for i in ids))
    print(f"  逐步吐出：{pieces}")
    for t in TEXTS:
        ids = tokenizer(t).input_ids
        ok &= check(f"{t!r}（{len(ids)} 个 token）", "".join(stream(tokenizer, ids)) == full(ids))
    rng = torch.Generator().manual_seed(0)
    random_ids = torch.randint(0, len(tokenizer), (2000,), generator=rng).tolist()
    ok &= check("2000 个随机 token", "".join(stream(tokenizer, random_ids)) == full(random_ids))
    llm = LLM(str(MODEL), max_running_req=1, num_page_override=256, max_seq_len_override=256)
    answer = llm.generate([ours], SamplingParams(max_tokens=40))[0]
    llm.shutdown()
    answer_pieces = stream(tokenizer, answer["token_ids"])
    print(f"  模型的回答：{full(answer['token_ids'])!r}")
    ok &= check(f"模型回答的 {len(answer['token_ids'])} 个 token",
                "".join(answer_pieces) == full(answer["token_ids"]))

    print("三、停止字符串")
    answer_text = full(answer["token_ids"])
    stop = answer_text[len(answer_text) // 2 : len(answer_text) // 2 + 5]
    matcher = StopMatcher([stop])
    cut = "".join(matcher.feed(p) for p in answer_pieces) + matcher.flush()
    print(f"  停止串 {stop!r}：{cut!r}")
    ok &= check("在停止串之前截断", matcher.stopped and cut == answer_text[: answer_text.find(stop)])

    print("四、tokenizer 进程")
    run_id = new_run_id()
    inbox, scheduler, frontend = (ipc_address(run_id, n) for n in ("tokenizer", "scheduler",
                                                                   "frontend"))
    to_tokenizer = PushQueue(inbox, bind=False, encode=encode)
    from_tokenizer = PullQueue(scheduler, bind=True, decode=decode)
    replies = PullQueue(frontend, bind=True, decode=decode)
    children = Children(run_id)
    process = children.start("minisgl.tokenizer.worker:run_tokenizer", "tokenizer",
                             model_path=str(MODEL), inbox=inbox, bind_inbox=True,
                             scheduler=scheduler, frontend=frontend)
    try:
        children.wait_ready(timeout=120)
        to_tokenizer.put(TokenizeMsg(uid=1, prompt=CHAT, sampling_params=SamplingParams()))
        user = from_tokenizer.get(timeout_ms=30_000)
        ok &= check(f"收到 {type(user).__name__}，id 与进程内相同",
                    isinstance(user, UserMsg) and user.input_ids.tolist() == ours)
        tokens = answer["token_ids"]
        for n, token in enumerate(tokens):
            to_tokenizer.put(DetokenizeMsg(uid=1, next_token=token, finished=n == len(tokens) - 1))
        got: list[UserReply] = []
        while not (got and got[-1].finished):
            got += unbatch(replies.get(timeout_ms=30_000))
        ok &= check(f"{len(got)} 条 UserReply 拼起来等于回答",
                    "".join(r.incremental_output for r in got) == answer_text)
        to_tokenizer.put(TokenizeMsg(uid=2, prompt="", sampling_params=SamplingParams()))
        error = replies.get(timeout_ms=30_000)
        print(f"  空 prompt 的回复：{error}")
        ok &= check("空 prompt 得到错误回复", isinstance(error, UserReply) and bool(error.error))
        to_tokenizer.put(ExitMsg())
        process.join(timeout=30)
        ok &= check(f"收到 ExitMsg 后进程退出（退出码 {process.exitcode}）", process.exitcode == 0)
    finally:
        children.stop()
        for q in (to_tokenizer, from_tokenizer, replies):
            q.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
