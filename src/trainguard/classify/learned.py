"""A learned second opinion for the exits the rules are unsure of (issue 13).

The catalogue decides what it recognises with confidence. Where it is unsure (confidence
under `SURE`), a logistic regression over the words of the log tail and the rules' own
verdict, trained on the development part of the real corpus (tests/corpus_real/), says
whether a retry is likely to help. Its decisions explain themselves: the words that
weighed most, and the known cases nearest to the log. A retry it grants is always
uncertain, so it is spent at most once (R-CLS-2). Pure: no clock, no files but the
shipped model, no network; stdlib only, so it runs on a base install.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from itertools import pairwise
from typing import Any

from trainguard.classify.classes import Classification, ExitKind, FailureClass
from trainguard.classify.logcontext import progress_lines

SURE = 0.7
"""Rules at least this confident are not second-guessed."""

WINDOW = 40
"""Lines of the tail the model reads: the corpus' excerpts are at most ~40 lines."""

RULE_SCALE = 3.0
"""Weight of the rules' verdict among the word features (which are L2-normalised)."""

DOUBT = 0.2
"""A sure stop of the rules (one of DOUBTABLE) that the model gives at least this chance
that a retry helps is not proof (the model is trained class-balanced: 0.2 is far from its
0.5 mark). Chosen on the development part's cross-validation: false stops 7.4% to 5.6%."""

DOUBTABLE = frozenset(
    {
        "cuda-oom",
        "port-in-use",
        "launcher-config",
        "local-service-down",
        "remote-permanent",
        "account-quota",
        "cuda-build-mismatch",
        "missing-input",
    }
)
"""Sure stops that read the job's surroundings (memory another process may hold, a port
another job has, hosts not up yet, a refusing service, a mount that went away): the model
may doubt these. Never a bug of the job's code, a bad configuration or data, or a cause a
person must fix (a full disk): a bug is never retried."""

MIN_TERMS = 10
"""Known terms a log needs before the model reads it: a bare exit says nothing to it."""

MODEL_FILE = "learned_model.json"
_WORD = re.compile(r"[A-Za-z_][A-Za-z_]+")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Known:
    """A case the model was trained on, kept to show as a nearest neighbour."""

    id: str
    url: str
    retryable: bool
    category: str
    terms: dict[str, float]  # its strongest weighted terms, for the similarity


@dataclass(frozen=True)
class Opinion:
    probability: float  # that a retry helps
    rules: float  # the push (log-odds) of the rules' own verdict
    prior: float  # the push of the bias: how often a retry helped in the training cases
    words: tuple[tuple[str, float], ...]  # the terms that pushed most, with their push
    nearest: tuple[tuple[Known, float], ...]  # known cases most like this log


def failure_lines(lines: Sequence[str]) -> list[str]:
    """The last `WINDOW` non-empty lines after the last sign of training progress.

    What a job printed while it still trained is not what it died of (an old traceback
    that it survived, a warning at start-up).
    """
    shown = progress_lines(lines)
    after = lines[shown[-1] + 1 :] if shown else lines
    return [x for x in after if x.strip()][-WINDOW:]


def terms(lines: Sequence[str]) -> Counter[str]:
    """Lower-case words of the failure's lines (`failure_lines`) and their bigrams."""
    kept = failure_lines(lines)
    words = [w.lower() for line in kept for w in _WORD.findall(_ANSI.sub("", line))]
    out = Counter(words)
    out.update(f"{a} {b}" for a, b in pairwise(words))
    return out


def rule_features(c: Classification) -> dict[str, float]:
    """The rules' verdict as features: its class, and its vote weighted by confidence."""
    vote = c.confidence if c.retryable else -c.confidence
    return {f"=class:{c.failure_class}": RULE_SCALE, "=vote": vote * RULE_SCALE}


