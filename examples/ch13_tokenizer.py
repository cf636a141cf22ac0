"""第 13 章示例：对话模板展开成什么样，一段中文怎样一个 token 一个 token 地变回文字，停止串怎样截断。"""

from transformers import AutoTokenizer

from minisgl.tokenizer import IncrementalDetokenizer, StopMatcher, TokenizeManager

tokenizer = AutoTokenizer.from_pretrained("models/SmolLM2-135M-Instruct")

# 对话先经过模型自带的模板变成一段文字，再分词；模板已经写好了特殊 token，分词时不再添加
chat = [{"role": "user", "content": "用一句话介绍大海。"}]
print("模板展开后：")
print(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
ids = TokenizeManager(tokenizer).tokenize(chat)
print(f"共 {len(ids)} 个 token，最后 5 个：{ids[-5:].tolist()}")

# 增量反解码：一个汉字常被拆成两三个字节 token，凑齐之前什么也不吐
text = "海水是咸的，🐟也是。"
detok = IncrementalDetokenizer(tokenizer)
pieces = []
for token in tokenizer(text).input_ids:
    piece = detok.add(token)
    pieces.append(piece)
    print(f"  token {token:>5}  单独解码 {tokenizer.decode([token])!r:8} 吐出 {piece!r}")
pieces.append(detok.finish())
print("拼起来：", "".join(pieces), "｜与原文相同：", "".join(pieces) == text)

# 停止串：流式片段里一旦出现 "，"，它和它之后的都不要；可能是停止串开头的尾巴先扣住
matcher = StopMatcher(["，"])
kept = "".join(matcher.feed(p) for p in pieces) + matcher.flush()
print(f"遇到停止串 '，' 截断后：{kept!r}（stopped={matcher.stopped}）")
matcher = StopMatcher(["</answer>"])
print("片段 'Paris</ans' 先吐出：", repr(matcher.feed("Paris</ans")), "，扣住的尾巴：", repr(matcher.held))
print("流结束时 flush 放出：", repr(matcher.flush()))
