"""Compose your own gravity policy, compare it with the default, and see every decision's reason.

Run: python examples/policies.py
"""

from agent_gravity import ChatGravity, GravityConfig, ProbeConfig

QUESTION = "If a shirt costs 20 dollars and is 25% off, what is the price?"

CONFIGS = {
    "default (probe-confirmed)": GravityConfig(),
    # A change point in entropy, confirmed within 6 tokens by a low EWMA; no probes, no loop stop.
    "cusum + ewma, no probes": GravityConfig(
        policy={"name": "all_of", "within": 6, "policies": [{"name": "cusum"}, {"name": "ewma", "threshold": 1.0}]},
        probe=None, loop=None),
    # Dynasor-CoT's schedule: probe every 32 tokens, exit when 3 answers agree.
    "periodic probes only": GravityConfig(policy=None, loop=None, probe=ProbeConfig(interval=32, agree=3, gap=32)),
}


def main() -> None:
    llm = ChatGravity()
    for name, config in CONFIGS.items():
        msg = llm.invoke(QUESTION, gravity=config)
        g = msg.response_metadata["gravity"]
        print(f"{name}: answer={msg.content!r} reasoning={g['reasoning_tokens']} probes={g['probes']} "
              f"reason={g['reason']}")
        if g["terminated_early"]:
            print(f"  why: {g['detail']}")


if __name__ == "__main__":
    main()
