from __future__ import annotations

from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from minisgl.core import SamplingParams, fit_max_tokens
from minisgl.scheduler import Scheduler, SchedulerConfig


class LLM:
    """Offline generation: give it all the prompts, get all the completions back.

        llm = LLM("models/SmolLM2-135M-Instruct", max_running_req=8)
        llm.generate(["The capital of France is"], SamplingParams(max_tokens=16))
        # -> [{"text": " Paris. ...", "token_ids": [7042, 30, ...]}]

    Keyword arguments are SchedulerConfig's (and so EngineConfig's) fields.
    """

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        self.scheduler: Scheduler | None = Scheduler(
            SchedulerConfig(model_path=model_path, dtype=dtype, **kwargs))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._next_uid = 0

    def generate(self, prompts: list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams],
                 progress: bool | None = None) -> list[dict[str, Any]]:
        """Completions in prompt order. The last token is left out of token_ids when it is the
        EOS that ended the request. A progress bar shows for more than 16 prompts unless
        `progress` says otherwise."""
        scheduler = self.scheduler
        if scheduler is None:
            raise RuntimeError("this LLM has been shut down")
        params = (sampling_params if isinstance(sampling_params, list)
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        token_ids = [self.tokenizer(p).input_ids if isinstance(p, str) else list(p)
                     for p in prompts]
        for ids, p in zip(token_ids, params):  # reject bad input before queueing anything
            fit_max_tokens(len(ids), p.max_tokens, scheduler.engine.max_seq_len)

        uids = list(range(self._next_uid, self._next_uid + len(prompts)))
        self._next_uid += len(prompts)
        outputs: dict[int, list[int]] = {uid: [] for uid in uids}
        params_of = dict(zip(uids, params))
        for uid, ids, p in zip(uids, token_ids, params):
            scheduler.add_request(uid, ids, p)
        show = len(prompts) > 16 if progress is None else progress
        with tqdm(total=len(prompts), desc="generate", unit="req", disable=not show) as bar:
            while scheduler.has_work:
                for result in scheduler.step():
                    ended_by_eos = (result.finished and result.token in scheduler.eos_token_ids
                                    and not params_of[result.uid].ignore_eos)
                    if not ended_by_eos:
                        outputs[result.uid].append(result.token)
                    bar.update(result.finished)
        return [{"text": self.tokenizer.decode(outputs[uid]), "token_ids": outputs[uid]}
                for uid in uids]

    def shutdown(self) -> None:
        """Release the model and the KV pool: close the engine (it uninstalls the process-global
        Context, which points at its attention backend) and drop the scheduler."""
        if self.scheduler is not None:
            self.scheduler.engine.close()
        self.scheduler = None
