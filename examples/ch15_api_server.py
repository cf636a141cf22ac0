"""第 15 章示例：起一个 OpenAI 兼容的服务，用官方 openai 客户端流式地问一个问题，再用 Ctrl-C（SIGINT）关掉它。"""

import re
import signal
import subprocess
import sys

import openai

# --port 0：让系统挑一个空闲端口，免得和正在运行的别的服务撞上（默认端口是 1919）
server = subprocess.Popen(
    [sys.executable, "-m", "minisgl", "--model", "models/SmolLM2-135M-Instruct",
     "--port", "0", "--max-seq-len", "1024"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
for line in server.stdout:  # 模型加载完、uvicorn 开始监听，才会打印 "ready" 这一行，里面有地址
    print("[服务]", line.rstrip())
    if ready := re.search(r"ready, .* at (http://\S+) ", line):
        break
else:
    sys.exit(f"服务没能启动，退出码 {server.wait()}")

try:
    client = openai.OpenAI(base_url=ready.group(1), api_key="none")  # 服务不检查密钥
    stream = client.chat.completions.create(
        model="SmolLM2", temperature=0, max_tokens=48, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    print("回答：", end="")
    for chunk in stream:
        if chunk.choices:  # 一块一块地到达；第一块只有 role，没有文字
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        else:  # 最后一块没有 choices，只有 usage
            print(f"\n用量：提示词 {chunk.usage.prompt_tokens} 个 token，"
                  f"回答 {chunk.usage.completion_tokens} 个")
finally:
    server.send_signal(signal.SIGINT)  # 和在终端里按 Ctrl-C 一样
    print("[服务]", server.communicate(timeout=30)[0].strip())
    print("退出码", server.returncode)
