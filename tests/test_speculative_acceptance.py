"""The acceptance model of speculative decoding, by hand: every form reduces to the probability
that the first i proposals are accepted, the draws follow it, and the published presets give back
the mean acceptance lengths they were read from."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.core.speculation import Speculator
from servesim.errors import ServesimError
from servesim.speculative import AcceptanceConfig, acceptance_model, iid_length
from servesim.speculative.presets import PRESETS
from servesim.speculative.schema import SpeculativeConfig


def test_iid_expected_length_by_hand() -> None:
    """alpha = 0.8, k = 4: 1 + 0.8 + 0.64 + 0.512 + 0.4096 = 3.3616 = (1 - 0.8^5) / 0.2."""
    assert iid_length(0.8, 4) == pytest.approx(3.3616)
    assert iid_length(0.8, 4) == pytest.approx((1 - 0.8**5) / (1 - 0.8))
    model = acceptance_model(AcceptanceConfig(rate=0.8), 4)
    assert model.survival.tolist() == pytest.approx([0.8, 0.64, 0.512, 0.4096])
    assert model.expected_length(4) == pytest.approx(3.3616)
    assert model.conditional(4).tolist() == pytest.approx([0.8] * 4)
    assert iid_length(1.0, 3) == 4.0 and iid_length(0.0, 3) == 1.0


def test_every_form_reduces_to_the_same_survival() -> None:
    """rates [0.9, 0.5, 0.4] (conditional) = per_position [0.9, 0.45, 0.18]; a distribution of
    accepted counts 10/45/27/18 (%) gives P(>=1) = 0.9, P(>=2) = 0.45, P(>=3) = 0.18; measured
    counters 900/450/180 of 1000 drafts likewise."""
    expected = [0.9, 0.45, 0.18]
    forms = [AcceptanceConfig(rates=[0.9, 0.5, 0.4]), AcceptanceConfig(per_position=expected),
             AcceptanceConfig(distribution=[10, 45, 27, 18]),
             AcceptanceConfig(measured={"num_drafts": 1000, "accepted_per_position": [900, 450, 180]})]
    for config in forms:
        model = acceptance_model(config, 3)
        assert model.survival.tolist() == pytest.approx(expected), config.form
        assert model.expected_length(3) == pytest.approx(2.53)
    # fewer proposals use the first positions (a chain's prefix does not depend on k)
    assert acceptance_model(forms[2], 2).expected_length(2) == pytest.approx(2.35)


def _draws(survival: np.ndarray, k: int, n: int, seed: int = 0, propose_rate: float = 1.0
           ) -> tuple[np.ndarray, np.ndarray]:
    speculator = Speculator(k, survival, seed, propose_rate)
    requests = np.arange(n, dtype=np.int64)
    generated = np.full(n, 7, dtype=np.int64)
    proposed = speculator.proposals(n, requests, generated, np.full(n, 100, dtype=np.int64))
    assert proposed is not None
    return proposed, speculator.accept(requests, generated, proposed)


def test_draws_follow_the_truncated_geometric_distribution() -> None:
    """With i.i.d. acceptance, P(accept exactly j of k) = alpha^j (1 - alpha) for j < k and
    alpha^k for j = k; 200,000 draws match within 4 standard errors, and their mean is the expected
    length minus one."""
    alpha, k, n = 0.7, 4, 200_000
    _, accepted = _draws(acceptance_model(AcceptanceConfig(rate=alpha), k).survival, k, n)
    frequencies = np.bincount(accepted, minlength=k + 1) / n
    theory = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    assert np.abs(frequencies - theory).max() < 4 * np.sqrt(theory * (1 - theory) / n).max()
    assert accepted.mean() == pytest.approx(iid_length(alpha, k) - 1, abs=0.01)


def test_draws_are_a_pure_function_of_seed_request_and_progress() -> None:
    survival = np.array([0.8, 0.6, 0.4])
    a = _draws(survival, 3, 1000, seed=1)[1]
    assert np.array_equal(a, _draws(survival, 3, 1000, seed=1)[1])  # same inputs, same draws
    assert not np.array_equal(a, _draws(survival, 3, 1000, seed=2)[1])  # the seed matters
    speculator = Speculator(3, survival, 1)
    requests, generated, proposed = np.arange(5), np.full(5, 7), np.full(5, 3)
    # asking in another order (a policy planning a step again after a preemption) changes nothing
    forward = speculator.accept(requests, generated, proposed)
    backward = speculator.accept(requests[::-1], generated, proposed)[::-1]
    assert np.array_equal(forward, backward)


def test_proposals_respect_the_remaining_output_the_budget_and_the_cap() -> None:
    speculator = Speculator(4, np.full(4, 0.5), 0, disable_above=8)
    requests, generated = np.arange(4), np.zeros(4, dtype=np.int64)
    remaining = np.array([10, 3, 2, 1])  # the last token left needs no proposal
    assert speculator.proposals(4, requests, generated, remaining).tolist() == [4, 2, 1, 0]
    assert speculator.proposals(4, requests, generated, remaining, budget=5).tolist() == [4, 1, 0, 0]
    assert speculator.proposals(9, requests, generated, remaining) is None  # 9 running > cap 8
    assert speculator.proposals(4, requests, generated, np.ones(4, dtype=np.int64)) is None


def test_ngram_misses_propose_nothing_at_the_propose_rate() -> None:
    proposed, _ = _draws(np.full(3, 0.5), 3, 100_000, propose_rate=0.3)
    assert np.isin(proposed, (0, 3)).all()
    assert (proposed > 0).mean() == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize(("name", "lengths"), [
    ("eagle3-llama-3.1-8b-mtbench", {2: 2.36, 3: 2.79, 4: 3.08, 5: 3.32, 6: 3.46, 7: 3.54}),
    ("eagle-llama-3.1-8b-mtbench", {2: 2.10, 3: 2.29, 4: 2.39, 5: 2.43, 6: 2.45, 7: 2.47}),
])
def test_presets_give_back_the_published_acceptance_lengths(name: str, lengths: dict[int, float]) -> None:
    """vLLM issue #20780's mean acceptance lengths at k = 2..7, to their two decimals."""
    for k, published in lengths.items():
        model = acceptance_model(AcceptanceConfig(preset=name), k)
        assert model.expected_length(k) == pytest.approx(published, abs=0.006), k
    assert PRESETS[name].per_position == tuple(sorted(PRESETS[name].per_position, reverse=True))


