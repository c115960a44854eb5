"""Kimi K3, Kimi-Linear and DeepSeek-V3 on the streaming machinery (the one
MoE loop of core_c/src/moe.c): the expert cache, overlapped reads, the
lookahead with the family's own router, and chunked prefill change speed,
never output, in every arithmetic mode (exact on f32 weights; 8-bit
activations asked for by name and the default, which keeps some classes of
the KDA models' products exact, on a q8_0 trunk with q4_0 experts); the opt-in
routing modes (fewer experts per token, cache-aware
routing) read fewer experts and are exact when set to the model's k and a
zero margin."""
from __future__ import annotations

import numpy as np
import pytest

from app.convert.convert import convert
from app.engine.binding import Engine, FerryError
from tests.kimi import tiny_k3, tiny_kimi

pytestmark = pytest.mark.slow

PROMPT, DECODE = 20, 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> f32 container, and (kind, "q8") -> the same checkpoint with a q8_0 trunk and q4_0 experts."""
    root = tmp_path_factory.mktemp("kimi_stream")
    out = {}
    tiny_k3.build(root / "k3")
    for kind in ("deepseek", "kimi_linear"):
        tiny_kimi.build(kind, root / kind)
    for kind in ("k3", "deepseek", "kimi_linear"):
        out[kind] = convert(root / kind, root / f"{kind}.ferry", trunk_format="f32", expert_format="f32")
        out[kind, "q8"] = convert(root / kind, root / f"{kind}-q.ferry", trunk_format="q8_0",
                                    expert_format="q4_0")
        out[kind, "auto"] = out[kind, "q8"]
    for kind in ("k3", "kimi_linear"):  # only the routed experts quantized (the default's rule, test below)
        out[kind, "experts"] = convert(root / kind, root / f"{kind}-e.ferry", trunk_format="f32",
                                       expert_format="q4_0")
    return out


#: The engine's path in each activation mode (ModelInfo.activations): "auto" reports "q8" on the KDA
#: models too, where it runs 8-bit activations on some classes of products only (test below).
RUNS = {"exact": "f32", "q8": "q8", "auto": "q8"}


def tokens_for(kind):
    vocab = tiny_k3.VOCAB if kind == "k3" else tiny_kimi.VOCAB
    return [int(t) for t in np.random.default_rng(7).integers(3, vocab, PROMPT + DECODE)]


def run(container, tokens, *, stepwise_prompt=False, routing=None, **options):
    """Logits of every position (a chunked or token-at-a-time prompt, then
    single steps) and the session's stats."""
    with Engine(container, threads=2, n_ctx=64, **options) as engine:
        s = engine.session(64)
        if routing is not None:
            s.set_routing(*routing)
        if stepwise_prompt:
            out = [s.eval([t])[None] for t in tokens[:PROMPT]]
        else:
            out = [s.eval(tokens[:PROMPT], all_logits=True)]
        out += [s.eval([t])[None] for t in tokens[PROMPT:]]
        return np.concatenate(out), s.stats(), engine.info


@pytest.mark.parametrize("activations", list(RUNS))
@pytest.mark.parametrize("kind", ["k3", "deepseek", "kimi_linear"])
def test_every_mechanism_and_prefill_mode_gives_identical_logits(models, kind, activations):
    tokens = tokens_for(kind)
    container = models[kind] if activations == "exact" else models[kind, activations]
    reference, _, info = run(container, tokens, cache=False, overlap=False, lookahead=False, direct_io=False,
                             activations=activations)
    assert info.activations == RUNS[activations]
    k = info.top_k
    variants = {
        "all on": {},
        "cache of one token's set": {"cache_slots": k},
        "small cache": {"cache_slots": 2 * k},
        "no cache": {"cache": False},
        "no overlap": {"overlap": False},
        "no lookahead": {"lookahead": False},
        "lookahead gate off (every prediction read), small cache": {"lookahead_gate": False, "cache_slots": 2 * k},
        "token-at-a-time prompt": {"stepwise_prompt": True},
        "token-at-a-time prompt, small cache": {"stepwise_prompt": True, "cache_slots": 2 * k},
        "experts per token = k, margin 0": {"routing": (k, 0.0), "cache_slots": 2 * k},
        "routing reset to exact": {"routing": (None, 0.0)},
    }
    for name, opts in variants.items():
        logits, stats, _ = run(container, tokens, activations=activations, **opts)
        assert np.array_equal(logits, reference), f"{kind}, {activations}: {name}"
        assert stats.hits + stats.misses > 0
        assert stats.routed_swaps == 0


