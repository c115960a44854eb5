"""What an online expert cache can reach from expert ids alone (issue 17).

    python bench/cache_bounds.py [--trace FILE] --json

Every figure here is a reference computed in Python, not an engine policy.
They all use one replacement rule, the engine's own `p/d` rule with a given
predictor: at each layer visit the cache evicts the unpinned resident key
with the lowest p/d, where p is the predicted chance that the key's layer
requests it at that layer's next visit and d is the number of layer visits
until then (ties: fewer requests so far first). Same cache model as the C
simulator: one pool for all layers, a layer's set requested and pinned
together, every miss inserted, no bypass.

Sections of the JSON:
  noisy_oracle  p = the predicted set of the next visit of every layer is the
                true set with each id replaced, with probability 1 - a, by a
                random expert outside the true set ("a predictor of accuracy
                a": a of the 8 ids right on average); the probabilities are
                calibrated (a inside the predicted set, 8(1-a)/56 outside).
                a = 1 is the one-token oracle of bench/cache_policy.py.
                Mean of 3 seeds.
  predictors    real predictors of the next visit's set from ids, their
                precision@8 (the fraction of the true set among the
                predictor's 8 most likely experts, scored at each visit) and
                the hit rate the p/d rule reaches with them:
                  frequency_fit: each expert's share of its layer's requests
                    over the WHOLE trace (fitted on the evaluated tokens)
                  markov_online: the same-layer successor table learned from
                    earlier visits only (what the engine's transit learns)
                  markov_fit: the same table counted over the WHOLE trace
                    (the exact first-order statistics: a cheating bound)
                  ridge_fit_l<lambda>: a linear model per layer from the
                    latest set of EVERY layer (1,024 bits; all 16 layers of
                    routing history) to the layer's next set, least squares
                    with an L2 penalty, fitted on the WHOLE trace; it sees
                    the visits just before the predicted one even when the
                    decision was taken earlier, so it is optimistic twice
                  ridge_cross_l<lambda>: the same model fitted on the OTHER
                    half only (an offline-trained predictor, no cheating)
                  lookahead_exact: markov_online, except that the very next
                    layer's set is known exactly (a perfect next-layer
                    lookahead router): the resident experts of that layer it
                    does NOT choose are scored for the layer's visit after,
                    one token later
  The halves are tokens 0-148 (tune) and 149-298 (held out), each replayed
  cold on its own, and the whole trace.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRACE = Path("/work/shared/data/traces/olmoe-1b-7b_299tok.jsonl")
SLOTS = (32, 61, 96, 128, 256)
ACCURACIES = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
LAMBDAS = (1.0, 10.0, 100.0)
SEEDS = 3


def sets_of(trace: np.ndarray) -> np.ndarray:
    """bool [visits, experts]: visit v = token * layers + layer requested e."""
    n_tok, n_layers, _ = trace.shape
    experts = int(trace.max()) + 1
    out = np.zeros((n_tok * n_layers, experts), dtype=bool)
    rows = np.repeat(np.arange(n_tok * n_layers), trace.shape[2])
    out[rows, trace.reshape(-1)] = True
    return out


def replay(trace: np.ndarray, slots: int, prob: np.ndarray, experts: int,
           lookahead: bool = False) -> float:
    """Hit rate of the p/d rule. prob[v, e] is the predicted chance that
    visit v requests expert e (rows past the end: 0). It is read only for
    the next visit of each layer, i.e. one token ahead at most. lookahead:
    the very next visit's set is known exactly (a perfect next-layer router):
    the layer's experts it does not choose are scored for the visit after,
    n_layers visits further."""
    n_tok, n_layers, _ = trace.shape
    n_visits = n_tok * n_layers
    n_keys = n_layers * experts
    resident = np.zeros(n_keys, dtype=bool)
    counts = np.zeros(n_keys, dtype=np.int64)
    key_layer = np.arange(n_keys) // experts
    key_expert = np.arange(n_keys) % experts
    padded = np.vstack([prob, np.zeros((2 * n_layers, experts))])
    exact = np.vstack([sets_of(trace), np.zeros((n_layers, experts), dtype=bool)])
    hits = 0
    n_res = 0
    for v in range(n_visits):
        t, layer = divmod(v, n_layers)
        keys = layer * experts + trace[t, layer]
        counts[keys] += 1
        hit = resident[keys]
        hits += int(hit.sum())
        missing = keys[~hit]
        over = n_res + len(missing) - slots
        if over > 0:
            ahead = (key_layer - layer - 1) % n_layers + 1  # 1..n_layers
            if lookahead:  # the next layer's unchosen experts wait a token more
                ahead = np.where((ahead == 1) & ~exact[v + 1, key_expert], ahead + n_layers, ahead)
            score = padded[np.minimum(v + ahead, len(padded) - 1), key_expert] / ahead
            cand = np.flatnonzero(resident)
            cand = cand[key_layer[cand] != layer]  # the open set is pinned
            order = np.lexsort((cand, counts[cand], score[cand]))
            resident[cand[order[:over]]] = False
            n_res -= over
        resident[missing] = True
        n_res += len(missing)
    return hits / (n_visits * trace.shape[2])


def noisy_prob(sets: np.ndarray, accuracy: float, rng) -> np.ndarray:
    n_visits, experts = sets.shape
    k = int(sets[0].sum())
    pred = np.zeros_like(sets)
    for v in range(n_visits):
        true = np.flatnonzero(sets[v])
        keep = rng.random(k) < accuracy
        outside = np.flatnonzero(~sets[v])
        pred[v, true[keep]] = True
        pred[v, rng.choice(outside, int((~keep).sum()), replace=False)] = True
    outside_p = k * (1.0 - accuracy) / (experts - k)
    return np.where(pred, accuracy, outside_p)


def frequency_prob(sets: np.ndarray, n_layers: int) -> np.ndarray:
    share = sets.reshape(-1, n_layers, sets.shape[1]).mean(axis=0)
    return np.tile(share, (sets.shape[0] // n_layers, 1))


def markov_prob(sets: np.ndarray, n_layers: int, online: bool) -> np.ndarray:
    """Mean over `from` in the layer's previous set of P(to | from), the
    counts taken from earlier visits only (online) or the whole trace."""
    n_visits, experts = sets.shape
    s = sets.reshape(-1, n_layers, experts).astype(np.float64)
    prob = np.zeros((n_visits, experts))
    for layer in range(n_layers):
        x = s[:-1, layer]  # previous visit of the layer
        y = s[1:, layer]
        if online:
            succ = np.zeros((experts, experts))
            fromv = np.zeros(experts)
            for t in range(len(x)):
                est = (x[t] @ ((succ + 0.1) / (fromv[:, None] + 1.0))) / x[t].sum()
                prob[(t + 1) * n_layers + layer] = est
                succ += np.outer(x[t], y[t])
                fromv += x[t]
        else:
            succ = x.T @ y
            fromv = x.sum(axis=0)
            est = (x @ ((succ + 0.1) / (fromv[:, None] + 1.0))) / x.sum(axis=1, keepdims=True)
            prob[n_layers + layer::n_layers] = est
    return prob


def latest_features(sets: np.ndarray, n_layers: int) -> np.ndarray:
    """[visits, n_layers * experts]: for visit v, the latest set of every
    layer among the visits before v (zeros where a layer had none)."""
    n_visits, experts = sets.shape
    x = np.zeros((n_visits, n_layers * experts))
    cur = np.zeros(n_layers * experts)
    for v in range(n_visits):
        x[v] = cur
        layer = v % n_layers
        cur[layer * experts:(layer + 1) * experts] = sets[v]
    return x


def ridge_prob(sets: np.ndarray, n_layers: int, lam: float, fit_rows: np.ndarray) -> np.ndarray:
    """Per target layer, least squares (with an intercept) from the latest
    sets of every layer to the visit's set, fitted on the visits fit_rows
    (bool per visit); predictions for every visit, clipped to [0, 1]."""
    x = latest_features(sets, n_layers)
    x = np.hstack([x, np.ones((len(x), 1))])
    y = sets.astype(np.float64)
    prob = np.zeros_like(y)
    penalty = lam * np.eye(x.shape[1])
    penalty[-1, -1] = 0.0
    for layer in range(n_layers):
        rows = np.arange(layer, len(x), n_layers)
        fit = rows[fit_rows[rows] & (rows >= n_layers)]
        w = np.linalg.solve(x[fit].T @ x[fit] + penalty, x[fit].T @ y[fit])
        prob[rows] = np.clip(x[rows] @ w, 0.0, 1.0)
    return prob


def precision_at_k(prob: np.ndarray, sets: np.ndarray, rows: np.ndarray) -> float:
    k = int(sets[0].sum())
    top = np.argsort(-prob[rows], axis=1, kind="stable")[:, :k]
    return float(np.take_along_axis(sets[rows], top, axis=1).mean())


def opt_rate(trace: np.ndarray, slots: int) -> float:
    sys.path.insert(0, str(REPO))
    from bench.cache_policy import horizon_hit_rate

    return horizon_hit_rate(trace, slots, None)


def bounds(trace: np.ndarray, slots_list=SLOTS, accuracies=ACCURACIES, seeds=SEEDS) -> dict:
    n_tok, n_layers, _ = trace.shape
    experts = int(trace.max()) + 1
    half = n_tok // 2
    sets = sets_of(trace)
    parts = {"tune": (0, half), "held_out": (half, n_tok), "whole": (0, n_tok)}
    out = {}
    for label, (a, b) in parts.items():
        part = trace[a:b]
        psets = sets_of(part)
        rows_part = np.zeros(len(sets), dtype=bool)
        rows_part[a * n_layers:b * n_layers] = True
        preds = {
            "frequency_fit": frequency_prob(psets, n_layers),
            "markov_online": markov_prob(psets, n_layers, online=True),
            "markov_fit": markov_prob(psets, n_layers, online=False),
        }
        for lam in LAMBDAS:
            # fitted on the whole trace, or on the other half only
            fit_all = np.ones(len(sets), dtype=bool)
            preds[f"ridge_fit_l{lam:g}"] = ridge_prob(sets, n_layers, lam, fit_all)[rows_part]
            if label != "whole":
                preds[f"ridge_cross_l{lam:g}"] = ridge_prob(sets, n_layers, lam, ~rows_part)[rows_part]
        scored = np.arange(n_layers, len(psets))  # visits with a previous token
        row = {"tokens": [a, b - 1], "slots": {}}
        row["precision_at_8"] = {n: round(precision_at_k(p, psets, scored), 3) for n, p in preds.items()}
        for slots in slots_list:
            opt = opt_rate(part, slots)
            cell = {"opt": round(opt, 4)}
            for acc in accuracies:
                rates = [replay(part, slots, noisy_prob(psets, acc, np.random.default_rng(s)), experts)
                         for s in range(seeds)]
                r = float(np.mean(rates))
                cell[f"noisy_{acc:g}"] = {"hit_rate": round(r, 4), "ratio_to_opt": round(r / opt, 3)}
            for name, p in preds.items():
                r = replay(part, slots, p, experts)
                cell[name] = {"hit_rate": round(r, 4), "ratio_to_opt": round(r / opt, 3)}
            r = replay(part, slots, preds["markov_online"], experts, lookahead=True)
            cell["lookahead_exact"] = {"hit_rate": round(r, 4), "ratio_to_opt": round(r / opt, 3)}
            row["slots"][str(slots)] = cell
        out[label] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from app.engine import cachesim

    trace = cachesim.load_trace(a.trace)
    result = {
        "machine": platform.machine(),
        "date": datetime.date.today().isoformat(),
        "command": "python bench/cache_bounds.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "trace": str(a.trace),
        "bounds": bounds(trace),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
