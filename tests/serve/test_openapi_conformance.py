"""Schemathesis fuzzes the proxy from its own OpenAPI description: documented statuses and schemas, no 500s."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from agent_gravity import ChatGravity
from agent_gravity.serve import create_app
from tests.serve._scripted_backend import ScriptedBackend

# The scripted backend answers at once, so the fuzzing exercises the HTTP layer and ChatGravity's option
# handling, not the model's speed.
APP = create_app(ChatGravity(backend=ScriptedBackend()), api_key="fuzz")
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
CHECKS = (not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance)


@SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_conforms_to_its_openapi_description(case):
    case.call_and_validate(headers={"Authorization": "Bearer fuzz"}, checks=CHECKS)
