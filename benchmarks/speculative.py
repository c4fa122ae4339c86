"""Speculative decoding on vLLM's CPU build: the gateway LLM served plainly, with its draft model
(`models/gateway_llm_draft`, same tokenizer, one layer) and with prompt n-grams, from one run.

For each backend and each concurrency (1 and 8 requests in flight) it streams REQUESTS completions at
temperature 0 (`ignore_eos`, MAX_TOKENS each) and reports, per repeat then median over repeats:
output tokens/s (all tokens / wall time), time per output token (per request: (end - first token) /
(tokens - 1); P50 and P99 over requests), and the acceptance rate from vLLM's own counters (accepted /
proposed draft tokens) with the mean tokens accepted per draft. Ratios are against the plain backend
at the same concurrency. The three servers start together and are measured one at a time.

    .venv/bin/python benchmarks/speculative.py [--model data/models/gateway_llm]
        [--draft data/models/gateway_llm_draft] [--requests 16] [--max-tokens 64] [--repeats 3] [--spec-tokens 3]

The models come from `dagster job execute -m orchestration.definitions -j gateway_llm_training`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.gateway.vllm_process import VllmProcess, speculative_config  # noqa: E402

PROMPTS = [
    "Hi, is the red wooden chair still available?",
    "low poly castle with four towers and a gate.",
    "Can you ship the sword to Berlin?",
    "A cute robot toy, painted metal, small.",
    "What is the price of the lamp?",
    "Thanks! I will buy the table tomorrow.",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def one_request(client, url: str, prompt: str, max_tokens: int) -> tuple[int, float, float]:
    """(output tokens, seconds to first token, seconds in all) of one streamed completion."""
    import json

    started, first, tokens = time.perf_counter(), None, 0
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    ended = time.perf_counter()
    return tokens, (first or ended) - started, ended - started


async def phase(url: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    import httpx

    queue = list(range(requests))
    results = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker():
            while queue:
                i = queue.pop()
                results.append(await one_request(client, url, PROMPTS[i % len(PROMPTS)], max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    tpot = [(total - ttft) / (tokens - 1) for tokens, ttft, total in results if tokens > 1]
    return {"tokens_per_s": sum(r[0] for r in results) / wall, "tpot": tpot}


def acceptance(server: VllmProcess) -> tuple[float, float]:
    metrics = server.metrics()
    return (
        metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
        metrics.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
        metrics.get("vllm:spec_decode_num_drafts_total", 0.0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "data" / "models" / "gateway_llm"))
    parser.add_argument("--draft", default=str(ROOT / "data" / "models" / "gateway_llm_draft"))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spec-tokens", type=int, default=3)
    args = parser.parse_args()
    model, draft = Path(args.model), Path(args.draft)
    for folder in (model, draft):
        if not (folder / "config.json").exists():
            sys.exit(f"{folder} has no model: run the gateway_llm_training job first")
    logs = Path(tempfile.mkdtemp(prefix="bench-speculative-"))
    backends = {
        "plain": VllmProcess(model, "bench", logs / "plain.log"),
        "draft model": VllmProcess(
            model,
            "bench",
            logs / "draft.log",
            ["--speculative-config", speculative_config("draft_model", args.spec_tokens, draft)],
        ),
        "n-gram": VllmProcess(
            model, "bench", logs / "ngram.log", ["--speculative-config", speculative_config("ngram", args.spec_tokens)]
        ),
    }
    try:
        for server in backends.values():
            server.start()
        for server in backends.values():
            server.wait_ready(900)
        report(backends, args)
    finally:
        for server in backends.values():
            server.stop()


def report(backends: dict[str, VllmProcess], args) -> None:
    rows = {}
    for name, server in backends.items():
        asyncio.run(phase(server.url, 4, 2, 8))  # warm-up (first batches compile kernels)
        for concurrency in (1, 8):
            rates, tpots, accepted, proposed, drafts = [], [], 0.0, 0.0, 0.0
            for _ in range(args.repeats):
                a0, p0, d0 = acceptance(server)
                result = asyncio.run(phase(server.url, args.requests, concurrency, args.max_tokens))
                a1, p1, d1 = acceptance(server)
                accepted, proposed, drafts = accepted + a1 - a0, proposed + p1 - p0, drafts + d1 - d0
                rates.append(result["tokens_per_s"])
                tpots.append(result["tpot"])
            rows[(name, concurrency)] = {
                "tokens_per_s": statistics.median(rates),
                "tpot_p50": statistics.median(percentile(t, 50) for t in tpots),
                "tpot_p99": statistics.median(percentile(t, 99) for t in tpots),
                "acceptance": accepted / proposed if proposed else None,
                "per_draft": accepted / drafts if drafts else None,
            }
    print(
        f"\nspeculative decoding, vLLM CPU build, {args.requests} requests x {args.max_tokens} tokens, "
        f"{args.spec_tokens} speculative tokens, median of {args.repeats} repeats"
    )
    print(
        f"{'backend':<12} {'conc':>4} {'tok/s':>8} {'TPOT P50 ms':>12} {'TPOT P99 ms':>12} {'accept':>7} "
        f"{'acc/draft':>9} {'tok/s ratio':>11} {'TPOT ratio':>10}"
    )
    for (name, concurrency), row in rows.items():
        base = rows[("plain", concurrency)]
        acceptance_text = f"{row['acceptance']:.2f}" if row["acceptance"] is not None else "-"
        per_draft = f"{row['per_draft']:.2f}" if row["per_draft"] is not None else "-"
        print(
            f"{name:<12} {concurrency:>4} {row['tokens_per_s']:>8.1f} {row['tpot_p50'] * 1000:>12.2f} "
            f"{row['tpot_p99'] * 1000:>12.2f} {acceptance_text:>7} {per_draft:>9} "
            f"{row['tokens_per_s'] / base['tokens_per_s']:>11.2f} {row['tpot_p50'] / base['tpot_p50']:>10.2f}"
        )


if __name__ == "__main__":
    main()
