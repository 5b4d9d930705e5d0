"""Published draft-token acceptance, per speculative method and dataset: the defaults of `[speculative]`.

A chain of k drafts is accepted up to its first rejection. vLLM reports acceptance per draft position
(`vllm/v1/spec_decode/metrics.py`: accepted tokens at position i over the drafts proposed), which is
unconditional: p_i = P(the first i drafts are all accepted), non-increasing in i. The expected tokens a
step yields per sequence is then 1 + p_1 + ... + p_k (the bonus or corrected token and the accepted
drafts); with i.i.d. acceptance a (p_i = a^i) that is (1 - a^(k+1)) / (1 - a).

Each preset gives those rates as measured with a chain of each length k (a step of k drafts visits other
positions than one of k + 1, so the rates move a little with k); past the longest measured k the rates
fall geometrically at the last two positions' ratio (an extrapolation, said in the source). Sources:

- eagle (and ngram), Llama-3.1-8B-Instruct on one H100, vLLM v0.10.1: SpecDecode-Bench ("Speculative
  Decoding: Performance or Illusion?", arXiv 2601.11580; github.com/SpecDecode-Bench/simulator,
  data/llama3.1-8B, commit 2fdccbd): the accepted length at every output position of 300-500 requests per
  dataset, walked here as vLLM's chain of k drafts would visit them. n-gram proposes only where its
  lookup finds a match: `proposal_rate` is the simulator's matching probability per dataset (raised to
  the traces' first-position acceptance where that is higher), and the rates are those of the steps that
  propose (as vLLM counts them).
- eagle3: RedHatAI/Llama-4-Maverick-17B-128E-Instruct-speculator.eagle3 model card (vLLM 0.11.0,
  temperature 0.6): mean acceptance length for k = 1..7 per use case; p_i is the length's step from
  k = i - 1 to i (the card measures each k on its own).
- mtp: GLM-4.5-Air's MTP layer on GPQA-Main, 0.92 / 0.68 / 0.38 at positions 1-3 (SpecDecode-Bench,
  vLLM v0.11.1); DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): the second token's
  acceptance rate is 85-90% (0.875 here).
"""

from __future__ import annotations

from typing import NamedTuple

_SDB = ("SpecDecode-Bench (arXiv 2601.11580), Llama-3.1-8B-Instruct on H100, vLLM v0.10.1: per-position "
        "accepted lengths of {n} {dataset} requests (github.com/SpecDecode-Bench/simulator, commit 2fdccbd)")
_MAVERICK = ("RedHatAI/Llama-4-Maverick-17B-128E-Instruct-speculator.eagle3 model card, vLLM 0.11.0: mean "
             "acceptance length for k = 1..7 on {dataset}")


class Preset(NamedTuple):
    """Per-position acceptance, by chain length: `by_k[k - 1]` holds p_1..p_k measured with k drafts
    (a preset measured at one k only holds that row); `proposal_rate`: the share of steps that propose."""

    by_k: tuple[tuple[float, ...], ...]
    source: str
    proposal_rate: float = 1.0


