"""Tokenizing prompts in the router process from the model's own tokenizer files, as vLLM does.

Chat requests are rendered with the model's chat template (:class:`ChatTemplate`) and the text encoded
without special tokens unless the request asks for them; completion prompts are encoded with special
tokens unless the request says otherwise; token ids pass through. Results are cached (:class:`PromptCache`).

Encoding a long prompt takes long enough to stall the event loop (measured
on the tiny model's byte-level BPE: ~2.6 ms for 5000 tokens, about 0.25 us a character), so a prompt whose
hashed request is at least ``thread_min_bytes`` (about 1 ms of encoding) is rendered and encoded in a worker
thread, with ``encode_batch``, which releases the GIL (``encode`` holds it); small ones are done inline,
where a thread hop would cost more than the work.

What can still differ from vLLM: a ``transformers`` tokenizer class that rewrites ``tokenizer.json``'s
normalizer or pre-tokenizer when it loads (check against the replica's ``/tokenize``, or use
:class:`RemotePromptTokenizer`), a server started with its own ``--chat-template``, and a processor's chat
template (multimodal models).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread

from burstsched.framework import ApiKind
from burstsched.tokenization.cache import PromptCache
from burstsched.tokenization.chat_template import ChatTemplate
from burstsched.tokenization.errors import TokenizationError
from burstsched.tokenization.files import load_encoder, read_tokenizer_files
from burstsched.tokenization.prompt_request import ChatPrompt, Prompt, parse_prompt, prompt_key

DEFAULT_CACHE_ENTRIES = 8192
DEFAULT_THREAD_MIN_BYTES = 4096


class LocalPromptTokenizer:
    """A :class:`PromptTokenizer` reading a tokenizer folder (or a ``tokenizer.json``) at ``path``."""

    def __init__(
        self,
        path: str | Path,
        *,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        thread_min_bytes: int = DEFAULT_THREAD_MIN_BYTES,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        """Raises :class:`TokenizationError` when the files are missing or malformed."""
        self.files = read_tokenizer_files(path)
        self._encoder = load_encoder(self.files)
        special = self.files.special_tokens
        self._templates: dict[bool, ChatTemplate | None] = {}
        for tools in (False, True):
            source = self.files.chat_template_for(tools=tools)
            self._templates[tools] = ChatTemplate(source, special, now=now) if source is not None else None
        self.cache = PromptCache(cache_entries)
        self.thread_min_bytes = thread_min_bytes

    async def prompt_token_ids(self, api: ApiKind, payload: Mapping[str, Any]) -> tuple[int, ...]:
        """The ids vLLM computes for ``payload``'s prompt; raises :class:`TokenizationError`."""
        prompt = parse_prompt(api, payload)
        if not isinstance(prompt, ChatPrompt) and prompt.token_ids is not None:
            return prompt.token_ids
        key, size = prompt_key(prompt)

        async def compute() -> tuple[int, ...]:
            if size >= self.thread_min_bytes:
                return await anyio.to_thread.run_sync(self._encode_releasing_gil, prompt)
            return self.encode_prompt(prompt)

        return await self.cache.get_or_compute(key, compute)

    def encode_prompt(self, prompt: Prompt) -> tuple[int, ...]:
        """The ids of ``prompt``, computed now (no cache, blocking)."""
        return self._encode(prompt, release_gil=False)

    def _encode_releasing_gil(self, prompt: Prompt) -> tuple[int, ...]:
        return self._encode(prompt, release_gil=True)

    def _encode(self, prompt: Prompt, *, release_gil: bool) -> tuple[int, ...]:
        if isinstance(prompt, ChatPrompt):
            template = self._templates[prompt.tools is not None]
            if template is None:
                raise TokenizationError(f"no chat template in {self.files.tokenizer_json.parent}")
            text = template.render(
                prompt.messages,
                add_generation_prompt=prompt.add_generation_prompt,
                continue_final_message=prompt.continue_final_message,
                tools=prompt.tools,
                documents=prompt.documents,
                extra=prompt.template_kwargs,
            )
        elif prompt.text is not None:
            text = prompt.text
        else:
            return prompt.token_ids or ()
        special = prompt.add_special_tokens
        if release_gil:  # encode_batch releases the GIL (encode holds it): the event loop keeps running
            ids: list[int] = self._encoder.encode_batch([text], add_special_tokens=special)[0].ids
        else:
            ids = self._encoder.encode(text, add_special_tokens=special).ids
        return tuple(ids)
