"""Text layer (host code): tokenizers, chat templates, token-in/token-out chat rendering with
per-message token spans, and parsing of generated assistant text into tool calls.

    from jaxagent.text import load_tokenizer, ChatRenderer, parse_assistant

Modules: ``spans`` (MessageSpan, RenderedChat: the data rollout consumes), ``chat`` (ChatRenderer
and its guarantees), ``anchoring`` (locating each message in the template's output),
``thinking`` (Qwen3's thinking views), ``template``, ``tokenizer``, ``toolcalls``.
"""

from jaxagent.text.chat import ChatRenderer
from jaxagent.text.spans import ROLES, THINKING_MODES, ChatInputError, MessageSpan, PrefixBreak, RenderedChat
from jaxagent.text.template import ChatTemplateError, compile_template, render_template, template_variables
from jaxagent.text.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from jaxagent.text.toolcalls import (
    ParsedAssistant,
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_assistant,
    tool_call_from_dict,
)

__all__ = [
    "ROLES", "THINKING_MODES", "ChatInputError", "ChatRenderer", "ChatTemplateError", "MessageSpan",
    "ParsedAssistant", "PrefixBreak", "RenderedChat", "Tokenizer", "TokenizerError", "ToolCall", "ToolCallError",
    "compile_template", "format_tool_call", "load_tokenizer", "parse_assistant", "render_template",
    "template_variables", "tool_call_from_dict",
]
