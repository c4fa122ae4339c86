"""The batch LLM engine's retry policy, without servers. The scripted answers stand for the gateway's
429s, 503s and 400s (the real gateway and vLLM are exercised by tests/serving/llm/test_llm_batch_asset.py);
here they pin which answers are retried, after how long, and what is recorded."""

from __future__ import annotations

import threading

import polars as pl

from engines.models.llm_batch import BatchSpec, RetryPolicy, describe_items

OK = {"choices": [{"message": {"content": " A red chair. "}}], "usage": {"prompt_tokens": 11, "completion_tokens": 4}}


class Script:
    """Answers per item title, in order; the last answer repeats."""

    def __init__(self, answers: dict[str, list[tuple[int, dict, object]]]):
        self.answers, self.calls, self.lock = answers, {}, threading.Lock()

    def __call__(self, body: dict):
        title = body["messages"][0]["content"].split("Title: ")[1].split("\n")[0]
        with self.lock:
            n = self.calls[title] = self.calls.get(title, 0) + 1
        queue = self.answers[title]
        return queue[min(n, len(queue)) - 1]


def test_429_and_503_are_retried_after_retry_after_and_other_errors_are_recorded():
    limited = (429, {"retry-after": "7"}, {"error": {"message": "Rate limit reached"}})
    script = Script(
        {
            "chair": [limited, limited, (200, {}, OK)],
            "lamp": [(503, {}, {"error": {"message": "no backend"}}), (200, {}, OK)],
            "sword": [(400, {}, {"error": {"message": "bad body"}})],
            "rock": [limited],
        }
    )
    slept = []
    items = [{"item_id": i, "title": t, "category": "c"} for i, t in enumerate(["chair", "lamp", "sword", "rock"])]
    spec = BatchSpec("m", concurrency=2, retry=RetryPolicy(max_attempts=4, base_delay_s=0.5, max_delay_s=30))
    run = describe_items(items, script, spec, sleep=slept.append)
    chair, lamp, sword, rock = run.results
    assert [r.item_id for r in run.results] == [0, 1, 2, 3]
    assert (chair.description, chair.attempts, chair.rate_limited, chair.error) == ("A red chair.", 3, 2, None)
    assert (chair.prompt_tokens, chair.completion_tokens) == (11, 4)
    assert (lamp.attempts, lamp.rate_limited, lamp.error) == (2, 1, None)
    assert (sword.attempts, sword.description) == (1, None) and sword.error == "HTTP 400: bad body"
    assert (rock.attempts, rock.rate_limited) == (4, 4) and rock.error.startswith("HTTP 429")
    assert script.calls == {"chair": 3, "lamp": 2, "sword": 1, "rock": 4}
    # Retry-After (7 s) wins over the backoff; the 503 without one backs off 0.5 s; no sleep after the last try
    assert sorted(slept) == sorted([7, 7, 0.5, 7, 7, 7])
    assert run.totals() == {
        "items": 4,
        "generated": 2,
        "failed": 2,
        "prompt_tokens": 22,
        "completion_tokens": 8,
        "rate_limited_retries": 7,
        "attempts": 10,
    }


def test_backoff_doubles_up_to_the_cap():
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=3)
    assert [policy.delay(a, None) for a in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 3, 3]
    assert policy.delay(1, "60") == 3 and policy.delay(1, "soon") == 0.5


def test_an_empty_answer_is_an_error_not_a_description():
    script = Script({"x": [(200, {}, {"choices": [{"message": {"content": "  "}}], "usage": {}})]})
    (result,) = describe_items([{"item_id": 1, "title": "x"}], script, BatchSpec("m")).results
    assert result.error == "the model returned an empty description"


def test_the_descriptions_table_has_a_typed_row_per_item_in_the_runs_order():
    from engines.models.llm_batch import BatchRun, ItemResult, descriptions_frame

    items = [{"item_id": 2, "title": "Chair"}, {"item_id": 1, "title": "Lamp"}]
    run = BatchRun([ItemResult(2, "A red chair.", 11, 4, 1), ItemResult(1, None, attempts=6, error="429")], 1.0)
    frame = descriptions_frame(run, items, "gateway-llm")
    assert frame["item_id"].to_list() == [2, 1] and frame["title"].to_list() == ["Chair", "Lamp"]
    assert frame["description"].to_list() == ["A red chair.", None] and frame["error"].to_list() == [None, "429"]
    assert frame.schema["generated_at"] == pl.Datetime("us", "UTC") and frame.schema["item_id"] == pl.Int64