@pytest.mark.parametrize("kind", ["k3", "deepseek", "kimi_linear"])
def test_chunked_prefill_reads_each_distinct_expert_once(models, kind):
    tokens = tokens_for(kind)
    _, chunked, info = run(models[kind], tokens[:PROMPT] + tokens[PROMPT:PROMPT], cache=False)
    _, stepwise, _ = run(models[kind], tokens, stepwise_prompt=True, cache=False)
    moe_layers = info.n_moe_layers
    assert chunked.expert_reads <= moe_layers * info.n_experts  # each distinct expert of a layer once
    assert chunked.prompt_tokens == PROMPT
    # token by token every choice is a read (no cache): PROMPT + DECODE tokens x layers x k
    assert stepwise.expert_reads == (PROMPT + DECODE) * moe_layers * info.top_k


def test_k3_near_its_floor_reports_lookahead_and_uses_prefetched_records(models):
    """Under a budget a few records above the floor, decoding runs the next
    layer's DeepSeek router on the current residual: its accuracy is
    reported and its reads are used."""
    tokens = tokens_for("k3")
    with Engine(models["k3"], threads=2, n_ctx=64) as probe:
        plan = probe.plan(64)
    budget = plan.floor_bytes + 4 * plan.record_bytes
    reference, _, _ = run(models["k3"], tokens, cache=False, lookahead=False)
    logits, st, info = run(models["k3"], tokens, ram_budget=budget)
    assert np.array_equal(logits, reference)
    assert info.cache_slots < info.n_moe_layers * info.n_experts
    mode = st.per_mode()
    assert mode["lookahead_accuracy"] is not None and 0 < mode["lookahead_accuracy"] <= 1
    assert st.lookahead_predicted == DECODE * (info.n_moe_layers - 1) * info.top_k
    assert st.prefetch_issued > 0 and st.prefetch_used > 0
    assert mode["bytes_per_token"] > 0 and 0 <= mode["hit_rate"] < 1


