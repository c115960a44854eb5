"""Budgets are parsed with bounds (a clear error, never an OverflowError) and
checked against the machine's memory; the opt-in routing options are refused
clearly by an engine build without them, and cost nothing when left at their
defaults."""
from __future__ import annotations

import openai
import pytest

from app.memory.budget import MachineMemory
from app.chat.turn import Prepared, TurnError, apply_routing, check_routing
from app.cli import main as ferry
from app.cli.common import UsageError, check_budget, parse_size
from app.sampling import SamplingParams

GIB = 1 << 30


def test_sizes_have_bounds():
    assert parse_size("24G") == 24 * GIB and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
    for bad in ("18446744073709551616", "1e30", "99999999E", "lots", "-4G"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_a_budget_above_the_machine_is_refused_with_the_numbers():
    machine = MachineMemory(total=24 * GIB, usable=20 * GIB, source="test")
    with pytest.raises(UsageError, match=r"100 TiB.*24.0 GiB of RAM, 20.0 GiB usable"):
        check_budget(parse_size("100T"), machine)
    assert "20.0 GiB usable" in check_budget(22 * GIB, machine)      # above usable: a warning
    assert check_budget(8 * GIB, machine) is None


@pytest.mark.parametrize("budget", ["18446744073709551616", "100000T"])
def test_the_cli_says_so_before_loading_anything(budget, capsys, tmp_path):
    code = ferry(["run", str(tmp_path / "no-such.ferry"), "hi", "--budget", budget])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ferry: error:") and "Traceback" not in err and "no-such" not in err


class _Session:
    def __init__(self, supported: bool):
        self.calls = []
        if supported:
            self.set_routing = lambda k, m: self.calls.append((k, m))


def _prepared(**kw) -> Prepared:
    return Prepared(prompt=[1], params=SamplingParams(), max_tokens=1, stops=[], dialect="think_tags",
                    channel="response", **kw)


def test_routing_options_are_applied_in_one_place():
    old = _Session(supported=False)
    apply_routing(old, _prepared())                     # defaults: nothing is called, nothing refused
    with pytest.raises(TurnError, match="does not support experts_per_token"):
        check_routing(old, _prepared(experts_per_token=4))
    with pytest.raises(TurnError, match="does not support cache_aware_margin"):
        apply_routing(old, _prepared(cache_aware_margin=0.5))
    new = _Session(supported=True)
    apply_routing(new, _prepared())
    assert new.calls == []
    apply_routing(new, _prepared(experts_per_token=4, cache_aware_margin=0.5))
    apply_routing(new, _prepared(experts_per_token=4, cache_aware_margin=0.5))   # unchanged: not again
    apply_routing(new, _prepared())                                               # put back to the model's own
    assert new.calls == [(4, 0.5), (None, 0.0)]


@pytest.mark.parametrize("extra, param", [({"experts_per_token": 2}, "experts_per_token"),
                                          ({"cache_aware_margin": 0.5}, "cache_aware_margin")])
def test_the_server_refuses_routing_on_a_dense_model(demo_container, extra, param):
    """Routing options are for mixture-of-experts models: on a dense one a
    clear 400 naming the field (found by the schema fuzzer as a 500)."""
    from app.model import LoadedModel
    from app.server import Server

    model = LoadedModel(demo_container, threads=2, n_ctx=512)
    server = Server(model, model.new_session(512), host="127.0.0.1", port=0).start()
    try:
        c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=2, extra_body=extra)
        assert info.value.body["param"] == param and "no experts to route" in info.value.body["message"]
        ok = c.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")   # the server goes on serving
    finally:
        server.stop()
        model.close()


def test_routing_bounds_come_from_the_model():
    from types import SimpleNamespace

    from app.chat.turn import TurnError, check_routing

    session = SimpleNamespace(set_routing=lambda k, m: None,
                              engine=SimpleNamespace(info=SimpleNamespace(n_experts=8, top_k=2)))
    check_routing(session, _prepared(experts_per_token=1, cache_aware_margin=0.1))
    for bad, param in (({"experts_per_token": 3}, "experts_per_token"), ({"experts_per_token": 0}, "experts_per_token"),
                       ({"cache_aware_margin": -1.0}, "cache_aware_margin"),
                       ({"cache_aware_margin": float("nan")}, "cache_aware_margin")):
        with pytest.raises(TurnError) as info:
            check_routing(session, _prepared(**bad))
        assert info.value.param == param


def test_one_byte_formatter():
    from app.units import size

    assert [size(n) for n in (0, 1023, 1536, 23.4 * 2**20, 118 * GIB, 2 * 2**40)] == \
        ["0 bytes", "1023 bytes", "1.50 KiB", "23.4 MiB", "118 GiB", "2.00 TiB"]
