"""Batch LLM inference over catalogue items: a short description for each listing whose description is
empty. Two engines behind one function shape:

- `gateway` (default, tested): chat completions through the ML gateway with a service key, so the run
  meets the same keys, rate limits, routing and usage records as every caller. A 429 or 503 is
  retried after its Retry-After (or an exponential backoff), up to the policy's attempts; other
  errors are recorded per item, never silently dropped.
- `ray_vllm` (production, GPU clusters): vLLM's offline `LLM.generate` in a Ray Data actor pool over
  the same rows; the Ray workers need vLLM installed (a runtime environment or image with it). It is
  not run by the tests here: vLLM cannot be imported in the main environment (see ENVIRONMENT.md).

Plain Python, no Dagster."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl

PROMPT = (
    "Write a one-sentence description for this marketplace listing.\nTitle: {title}\nCategory: {category}\nDescription:"
)
RETRIED = (429, 503)


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before attempt `attempt + 1`: the server's Retry-After when it names one, else
        exponential backoff; never more than max_delay_s."""
        try:
            asked = float(retry_after) if retry_after is not None else 0.0
        except ValueError:
            asked = 0.0
        return min(self.max_delay_s, max(asked, self.base_delay_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class BatchSpec:
    model: str
    max_tokens: int = 48
    min_tokens: int = 8  # vLLM's min_tokens: a description, not an end-of-text token at once
    temperature: float = 0.0
    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass
class ItemResult:
    item_id: int
    description: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    rate_limited: int = 0  # 429 and 503 answers retried
    error: str | None = None


@dataclass
class BatchRun:
    results: list[ItemResult]
    seconds: float

    @property
    def items_per_s(self) -> float:
        return len(self.results) / self.seconds if self.seconds > 0 else 0.0

    def totals(self) -> dict[str, int]:
        r = self.results
        failed = sum(x.error is not None for x in r)
        return {
            "items": len(r),
            "generated": len(r) - failed,
            "failed": failed,
            "prompt_tokens": sum(x.prompt_tokens for x in r),
            "completion_tokens": sum(x.completion_tokens for x in r),
            "rate_limited_retries": sum(x.rate_limited for x in r),
            "attempts": sum(x.attempts for x in r),
        }


# call(body) -> (status, headers, payload): one HTTP call to the gateway's chat completions
Call = Callable[[dict], tuple[int, dict, object]]


def prompt_for(item: dict) -> str:
    return PROMPT.format(title=item.get("title") or "", category=item.get("category") or "")


def describe_one(item: dict, call: Call, spec: BatchSpec, sleep=time.sleep) -> ItemResult:
    result = ItemResult(int(item["item_id"]), None)
    body = {
        "model": spec.model,
        "max_tokens": spec.max_tokens,
        "min_tokens": spec.min_tokens,
        "temperature": spec.temperature,
        "messages": [{"role": "user", "content": prompt_for(item)}],
    }
    for attempt in range(1, spec.retry.max_attempts + 1):
        result.attempts = attempt
        try:
            status, headers, payload = call(body)
        except OSError as error:  # the gateway unreachable: retried like a 503
            status, headers, payload = 503, {}, {"error": {"message": f"{type(error).__name__}: {error}"}}
        if status == 200:
            usage = payload.get("usage") or {}
            result.description = (payload["choices"][0]["message"].get("content") or "").strip()
            result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            result.completion_tokens = int(usage.get("completion_tokens") or 0)
            result.error = None  # an earlier attempt's refusal is history now
            if not result.description:
                result.error = "the model returned an empty description"
            return result
        message = (payload.get("error") or {}).get("message") if isinstance(payload, dict) else None
        result.error = f"HTTP {status}: {message or payload}"[:500]
        if status not in RETRIED and status < 500:
            return result  # the request itself is wrong: retrying cannot help
        if status in RETRIED:
            result.rate_limited += 1
        if attempt < spec.retry.max_attempts:
            sleep(spec.retry.delay(attempt, (headers or {}).get("retry-after")))
    return result


def describe_items(items: list[dict], call: Call, spec: BatchSpec, sleep=time.sleep) -> BatchRun:
    """Every item through the gateway, `spec.concurrency` at a time; results in the items' order."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, spec.concurrency)) as pool:
        results = list(pool.map(lambda item: describe_one(item, call, spec, sleep), items))
    return BatchRun(results, time.perf_counter() - started)


def describe_items_ray_vllm(
    items: list[dict], model_dir: str, spec: BatchSpec, replicas: int = 1, num_gpus: float = 1.0
) -> BatchRun:
    """Production path: vLLM's offline batch API on a Ray actor pool (each actor loads the model once)."""
    import ray

    class Generator:
        def __init__(self):
            from vllm import LLM, SamplingParams

            self.llm = LLM(model_dir)
            self.params = SamplingParams(
                temperature=spec.temperature, max_tokens=spec.max_tokens, min_tokens=spec.min_tokens
            )

        def __call__(self, batch: dict) -> dict:
            chats = [[{"role": "user", "content": p}] for p in batch["prompt"]]
            outputs = self.llm.chat(chats, self.params, use_tqdm=False)
            batch["description"] = [o.outputs[0].text.strip() for o in outputs]
            batch["prompt_tokens"] = [len(o.prompt_token_ids) for o in outputs]
            batch["completion_tokens"] = [len(o.outputs[0].token_ids) for o in outputs]
            return batch

    started = time.perf_counter()
    rows = [{"item_id": int(i["item_id"]), "prompt": prompt_for(i)} for i in items]
    dataset = ray.data.from_items(rows).map_batches(
        Generator, batch_size=64, num_gpus=num_gpus, compute=ray.data.ActorPoolStrategy(size=replicas)
    )
    results = [
        ItemResult(
            int(r["item_id"]),
            r["description"],
            int(r["prompt_tokens"]),
            int(r["completion_tokens"]),
            attempts=1,
            error=None if r["description"] else "the model returned an empty description",
        )
        for r in dataset.take_all()
    ]
    order = {int(i["item_id"]): n for n, i in enumerate(items)}
    return BatchRun(sorted(results, key=lambda r: order[r.item_id]), time.perf_counter() - started)


def descriptions_frame(run: BatchRun, items: list[dict], model: str) -> pl.DataFrame:
    """The run's descriptions as the lake's table: a row per item (`items` in the run's order, with their
    titles), the tokens, attempts and error of each call, and when it was written."""
    return pl.DataFrame(
        {
            "item_id": [r.item_id for r in run.results],
            "title": [r["title"] for r in items],
            "description": [r.description for r in run.results],
            "model": [model] * len(items),
            "prompt_tokens": [r.prompt_tokens for r in run.results],
            "completion_tokens": [r.completion_tokens for r in run.results],
            "attempts": [r.attempts for r in run.results],
            "rate_limited": [r.rate_limited for r in run.results],
            "error": [r.error for r in run.results],
            "generated_at": [datetime.now(UTC)] * len(items),
        },
        schema_overrides={
            "item_id": pl.Int64,
            "title": pl.String,
            "description": pl.String,
            "model": pl.String,
            "error": pl.String,
            "generated_at": pl.Datetime("us", "UTC"),
        },
    )
