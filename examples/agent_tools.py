"""A create_agent tool agent (calculator and a stock-table lookup) on the embedded model, with and
without GravityMiddleware. Needs the ``agents`` extra: pip install 'agent-gravity[agents]'.

Run: python examples/agent_tools.py
"""

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage

from agent_gravity import ChatGravity, ConvergenceConfig, GravityMiddleware
from agent_gravity.bench.agent_tasks import SYSTEM_PROMPT, FinalAnswer, calculator, lookup

QUESTION = "How many limes are in stock, times 2?"


def build(model: ChatGravity, gravity: bool):
    """The agent; with ``gravity`` it ends as soon as its steps converge."""
    middleware = [GravityMiddleware(ConvergenceConfig(max_steps=6))] if gravity else []
    return create_agent(model, tools=[lookup, calculator], system_prompt=SYSTEM_PROMPT,
                        response_format=ToolStrategy(FinalAnswer),
                        middleware=[*middleware, ModelCallLimitMiddleware(run_limit=6)])


def main() -> None:
    model = ChatGravity()
    for gravity in (False, True):
        state = build(model, gravity).invoke({"messages": [("user", QUESTION)]})
        calls = sum(1 for m in state["messages"] if isinstance(m, AIMessage) and m.usage_metadata)
        tokens = sum(m.usage_metadata["output_tokens"] for m in state["messages"]
                     if isinstance(m, AIMessage) and m.usage_metadata)
        outcome = state.get("gravity") or {}
        answer = state["structured_response"].answer if state.get("structured_response") else outcome.get("answer")
        print(f"{'with' if gravity else 'without'} GravityMiddleware: {calls} model calls, {tokens} tokens, "
              f"answer={answer!r}, why={outcome.get('reason')} {outcome.get('detail') or ''}".rstrip())


if __name__ == "__main__":
    main()