@pytest.mark.parametrize("kind", ["k3", "deepseek", "kimi_linear"])
def test_fewer_experts_per_token_read_fewer_experts(models, kind):
    tokens = tokens_for(kind)
    exact, exact_st, info = run(models[kind], tokens, cache=False)
    k = info.top_k
    n = max(1, k // 2)
    logits, st, _ = run(models[kind], tokens, cache=False, routing=(n, 0.0))
    uses = (PROMPT + DECODE) * info.n_moe_layers
    assert st.routed_choices == uses * n and exact_st.routed_choices == uses * k
    assert st.bytes_read < exact_st.bytes_read and st.expert_reads < exact_st.expert_reads
    assert np.isfinite(logits).all() and not np.array_equal(logits, exact)
    # same argmax for most positions on these random models is not promised; the logits stay close in scale
    assert np.abs(logits).max() < 10 * np.abs(exact).max()


@pytest.mark.parametrize("kind", ["k3", "deepseek"])
def test_cache_aware_routing_moves_choices_to_experts_in_ram(models, kind):
    tokens = tokens_for(kind)
    with Engine(models[kind], threads=2, n_ctx=64) as probe:
        k = probe.info.top_k
    _, exact_st, _ = run(models[kind], tokens, cache_slots=2 * k)
    logits, st, _ = run(models[kind], tokens, cache_slots=2 * k, routing=(None, 0.2))
    assert st.routed_swaps > 0
    assert st.routed_choices == exact_st.routed_choices
    assert st.per_mode()["hit_rate"] > exact_st.per_mode()["hit_rate"]
    assert st.misses < exact_st.misses  # (reads also count the lookahead's, so they need not fall)
    assert np.isfinite(logits).all()


def test_routing_settings_are_checked(models, demo_container):
    with Engine(models["deepseek"], threads=1, n_ctx=32) as engine:
        s = engine.session(32)
        k = engine.info.top_k
        for bad in [(0, 0.0), (k + 1, 0.0), (None, -1.0), (None, float("nan"))]:
            with pytest.raises(FerryError):
                s.set_routing(*bad)
        s.set_routing(k, 0.0)
        s.set_routing(1, 0.5)
        s.set_routing(None, 0.0)
    with Engine(demo_container, threads=1, n_ctx=32) as dense:
        s = dense.session(32)
        s.set_routing(None, 0.0)  # exact routing: accepted by every model
        with pytest.raises(FerryError, match="no experts"):
            s.set_routing(2, 0.0)


@pytest.mark.parametrize("key", ["model_max_length", None])
def test_convert_takes_the_context_length_a_kimi_linear_config_states(tmp_path, key):
    """The Kimi-Linear release states its context as model_max_length only; a
    config that states no length gets the documented default."""
    import json

    from app.convert.arch import DEFAULT_CONTEXT

    ckpt = tmp_path / "ckpt"
    tiny_kimi.build("kimi_linear", ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["max_position_embeddings"]
    if key:
        cfg[key] = 1048576
    (ckpt / "config.json").write_text(json.dumps(cfg))
    out = convert(ckpt, tmp_path / "kl.ferry", trunk_format="f32", expert_format="f32")
    with Engine(out, threads=1, n_ctx=32) as engine:
        assert engine.info.max_ctx == (1048576 if key else DEFAULT_CONTEXT)
        assert np.isfinite(engine.session(32).eval([5, 6, 7])).all()


@pytest.mark.parametrize("kind", ["k3", "kimi_linear", "deepseek"])
def test_the_default_runs_8_bit_activations_on_the_measured_classes(models, kind):
    """"auto" runs every product of the quantized DeepSeek-V3 (MLA only) on 8-bit activations, as "q8"
    does; on K3 and Kimi-Linear only the classes whose measured distance from exact stayed far below the
    weights' own (core_c/src/arch_kimi.c, KIMI_LINEAR_AUTO_Q8 / K3_AUTO_Q8): so it differs from both
    "exact" and "q8" there, and the routed experts take them on Kimi-Linear but stay exact on K3."""
    tokens = tokens_for(kind)
    runs = {m: run(models[kind, "q8"], tokens, activations=m) for m in ("auto", "q8", "exact")}
    assert runs["auto"][2].activations == "q8"
    if kind == "deepseek":
        assert np.array_equal(runs["auto"][0], runs["q8"][0])
        return
    assert not np.array_equal(runs["auto"][0], runs["q8"][0])
    assert not np.array_equal(runs["auto"][0], runs["exact"][0])
    experts = {m: run(models[kind, "experts"], tokens, activations=m)[0] for m in ("auto", "q8", "exact")}
    assert not np.array_equal(experts["q8"], experts["exact"])
    assert np.array_equal(experts["auto"], experts["q8" if kind == "kimi_linear" else "exact"])


@pytest.mark.parametrize("mode", list(RUNS))
def test_a_kimi_linear_follow_up_resumes_from_the_kept_state(models, mode):
    """Kimi-Linear's KDA layers cannot rewind either: the second turn of a conversation resumes from the
    state the first kept (issue 38's follow-up), with the answer a fresh engine gives, bit for bit, in
    the exact and the 8-bit paths."""
    from app.api import EngineService, LoadedModel, SamplingParams, TurnRequest, collect

    model = LoadedModel(models["kimi_linear"] if mode == "exact" else models["kimi_linear", "q8"])
    service, fresh = EngineService(model, model.new_session(256)), EngineService(model, model.new_session(256))
    try:
        assert model.recurrent

        def ask(engine, messages):
            return collect(engine.submit(TurnRequest(messages, max_tokens=4, top_logprobs=2,
                                                     sampling=SamplingParams(temperature=0.0))))
        first = [{"role": "user", "content": "Tell me about boats " * 4}]
        one = ask(service, first)
        follow = [*first, {"role": "assistant", "content": one.content}, {"role": "user", "content": "And ships?"}]
        two, want = ask(service, follow), ask(fresh, follow)
        assert two.reused_tokens >= one.prompt_tokens - 8 > 0 and want.reused_tokens == 0
        assert two.token_ids == want.token_ids and two.logprobs == want.logprobs
    finally:
        service.close()
        fresh.close()
        model.close()
