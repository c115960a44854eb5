"""The server's own OpenAPI description, fuzzed with schemathesis against a
real `ferry serve` on the demo model: no input may produce a server error, and
every response must match the description.

All of schemathesis's checks run but one: `positive_data_acceptance`. The API
refuses some requests that the schema allows, with a 400 as OpenAI does: a
prompt longer than the context, more tokens than this server's --max-tokens,
tools or response_format for a model whose chat format has neither."""
from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from app.server.app import openapi_document
from tests.server.conftest import start_ferry_serve

#: The whole fuzzing run stays under five minutes (each answer is at most 2 tokens; generating the Anthropic
#: endpoints' nested bodies takes schemathesis most of it: about 3.5 minutes for all six on a loaded machine).
BUDGET_SECONDS = 300
_clock: list[float] = []
_statuses: list[int] = []

schema = schemathesis.openapi.from_dict(openapi_document())
#: Each operation is its own test, by its label: schemathesis's own parametrize gives its items one node id,
#: and pytest-xdist (scripts/test.sh) then ran one of the six operations and dropped the others.
OPERATIONS = {op.label: op for op in (result.ok() for result in schema.get_all_operations())}


@pytest.fixture(scope="module")
def fuzz_server(demo_container, tmp_path_factory):
    s = start_ferry_serve(demo_container, tmp_path_factory.mktemp("fuzz"), "--max-tokens", "2", "--ctx", "256")
    _clock.append(time.monotonic())
    yield s
    s.stop()


def test_the_served_description_is_this_one(fuzz_server):
    import httpx

    served = httpx.get(fuzz_server.url.removesuffix("/v1") + "/openapi.json").json()
    assert served == openapi_document() | {"paths": served["paths"]}
    assert set(served["paths"]) == {"/v1/models", "/v1/models/{model}", "/ferry/status", "/v1/chat/completions",
                                    "/v1/messages", "/v1/messages/count_tokens"}


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_no_input_breaks_the_server(label, fuzz_server):
    # valid requests and invalid ones (wrong types, missing or unknown fields...), the same cases every run
    op = OPERATIONS[label]
    cases = st.one_of(op.as_strategy(schemathesis.GenerationMode.POSITIVE),
                      op.as_strategy(schemathesis.GenerationMode.NEGATIVE))

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    @given(case=cases)
    def check(case):
        assert time.monotonic() - _clock[0] < BUDGET_SECONDS, "the fuzzing run went over its time budget"
        valid = case.meta is None or case.meta.generation.mode == schemathesis.GenerationMode.POSITIVE
        # (a model named in the path stays as drawn: those are the requests for an unknown model, a 404)
        if valid and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = fuzz_server.model      # so that valid requests reach the engine
        response = case.call(base_url=fuzz_server.url.removesuffix("/v1"), timeout=30)
        # A 413 (the body is over the server's size limit) rejects a request as surely as a 400, but
        # schemathesis does not count it as rejecting schema-violating data.
        excluded = [positive_data_acceptance] + ([negative_data_rejection] if response.status_code == 413 else [])
        case.validate_response(response, excluded_checks=excluded)
        _statuses.append(response.status_code)

    check()


def test_the_fuzzer_reached_the_engine():
    from collections import Counter

    # Valid requests that the engine answered, and invalid ones refused both ways. The counts depend
    # on which files ran before in the same worker (schemathesis's strategies are not independent of
    # them): the whole suite gives 9 answers of 122 requests every run since session 16's file order,
    # this file alone more; five answers still show the engine was reached through every layer.
    assert _statuses.count(200) >= 5 and 400 in _statuses and 404 in _statuses, Counter(_statuses)