@dataclass(frozen=True)
class Model:
    idf: dict[str, float]
    weights: dict[str, float]
    bias: float
    known: tuple[Known, ...] = ()
    trained_on: str = ""  # a digest of the cases it was trained on

    def vector(self, lines: Sequence[str]) -> dict[str, float]:
        """TF-IDF of the log's known terms (sublinear tf), L2-normalised."""
        raw = {t: (1 + math.log(n)) * self.idf[t] for t, n in terms(lines).items() if t in self.idf}
        norm = math.sqrt(sum(v * v for v in raw.values())) or 1.0
        return {t: v / norm for t, v in raw.items()}

    def probability(self, feats: dict[str, float]) -> float:
        z = self.bias + sum(self.weights.get(f, 0.0) * v for f, v in feats.items())
        return _sigmoid(z)

    def opinion(self, vec: dict[str, float], c: Classification, k: int = 3) -> Opinion:
        """Its reading of a log (`vector`) the rules classified as `c`."""
        ruled = rule_features(c)
        feats = vec | ruled
        pushes = sorted(
            ((f, self.weights.get(f, 0.0) * v) for f, v in vec.items()),
            key=lambda fv: -abs(fv[1]),
        )
        near = sorted(((kn, _dot(vec, kn.terms)) for kn in self.known), key=lambda ks: -ks[1])[:k]
        return Opinion(
            self.probability(feats),
            sum(self.weights.get(f, 0.0) * v for f, v in ruled.items()),
            self.bias,
            tuple((f, round(v, 3)) for f, v in pushes[:5] if v),
            tuple((kn, round(s, 2)) for kn, s in near if s > 0),
        )


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1 / (1 + math.exp(-z))
    e = math.exp(z)
    return e / (1 + e)


def _dot(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(t, 0.0) for t, v in a.items())


def reconsider(
    c: Classification, lines: Sequence[str], model: Model | None = None
) -> Classification:
    """The rules' classification, or the model's reading where the rules are unsure.

    Only exits whose meaning is in the log are read: a nonzero status or a signal. When
    the model disagrees, the class becomes a plain user error or a transient exit, and the
    confidence stays under the uncertain mark: a learned retry is granted once.
    """
    if c.kind not in (ExitKind.NONZERO, ExitKind.SIGNAL):
        return c
    if c.failure_class in (FailureClass.INTERNAL, FailureClass.HOST_OOM) or not lines:
        return c
    if c.confidence >= SURE and (c.retryable or c.uncertain or c.rule not in DOUBTABLE):
        return c
    model = model or default()
    vec = model.vector(lines)
    if len(vec) < MIN_TERMS:
        return c
    op = model.opinion(vec, c)
    if c.confidence >= SURE:
        return _doubted(c, op)
    says = op.probability >= 0.5
    pushed = ", ".join(f"{w!r} {v:+.2f}" for w, v in op.words[:3]) or "none"
    near = "; ".join(
        f"{kn.url} ({'retryable' if kn.retryable else 'permanent'} {kn.category}, {s:.2f})"
        for kn, s in op.nearest
    )
    note = (
        f"learned model: a retry helps with p={op.probability:.2f} (log-odds: the rules' "
        f"verdict {op.rules:+.2f}, the prior {op.prior:+.2f}, the words, most of all {pushed}"
        + (f"; nearest known cases {near}" if near else "")
        + ")"
    )
    if says == c.retryable:
        return replace(c, notes=(*c.notes, note + ": agrees"))
    cls = FailureClass.TRANSIENT_EXIT if says else FailureClass.USER_ERROR
    return replace(
        c,
        failure_class=cls,
        retryable=says,
        rule=f"learned-model({c.rule})",
        confidence=min(c.confidence, 0.5),
        notes=(*c.notes, note + f": overrules {c.rule}"),
    )


def _doubted(c: Classification, op: Opinion) -> Classification:
    """A sure stop the model doubts (a retry helps with p >= DOUBT) is not proof: it stays
    what the rules read, uncertain, so the default policy retries it once."""
    if op.probability < DOUBT:
        return c
    note = (
        f"learned model: a retry helps with p={op.probability:.2f} (>= {DOUBT:g}): "
        f"{c.rule} is not proof enough to end the job"
    )
    return replace(c, confidence=min(c.confidence, 0.5), notes=(*c.notes, note))


@cache
def default() -> Model:
    """The shipped model (scripts/train_classifier.py writes it)."""
    text = resources.files("trainguard.classify").joinpath(MODEL_FILE).read_text()
    return from_dict(json.loads(text))


def from_dict(d: dict[str, Any]) -> Model:
    return Model(
        idf={str(k): float(v) for k, v in d["idf"].items()},
        weights={str(k): float(v) for k, v in d["weights"].items()},
        bias=float(d["bias"]),
        known=tuple(
            Known(str(k["id"]), str(k["url"]), bool(k["retryable"]), str(k["category"]), k["terms"])
            for k in d.get("known", ())
        ),
        trained_on=str(d.get("trained_on", "")),
    )


