"""The safeguard: adapt only when the adapted model is predicted to be better than source-only.

A source-only model (same bottleneck architecture, ``method=source_only``, same seed and steps)
is trained alongside the adapted one, a step after each of its steps (the *companion*,
:meth:`AdaptTrainer.attach_companions`, in the same checkpoints), both on the labelled rows minus
a stratified held-out split. Without any unlabelled label, the two are compared on:

* ``val_accuracy``: accuracy on the held-out labelled rows, each class weighted by the
  source-only model's estimate of its share of the unlabelled domain (so classes that are absent
  there, which PWAN is meant to down-weight, do not count);
* ``outlier_mass``: the fraction of unlabelled rows predicted in classes that the source-only
  model estimates absent (predicted for less than ``1 / (2K)`` of the rows);
* ``agreement``: the fraction of unlabelled rows on which both models predict the same class;
* ``mean_entropy``: the mean prediction entropy on the unlabelled rows.

A model *passes* when its weighted held-out accuracy is not below source-only by more than
``safeguard_margin``, its outlier mass does not exceed source-only's by more than
``safeguard_margin``, it agrees with source-only on at least ``min_agreement`` of the unlabelled
rows and it is more confident (lower mean entropy).

Snapshot selection (early stopping without target labels): at every evaluation of the adapted
training (``eval_interval`` steps, after warm-up), the current weights are judged as above
against the companion at the same step (trained as long) and, when they pass, replace the kept
snapshot if their ``val_accuracy - outlier_mass`` is higher by more than a tolerance, or not
lower by more than it and their ``mean_entropy`` is lower; the tolerance is
``safeguard_margin`` or 1.5 held-out rows' weight when larger
(:meth:`SnapshotSelector.prefers`). At the end, when the final weights pass, the kept snapshot
(in memory and in the checkpoints) is deployed; when they fail, the *fallback* is deployed: a
third model, source-only on all labelled rows (the held-out rows served the decision), trained in
the same lock-step (what a plain ``method=source_only`` run gives), and the decision says which
test the final weights failed (:func:`decide` says why an earlier passing snapshot is not
deployed then).

A linear source-only model is the other source-only candidate (:func:`linear_candidate`,
:func:`consider_linear`): logistic regression (:class:`~pwan_ros.adaptation.linear.LinearSource`)
on the companion's training rows, compared on the held-out rows. It is the source-only model when
they show it better than the companion (a sign test at ``check_alpha``), and it replaces a
passing adapted model they also show it better than; the checks above stay against the
companion. What is deployed as source-only is refitted on all labelled rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from .data import FeatureSet
from .linear import LinearSource


def holdout_split(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Stratified held-out labelled rows (sorted indices): ``round(fraction * n_c)`` of each
    class c, at least one when the class has two or more rows, never all of its rows."""
    rng = np.random.default_rng([seed, 0x5AFE])
    out: List[np.ndarray] = []
    for c in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == c)
        if idx.size < 2 or fraction <= 0:
            continue
        take = int(min(idx.size - 1, max(1, round(fraction * idx.size))))
        out.append(rng.choice(idx, take, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)


@torch.no_grad()
def _predict(trainer, fs: FeatureSet, index: Optional[np.ndarray] = None):
    """(predictions (n,), probabilities (n, K)) of a trainer's model on rows of ``fs``."""
    model, dev, chunk = trainer.model, trainer.device, trainer.config.eval_batch
    model.eval()
    if index is None:
        blocks = fs.batches(chunk)
    else:
        blocks = (fs.rows(index[s : s + chunk]) for s in range(0, index.size, chunk))
    probs = [
        model(torch.from_numpy(b).to(dev)).softmax(dim=1).double().cpu().numpy() for b in blocks
    ]
    p = np.concatenate(probs) if probs else np.zeros((0, trainer.num_classes))
    return p.argmax(axis=1), p


@dataclass
class ModelCheck:
    """One candidate model judged without unlabelled labels."""

    val_accuracy: Optional[float]
    outlier_mass: float
    mean_entropy: float
    agreement: float


@dataclass
class SafeguardDecision:
    """Which model was deployed (``adapted`` | ``source_only``) and why; ``source_only`` is the
    network companion's criteria, ``source_only_model`` the source-only model chosen (``mlp``:
    the network, ``linear``: logistic regression; deployed with ``source_only``)."""

    deployed: str
    reason: str
    adapted: ModelCheck
    source_only: ModelCheck
    present_classes: List[int]
    n_holdout: int
    snapshot_step: Optional[int] = None  # step of the deployed adapted snapshot
    check: Optional[Dict] = None  # CheckVerdict.to_dict() when check rows were given
    source_only_model: str = 'mlp'
    linear_val_accuracy: Optional[float] = None  # the linear model's weighted held-out accuracy
    # the held-out sign tests of the linear model against 'mlp' and 'adapted' (linear_candidate)
    linear_tests: Optional[Dict] = None
    # step of the adapted candidate when it passed the label-free tests (None: it failed)
    adapted_step: Optional[int] = None

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    @property
    def label(self) -> str:
        """``adapted``, ``source_only (mlp)`` or ``source_only (linear)``."""
        return (
            'adapted' if self.deployed == 'adapted' else f'source_only ({self.source_only_model})'
        )


@dataclass
class CheckVerdict:
    """The two candidates on labelled rows of the unlabelled domain (the ``check`` file).

    ``rows``: the distinct rows (a repeated feature row counts once); ``adapted_only`` /
    ``source_only_only``: rows only that candidate classifies correctly (the rows they disagree
    on and one of them gets right); ``p_better`` / ``p_worse``: one-sided exact sign-test
    p-values of "the adapted candidate is better / worse" on those rows (binomial, 1/2,
    as McNemar's exact test); ``verdict``: ``adapted`` (shown better at ``alpha``),
    ``source_only`` (shown worse) or ``undecided``."""

    rows: int
    adapted_accuracy: float
    source_only_accuracy: float
    adapted_only: int
    source_only_only: int
    p_better: float
    p_worse: float
    alpha: float
    verdict: str

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        what = {
            'adapted': 'shown better',
            'source_only': 'shown worse',
            'undecided': 'not shown better or worse',
        }[self.verdict]
        return (
            f'check rows: adapted {what} at {self.alpha:g} ({self.rows} rows: accuracy '
            f'{self.adapted_accuracy:.3f} against source-only {self.source_only_accuracy:.3f}; '
            f'only the adapted candidate right on {self.adapted_only}, only source-only on '
            f'{self.source_only_only}; p {self.p_better:.3g} / {self.p_worse:.3g})'
        )


def _distinct(fs: FeatureSet, index: np.ndarray) -> np.ndarray:
    """Mask (k,) of the rows ``index`` of ``fs`` that are the first of their feature vector: a
    repeated row is one example (repeated 10x, 2 check rows read as p 1e-6 and deployed a model
    they showed wrong; the sign test assumes independent rows)."""
    feats = np.ascontiguousarray(fs.rows(index))
    _, first = np.unique(
        feats.view(np.dtype((np.void, feats.dtype.itemsize * feats.shape[1]))), return_index=True
    )
    once = np.zeros(index.size, bool)
    once[first] = True
    return once


def sign_test(right_a: np.ndarray, right_b: np.ndarray) -> tuple:
    """``(a_only, b_only, p_a_better, p_b_better)`` on rows that models a and b get right
    (bool masks): the rows only one of them gets right and the one-sided exact sign-test p-values
    (binomial, 1/2, as McNemar's exact test) that a, resp. b, is the better one."""
    from scipy.stats import binomtest

    wins, losses = int((right_a & ~right_b).sum()), int((right_b & ~right_a).sum())
    n = wins + losses
    p_a = binomtest(wins, n, 0.5, alternative='greater').pvalue if n else 1.0
    p_b = binomtest(losses, n, 0.5, alternative='greater').pvalue if n else 1.0
    return wins, losses, float(p_a), float(p_b)


def check_candidates(adapted, source, check: FeatureSet, alpha: float) -> CheckVerdict:
    """Compare two trainers' current models on the labelled ``check`` rows (C, D) (see
    :class:`CheckVerdict`). ValueError when the rows have no labels or another width."""
    if check.labels is None or check.dim != source.labelled.dim:
        raise ValueError(
            f'check rows need labels and D={source.labelled.dim} features (got D={check.dim}'
            f'{", no labels" if check.labels is None else ""})'
        )

    pa, _ = _predict(adapted, check)
    ps, _ = _predict(source, check)
    once = _distinct(check, np.arange(check.n))
    right_a, right_s = (pa == check.labels)[once], (ps == check.labels)[once]
    wins, losses, p_better, p_worse = sign_test(right_a, right_s)
    verdict = 'undecided'
    if p_better <= alpha:
        verdict = 'adapted'
    elif p_worse <= alpha:
        verdict = 'source_only'
    return CheckVerdict(
        int(once.sum()),
        float(right_a.mean()),
        float(right_s.mean()),
        wins,
        losses,
        p_better,
        p_worse,
        float(alpha),
        verdict,
    )


def apply_check(decision: SafeguardDecision, verdict: CheckVerdict, adapted) -> SafeguardDecision:
    """The decision after the check rows: the verdict's candidate when it is decided, else the
    label-free one. ``adapted``: the trainer whose current weights were checked; when the check
    deploys them against a label-free refusal (the final weights), they become its kept snapshot
    (``snapshot``, ``best_step``), as in :func:`decide`."""
    deployed = decision.deployed if verdict.verdict == 'undecided' else verdict.verdict
    if deployed == 'source_only':
        step = None
    elif decision.adapted_step is not None:  # it passed: the kept snapshot, loaded
        step = decision.adapted_step
    else:
        keep_final_weights(adapted, decision.adapted)
        step = adapted.state.step
    return dataclasses.replace(
        decision,
        deployed=deployed,
        reason=f'{decision.reason}; {verdict.describe()}',
        snapshot_step=step,
        check=verdict.to_dict(),
    )


def keep_final_weights(adapted, criteria: ModelCheck) -> None:
    """Make ``adapted``'s current (final) weights its kept snapshot, judged as ``criteria``."""
    st = adapted.state
    adapted.snapshot = {k: v.detach().clone() for k, v in adapted.model.state_dict().items()}
    st.best_step, st.best_entropy = st.step, criteria.mean_entropy
    st.best_criteria = dataclasses.asdict(criteria)


def _weighted_accuracy(pred, labels, weights) -> Optional[float]:
    if labels.size == 0:
        return None
    acc = np.array(
        [
            (pred[labels == c] == c).mean() if (labels == c).any() else np.nan
            for c in range(weights.size)
        ]
    )
    ok = np.isfinite(acc) & (weights > 0)
    return float((acc[ok] * weights[ok]).sum() / weights[ok].sum()) if ok.any() else None


@dataclass
class Reference:
    """What every candidate is judged against: the source-only model's view of the data."""

    holdout: np.ndarray
    predictions: np.ndarray  # (M,) source-only predictions on the unlabelled rows
    present: np.ndarray  # (K,) bool: classes source-only predicts for >= 1/(2K) of the rows
    weights: np.ndarray  # (K,) source-only mean probabilities: estimated class shares
    check: ModelCheck  # source-only's own criteria

    @classmethod
    def of(cls, source, holdout: np.ndarray) -> 'Reference':
        k = source.num_classes
        ps, probs = _predict(source, source.unlabelled)
        share = np.bincount(ps, minlength=k) / max(1, ps.size)
        present = share >= 1.0 / (2 * k)
        weights = probs.mean(axis=0)
        vs, _ = _predict(source, source.labelled, holdout)
        check = ModelCheck(
            _weighted_accuracy(vs, source.labelled.labels[holdout], weights),
            float((~present[ps]).mean()) if ps.size else 0.0,
            _entropy(probs),
            1.0,
        )
        return cls(holdout, ps, present, weights, check)


def _num(v: Optional[float]) -> str:
    return 'n/a' if v is None else f'{v:.3f}'


def _entropy(p) -> float:
    return float(-(p * np.log(np.clip(p, 1e-30, None))).sum(axis=1).mean()) if len(p) else 0.0


def judge(trainer, ref: Reference, margin: float, min_agreement: float):
    """The current weights of ``trainer`` against ``ref``: ``(ModelCheck, failures)`` where
    ``failures`` lists the tests it fails (empty: it passes)."""
    pa, proba = _predict(trainer, trainer.unlabelled)
    va, _ = _predict(trainer, trainer.labelled, ref.holdout)
    agree = float((pa == ref.predictions).mean()) if pa.size else 1.0
    a = ModelCheck(
        _weighted_accuracy(va, trainer.labelled.labels[ref.holdout], ref.weights),
        float((~ref.present[pa]).mean()) if pa.size else 0.0,
        _entropy(proba),
        agree,
    )
    s = ref.check
    fails = []
    if not np.isfinite(proba).all():  # diverged weights: no test below can pass them
        fails.append('non-finite outputs on unlabelled rows (NaN or inf: the weights diverged)')
    if (
        a.val_accuracy is not None
        and s.val_accuracy is not None
        and a.val_accuracy < s.val_accuracy - margin
    ):
        fails.append(
            f'held-out labelled accuracy {a.val_accuracy:.3f} < source-only {s.val_accuracy:.3f} '
            f'- {margin:g}'
        )
    if a.outlier_mass > s.outlier_mass + margin:
        fails.append(
            f'{a.outlier_mass:.1%} of unlabelled rows in estimated-absent classes '
            f'(source-only {s.outlier_mass:.1%})'
        )
    if agree < min_agreement:
        fails.append(
            f'agrees with source-only on only {agree:.1%} of unlabelled rows (< '
            f'{min_agreement:.1%})'
        )
    if not a.mean_entropy < s.mean_entropy:  # NaN fails too
        fails.append(
            f'not more confident than source-only (entropy {a.mean_entropy:.3f} >= '
            f'{s.mean_entropy:.3f})'
        )
    return a, fails


def one_row(ref: Reference, labels: np.ndarray) -> float:
    """The resolution of the weighted held-out accuracy: the most that one held-out row (of
    ``labels``, the held-out rows' labels) changes it, ``max_c w_c / (n_c sum w)``."""
    counts = np.bincount(labels, minlength=ref.weights.size)
    ok = (counts > 0) & (ref.weights > 0)
    if not ok.any():
        return 0.0
    return float((ref.weights[ok] / counts[ok]).max() / ref.weights[ok].sum())


def selection_score(check: ModelCheck, resolution: float = 0.0) -> tuple:
    """Score of a passing snapshot: ``(weighted held-out accuracy - outlier mass, mean
    entropy, resolution)``, ``resolution`` being :func:`one_row` (see
    :meth:`SnapshotSelector.prefers`)."""
    val = check.val_accuracy if check.val_accuracy is not None else 0.0
    return (val - check.outlier_mass, check.mean_entropy, resolution)


class SnapshotSelector:
    """:attr:`AdaptTrainer.selector <pwan_ros.adaptation.trainer.AdaptTrainer.selector>` of the
    safeguard: after warm-up, a snapshot that passes :func:`judge` against the trainer's
    companion at the same step (its held-out rows ``holdout``) is scored by
    :func:`selection_score`; before warm-up or when it fails, it is not eligible."""

    def __init__(self, holdout: Optional[np.ndarray], margin: float, min_agreement: float):
        self.holdout, self.margin, self.min_agreement = holdout, margin, min_agreement

    def __call__(self, trainer, res):
        if trainer.state.step < trainer.config.warmup_steps:
            return None  # not adapted yet
        ref = Reference.of(trainer.companion, self.holdout)
        check, fails = judge(trainer, ref, self.margin, self.min_agreement)
        if fails:
            return None
        labels = trainer.labelled.labels[ref.holdout]
        return selection_score(check, one_row(ref, labels)), dataclasses.asdict(check)

    def prefers(self, new, kept) -> bool:
        """A new passing snapshot replaces the kept one when its held-out accuracy minus outlier
        mass is better by more than the tolerance, or not worse by more than it and it is more
        confident (lower entropy). The tolerance is ``margin`` or, when larger, 1.5 held-out
        rows (the score's third entry, :func:`one_row`, is the heaviest row: on ~10 rows per
        class 0.02-0.03; the half row covers the drift of the class weights between two
        evaluations): differences within it are the held-out split's noise, and the entropy term
        makes the later, more adapted snapshot win them, so training runs to its end unless the
        checks see it degrade by two rows or more. (Passing or failing the checks,
        :func:`judge`, keeps the plain margin: there a single row may be the only evidence of
        harm.)"""
        q_new, h_new, q_kept, h_kept = new[0], new[1], kept[0], kept[1]
        rows = [1.5 * s[2] for s in (new, kept) if len(s) > 2]
        tol = max([self.margin, *rows])
        if q_new > q_kept + tol:
            return True
        return q_new >= q_kept - tol and h_new < h_kept


def decide(adapted, ref: Reference, margin: float, min_agreement: float) -> SafeguardDecision:
    """The safeguard's decision after training ``adapted`` (its final weights loaded) with a
    :class:`SnapshotSelector`.

    The final weights are judged first. When they fail, source-only is deployed even if an
    earlier snapshot passed: every snapshot was driven by the same m0 and mu, estimated once
    from the warmed-up classifier, and a run that ends outside the checks is taken as evidence
    that they were wrong (an early snapshot then is mostly a less-trained source-only model that
    the checks cannot tell apart from a good one). When they pass, the kept snapshot is judged
    again, against the same final reference: it passed against the companion of its own step,
    which may have been weaker (seen: a step-250 snapshot with 4.4 % of the rows in absent
    classes passed against a companion at 2.9 %; the final one has 0 %). If it passes, it is
    deployed; if not, the final weights become the kept snapshot (``adapted.snapshot``,
    ``best_step``) and are deployed. Either way the decision's criteria are those against the
    final reference."""
    present = np.flatnonzero(ref.present).tolist()
    n = int(ref.holdout.size)
    st = adapted.state
    a, fails = judge(adapted, ref, margin, min_agreement)
    if fails:
        reason = 'adapted model not predicted to be better: final weights: ' + '; '.join(fails)
        return SafeguardDecision('source_only', reason, a, ref.check, present, n, None)
    if adapted.snapshot is None or st.best_step < 0:  # no selector ran: the final weights
        reason = 'adapted model kept (final weights pass; no snapshot was evaluated)'
        return SafeguardDecision(
            'adapted', reason, a, ref.check, present, n, st.step, adapted_step=st.step
        )
    kept, kept_fails = a, []
    if st.best_step != st.step:
        final = {k: v.detach().clone() for k, v in adapted.model.state_dict().items()}
        adapted.model.load_state_dict(adapted.snapshot)
        kept, kept_fails = judge(adapted, ref, margin, min_agreement)
        adapted.model.load_state_dict(final)
    note = ''
    if kept_fails:
        note = (
            f'; the snapshot of step {st.best_step} fails against the final source-only model ('
            + '; '.join(kept_fails)
            + ')'
        )
        keep_final_weights(adapted, a)  # the final weights are loaded again
        kept = a
    reason = (
        f'adapted model (snapshot of step {st.best_step}) kept: held-out accuracy '
        f'{_num(kept.val_accuracy)} (source-only {_num(ref.check.val_accuracy)}), outlier '
        f'mass {kept.outlier_mass:.1%} (source-only {ref.check.outlier_mass:.1%}), agreement '
        f'{kept.agreement:.1%}' + note
    )
    return SafeguardDecision(
        'adapted', reason, kept, ref.check, present, n, st.best_step, adapted_step=st.best_step
    )


def linear_candidate(adapted, source, ref: Reference) -> tuple:
    """``(linear model on all labelled rows, evidence or None)``: the linear source-only
    candidate (:class:`~pwan_ros.adaptation.linear.LinearSource`) of ``adapted``'s data and, with
    held-out rows, the same model fitted without them, on them: ``evidence`` =
    ``{'val_accuracy': its weighted held-out accuracy, 'mlp': test, 'adapted': test}``, each test
    ``[rows only it gets right, rows only the other model gets right, p-value that it is the
    better one]`` (:func:`sign_test`) against ``source`` (the companion) and ``adapted``'s current
    weights (the adapted candidate), on the distinct held-out rows of the classes the companion
    estimates present (``ref.present``)."""
    lab, holdout = adapted.labelled, ref.holdout
    linear = LinearSource(adapted)
    if not holdout.size:
        return linear, None
    held = LinearSource(adapted, np.setdiff1d(np.arange(lab.n), holdout))
    labels = lab.labels[holdout]
    rows = ref.present[labels] & _distinct(lab, holdout)
    pred, _ = _predict(held, lab, holdout)
    evidence = {'val_accuracy': _weighted_accuracy(pred, labels, ref.weights)}
    for name, other in (('mlp', source), ('adapted', adapted)):
        other_pred, _ = _predict(other, lab, holdout)
        right, other_right = (pred == labels)[rows], (other_pred == labels)[rows]
        evidence[name] = list(sign_test(right, other_right)[:3])
    return linear, evidence


def consider_linear(decision: SafeguardDecision, evidence: Optional[Dict], alpha: float):
    """``decision`` (from :func:`decide`) with the linear source-only candidate (``evidence`` of
    :func:`linear_candidate`): it is the source-only model when the held-out rows show it better
    than the companion (one-sided exact sign test at ``alpha``, the check rows' level), and it is
    deployed instead of a passing adapted model when they also show it better than that one.
    Fewer rows decide nothing and the network stays: held-out rows are of the labelled domain,
    weak evidence for the new one (on SURF features the linear model leads on them on tasks where
    it transfers 5-13 points worse)."""
    if evidence is None:
        return decision
    d = dataclasses.replace(
        decision,
        linear_val_accuracy=evidence['val_accuracy'],
        linear_tests={k: evidence[k] for k in ('mlp', 'adapted')},
    )
    wins, losses, p = evidence['mlp']
    if p > alpha:
        return d
    d = dataclasses.replace(d, source_only_model='linear')
    note = f'linear source-only model shown better on held-out rows than the MLP ({wins}:{losses}'
    note += f', p {p:.3g})'
    wins, losses, p = evidence['adapted']
    if decision.deployed == 'adapted' and p <= alpha:
        return dataclasses.replace(
            d,
            deployed='source_only',
            snapshot_step=None,
            reason=f'{note} and than the adapted model ({wins}:{losses}, p {p:.3g}), which '
            f'passes the label-free tests: {decision.reason}',
        )
    return dataclasses.replace(d, reason=f'{decision.reason}; {note}')


def adapt_with_safeguard(
    config, labelled: FeatureSet, unlabelled: FeatureSet, check: Optional[FeatureSet] = None
):
    """Train the adapted model with its source-only companion and fallback in lock-step and
    snapshot selection (in memory, no files), and decide (with ``check``, labelled rows of the
    unlabelled domain, as :func:`pwan_ros.adaptation.runner.run_adaptation` does).

    Returns ``(deployed, final, source_only, decision)``: ``deployed`` is the adapted trainer with
    its kept snapshot loaded (the final weights when the check rows deployed them against a
    label-free refusal), or the chosen source-only model on all labelled rows (the fallback
    network or a :class:`~pwan_ros.adaptation.linear.LinearSource`); ``final`` is
    the :class:`~pwan_ros.adaptation.trainer.UnlabelledPass` of the adapted model's last iterate
    (before the snapshot is restored); ``source_only`` the companion (trained without the
    held-out rows: the reference of the checks); ``decision`` the :class:`SafeguardDecision`. What
    :func:`pwan_ros.adaptation.runner.run_adaptation` does, without checkpoints or outputs."""
    from .trainer import AdaptTrainer

    holdout = holdout_split(labelled.labels, config.holdout_fraction, config.seed)
    adapted = AdaptTrainer(config, labelled, unlabelled, holdout)
    adapted.attach_companions()
    source = adapted.companion
    adapted.selector = SnapshotSelector(holdout, config.safeguard_margin, config.min_agreement)
    adapted.train()
    final = adapted.evaluate()
    ref = Reference.of(source, holdout)
    decision = decide(adapted, ref, config.safeguard_margin, config.min_agreement)
    if decision.adapted_step is not None:  # it passed: the candidate is the kept snapshot
        adapted.restore_snapshot()
    linear, evidence = linear_candidate(adapted, source, ref)
    decision = consider_linear(decision, evidence, config.check_alpha)
    fallback = linear if decision.source_only_model == 'linear' else adapted.fallback
    if check is not None:
        verdict = check_candidates(adapted, fallback, check, config.check_alpha)
        decision = apply_check(decision, verdict, adapted)
    if decision.deployed == 'adapted':
        return adapted, final, source, decision
    return fallback, final, source, decision
