"""End-to-end serving measurements in AIConfigurator's ``silicon`` CSV format, as experiments.

Each row of such a file (``serving/aiconfigurator_silicon_dev.csv``, see its README) is one
deployment of one engine, driven by closed-loop clients at a fixed concurrency (``silicon_
concurrency=N`` inside ``silicon_data_source``) with fixed input and output lengths, and the
measured TTFT and TPOT (milliseconds). Rows that repeat another row in every column but ``id``
and ``silicon_data_source`` are the same measurement imported twice and are dropped first; so are
rows that repeat one in every column but those and ``model_path``, where both model names are of one
architecture (the same catalogue model) and both sources give the same ``measured=`` day: the
file holds 173 DeepSeek-V3 measurements a second time as DeepSeek-R1's, from another dump, with
the very same TTFT and TPOT floats (:func:`alias_duplicates`). Some rows file their layout with
``tp_size`` (or ``attention_dp_size``) multiplied by ``moe_ep_size`` (TP 64 on an 8-GPU node for
TP 8 and EP 8): they are read as the real layout (:func:`ep_multiplied`), and those that then
repeat another row are dropped as well; so are vLLM rows filing attention DP equal to their TP,
which measure their siblings without it (:func:`dp_as_tp`), and disaggregated rows without worker
counts whose very floats a row with them holds (:func:`workerless_twins`). Each dropped row is
listed with the reason, like every row that is not replayed.

:func:`read_serving_file` turns every row the simulator can express into an experiment document
(model, GPU, engine, parallelism, precision, closed-loop workload) and every other row into a
reason, so that nothing is skipped silently.

Parallelism, as AIConfigurator's columns say it (``_estimate_args`` of its reader): one
aggregated worker has ``tp_size x max(attention_dp_size, 1) x pp_size`` GPUs; with attention data
parallelism each of the ``attention_dp_size`` ranks runs attention at TP ``tp_size`` and the MoE
layers span all ranks (``moe_tp_size x moe_ep_size`` GPUs). servesim's ``deployment.tp/dp/pp/ep``
says the same (a replica is ``tp x dp x pp`` GPUs; ``ep`` the expert-parallel degree), so the
columns map one to one; combinations servesim cannot run (MoE TP and EP both above 1 under
attention DP, TP spanning NVLink domains, heads not divisible) are refused by its own checks and
listed with that reason. A disaggregated row names ``prefill_num_workers`` workers of
``prefill_tp_size x prefill_attention_dp_size`` GPUs and ``decode_num_workers`` of the decode
sizes: a ``deployment.kind: disaggregated`` with those groups. Rows that do not say how many
workers they had (most of the disaggregated ones) are listed as such.

Assumptions where the file is silent: the engine flags AIConfigurator's generator gives the
deployments it measures (:mod:`servesim.calibration.aic_flags`: step budget, seats, CUDA-graph
sizes, an FP8 KV cache for FP8 and NVFP4 checkpoints), the engine's defaults for the rest, and
``max_model_len`` set to the row's input + output length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesim.calibration.aic_flags import (
    aggregated_flags,
    aggregated_policy,
    disaggregated_flags,
    generator_deployed,
    kv_cache_dtype,
)
from servesim.calibration.inferencex_flags import inferencex_attention_dp, inferencex_mtp_budget
from servesim.calibration.serving_speculation import speculation
from servesim.dtypes import DType
from servesim.engines import ENGINES as ENGINE_MODELS
from servesim.engines.sglang import GB as GIB
from servesim.engines.sglang import legacy_reserved_gb, mem_fraction_static
from servesim.errors import ServesimError
from servesim.hardware_io import load_hardware
from servesim.inputs.files import read_text
from servesim.model_config import load_model
from servesim.resources import model_configs_dir

REQUIRED = ("backend", "model_path", "system", "mode", "isl", "osl", "tp_size", "silicon_data_source",
            "silicon_ttft_ms", "silicon_tpot_ms")
KEY_EXCLUDED = ("id", "silicon_data_source")
MEASURED_FLOATS = ("silicon_ttft_ms", "silicon_tpot_ms")
"""Compared to 12 significant digits when finding one measurement filed twice (:func:`same_float_text`)."""
HARDWARE = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200", "b300_sxm": "b300",
            "gb200": "gb200-nvl72", "gb300": "gb300-nvl72", "a100_sxm": "a100-sxm-80gb", "l40s": "l40s",
            "h20": "h20", "h100_pcie": "h100-pcie-80gb"}
"""AIConfigurator systems -> hardware profiles (its ``systems/`` names; A100 SXM is one of its
kernel-data systems, the others are the profiles servesim has for the same parts)."""
FP4_SYSTEMS = frozenset({"b200_sxm", "b300_sxm", "gb200", "gb300"})
"""Systems whose profiles price FP4 GEMMs (Blackwell; with the FP8 GEMM curve, an estimate)."""
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
          "Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
          "deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
          "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
          "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
          "moonshotai/Kimi-K2.5": "kimi-k2"}
"""Hugging Face ids -> catalogue models of the same architecture: DeepSeek-R1 and V3.1 are
DeepSeek-V3's; NVIDIA's FP8/NVFP4 checkpoints are quantisations of the model they name (the
precision columns say which); Kimi-K2.5's language model is Kimi-K2's (an assumption: its
``text_config`` shapes, DeepSeek-V3 layout with 64 heads and 384 experts, were not read here; the
vision encoder is not modelled, and these text prompts never run it)."""
SAME_ARCHITECTURE = {
    "llama-3.3-70b": "llama-3.1-70b", "deepseek-r1": "deepseek-v3", "deepseek-v3.1": "deepseek-v3",
    "deepseek-v3-0324": "deepseek-v3", "deepseek-r1-0528": "deepseek-v3", "kimi-k2.5": "kimi-k2",
    "minimax-m2": "minimax-m2.5", "minimax-m2.1": "minimax-m2.5",
    "llama-4-maverick-17b-128e": "llama-4-maverick", "llama-4-scout-17b-16e": "llama-4-scout",
    "glm-4.5": "glm-4.7", "glm-4.6": "glm-4.7", "deepseek-v3.1-terminus": "deepseek-v3",
    "deepseek-v3.2-exp": "deepseek-v3.2", "deepseek-v3.2-speciale": "deepseek-v3.2", "glm-5.1": "glm-5",
    "qwen3-vl-235b-a22b": "qwen3-235b-a22b", "qwen3-coder-30b-a3b": "qwen3-30b-a3b",
    "deepseek-r1-distill-llama-70b": "llama-3.1-70b", "deepseek-r1-distill-llama-8b": "llama-3.1-8b",
    "qwen3-vl-8b": "qwen3-8b", "qwen3-vl-32b": "qwen3-32b", "qwen3-vl-30b-a3b": "qwen3-30b-a3b"}
"""Normalised checkpoint names -> the catalogue model of the same architecture (a later release
or a fine-tune with the shapes of one already in the catalogue, or a vision model read for its
language model: Llama 3.3 70B is Llama 3.1 70B's, Qwen3-VL-235B's is Qwen3-235B's (and the
8B's, 32B's and 30B-A3B's are Qwen3's of that size),
DeepSeek-R1 and V3.1 are V3's, MiniMax-M2 and M2.1 are M2.5's, GLM-4.5 and 4.6 are 4.7's,
Qwen3-Coder-30B-A3B is Qwen3-30B-A3B's with a longer context, DeepSeek's R1 distillations of Llama
are the Llama they were distilled into). GLM-4.5-Air and GLM-4.7-Flash are smaller architectures
of their own (entries of their own), as is Qwen3-Coder-480B-A35B.
DeepSeek-V3.2 and GLM-5 are their own (sparse attention) entries."""
CHECKPOINT_SUFFIX = re.compile(r"-(instruct|it|chat|base|hf|thinking|fp8|fp8-dynamic|fp4|nvfp4|mxfp4|awq|"
                               r"gptq|int4|int8|w4a16|w8a8|w4a8|bf16|\d{4}|fp4-v\d|fp8-v\d)$")
"""What a checkpoint's name adds to its architecture's (tuning, quantisation, a release date)."""


@cache
def catalogue_model(hf_model: str) -> str | None:
    """The catalogue model a serving file's ``model_path`` runs: :data:`MODELS` for the file's own,
    else its name without the organisation, the checkpoint suffixes (:data:`CHECKPOINT_SUFFIX`,
    as often as they repeat) and Meta's ``meta-`` and NVIDIA's ``nvidia-`` prefixes, read through
    :data:`SAME_ARCHITECTURE`;
    None when that is not in the catalogue (the row is then listed as a model it cannot read).
    Remembered per name: a file asks for each of its thousands of rows three times."""
    if hf_model in MODELS:
        return MODELS[hf_model]
    name = hf_model.split("/")[-1].lower()
    while (shorter := CHECKPOINT_SUFFIX.sub("", name)) != name:
        name = shorter
    name = name.removeprefix("meta-").removeprefix("nvidia-")
    name = SAME_ARCHITECTURE.get(name, name)
    return name if (model_configs_dir() / f"{name}.json").is_file() else None


ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")
MEASURED_ON = re.compile(r"measured=([^;]*)")
RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
DUPLICATE = "repeats an earlier row's measurement (imported twice)"
ALIAS = "repeats an earlier row's measurement under another name of the same architecture"
EP_TWIN = "repeats another row's measurement, filed with its tp or attention dp multiplied by its ep"
WORKERLESS_TWIN = ("repeats the measurement of a disaggregated row that records its worker counts "
                   "(the same floats), without them")
"""The reasons a dropped duplicate is listed with (:func:`read_serving_file`)."""


PRECISIONS = {"bf16": {"weights": "bf16", "activations": "bf16"},
              "fp8": {"weights": "fp8", "activations": "fp8"},
              "fp4": {"weights": "nvfp4", "activations": "nvfp4"},
              "int4": {"weights": "int4", "activations": "bf16"},
              "mxfp4": {"weights": "bf16", "activations": "bf16", "expert_weights": "mxfp4"}}
"""A row's precision -> servesim's weights and activations: fp8 and nvfp4 GEMMs quantise both
(W8A8, W4A4); ``int4_wo`` is weight-only; ``mxfp4`` experts (gpt-oss's checkpoint: ``w4a16_mxfp4``)
beside 16-bit attention and dense layers, as the checkpoint ships them."""


@dataclass(frozen=True)
class ServingRow:
    """One expressible measurement: where it came from, the experiment that replays it, and
    what was measured."""

    row: int
    """Line of the file (1 = the first data row after the header)."""
    engine: str
    model: str
    hf_model: str
    gpu: str
    tp: int
    precision: str
    isl: int
    osl: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    version: str
    pp: int = 1
    dp: int = 1
    ep: int = 1
    prefill: tuple[int, int, int, int] | None = None
    """Disaggregated: (workers, tp, dp, ep) of the prefill group; None when aggregated."""
    decode: tuple[int, int, int, int] | None = None
    """Disaggregated: (workers, tp, dp, ep) of the decode group."""
    prefill_batch: int | None = None
    """Disaggregated: the row's ``prefill_batch_size`` (requests per prefill rank), when recorded."""
    decode_batch: int | None = None
    """Disaggregated: the row's ``decode_batch_size`` (requests per decode rank), when recorded."""
    measured_on: str = ""
    """The ISO day the row was measured (its ``measured=``), else the earliest such day of the
    file's rows of the same engine and version (one release is measured in one campaign), else
    empty: which of the generator's dated rules deployed it (:mod:`~servesim.calibration.aic_flags`)."""
    speculative: dict[str, Any] | None = None
    """The ``speculative`` section the deployment ran with where the file does not record it
    (:mod:`~servesim.calibration.serving_speculation`), else None."""
    generated: bool = True
    """Whether AIConfigurator's generator deployed it (its own campaigns, not InferenceX's:
    :func:`~servesim.calibration.aic_flags.generator_deployed`): only then do its templates' KV
    fractions apply."""
    length_spread: float = 0.0
    """Half-width of the replay's output lengths as a fraction of ``osl`` (0: every request
    generates exactly ``osl`` tokens, as the benchmark asked). A deterministic replay of fixed
    lengths can hold its clients in exact lock-step for ever (a prefill-first scheduler finishes a
    whole round in one step); a spread of a few per cent breaks that, as an experiment on what the
    measurements say about phase (README, Calibration: "Lock-step, an open question")."""

    def deployment(self) -> dict[str, Any]:
        """The ``deployment`` section: one worker's parallelism, or the two groups of a
        disaggregated row (with the memory fraction of an SGLang release before 0.5.3)."""
        if self.prefill is None or self.decode is None:
            return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep,
                    **self._legacy_memory(self.tp * self.dp)}
        groups = {}
        for role, (workers, tp, dp, ep) in (("prefill", self.prefill), ("decode", self.decode)):
            groups[role] = {"replicas": workers, "tp": tp, "dp": dp, "ep": ep, **self._legacy_memory(tp * dp)}
        return {"kind": "disaggregated", **groups}

    def _legacy_memory(self, tp_size: int) -> dict[str, float]:
        """``gpu_memory_utilization`` of an SGLang release before 0.5.3, whose default
        ``mem_fraction_static`` came from the older rule (:func:`~servesim.engines.sglang.
        legacy_reserved_gb`; the engine models the rule of 0.5.3 on), else nothing."""
        if self.engine != "sglang" or not before_release(self.version, (0, 5, 3)):
            return {}
        hbm = load_hardware(HARDWARE[self.gpu]).memory.capacity_bytes
        return {"gpu_memory_utilization": mem_fraction_static(hbm, legacy_reserved_gb(hbm, tp_size) * GIB)}

    def engine_flags(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(deployment keys, engine knobs) the replay assumes where the file is silent: the flags
        AIConfigurator's generator gives an aggregated worker (:mod:`servesim.calibration.aic_flags`;
        its batch is per attention-DP rank), or a disaggregated row's groups (the keys of each
        group under ``prefill`` and ``decode``). An InferenceX worker (not the generator's) adds its
        scripts' TensorRT-LLM ``attention_dp_config`` with attention DP, and their
        ``max_num_tokens`` with MTP (:mod:`~servesim.calibration.inferencex_flags`)."""
        if self.prefill is not None:
            return disaggregated_flags(self.engine, self.isl, self.prefill_batch, self.decode_batch,
                                       self.generated)
        per_rank = -(-self.concurrency // self.dp)  # rounded up
        flags, knobs = aggregated_flags(self.engine, self.isl, per_rank, self.measured_on, self.generated)
        if self.generated:
            return flags, knobs
        if self.dp > 1:
            knobs = {**knobs, **inferencex_attention_dp(self.engine)}
        if self.speculative is not None and "max_num_batched_tokens" in flags:
            proposals = int(self.speculative["num_speculative_tokens"])
            flags = {**flags, "max_num_batched_tokens": inferencex_mtp_budget(self.isl, per_rank, proposals)}
        return flags, knobs

    def policy(self) -> dict[str, Any] | None:
        """The ``policy`` section where the generator's rules change the engine's default
        scheduling (SGLang's mixed chunks from 2026-01-19), else None."""
        return None if self.prefill is not None else aggregated_policy(self.engine, self.measured_on)

    def engine_version(self) -> str | None:
        """The engine version the replay models: the row's ``backend_version`` as ``major.minor``
        when the engine models that release (vLLM's async-scheduling default changed at 0.14), else
        None (the engine's default: a nightly build, an empty field, a release not modelled)."""
        match = re.match(r"(\d+)\.(\d+)", self.version)
        if match is None:
            return None
        release = f"{int(match.group(1))}.{int(match.group(2))}"
        return release if release in ENGINE_MODELS[self.engine].versions else None

    def step_budget(self) -> int | str:
        """The step budget the replay assumes (the prefill group's, disaggregated), or ``engine
        default``."""
        flags, knobs = self.engine_flags()
        worker = flags.get("prefill", {}) if self.prefill is not None else flags
        budget = worker.get("max_num_batched_tokens")
        if budget is None and "max_prefill_tokens" in knobs:
            return f"max_prefill_tokens {knobs['max_prefill_tokens']}"
        return budget if budget is not None else "engine default"

    def formats(self) -> dict[str, str]:
        """Weights and activations as the row's precision deploys them on its GPU: an FP8
        checkpoint on a GPU without FP8 tensor cores (A100) runs weight-only, as vLLM's Marlin
        kernels run it."""
        formats = dict(PRECISIONS[self.precision])
        if formats["activations"] == "fp8" and DType.FP8 not in load_hardware(HARDWARE[self.gpu]).peak_flops:
            formats["activations"] = "bf16"
        return formats

    def kv_cache(self) -> str:
        """The KV cache dtype the replay assumes (AIConfigurator's, from the checkpoint)."""
        return kv_cache_dtype(self.hf_model, self.engine, self.precision)

    def output_spread(self) -> int:
        """Tokens each side of ``osl`` the replay's output lengths spread over (at least one when
        ``length_spread`` is set, never as many as ``osl``)."""
        if self.length_spread <= 0:
            return 0
        return min(self.osl - 1, max(1, round(self.osl * self.length_spread)))

    def document(self, requests_per_client: int,
                 engine_knobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experiment replaying this row: ``concurrency`` closed-loop clients, each sending
        ``requests_per_client`` requests of ``isl`` + ``osl`` tokens."""
        # Benchmark prompts are random tokens: no prefix is ever shared, so the prefix cache (on in
        # every engine here) would only cost simulation time.
        spread = self.output_spread()
        deployment: dict[str, Any] = {**self.deployment(), "max_model_len": self.isl + self.osl + spread,
                                      "enable_prefix_caching": False}
        flags, knobs = self.engine_flags()
        version = self.engine_version()
        if version is not None:
            knobs = {**knobs, "version": version}
        for key, value in flags.items():
            deployment[key] = {**deployment[key], **value} if isinstance(value, dict) else value
        policy = self.policy()
        return {
            "name": f"row{self.row}", "model": self.model, "hardware": HARDWARE[self.gpu],
            "engine": {"name": self.engine, **knobs, **(engine_knobs or {})},
            **({"policy": policy} if policy is not None else {}),
            **({"speculative": self.speculative} if self.speculative is not None else {}),
            "deployment": deployment,
            "precision": {**self.formats(), "kv_cache": self.kv_cache()},
            "workload": {"arrival": {"process": "closed", "concurrency": self.concurrency},
                         "num_requests": self.concurrency * requests_per_client,
                         "prompt": {"dist": "fixed", "value": self.isl},
                         "output": ({"dist": "uniform", "low": self.osl - spread, "high": self.osl + spread}
                                    if spread else {"dist": "fixed", "value": self.osl})},
            "output": "summary"}


@dataclass
class ServingFile:
    """A serving file read: the rows to replay and the others, each with its reason."""

    path: Path
    total: int
    duplicates: int
    """Rows dropped as another row's measurement: imported twice, or under a second name of the
    same architecture (:func:`alias_duplicates`, counted in ``aliases`` too)."""
    rows: list[ServingRow] = field(default_factory=list)
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)
    aliases: int = 0
    """Of ``duplicates``, those filed under another model name of the same architecture."""
    ep_multiplied: int = 0
    """Rows whose layout was filed with tp or attention dp multiplied by ep (:func:`ep_multiplied`),
    read as their twins file it."""
    ep_twins: int = 0
    """Of ``duplicates``, those that repeat another row once its layout is read so."""
    dp_as_tp: int = 0
    """vLLM rows filed with attention DP equal to their TP that measure their sibling without it,
    read as that sibling's layout (:func:`dp_as_tp`)."""
    workerless_twins: int = 0
    """Of ``duplicates``, disaggregated rows without worker counts whose measurement a row with
    them holds (:func:`workerless_twins`)."""
    unique: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The file's rows (as text) with the duplicates dropped, replayable or not: what
    :mod:`~servesim.calibration.serving_noise` compares re-measurements in."""

    def skipped_by_reason(self) -> dict[str, int]:
        if self.skipped.empty:
            return {}
        return {str(k): int(v) for k, v in self.skipped["reason"].value_counts().items()}


def alias_duplicates(raw: pd.DataFrame, deflated: np.ndarray | None = None) -> np.ndarray:
    """Per row of ``raw`` (exact repeats already dropped), whether it repeats an earlier row in
    every column but ``id``, ``silicon_data_source`` and ``model_path``, with a model of the same
    architecture (:func:`catalogue_model`; a model not in the catalogue is only itself) and the same
    ``measured=`` day in its source (one dump keeps the time of day, the other truncates it to
    midnight): one measurement filed under two names, kept once (the first). Where one of the
    rows had its layout read from tp or dp multiplied by ep (``deflated``), ``batch_size`` is left
    out of the comparison too: it follows the filed ranks (:func:`read_serving_file`'s twins)."""
    key = raw.drop(columns=[*KEY_EXCLUDED, "model_path"])
    key["architecture"] = raw["model_path"].map(lambda name: catalogue_model(name) or name)
    key["measured_on"] = raw["silicon_data_source"].map(lambda source: measured_day(source) or source)
    repeated = key.duplicated(keep="first").to_numpy()
    if deflated is None or not deflated.any() or "batch_size" not in key.columns:
        return repeated
    loose = key.drop(columns=["batch_size"])
    groups = loose.groupby(list(loose.columns), sort=False, dropna=False).ngroup().to_numpy()
    has_deflated = pd.Series(deflated).groupby(groups).transform("any").to_numpy(bool)
    return repeated | (loose.duplicated(keep="first").to_numpy() & has_deflated)


def same_float_text(text: str) -> str:
    """A measured float as text to 12 significant digits: the file holds some measurements twice,
    re-exported with the last digit of a 17-digit float changed (a TPOT of 15.873633393639292 ms
    and 15.873633393639293 ms on the same day), which must compare equal. Text that is not a
    finite number stays as it is (the row is then listed with its reason)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return f"{value:.12g}" if np.isfinite(value) else text


def workerless_twins(raw: pd.DataFrame) -> np.ndarray:
    """Per row of ``raw``, whether it is a disaggregated row without worker counts whose measurement
    another row records with them: the same engine, release, GPU system, precision, lengths,
    client concurrency and model architecture, and the very same TTFT and TPOT floats. The file
    holds 203 such pairs (a DeepSeek-V3 row of one dump with its workers, the DeepSeek-R1 row of
    another without), so a row without workers is often a measurement that is replayed already."""
    disaggregated = raw["mode"].to_numpy() == "disagg"
    rows = zip(disaggregated, raw.iterrows(), strict=True)
    recorded = np.array([flag and _group(row, "prefill") is not None and _group(row, "decode") is not None
                         for flag, (_, row) in rows], dtype=bool)
    key = raw[["backend", "backend_version", "system", "precision", "isl", "osl", "silicon_ttft_ms",
               "silicon_tpot_ms"]].copy()
    key["concurrency"] = raw["silicon_data_source"].map(
        lambda source: match.group(1) if (match := CONCURRENCY.search(str(source))) else "")
    key["architecture"] = raw["model_path"].map(lambda name: catalogue_model(name) or name)
    keys = list(key.itertuples(index=False, name=None))
    with_workers = {k for k, flag, has in zip(keys, disaggregated, recorded, strict=True) if flag and has}
    return np.array([flag and not has and k in with_workers
                     for k, flag, has in zip(keys, disaggregated, recorded, strict=True)], dtype=bool)


def dp_as_tp(raw: pd.DataFrame) -> np.ndarray:
    """Per row of ``raw``, whether it is a vLLM aggregated row that files attention data
    parallelism equal to its TP (``attention_dp_size == tp_size`` above 1, MoE TP 1, EP their
    product: MiniMax-M2.5 ``tp 2, dp 2, ep 4`` and ``tp 4, dp 4, ep 16``, Kimi-K2.5 ``tp 4, dp 4,
    ep 16``) for a deployment that ran on ``tp_size`` GPUs without DP ranks. The file's 115 such rows
    with a sibling (the same release, model, GPU, precision, lengths and clients, filed at
    ``tp_size`` GPUs with EP ``tp_size`` and no DP) measure the sibling's TPOT within 5% in 95% of
    the pairs (median ratio 1.00) and its TTFT within a few per cent, where ``tp x dp`` GPUs whose
    DP ranks each decode a ``dp``-th of the batch would measure a TPOT 1.5-2x lower at 128 clients
    and more. They are read as that sibling's layout (:func:`deflate_dp_as_tp`)."""
    tp, dp, moe_tp, ep = _layout(raw)
    return ((raw["backend"].to_numpy() == "vllm") & (raw["mode"].to_numpy() == "agg") & (tp > 1)
            & (dp == tp) & (moe_tp == 1) & (ep == tp * dp))


def _layout(raw: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every row's (``tp_size``, ``attention_dp_size``, ``moe_tp_size``, ``moe_ep_size``) as
    degrees (:func:`_degree` of a whole column: empty, 0 or missing mean 1)."""
    def degree(column: str) -> np.ndarray:
        values = pd.to_numeric(raw[column], errors="coerce").fillna(1).to_numpy(float)
        return np.where(values >= 1, values, 1).astype(np.int64)

    return degree("tp_size"), degree("attention_dp_size"), degree("moe_tp_size"), degree("moe_ep_size")


def deflate_dp_as_tp(raw: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """``raw`` with the layouts of ``rows`` (:func:`dp_as_tp`) as their siblings file them: no
    attention DP, EP ``tp_size``."""
    out = raw.copy()
    for label in raw.index[rows]:
        out.loc[label, "moe_ep_size"] = out.loc[label, "tp_size"]
        out.loc[label, "attention_dp_size"] = "1"
    return out


def ep_multiplied(raw: pd.DataFrame) -> np.ndarray:
    """Per row of ``raw``, whether its layout is filed with ``tp_size`` (or ``attention_dp_size``)
    multiplied by ``moe_ep_size``, the MoE TP set to the real TP (or DP): an aggregated row on
    more GPUs than the system's NVLink domain whose ``moe_tp_size`` equals its ``moe_ep_size``
    (above 1) and whose ``tp_size x attention_dp_size`` is their product. The file's own evidence:
    41 such rows (DeepSeek on 8-GPU B200 and H200 nodes: TP 16 and 64, DP 16 and 64) repeat another
    row's TTFT and TPOT to the last digit, and in every one the other row has the layout
    ``tp_size / moe_ep_size`` (or ``attention_dp_size / moe_ep_size``) with MoE TP 1 and the same
    EP: TP 64 / EP 8 is TP 8 / EP 8 on one node; and no row within one node has MoE TP equal to EP
    above 1. The other 190 rows of that signature are read as their twins are
    (:func:`deflate_ep_multiplied`)."""
    tp, dp, moe_tp, ep = _layout(raw)
    domain = raw["system"].map(lambda system: _domain_gpus(str(system))).to_numpy(np.int64)
    one_kind = (tp == 1) | (dp == 1)
    return ((raw["mode"].to_numpy() == "agg") & (ep > 1) & (moe_tp == ep) & (tp * dp == moe_tp * ep)
            & one_kind & (domain > 0) & (tp * dp > domain))


def deflate_ep_multiplied(raw: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """``raw`` with the layouts of ``rows`` (:func:`ep_multiplied`) as their twins file them:
    ``tp_size`` (or ``attention_dp_size``) divided by ``moe_ep_size``, ``moe_tp_size`` 1."""
    out = raw.copy()
    for label in raw.index[rows]:
        row = out.loc[label]
        ep = _degree(row, "moe_ep_size")
        column = "tp_size" if _degree(row, "tp_size") > 1 else "attention_dp_size"
        out.loc[label, column] = str(_degree(row, column) // ep)
        out.loc[label, "moe_tp_size"] = "1"
    return out


@cache
def _domain_gpus(system: str) -> int:
    """GPUs of a system's NVLink domain (its profile's ``fast_domain_gpus``), 0 when unknown."""
    profile = HARDWARE.get(system)
    if profile is None:
        return 0
    return load_hardware(profile).fast_domain_gpus or 0


def before_release(version: str, release: tuple[int, int, int]) -> bool:
    """Whether ``version`` (``0.5.1.post1``, ``0.5.10.post1``) is a release before ``release``;
    False for one that names none (a nightly build, an empty field)."""
    match = RELEASE.match(version)
    return match is not None and tuple(int(part) for part in match.groups()) < release


def beyond_peak(row: ServingRow,
                capacities: dict[tuple[str, str, str], tuple[int, float] | None] | None = None) -> str | None:
    """Why an aggregated row's measurement cannot have done the work its lengths say, or None.

    A closed loop of ``c`` clients completes ``c / (TTFT + (osl - 1) TPOT)`` requests a second
    (Little's law), each at least ``2 x matmul parameters x (isl + osl)`` FLOPs (attention left
    out: a lower bound). When that is more than the deployment's GPUs can do at their dense peak
    in the row's math format, the prompts cannot all have been computed (the benchmark must have
    reused cached prefixes, which the replay of random prompts does not): the row is not
    replayed, with this reason. Three TensorRT-LLM Qwen3-32B NVFP4 rows of the serving file (15,000
    + 500 tokens at 416-448 clients) need 2.9-3.0 times the peak. ``capacities`` keeps each
    (model, GPU, precision)'s matmul parameters and peak for the next row (a file reads thousands)."""
    if row.prefill is not None:
        return None
    key = (row.model, row.gpu, row.precision)
    if capacities is None or key not in capacities:
        capacity = _capacity(*key)
        if capacities is not None:
            capacities[key] = capacity
    else:
        capacity = capacities[key]
    if capacity is None:  # no tensor cores for the format: the replay refuses it with its reason
        return None
    params, peak = capacity
    per_second = row.concurrency / (row.ttft_s + (row.osl - 1) * row.tpot_s)
    needed = per_second * 2.0 * params * (row.isl + row.osl)
    share = needed / (row.tp * row.pp * row.dp * peak)
    if share <= 1.0:
        return None
    return ("measured throughput exceeds the GPUs' dense peak compute for its prompt and output tokens "
            "(cached prefixes reused?)")


def _capacity(model: str, gpu: str, precision: str) -> tuple[int, float] | None:
    """(matmul parameters per token, dense peak FLOP/s of one GPU in the row's math format), or
    None when the GPU has no tensor cores for it."""
    hardware = load_hardware(HARDWARE[gpu])
    try:
        peak = hardware.peak(DType(PRECISIONS[precision]["activations"]))
    except ServesimError:
        return None
    return load_model(model).matmul_params_per_token, peak


def _serving_row(line: int, row: pd.Series, campaigns: dict[tuple[str, str], str]) -> ServingRow:
    """The experiment of a row :func:`_reason` accepts (line ``line`` of the file); ``campaigns``:
    the earliest measured day of each (engine, version), for rows that give none."""
    match = CONCURRENCY.search(str(row["silicon_data_source"]))
    assert match is not None
    disaggregated = str(row["mode"]) == "disagg"
    engine = ENGINES[str(row["backend"])]
    measured_on = (measured_day(str(row["silicon_data_source"]))
                   or campaigns.get((str(row["backend"]), str(row.get("backend_version", ""))), ""))
    return ServingRow(
        row=line, engine=engine, model=str(catalogue_model(str(row["model_path"]))),
        hf_model=str(row["model_path"]), gpu=str(row["system"]), tp=_degree(row, "tp_size"),
        precision=precision_of(row),
        isl=int(_number(row["isl"])), osl=int(_number(row["osl"])), concurrency=int(match.group(1)),
        ttft_s=_number(row["silicon_ttft_ms"]) * 1e-3, tpot_s=_number(row["silicon_tpot_ms"]) * 1e-3,
        version=str(row.get("backend_version", "")), pp=_degree(row, "pp_size"),
        dp=_degree(row, "attention_dp_size"), ep=_degree(row, "moe_ep_size"),
        prefill=_group(row, "prefill") if disaggregated else None,
        decode=_group(row, "decode") if disaggregated else None,
        speculative=None if disaggregated else speculation(
            engine, str(row.get("backend_version", "")), str(row["model_path"]),
            _degree(row, "attention_dp_size"), measured_on),
        prefill_batch=_batch(row, "prefill_batch_size") if disaggregated else None,
        decode_batch=_batch(row, "decode_batch_size") if disaggregated else None,
        measured_on=measured_on,
        generated=generator_deployed(str(row["silicon_data_source"])))


def measured_day(source: str) -> str:
    """The ISO day of a ``silicon_data_source``'s ``measured=`` (sources write a time of day or
    midnight), or empty."""
    match = MEASURED_ON.search(source)
    day = match.group(1).strip()[:10] if match else ""
    return day if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day) else ""


def campaign_days(raw: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(engine, version) -> the earliest ``measured=`` day of the file's rows of that release (the
    day an undated row of the release is taken to be measured on)."""
    days: dict[tuple[str, str], str] = {}
    versions = raw["backend_version"] if "backend_version" in raw.columns else [""] * len(raw)
    for backend, version, source in zip(raw["backend"], versions, raw["silicon_data_source"], strict=True):
        day = measured_day(str(source))
        key = (str(backend), str(version))
        if day and version and (key not in days or day < days[key]):
            days[key] = day
    return days


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return number


def _degree(raw: pd.Series, column: str) -> int:
    """A parallelism column as a degree: empty, 0 or missing mean 1 (not used)."""
    value = _number(raw.get(column))
    return int(value) if np.isfinite(value) and value >= 1 else 1


def _batch(raw: pd.Series, column: str) -> int | None:
    """A batch-size column as a whole number of requests, or None when not recorded."""
    value = _number(raw.get(column))
    return int(value) if np.isfinite(value) and value >= 1 else None


def _group(raw: pd.Series, role: str) -> tuple[int, int, int, int] | None:
    """(workers, tp, dp, ep) of a disaggregated row's ``role`` group, or None when not recorded."""
    workers = _number(raw.get(f"{role}_num_workers"))
    if not np.isfinite(workers) or workers < 1:
        return None
    return (int(workers), _degree(raw, f"{role}_tp_size"), _degree(raw, f"{role}_attention_dp_size"),
            _degree(raw, f"{role}_moe_ep_size"))


def precision_of(raw: pd.Series) -> str:
    """bf16, fp8, fp4, int4 or mxfp4, from the precision and quantisation columns (and an FP8/NVFP4
    checkpoint's name when the columns are empty)."""
    quant = " ".join(str(raw.get(c, "")).lower() for c in ("precision", "gemm_quant_mode", "moe_quant_mode"))
    name = str(raw.get("model_path", "")).lower()
    if "mxfp4" in quant:
        return "mxfp4"
    if "fp4" in quant or "nvfp4" in name:
        return "fp4"
    if "int4" in quant:
        return "int4"
    if "fp8" in quant or "fp8" in name:
        return "fp8"
    return "bf16"


def _reason(raw: pd.Series) -> str | None:
    """Why the simulator cannot replay this row, or None when it can."""
    if str(raw["mode"]) not in ("agg", "disagg"):
        return f"serving mode {raw['mode']!r} not known"
    if str(raw["mode"]) == "disagg" and (_group(raw, "prefill") is None or _group(raw, "decode") is None):
        return "disaggregated row without worker counts (AIConfigurator's own reader refuses these too)"
    if str(raw["backend"]) not in ENGINES:
        return f"engine {raw['backend']} not modelled"
    if str(raw["system"]) not in HARDWARE:
        return f"GPU system {raw['system']} has no profile"
    if precision_of(raw) == "fp4" and str(raw["system"]) not in FP4_SYSTEMS:
        return f"fp4 on {raw['system']} (no FP4 GEMMs)"
    if catalogue_model(str(raw["model_path"])) is None:
        return f"model {raw['model_path']} not in the catalogue"
    if not CONCURRENCY.search(str(raw["silicon_data_source"])):
        return "no client concurrency recorded"
    for column in ("isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms"):
        if not np.isfinite(_number(raw[column])) or _number(raw[column]) <= 0:
            return f"no {column}"
    if str(raw["mode"]) == "agg" and not (_number(raw["tp_size"]) >= 1):
        return "no tp_size"
    return None


def read_serving_file(path: Path) -> ServingFile:
    """The rows of ``path`` the simulator can replay, and the others with their reasons."""
    path = Path(path)
    read_text(path, "serving file")  # one-line errors for a missing or unreadable file
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ServesimError(str(path), f"not a CSV file ({exc.__class__.__name__})",
                            "give a file in AIConfigurator's silicon CSV format") from None
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise ServesimError(str(path), f"missing column(s) {', '.join(missing)}",
                            "give a file in AIConfigurator's silicon CSV format (see serving/README.md)")
    raw.index = np.arange(1, len(raw) + 1)
    for column in MEASURED_FLOATS:
        raw[column] = raw[column].map(same_float_text)
    key = [c for c in raw.columns if c not in KEY_EXCLUDED]
    repeated = raw.duplicated(subset=key, keep="first").to_numpy()
    deflated = ep_multiplied(raw) & ~repeated
    raw = deflate_ep_multiplied(raw, deflated)
    without_dp = dp_as_tp(raw) & ~repeated
    raw = deflate_dp_as_tp(raw, without_dp)
    # A row filed with tp or dp multiplied by ep, and its twin: the same measurement once the
    # layout is read (batch_size follows the filed ranks, so it is left out of the comparison)
    twin_key = [c for c in key if c != "batch_size"]
    groups = raw.groupby(twin_key, sort=False, dropna=False).ngroup().to_numpy()
    has_deflated = pd.Series(deflated).groupby(groups).transform("any").to_numpy(bool)
    twins = raw.duplicated(subset=twin_key, keep="first").to_numpy() & has_deflated & ~repeated
    distinct = raw[~repeated & ~twins]
    aliased = alias_duplicates(distinct, deflated[~repeated & ~twins])
    named = distinct[~aliased]
    workerless = workerless_twins(named)
    unique = named[~workerless]
    out = ServingFile(path, total=len(raw), duplicates=len(raw) - len(unique),
                      aliases=len(distinct) - len(named), unique=unique,
                      ep_multiplied=int(deflated.sum()), ep_twins=int(twins.sum()),
                      dp_as_tp=int(without_dp.sum()),
                      workerless_twins=int(workerless.sum()))
    skipped = [{"row": line, "backend": backend, "model": model, "system": system, "reason": reason}
               for rows, reason in ((raw[repeated], DUPLICATE), (raw[twins], EP_TWIN),
                                    (distinct[aliased], ALIAS), (named[workerless], WORKERLESS_TWIN))
               for line, backend, model, system in zip(rows.index.to_numpy(dtype=np.int64).tolist(),
                                                       rows["backend"], rows["model_path"], rows["system"],
                                                       strict=True)]
    capacities: dict[tuple[str, str, str], tuple[int, float] | None] = {}
    campaigns = campaign_days(raw)
    lines = unique.index.to_numpy(dtype=np.int64)
    for position in range(len(unique)):
        line = int(lines[position])
        row = unique.iloc[position]
        serving = _serving_row(line, row, campaigns) if (reason := _reason(row)) is None else None
        if serving is not None and (reason := beyond_peak(serving, capacities)) is None:
            out.rows.append(serving)
            continue
        skipped.append({"row": line, "backend": row["backend"], "model": row["model_path"],
                        "system": row["system"], "reason": reason})
    out.skipped = pd.DataFrame(skipped, columns=["row", "backend", "model", "system", "reason"])
    return out
