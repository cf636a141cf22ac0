"""minisgl: a small LLM inference engine, rebuilt chapter by chapter in 《手写 mini-sglang》."""
