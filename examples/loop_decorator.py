"""A hand-written agent loop under @gravity_loop: it stops once the steps converge and says why.

Run: python examples/loop_decorator.py
"""

from langchain_core.messages import HumanMessage, SystemMessage

from agent_gravity import AgentLoop, ChatGravity, gravity_loop
from agent_gravity.bench.agent_tasks import SYSTEM_PROMPT, calculator, lookup

TOOLS = {t.name: t for t in (lookup, calculator)}
model = ChatGravity().bind_tools(list(TOOLS.values()), tool_choice="any")


@gravity_loop(max_steps=6)
def solve(question: str, loop: AgentLoop) -> str | None:
    messages = [SystemMessage(SYSTEM_PROMPT), HumanMessage(question)]
    for _ in loop:  # ends by itself once the steps converge, or after max_steps
        reply = loop.step(model.invoke(messages))
        if not reply.tool_calls:
            return reply.text
        messages += [reply, *(loop.call_tool(TOOLS[c["name"]], c) for c in reply.tool_calls)]
    return None  # converged: the loop's best answer is the result


def main() -> None:
    result = solve("How many apples are in stock, times 3?")
    print(f"answer={result.answer!r} reason={result.reason} steps={result.steps} "
          f"steps_saved={result.steps_saved} ({result.detail})")


if __name__ == "__main__":
    main()
