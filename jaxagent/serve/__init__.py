"""An OpenAI-compatible server for a policy (``python -m jaxagent.launch job=serve``): the wire
format (`protocol`), streamed text split into thinking, content and tool calls (`streaming`), and
the server over the in-flight generation engine (`server`). docs/SERVING.md shows its use."""

from jaxagent.serve.protocol import APIError, ChatRequest, CompletionRequest, Sampling, parse_chat, parse_completion
from jaxagent.serve.server import PolicyServer, ServeSettings, SessionIndex, make_app, serve
from jaxagent.serve.streaming import TextStream, visible

__all__ = ["APIError", "ChatRequest", "CompletionRequest", "PolicyServer", "Sampling", "ServeSettings", "SessionIndex",
           "TextStream", "make_app", "parse_chat", "parse_completion", "serve", "visible"]