def _steps(lengths: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
    """Per-position rates from mean acceptance lengths at k = 1, 2, ...: p_i = L(i) - L(i - 1), L(0) = 1."""
    rates, last = [], 1.0
    for length in lengths:
        rates.append(round(max(0.0, length - last), 3))
        last = length
    for i in range(1, len(rates)):  # a noisy card may rise: keep the rates non-increasing
        rates[i] = min(rates[i], rates[i - 1])
    return (tuple(rates),)


PRESETS: dict[str, dict[str, Preset]] = {
    "eagle": {
        "sharegpt": Preset(((0.661,), (0.638, 0.401), (0.622, 0.381, 0.252), (0.612, 0.369, 0.241, 0.169),
                            (0.605, 0.361, 0.233, 0.162, 0.118)), _SDB.format(n=310, dataset="ShareGPT")),
        "gsm8k": Preset(((0.699,), (0.686, 0.448), (0.675, 0.437, 0.279), (0.668, 0.432, 0.276, 0.181),
                         (0.667, 0.431, 0.274, 0.18, 0.113)), _SDB.format(n=300, dataset="GSM8K")),
        "cnn_dailymail": Preset(((0.674,), (0.659, 0.424), (0.648, 0.412, 0.269), (0.641, 0.405, 0.262, 0.175),
                                 (0.635, 0.399, 0.257, 0.17, 0.117)), _SDB.format(n=300, dataset="CNN/DailyMail")),
        "instructcoder": Preset(((0.681,), (0.651, 0.444), (0.63, 0.42, 0.298), (0.616, 0.4, 0.285, 0.214),
                                 (0.608, 0.39, 0.27, 0.202, 0.155)), _SDB.format(n=500, dataset="InstructCoder")),
    },
    "ngram": {
        "sharegpt": Preset(((1.0,), (0.797, 0.643), (0.68, 0.544, 0.452), (0.603, 0.477, 0.395, 0.342),
                            (0.561, 0.43, 0.351, 0.304, 0.267)), _SDB.format(n=310, dataset="ShareGPT"), 0.236),
        "gsm8k": Preset(((0.547,), (0.461, 0.272), (0.423, 0.246, 0.151), (0.401, 0.231, 0.14, 0.089),
                         (0.39, 0.22, 0.132, 0.084, 0.059)), _SDB.format(n=300, dataset="GSM8K"), 0.2),
        "cnn_dailymail": Preset(((0.512,), (0.414, 0.309), (0.36, 0.267, 0.207), (0.329, 0.241, 0.186, 0.146),
                                 (0.308, 0.224, 0.171, 0.135, 0.107)), _SDB.format(n=300, dataset="CNN/DailyMail"),
                                0.4),
        "instructcoder": Preset(((0.636,), (0.536, 0.492), (0.465, 0.426, 0.393), (0.42, 0.38, 0.352, 0.332),
                                 (0.382, 0.345, 0.311, 0.296, 0.277)), _SDB.format(n=500, dataset="InstructCoder"),
                                0.8),
    },
    "eagle3": {
        "humaneval": Preset(_steps((1.83, 2.45, 2.94, 3.26, 3.47, 3.57, 3.62)), _MAVERICK.format(dataset="HumanEval")),
        "gsm8k": Preset(_steps((1.86, 2.56, 3.08, 3.53, 3.73, 3.91, 4.02)), _MAVERICK.format(dataset="GSM8K")),
        "cnn_dailymail": Preset(_steps((1.69, 2.12, 2.37, 2.52, 2.60, 2.63, 2.63)),
                                _MAVERICK.format(dataset="CNN/DailyMail")),
    },
    "mtp": {
        "gpqa": Preset(((0.92, 0.68, 0.38),), "SpecDecode-Bench (arXiv 2601.11580): GLM-4.5-Air's MTP layer on "
                       "GPQA-Main, vLLM v0.11.1, per-position acceptance 0.92 / 0.68 / 0.38"),
        "deepseek_v3": Preset(((0.875,),), "DeepSeek-V3 technical report (arXiv 2412.19437, 5.4.3): the second "
                              "token's acceptance rate is 85-90% across generation topics"),
    },
}
# The preset a method takes when the scenario names none: the dataset its source measured first, or the
# most conservative of its use cases (eagle3: summarization).
DEFAULT_PRESET = {"eagle": "sharegpt", "ngram": "sharegpt", "eagle3": "cnn_dailymail", "mtp": "gpqa"}


class Acceptance(NamedTuple):
    """Resolved acceptance for k drafts: p_1..p_k (unconditional, non-increasing), the share of steps that
    propose drafts, and where the figures come from."""

    rates: tuple[float, ...]
    proposal_rate: float
    source: str

    @property
    def mean_tokens(self) -> float:
        """Expected tokens a step yields per sequence: 1 + q * (p_1 + ... + p_k)."""
        return 1.0 + self.proposal_rate * sum(self.rates)


def preset_rates(method: str, dataset: str, k: int) -> Acceptance:
    """The preset's rates for k drafts (KeyError: no such preset)."""
    preset = PRESETS[method][dataset]
    rows = preset.by_k
    if k <= len(rows) and len(rows[k - 1]) == k:
        return Acceptance(rows[k - 1], preset.proposal_rate, preset.source)
    base = rows[-1]
    if k <= len(base):
        return Acceptance(base[:k], preset.proposal_rate, f"{preset.source}; the first {k} of its positions")
    return Acceptance(extend(base, k), preset.proposal_rate,
                      f"{preset.source}; positions {len(base) + 1}-{k} extrapolated geometrically (estimate)")


def extend(rates: tuple[float, ...], k: int) -> tuple[float, ...]:
    """Rates continued to k positions at the ratio of the last two (of the last one alone: p_1)."""
    out = list(rates)
    ratio = out[-1] / out[-2] if len(out) > 1 and out[-2] > 0 else out[-1]
    while len(out) < k:
        out.append(round(out[-1] * min(ratio, 1.0), 6))
    return tuple(out)


def iid_rates(a: float, k: int) -> tuple[float, ...]:
    """p_i = a^i: each draft accepted with probability a given the ones before it were."""
    return tuple(a ** i for i in range(1, k + 1))


def expected_tokens(rates, proposal_rate: float = 1.0) -> float:
    """1 + q * sum(p_i): the per-position generalisation of (1 - a^(k+1)) / (1 - a)."""
    return 1.0 + proposal_rate * sum(rates)