def test_ngram_preset_matches_its_counters() -> None:
    """vLLM PR #24344: 993 drafts accepted 3,562 proposals (3.59 per draft with the rounded
    per-position rates), and proposed in 993 of 993 + 821 decode steps."""
    preset = PRESETS["ngram-blazedit-k5"]
    assert sum(preset.per_position) * 993 == pytest.approx(3562, rel=0.002)
    assert preset.propose_rate == pytest.approx(0.547, abs=0.001)
    model = acceptance_model(AcceptanceConfig(preset="ngram-blazedit-k5"), 5)
    assert model.propose_rate == preset.propose_rate


@pytest.mark.parametrize(("acceptance", "k", "message"), [
    ({"rates": [0.8, 0.7]}, 3, "speculative.acceptance.rates: covers 2 proposal positions"),
    ({"per_position": [0.5, 0.7]}, 2, "speculative.acceptance.per_position: must not increase"),
    ({"preset": "mtp-deepseek-v3"}, 2, "speculative.acceptance.preset: covers 1 proposal positions"),
    ({"preset": "nope"}, 2, "speculative.acceptance.preset: unknown preset 'nope'"),
    ({"distribution": [0, 0]}, 1, "speculative.acceptance.distribution: needs non-negative counts"),
    ({"measured": {"num_drafts": 10, "accepted_per_position": [20]}}, 1, "counts exceed num_drafts"),
])
def test_acceptance_errors_are_one_line_naming_the_key(acceptance: dict, k: int, message: str) -> None:
    with pytest.raises(ServesimError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        acceptance_model(AcceptanceConfig(**acceptance), k)
    assert "\n" not in str(error.value)


def test_propose_rate_is_for_ngram_only() -> None:
    message = "speculative.acceptance.propose_rate: applies to method ngram"
    with pytest.raises(ServesimError, match=message):
        SpeculativeConfig(method="eagle", num_speculative_tokens=2,
                          acceptance={"rate": 0.5, "propose_rate": 0.5})
