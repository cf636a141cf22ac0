from __future__ import annotations

from transformers import AutoTokenizer

from minisgl.message import (DetokenizeMsg, ExitMsg, Message, TokenizeMsg, UserMsg, UserReply,
                             batched, decode, encode, unbatch)
from minisgl.utils.process import Reporter
from minisgl.utils.zmq_queue import PullQueue, PushQueue

from .detokenize import DetokenizeManager
from .tokenize import TokenizeManager

MAX_DRAIN = 256  # messages handled together at most: one send each way for all of them


class TokenizerWorker:
    """What a tokenizer process does with the messages it receives:

    - TokenizeMsg (from the API server): the prompt becomes ids, sent to the scheduler as a
      UserMsg; a prompt that cannot be tokenized is answered at once with an error reply;
    - DetokenizeMsg (from the scheduler): a new token becomes text for the API server;
    - anything else (an abort) is passed on to the scheduler.
    """

    def __init__(self, model_path: str) -> None:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenize = TokenizeManager(tokenizer)
        self.detokenize = DetokenizeManager(tokenizer)

    def handle(self, messages: list[Message]) -> tuple[list[Message], list[Message]]:
        """(to the scheduler, to the API server), each in the order the messages came."""
        to_scheduler: list[Message] = []
        to_frontend: list[Message] = []
        for msg in messages:
            if isinstance(msg, TokenizeMsg):
                try:
                    ids = self.tokenize.tokenize(msg.prompt)
                except Exception as e:  # an empty prompt, a chat its template rejects: not fatal
                    to_frontend.append(UserReply(msg.uid, "", finished=True, error=str(e)))
                    continue
                to_scheduler.append(UserMsg(msg.uid, ids, msg.sampling_params))
            elif isinstance(msg, DetokenizeMsg):
                to_frontend.append(self.detokenize.detokenize(msg))
            else:
                to_scheduler.append(msg)
        return to_scheduler, to_frontend


def run_tokenizer(*, model_path: str, inbox: str, bind_inbox: bool, scheduler: str,
                  frontend: str, status: Reporter) -> None:
    """A tokenizer process: receive, handle, send, until an ExitMsg arrives.

    With --num-tokenizer 0 there is one such process and it both tokenizes and detokenizes.
    Otherwise each tokenizer has an inbox of its own (so all messages of a request go through
    the same one, in order) and one more process only detokenizes.
    """
    worker = TokenizerWorker(model_path)
    receive = PullQueue(inbox, bind=bind_inbox, decode=decode)
    to_scheduler = PushQueue(scheduler, bind=False, encode=encode)
    to_frontend = PushQueue(frontend, bind=False, encode=encode)
    status.ready()
    while True:
        messages = unbatch(receive.get())
        while len(messages) < MAX_DRAIN and (more := receive.get(timeout_ms=0)) is not None:
            messages += unbatch(more)
        if any(isinstance(m, ExitMsg) for m in messages):
            receive.close()  # the socket file goes too, if this process bound it
            return
        for_scheduler, for_frontend = worker.handle(messages)
        if for_scheduler:
            to_scheduler.put(batched(for_scheduler))
        if for_frontend:
            to_frontend.put(batched(for_frontend))
