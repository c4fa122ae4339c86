"""`mlplane labeling seed-gold` and `refit`: an expert's gold questions into a task, and the annotator
model fitted and stored for the queue."""

import json

from click.testing import CliRunner

from cli.main import main
from ground_truth import queue, review
from ground_truth.schema import ItemIn, TaskSpec
from orchestration.profiles import resources_for

SPEC = TaskSpec(name="copies", question="Copy?", labels=["violation", "ok"], adaptive=True, max_answers=3)


def test_seed_gold_and_refit(tmp_path):
    engine = resources_for("local", data_dir=str(tmp_path))["labels"].get_client()
    task = queue.create_task(engine, SPEC)
    queue.add_items(engine, task, [ItemIn(key="1", queue="audit")])
    seeds = tmp_path / "gold.jsonl"
    seeds.write_text(
        '{"key": "g1", "gold_label": "ok", "title": "a teapot"}\n{"key": "g2", "gold_label": "violation"}\n'
    )
    runner = CliRunner()
    seeded = runner.invoke(main, ["labeling", "seed-gold", "copies", str(seeds), "--data-dir", str(tmp_path)])
    assert seeded.exit_code == 0, seeded.output
    assert json.loads(seeded.output)["gold_questions_added"] == 2
    gold = {s.key: s.gold_label for s in review.item_states(engine, task) if s.is_gold_question}
    assert gold == {"g1": "ok", "g2": "violation"}
    seeds.write_text('{"key": "g3", "gold_label": "maybe"}\n')
    refused = runner.invoke(main, ["labeling", "seed-gold", "copies", str(seeds), "--data-dir", str(tmp_path)])
    assert refused.exit_code != 0 and "outside the label set" in refused.output
    seeds.write_text('{"key": "g4"}\n')
    refused = runner.invoke(main, ["labeling", "seed-gold", "copies", str(seeds), "--data-dir", str(tmp_path)])
    assert refused.exit_code != 0 and "no gold_label" in refused.output
    refit = runner.invoke(main, ["labeling", "refit", "copies", "--data-dir", str(tmp_path)])
    assert refit.exit_code == 0, refit.output
    assert json.loads(refit.output)["method"] == "dawid-skene"
    with engine.begin() as conn:
        assert queue.load_model(conn, task).labels == ["violation", "ok"]
    missing = runner.invoke(main, ["labeling", "refit", "nothing", "--data-dir", str(tmp_path)])
    assert missing.exit_code != 0 and "no task" in missing.output
