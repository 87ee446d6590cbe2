"""Ask the embedded model a question with gravity on, then off, and show what gravity did.

Run: python examples/quickstart.py
"""

from agent_gravity import ChatGravity, GravityConfig


def main() -> None:
    question = "If a shirt costs 20 dollars and is 25% off, what is the price?"
    for llm in (ChatGravity(), ChatGravity(gravity=GravityConfig(enabled=False))):
        msg = llm.invoke(question)
        gravity = msg.response_metadata["gravity"]
        print(f"gravity {'on ' if gravity['enabled'] else 'off'}: answer={msg.content!r}")
        print(f"  tokens={msg.usage_metadata['output_tokens']} reasoning={gravity['reasoning_tokens']} "
              f"ended early={gravity['terminated_early']} why={gravity['detail'] or gravity['reason']}")


if __name__ == "__main__":
    main()
