"""What proposes, and what it costs in memory and per pass.

- **draft_model**: any catalogue model or Hugging Face ``config.json`` that shares the target's
  vocabulary (vLLM requires the same tokenizer), at tensor parallelism 1 or the target's. Its
  weights and its own KV cache (every layer, per token) sit beside the target's on each GPU; vLLM
  puts the draft's KV in the same block pool, so a block holds both and the pool has fewer blocks.
  At tp 1 under a wider target the whole draft sits on one GPU of the group, which then has the
  least room and sizes every GPU's pool: that GPU is the one planned here.
- **eagle** (EAGLE-1/2) and **eagle3**: one decoder layer on the target's hidden states. By
  default it is shaped like one layer of the target (its attention and a dense MLP of the target's
  ``intermediate_size``), which is how the published heads are built; ``model:`` may name the
  head's own ``config.json`` instead. EAGLE-1 concatenates the token embedding and the feature and
  projects them back (``fc``: 2h x h, every pass) and samples with the target's LM head (shared:
  no extra weights, but its full-vocabulary GEMM runs every pass). EAGLE-3 fuses three target
  layers (``fc``: 3h x h, first pass only), feeds ``[embedding, feature]`` (2h wide) into its
  attention (an extra h x qkv GEMM every pass) and has its own LM head over a reduced draft
  vocabulary (32,000 tokens in the published Llama heads, or ``draft_vocab_size`` of its config).
  Heads share the target's embedding.
- **mtp**: the target's own multi-token-prediction layer (DeepSeek-V3: one MLA + MoE layer and an
  ``eh_proj`` of 2h x h; 11.5B parameters, DeepSeek's README_WEIGHTS), reused for every proposal
  as vLLM and SGLang do; it shares the target's embedding and LM head. Only for targets whose
  config has ``num_nextn_predict_layers``.
- **ngram**: prompt lookup on the CPU: no weights, no KV, no GPU pass.

Heads and draft models run in the deployment's precision (weights, activations, KV).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from servesim.cost import CostModel
from servesim.cost.speculative import ProposerPasses
from servesim.dtypes import Precision
from servesim.engines import RuntimeCosts
from servesim.errors import ServesimError
from servesim.hardware import HardwareProfile
from servesim.inputs.files import read_json
from servesim.model_config import load_model
from servesim.model_spec import ModelSpec
from servesim.speculative.schema import SpeculativeConfig

EAGLE3_DRAFT_VOCAB = 32000
"""The draft vocabulary of the published EAGLE-3 heads (``draft_vocab_size`` in
yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json), used when the head's config is not given."""