def to_dict(m: Model) -> dict[str, Any]:
    r = 4  # digits kept: the file stays small and diffs stay readable
    return {
        "trained_on": m.trained_on,
        "bias": round(m.bias, r),
        "idf": {t: round(v, r) for t, v in sorted(m.idf.items())},
        "weights": {t: round(v, r) for t, v in sorted(m.weights.items()) if round(v, r)},
        "known": [
            {
                "id": k.id,
                "url": k.url,
                "retryable": k.retryable,
                "category": k.category,
                "terms": {t: round(v, 3) for t, v in k.terms.items()},
            }
            for k in m.known
        ],
    }


@dataclass(frozen=True)
class Example:
    lines: tuple[str, ...]
    rules: Classification  # what the rules said about it
    retryable: bool  # its label
    id: str = ""
    url: str = ""
    category: str = ""


def train(
    examples: Sequence[Example],
    *,
    c: float = 3.0,
    min_df: int = 2,
    iterations: int = 300,
    keep_terms: int = 40,
    trained_on: str = "",
) -> Model:
    """L2-regularised logistic regression, classes weighted to balance, by gradient descent.

    Deterministic for the same examples. `c` is scikit-learn's C (inverse regularisation).
    """
    n = len(examples)
    df: Counter[str] = Counter()
    for e in examples:
        df.update(terms(e.lines).keys())
    idf = {t: math.log((1 + n) / (1 + k)) + 1 for t, k in df.items() if k >= min_df}
    base = Model(idf, {}, 0.0)
    vecs = [base.vector(e.lines) for e in examples]
    rows = [v | rule_features(e.rules) for v, e in zip(vecs, examples, strict=True)]
    ys = [1.0 if e.retryable else 0.0 for e in examples]
    pos = sum(ys)
    sw = [n / (2 * pos) if y else n / (2 * (n - pos)) for y in ys]
    w, b = _descend(rows, ys, sw, c, iterations)
    known = tuple(
        Known(e.id, e.url, e.retryable, e.category, dict(_strongest(v, keep_terms)))
        for v, e in zip(vecs, examples, strict=True)
        if e.id
    )
    return Model(idf, w, b, known, trained_on)


def _strongest(v: dict[str, float], k: int) -> list[tuple[str, float]]:
    return sorted(v.items(), key=lambda tv: -tv[1])[:k]


def _descend(
    rows: list[dict[str, float]], ys: list[float], sw: list[float], c: float, iterations: int
) -> tuple[dict[str, float], float]:
    """Minimise 0.5|w|^2 + c * sum(sw * logloss) with Nesterov momentum (fixed steps).

    On lists indexed by feature rather than dicts (the corpus test trains six models), with
    the same operations in the same order: the same weights to the last bit."""
    feats = sorted({f for r in rows for f in r})
    index = {f: i for i, f in enumerate(feats)}
    sparse = [([index[f] for f in r], list(r.values())) for r in rows]
    w = [0.0] * len(feats)
    vw = [0.0] * len(feats)
    b = 0.0
    vb = 0.0
    lr = 1.0 / _smoothness(rows, sw, c)
    mu = 0.9
    for _ in range(iterations):
        lw = [wf + mu * vf for wf, vf in zip(w, vw, strict=True)]
        lb = b + mu * vb
        g = lw[:]
        gb = 0.0
        for (idx, vals), y, s in zip(sparse, ys, sw, strict=True):
            p = _sigmoid(lb + sum(map(operator.mul, map(lw.__getitem__, idx), vals)))
            d = c * s * (p - y)
            gb += d
            for i, v in zip(idx, vals, strict=True):
                g[i] += d * v
        vw = [mu * vf - lr * gf for vf, gf in zip(vw, g, strict=True)]
        w = [wf + vf for wf, vf in zip(w, vw, strict=True)]
        vb = mu * vb - lr * gb
        b += vb
    return dict(zip(feats, w, strict=True)), b


def _smoothness(rows: list[dict[str, float]], sw: list[float], c: float) -> float:
    """An upper estimate of the loss' curvature: 1 + c/4 * the top eigenvalue of X'SX.

    By power iteration on [x, 1] (the bias is a feature here), deterministic from ones.
    """
    v: dict[str, float] = {f: 1.0 for r in rows for f in r}
    vb = 1.0
    lam = 1.0
    for _ in range(30):
        u = dict.fromkeys(v, 0.0)
        ub = 0.0
        for r, s in zip(rows, sw, strict=True):
            d = s * (vb + sum(v[f] * x for f, x in r.items()))
            ub += d
            for f, x in r.items():
                u[f] += d * x
        lam = math.sqrt(sum(x * x for x in u.values()) + ub * ub)
        v = {f: x / lam for f, x in u.items()}
        vb = ub / lam
    return 1 + c * lam / 4 * 1.05
