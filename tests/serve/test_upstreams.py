"""The proxy in front of vLLM servers: a bounded load test over two with the plugin, a client that leaves, and an
upstream that is down."""

from __future__ import annotations

import time

import httpx
import pytest

from agent_gravity import ChatGravity, RouteConfig
from agent_gravity._cli import _tiers, main
from agent_gravity.bench.serve import load_test, serving
from agent_gravity.bench.vllm_servers import free_port, metric
from agent_gravity.serve import CLIENT_SETTINGS, create_app

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def proxied(vllm_servers):
    """The proxy on loopback, spreading requests over both plugin servers; yields its /v1 URL."""
    model = ChatGravity(base_url=[vllm_servers["plugin"], vllm_servers["plugin_b"]])
    with serving(create_app(model, client_settings=CLIENT_SETTINGS | {"reasoning"})) as url:  # load_test turns it off
        yield url + "/v1", model


def test_64_concurrent_streams_lose_no_request_and_mix_up_no_trace(proxied):
    url, model = proxied
    report = load_test(url, MODEL, streams=64, requests=64)
    print({k: report[k] for k in ("completed", "lost", "mixed_up", "ran_to_length", "seconds", "tokens_per_s",
                                  "first_token_s", "total_s")})
    assert report["completed"] == 64 and report["lost"] == 0 and report["errors"] == []
    assert report["mixed_up"] == 0
    assert report["ran_to_length"] >= 32  # most requests check their trace against their own token count
    assert all(u.sent >= 16 for u in model.get_backend().upstreams)  # both servers carried the load
    assert 0 < report["first_token_s"]["p50"] <= report["total_s"]["p50"] <= report["total_s"]["p99"]


def test_a_client_that_leaves_mid_stream_stops_the_generation_on_the_upstream(vllm_servers):
    upstream = vllm_servers["plain"]
    body = {"messages": [{"role": "user", "content": "Count from 1 to 1000, one number per line."}],
            "stream": True, "max_completion_tokens": 2000, "gravity": {"enabled": False, "reasoning": None}}
    with serving(create_app(ChatGravity(base_url=upstream), client_settings=CLIENT_SETTINGS | {"reasoning"})) as url:
        before = metric(upstream, "vllm:generation_tokens_total")
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert response.status_code == 200 and next(lines).startswith("data:")
        time.sleep(1.0)  # the proxy cancels the call; vLLM notices the closed connection on its next write
        generated = metric(upstream, "vllm:generation_tokens_total")
        time.sleep(1.5)
        assert metric(upstream, "vllm:generation_tokens_total") == generated < before + 2000
        assert metric(upstream, "vllm:num_requests_running") == 0


def test_the_proxy_refuses_to_start_when_its_upstream_is_down(capsys):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["serve", "--upstream", dead, "--port", str(free_port())]) == 2
    assert f"no server answered: {dead} (ConnectError" in capsys.readouterr().err


def test_the_proxy_refuses_a_public_address_without_a_key(capsys):
    assert main(["serve", "--host", "0.0.0.0", "--upstream", "http://127.0.0.1:1/v1"]) == 2
    assert "without an API key" in capsys.readouterr().err


def test_an_api_key_comes_from_the_environment_never_the_command_line(capsys, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    assert main(["serve", "--api-key-env", "NO_SUCH_KEY"]) == 2
    assert "NO_SUCH_KEY is not set" in capsys.readouterr().err


def test_the_proxy_runs_a_cascade_over_upstream_tiers(vllm_servers):
    tiers = _tiers([f"cheap={vllm_servers['plain']}", f"full={vllm_servers['plugin']}"], None)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 3?"}],
            "max_completion_tokens": 48}
    for above, answered in ((0.0, "full"), (64.0, "cheap")):
        model = ChatGravity(tiers=tiers, route=RouteConfig(escalate_above=above, escalate_unsettled=False))
        with serving(create_app(model)) as url:
            reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        route = reply["gravity"]["route"]
        assert route["tier"] == answered and reply["choices"][0]["message"]["content"]
        assert [t["tier"] for t in route["tried"]] == (["cheap"] if answered == "full" else [])


def test_upstream_tiers_are_parsed_cheapest_first_and_bad_ones_refused(capsys):
    tiers = _tiers(["cheap=http://a/v1", "full=http://b/v1", "cheap=http://c/v1"], None)
    assert [(t.name, t.base_url) for t in tiers] == [("cheap", ["http://a/v1", "http://c/v1"]), ("full", ["http://b/v1"])]
    assert main(["serve", "--upstream-tier", "cheap=http://a/v1"]) == 2
    assert "at least two tiers" in capsys.readouterr().err
    assert main(["serve", "--upstream-tier", "http://a/v1", "--upstream-tier", "b=http://b/v1"]) == 2
    assert "takes NAME=URL" in capsys.readouterr().err
    assert main(["serve", "--upstream", "http://a/v1", "--upstream-tier", "a=http://a/v1",
                 "--upstream-tier", "b=http://b/v1"]) == 2
    assert "not both" in capsys.readouterr().err
