"""A session on the embedded model whose history buries one exact value in log noise."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from agent_gravity import ChatGravity, GravityConfig

NOISE = "\n".join(f"[INFO] worker-{i} heartbeat ok" for i in range(12))
HISTORY = [SystemMessage("Answer with the exact value."), HumanMessage("Read the log."), AIMessage("Reading."),
           HumanMessage(f"LOG:\n{NOISE}\n[WARN] deploy code is K7Q2X9\n{NOISE}"), AIMessage("Noted.")]
QUESTION = HumanMessage("What is the deploy code?")


def chat_on(backend) -> ChatGravity:
    return ChatGravity(backend=backend, gravity=GravityConfig(enabled=False, reasoning=None), max_tokens=8)


@pytest.fixture
def session(transformers_backend, request):
    sid = f"trim-{request.node.name}"
    chat_on(transformers_backend).invoke(HISTORY, conversation_id=sid)
    yield sid
    transformers_backend.sessions.pop(sid, None)
