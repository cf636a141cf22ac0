from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoTokenizer

from minisgl.core import SamplingParams, fit_max_tokens
from minisgl.message import DetokenizeMsg, ExitMsg, UserMsg, batched, decode, encode, unbatch
from minisgl.models import check_tensor_parallel
from minisgl.scheduler import Scheduler, SchedulerConfig, TokenOutput
from minisgl.scheduler.io import SchedulerAddresses, start_schedulers
from minisgl.utils.process import Children, rendezvous_address
from minisgl.utils.zmq_queue import PullQueue, PushQueue, ipc_address, new_run_id


Request = tuple[int, list[int], SamplingParams]  # uid, prompt ids, sampling


class InProcess:
    """TP = 1: the scheduler runs right here, stepped by generate()."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.scheduler = Scheduler(config)
        self.max_seq_len = self.scheduler.engine.max_seq_len

    def add(self, requests: list[Request]) -> None:
        for uid, ids, params in requests:
            self.scheduler.add_request(uid, ids, params)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def tokens(self) -> list[TokenOutput]:
        return self.scheduler.step()

    def shutdown(self) -> None:
        # Frees the KV pool (the global Context points at it), and a process group (NCCL at
        # world size 1) that would stop the next LLM from forming its own.
        self.scheduler.engine.close()


@dataclass
class RankProcesses:
    """TP > 1: one scheduler process per rank, as the server runs them; we are their tokenizer
    and detokenizer, talking to rank 0 over ZMQ."""

    children: Children
    to_rank0: PushQueue
    from_rank0: PullQueue
    max_seq_len: int
    pending: int = 0

    @classmethod
    def start(cls, config: SchedulerConfig) -> RankProcesses:
        run_id = new_run_id()
        addresses = SchedulerAddresses(*(ipc_address(run_id, name) for name in (
            "scheduler", "results", "broadcast", "acks")), rendezvous_address(run_id))
        from_rank0 = PullQueue(addresses.reply, bind=True, decode=decode)
        children = Children(run_id)
        try:
            start_schedulers(children, config, addresses)
            infos = children.wait_ready()
        except BaseException:
            children.stop()
            from_rank0.close()
            raise
        to_rank0 = PushQueue(addresses.inbox, bind=False, encode=encode)
        return cls(children, to_rank0, from_rank0, infos["scheduler-rank0"]["max_seq_len"])

    def add(self, requests: list[Request]) -> None:
        # One message: rank 0 takes them all into the same step, as the in-process scheduler
        # does, so batches (and with them the order of random draws) do not depend on timing.
        self.to_rank0.put(batched([UserMsg(uid, torch.tensor(ids, dtype=torch.int32), params)
                                   for uid, ids, params in requests]))
        self.pending += len(requests)

    @property
    def has_work(self) -> bool:
        return self.pending > 0

    def tokens(self) -> list[TokenOutput]:
        while (message := self.from_rank0.get(timeout_ms=500)) is None:
            if (exited := self.children.first_exit()) is not None:  # not a hang
                raise RuntimeError(f"{exited}\n{exited.traceback}".rstrip())
        out = []
        for msg in unbatch(message):
            assert isinstance(msg, DetokenizeMsg)
            if msg.error:
                raise RuntimeError(f"request {msg.uid} failed: {msg.error}")
            self.pending -= msg.finished
            out.append(TokenOutput(msg.uid, msg.next_token, msg.finished,
                                   eos=msg.finish_reason == "stop"))
        return out

    def shutdown(self) -> None:
        self.to_rank0.put(ExitMsg())
        for p in self.children.processes:
            p.join(timeout=30)
        self.children.stop()  # only those that did not exit
        self.to_rank0.close()
        self.from_rank0.close()


class LLM:
    """Offline generation: give it all the prompts, get all the completions back.

        llm = LLM("models/SmolLM2-135M-Instruct", max_running_req=8)
        llm.generate(["The capital of France is"], SamplingParams(max_tokens=16))
        # -> [{"text": " Paris. ...", "token_ids": [7042, 30, ...]}]

    Keyword arguments are SchedulerConfig's (and so EngineConfig's) fields; with tp_size=N
    the model runs sharded over N scheduler processes, exactly as the server runs it.
    """

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        config = SchedulerConfig(model_path=model_path, dtype=dtype, **kwargs)
        check_tensor_parallel(model_path, config.tp_size)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.backend: InProcess | RankProcesses | None = (
            InProcess(config) if config.tp_size == 1 else RankProcesses.start(config))
        self._next_uid = 0

    def generate(self, prompts: list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams],
                 progress: bool | None = None) -> list[dict[str, Any]]:
        """Completions in prompt order. The last token is left out of token_ids when it is the
        EOS that ended the request. A progress bar shows for more than 16 prompts unless
        `progress` says otherwise."""
        backend = self.backend
        if backend is None:
            raise RuntimeError("this LLM has been shut down")
        params = (sampling_params if isinstance(sampling_params, list)
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        token_ids = [self.tokenizer(p).input_ids if isinstance(p, str) else list(p)
                     for p in prompts]
        for ids, p in zip(token_ids, params):  # reject bad input before queueing anything
            fit_max_tokens(len(ids), p.max_tokens, backend.max_seq_len)

        uids = list(range(self._next_uid, self._next_uid + len(prompts)))
        self._next_uid += len(prompts)
        outputs: dict[int, list[int]] = {uid: [] for uid in uids}
        backend.add(list(zip(uids, token_ids, params)))
        show = len(prompts) > 16 if progress is None else progress
        with tqdm(total=len(prompts), desc="generate", unit="req", disable=not show) as bar:
            while backend.has_work:
                for t in backend.tokens():
                    if not t.eos:  # the EOS that ended a request is no text
                        outputs[t.uid].append(t.token)
                    bar.update(t.finished)
        return [{"text": self.tokenizer.decode(outputs[uid]), "token_ids": outputs[uid]}
                for uid in uids]

    def shutdown(self) -> None:
        """Release the model and the KV pool (and stop the rank processes, if any)."""
        if self.backend is not None:
            self.backend.shutdown()
        self.backend = None
