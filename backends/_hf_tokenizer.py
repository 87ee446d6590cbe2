"""The tokenizer half of a Backend, shared by every engine that loads a Hugging Face tokenizer."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_gravity._errors import ModelNotFoundError


def check_model_dir(model_dir: str) -> None:
    """Raise ModelNotFoundError unless ``model_dir`` is a local model folder."""
    if not Path(model_dir, "config.json").is_file():
        raise ModelNotFoundError(
            f"model folder {model_dir!r} does not exist or has no config.json; "
            "give a local Hugging Face model folder, or omit the model to use the embedded default")


class HFTokenizerMethods:
    """``render``, ``encode``, ``decode`` and ``token_texts`` over ``self._tokenizer``."""

    _tokenizer: Any

    def render(self, messages: Sequence[dict[str, str]], prefill: str = "") -> list[int]:
        text = self._tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return self._tokenizer.encode(text + prefill, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        return [self.decode([i]) for i in range(len(self._tokenizer))]

    def single_token_id(self, text: str) -> int | None:
        """The id of ``text`` when the vocabulary holds it as one token."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None