@dataclass(frozen=True)
class Proposer:
    """A resolved proposer: the network each pass runs and what it holds on each GPU."""

    method: str
    spec: ModelSpec | None
    """The network of one pass (None: n-gram lookup)."""
    tp: int
    passes: ProposerPasses | None
    weight_bytes: float
    """Per GPU, beyond the target's weights."""
    kv_bytes_per_token: float
    """Per GPU and token, beyond the target's KV (the draft's or head's own cache)."""

    def describe(self) -> dict[str, object]:
        return {"method": self.method, "network": self.spec.name if self.spec else None,
                "layers": self.spec.num_layers if self.spec else 0, "tp": self.tp,
                "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token}


def _shared_vocab_bytes(spec: ModelSpec, tp: int, lm_head: bool) -> float:
    """16-bit bytes per GPU of the embedding (and LM head) a head shares with the target."""
    params = spec.embedding_params + (spec.vocab_size * spec.hidden_size if lm_head else 0)
    return params / tp * 2.0


def _head_layer(target: ModelSpec, name: str, vocab: int) -> ModelSpec:
    """One decoder layer shaped like the target's, with a dense MLP, sampling over ``vocab``."""
    return _softmax_layer(replace(target, name=name, num_layers=1, moe=None, vocab_size=vocab,
                                  tie_word_embeddings=False, mtp_layers=0))


def _softmax_layer(spec: ModelSpec) -> ModelSpec:
    """A one-layer head of a hybrid model attends with the target's full (gated) attention, not
    its linear attention (Qwen3-Next's and Qwen3.5's MTP layer is a full-attention layer)."""
    if spec.linear_attention is None:
        return spec
    return replace(spec, layer_types=(), linear_attention=None)


def _head_from_config(path: str, target: ModelSpec, method: str) -> tuple[ModelSpec, int]:
    """The head's config.json as the checkpoint ships it; (spec, draft vocabulary)."""
    spec = load_model(path, "speculative.model")
    if spec.hidden_size != target.hidden_size:
        raise ServesimError("speculative.model", f"the head's hidden_size {spec.hidden_size} differs "
                            f"from {target.name}'s {target.hidden_size}",
                            f"give a {method} head trained for {target.name}")
    vocab = spec.vocab_size
    file = Path(path).expanduser()
    file = file / "config.json" if file.is_dir() else file
    if method == "eagle3" and file.is_file():
        raw = read_json(file, "speculative.model")
        vocab = int(raw.get("draft_vocab_size") or vocab) if isinstance(raw, dict) else vocab
    return replace(spec, vocab_size=vocab, mtp_layers=0), vocab


def resolve_proposer(config: SpeculativeConfig, target: ModelSpec, hardware: HardwareProfile,
                     tp: int, precision: Precision) -> Proposer:
    """The proposer of ``config`` for ``target`` on ``tp`` GPUs of ``hardware`` (errors name the
    ``speculative`` key at fault)."""
    method = config.method
    if method == "ngram":
        return Proposer(method, None, tp, None, 0.0, 0.0)
    weight, kv, group = precision.weight, precision.kv_cache, precision.group_size
    h = target.hidden_size
    fusion: tuple[tuple[int, int], ...] = ()
    if method == "draft_model":
        assert config.model is not None
        spec = load_model(config.model, "speculative.model")
        if spec.vocab_size != target.vocab_size:
            raise ServesimError("speculative.model", f"{spec.name}'s vocabulary ({spec.vocab_size:,}) "
                                f"differs from {target.name}'s ({target.vocab_size:,})",
                                "a draft model must share the target's tokenizer: pick one of its family")
        draft_tp = config.draft_tensor_parallel_size or tp
        if draft_tp not in (1, tp):
            raise ServesimError("speculative.draft_tensor_parallel_size",
                                f"{draft_tp} is neither 1 nor the deployment's tp {tp}", f"use 1 or {tp}")
        try:
            spec.check_tensor_parallel(draft_tp)
        except ServesimError as exc:
            raise ServesimError("speculative.draft_tensor_parallel_size", f"{spec.name}: {exc.problem}",
                                "use draft_tensor_parallel_size: 1") from None
        cost = CostModel(spec, hardware, draft_tp, precision, RuntimeCosts.none())
        return Proposer(method, spec, draft_tp, ProposerPasses(cost),
                        spec.weight_bytes(weight, group, draft_tp),
                        spec.kv_bytes_per_token(kv, draft_tp, group))
    if method == "mtp":
        if target.mtp_layers < 1:
            raise ServesimError("speculative.method", f"mtp: {target.name} has no multi-token-prediction "
                                "layers (its config has no num_nextn_predict_layers)",
                                "use eagle3, a draft_model or ngram for this model")
        moe = replace(target.moe, layers=(0,)) if target.moe is not None else None
        spec = _softmax_layer(replace(target, name=f"{target.name}-mtp", num_layers=1, moe=moe, mtp_layers=0))
        fusion = ((2 * h, h),)  # eh_proj over [embedding, hidden]
        shared = _shared_vocab_bytes(spec, tp, lm_head=not spec.tie_word_embeddings)
    else:
        if config.model:
            spec, vocab = _head_from_config(config.model, target, method)
        else:
            vocab = EAGLE3_DRAFT_VOCAB if method == "eagle3" else target.vocab_size
            spec = _head_layer(target, f"{target.name}-{method}-head", vocab)
        if method == "eagle":
            fusion = ((2 * h, h),)  # fc over [embedding, feature]
            shared = _shared_vocab_bytes(spec, tp, lm_head=True)
        else:
            shared = _shared_vocab_bytes(spec, tp, lm_head=False)
    try:
        spec.check_tensor_parallel(tp)
    except ServesimError as exc:
        raise ServesimError("speculative.model", f"{spec.name}: {exc.problem}",
                            "give a head whose heads the deployment's tp divides") from None
    cost = CostModel(spec, hardware, tp, precision, RuntimeCosts.none())
    if method == "eagle3":
        qkv = (spec.num_heads // tp + 2 * max(1, spec.num_kv_heads // tp)) * spec.head_dim
        passes = ProposerPasses(cost, pass_gemms=((h, qkv),), first_pass_gemms=((3 * h, h),))
        extra = 3 * h * h + h * qkv  # fc replicated, the wider QKV input split like QKV
    else:
        passes = ProposerPasses(cost, pass_gemms=fusion)
        extra = sum(k * n for k, n in fusion)
    fusion_bytes = extra * precision.weight.bytes_per_element(group)
    weights = spec.weight_bytes(weight, group, tp) - shared + fusion_bytes
    return Proposer(method, spec, tp, passes, weights, spec.kv_bytes_per_token(kv, tp, group))
