from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # for annotations only: importing transformers takes a second
    from transformers import PreTrainedTokenizerBase

Chat = list[dict[str, str]]


class TokenizeManager:
    """Text in, token ids out. A chat (a list of {role, content}) goes through the model's chat
    template first, with the assistant's turn opened so the model answers."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, prompt: str | Chat) -> torch.Tensor:
        """The prompt's ids as a 1-D int32 tensor. Raises ValueError for an empty prompt or a
        chat on a tokenizer without a chat template."""
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt).input_ids
        else:
            if not self.tokenizer.chat_template:
                raise ValueError("this model's tokenizer has no chat template: "
                                 "send plain text to /v1/completions instead")
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True,
                                                      tokenize=False)
            # The template already wrote the special tokens: adding BOS again would double it.
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise ValueError("the prompt is empty")
        return torch.tensor(ids, dtype=torch.int32)
