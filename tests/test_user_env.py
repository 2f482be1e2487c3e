"""LLMUserEnv against a real loopback simulator server."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jaxagent.envs.base import AgentMessage
from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
from jaxagent.envs.user_env import EMPTY_AGENT_TURN, LLMUserEnv


def _server(replies):
    seen = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            content = replies[min(len(seen) - 1, len(replies) - 1)]
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_user_env_round_trip_labels_stop_and_empty_turns():
    srv, seen = _server(['{"utterance": "at noon", "strategy": "provide_info"}',
                         '{"utterance": "###STOP###", "strategy": "accept"}'])
    tasks = {"t": {"profile": {"instructions": "fly at noon"}, "opening": "book a flight"}}

    async def main():
        async with LLMUserClient(LLMUserConfig(base_url=f"http://127.0.0.1:{srv.server_address[1]}", model="m")) as c:
            env = LLMUserEnv(c, tasks, max_user_turns=5)
            reset = await env.reset("t", 0)
            s1 = await env.step(AgentMessage("when ?"))
            s2 = await env.step(AgentMessage(""))
            with pytest.raises(KeyError, match="task_id='nope'"):
                await env.reset("nope", 0)
            return reset, s1, s2

    reset, s1, s2 = asyncio.run(main())
    srv.shutdown()
    assert [m.role for m in reset.messages] == ["system", "user"]
    assert s1.messages[0].content == "at noon" and s1.messages[0].reaction == "provide_info" and not s1.done
    assert s2.done
    shown = [m["content"] for m in seen[1]["messages"] if m["role"] == "user"]
    assert EMPTY_AGENT_TURN in shown  # the empty agent turn reached the simulator as a marker
