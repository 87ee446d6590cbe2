"""The gravity logits processor as a vLLM plugin: any ``vllm serve`` decides gravity exits in-engine.

Installed with agent-gravity under vLLM's ``vllm.logits_processors`` entry-point group, so every vLLM
engine in the environment loads it; ``--logits-processors agent_gravity.backends.vllm_plugin:GravityPlugin``
names it explicitly where entry points are not scanned. Requests opt in with
``vllm_xargs={"agent_gravity": "<SteeringSpec as JSON>"}``; the others pass untouched.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as RunnerV2Processor

from agent_gravity.backends import _steered_rows as steered


class GravityPlugin(RunnerV2Processor):
    """One entry point for both of vLLM's processor interfaces: builds the one the model runner calls for.

    vLLM's V2 model runner (its GPU default) checks plugins against its own base class and builds them from
    ``(vllm_config, req_states)``; the V1 runner (the CPU one) builds them from ``(vllm_config, device,
    is_pin_memory)``. The constructor's arguments tell which runner asked.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 - the class docstring says it
        if len(args) + len(kwargs) == 2:
            from agent_gravity.backends._vllm_processor_v2 import GravityLogitsProcessorV2

            return GravityLogitsProcessorV2(*args, **kwargs)
        from agent_gravity.backends._vllm_processor import GravityLogitsProcessor

        return GravityLogitsProcessor(*args, **kwargs)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse malformed ``agent_gravity`` settings before the request is queued (a 400 over HTTP)."""
        steered.spec_of(sampling_params)
