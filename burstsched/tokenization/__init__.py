"""Prompt tokenization exactly as vLLM does it, for the router's precise prefix mode and the simulator.

The router turns a request body into the engine's token ids with a :class:`PromptTokenizer`: a
:class:`LocalPromptTokenizer` (the model's tokenizer files and chat template, in process) or a
:class:`RemotePromptTokenizer` (a replica's ``POST /tokenize``), both cached; :func:`build_prompt_tokenizer`
picks one from the ``tokenizer:`` configuration. The simulator shares :class:`ChatTemplate` and the file
reading. Anything that cannot be exact raises :class:`TokenizationError`.
"""

from burstsched.tokenization.cache import PromptCache
from burstsched.tokenization.chat_template import CHATML_TEMPLATE, ChatTemplate, normalize_tools
from burstsched.tokenization.content_format import ContentFormat, detect_content_format
from burstsched.tokenization.errors import TemplateError, TokenizationError
from burstsched.tokenization.factory import build_prompt_tokenizer
from burstsched.tokenization.files import TokenizerFiles, load_encoder, read_tokenizer_files
from burstsched.tokenization.local import LocalPromptTokenizer
from burstsched.tokenization.prompt_request import (
    ChatPrompt,
    CompletionPrompt,
    Prompt,
    parse_prompt,
    prompt_key,
)
from burstsched.tokenization.prompt_tokenizer import PromptTokenizer
from burstsched.tokenization.remote import RemotePromptTokenizer, tokenize_body

__all__ = [
    "CHATML_TEMPLATE",
    "ChatPrompt",
    "ChatTemplate",
    "CompletionPrompt",
    "ContentFormat",
    "LocalPromptTokenizer",
    "Prompt",
    "PromptCache",
    "PromptTokenizer",
    "RemotePromptTokenizer",
    "TemplateError",
    "TokenizationError",
    "TokenizerFiles",
    "build_prompt_tokenizer",
    "detect_content_format",
    "load_encoder",
    "normalize_tools",
    "parse_prompt",
    "prompt_key",
    "read_tokenizer_files",
    "tokenize_body",
]
