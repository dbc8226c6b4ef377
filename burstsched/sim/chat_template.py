"""Rendering chat messages into the prompt text the engine tokenizes, as vLLM does.

The renderer is shared with the router's precise prefix mode and lives in
:mod:`burstsched.tokenization.chat_template`; this module keeps the simulator's names for it. The built-in
template is ChatML.
"""

from burstsched.tokenization.chat_template import CHATML_TEMPLATE, ChatTemplate
from burstsched.tokenization.errors import TemplateError

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "TemplateError"]
