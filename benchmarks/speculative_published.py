"""Speculative decoding in servesim against published speedups. Prints markdown tables.

1. The engine's speculative overheads refitted from vLLM issue #20780 (Llama-3.1-8B, H100,
   batch 1, EAGLE-1 and EAGLE-3, k = 2..7), with each method also predicted from a fit to the
   other method alone (leave one method out).
2. Batch 1: simulated TPOT speedup against the measured one, same model, GPU, heads, k and
   acceptance (the presets read from the same issue).
3. Batch 64: EAGLE-3 paper (arXiv 2503.01840): SGLang, H100, Llama-3.1-8B, MT-bench, 1.38x
   throughput at batch 64.
4. DeepSeek-V3 technical report (arXiv 2412.19437): one MTP module, 85-90% acceptance, 1.8x
   decoding TPS.

Run: ``python benchmarks/speculative_published.py`` (about a minute on two cores). Not a test.
"""

from __future__ import annotations

from typing import Any

from servesim.calibration.speculation import fit_overheads, read_measurements, step_rows
from servesim.config import validate_document
from servesim.pipeline import prepare, simulate

MEASURED_PLAIN_TPOT_MS = 7.07  # vLLM issue #20780, Llama-3.1-8B alone, batch 1


def run(speculative: dict[str, Any] | None, *, batch: int, requests: int, prompt: int, output: int,
        model: str = "llama-3-8b", hardware: str = "h100-sxm-80gb", tp: int = 1,
        precision: dict[str, str] | None = None, engine: dict[str, Any] | None = None) -> Any:
    document: dict[str, Any] = {
        "name": "published", "seed": 0, "model": model, "hardware": hardware,
        "deployment": {"tp": tp, "max_num_seqs": batch}, "output": "summary",
        "workload": {"arrival": {"process": "constant", "rate": 10000.0}, "num_requests": requests,
                     "prompt": {"dist": "fixed", "value": prompt},
                     "output": {"dist": "fixed", "value": output}}}
    if speculative is not None:
        document["speculative"] = speculative
    if precision:
        document["precision"] = precision
    if engine:
        document["engine"] = engine
    return simulate(prepare(validate_document(document))).summary


def overhead_fit() -> None:
    rows = step_rows()
    fit = fit_overheads(rows)
    print("## 1. Speculative software overheads fitted to vLLM issue #20780\n")
    print(f"all 12 rows: per verifying step {fit.step_s * 1e3:.2f} ms, per proposer pass "
          f"{fit.pass_s * 1e3:.2f} ms\n")
    print("| method | k | measured extra ms | kernels ms | fitted (all) ms | "
          "fitted on the other method ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for method in ("eagle", "eagle3"):
        other = fit_overheads([r for r in rows if r.method != method])
        for row in (r for r in rows if r.method == method):
            cells = (row.measured_extra_s, row.kernels_extra_s, fit.predicted_extra_s(row),
                     other.predicted_extra_s(row))
            print(f"| {method} | {row.k} | " + " | ".join(f"{c * 1e3:.2f}" for c in cells) + " |")
    print()


def batch1() -> None:
    print("## 2. Batch 1: Llama-3.1-8B on one H100, MT-bench acceptance (vLLM issue #20780)\n")
    print("| head | k | acceptance length | measured speedup | simulated speedup |")
    print("|---|---:|---:|---:|---:|")
    shape = {"batch": 1, "requests": 12, "prompt": 200, "output": 300}
    plain = run(None, **shape).tpot_s.mean
    for record in read_measurements():
        method = record["method"]
        if method == "none":
            continue
        k = int(record["num_speculative_tokens"])
        preset = f"{method}-llama-3.1-8b-mtbench"
        spec = run({"method": method, "num_speculative_tokens": k, "acceptance": {"preset": preset}}, **shape)
        measured = MEASURED_PLAIN_TPOT_MS / float(record["tpot_ms"])
        print(f"| {method} | {k} | {record['mean_acceptance_length']} | {measured:.2f} | "
              f"{plain / spec.tpot_s.mean:.2f} |")
    print()


def batch64() -> None:
    print("## 3. Batch 64: EAGLE-3 paper, SGLang, H100, Llama-3.1-8B, MT-bench: 1.38x throughput\n")
    print("| k | simulated output tokens/s speedup | simulated TPOT speedup |")
    print("|---:|---:|---:|")
    shape = {"batch": 64, "requests": 256, "prompt": 200, "output": 300}
    plain = run(None, **shape)
    for k in (1, 2, 3, 4, 5):
        spec = run({"method": "eagle3", "num_speculative_tokens": k,
                    "acceptance": {"preset": "eagle3-llama-3.1-8b-mtbench"}}, **shape)
        print(f"| {k} | {spec.throughput.output_tokens_per_s / plain.throughput.output_tokens_per_s:.2f} | "
              f"{plain.tpot_s.mean / spec.tpot_s.mean:.2f} |")
    print()


def deepseek() -> None:
    print("## 4. DeepSeek-V3 MTP (k = 1, acceptance 0.875): 1.8x decoding TPS in the report\n")
    print("One wave of `batch` requests (prompt 256, output 512) on 8 x H200, TP 8, FP8 weights.\n")
    print("| batch | simulated TPOT speedup | simulated output tokens/s speedup |")
    print("|---:|---:|---:|")
    for batch in (32, 128, 256):
        shape = {"batch": batch, "requests": batch, "prompt": 256, "output": 512,
                 "model": "deepseek-v3", "hardware": "h200-sxm-141gb", "tp": 8,
                 "precision": {"weights": "fp8", "activations": "fp8", "kv_cache": "bf16"}}
        plain = run(None, **shape)
        mtp = {"method": "mtp", "num_speculative_tokens": 1, "acceptance": {"preset": "mtp-deepseek-v3"}}
        spec = run(mtp, **shape)
        print(f"| {batch} | {plain.tpot_s.mean / spec.tpot_s.mean:.2f} | "
              f"{spec.throughput.output_tokens_per_s / plain.throughput.output_tokens_per_s:.2f} |")
    print()


def main() -> None:
    overhead_fit()
    batch1()
    batch64()
    deepseek()


if __name__ == "__main__":
    main()
