"""Hides the agent-gravity vLLM plugin from every Python process started with this folder on PYTHONPATH.

vLLM loads every ``vllm.logits_processors`` entry point installed, in its API server and in each engine and
worker process it starts. A server started with this folder first on ``PYTHONPATH`` is vLLM without our
plugin: the baseline ``agent-gravity bench serve`` measures the plugin's overhead against.
"""

import importlib.metadata

_entry_points = importlib.metadata.entry_points


def _without_gravity(**params):
    found = _entry_points(**params)
    if params.get("group") != "vllm.logits_processors":
        return found
    return importlib.metadata.EntryPoints(e for e in found if not e.value.startswith("agent_gravity."))


importlib.metadata.entry_points = _without_gravity
