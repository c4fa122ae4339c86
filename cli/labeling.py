"""`mlplane labeling`: the annotators' web app, accounts, tasks and the simulated annotators."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

ROLES = ["annotator", "reviewer", "admin"]


@click.group()
def labeling() -> None:
    """Ground-truth labeling: web app, accounts, tasks, releases."""


def _store(data_dir: str | None):
    from orchestration.profiles import open_resource

    return open_resource("labels", data_dir)


@labeling.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8700, show_default=True)
@click.option("--data-dir", default=None, help="Lake root (default: $MLPLANE_DATA_DIR or ./data).")
def serve(host: str, port: int, data_dir: str | None) -> None:
    """Serve the labeling app (sign in, label one item at a time, review) on HOST:PORT."""
    import uvicorn

    from ground_truth.app import create_app

    with _store(data_dir) as labels:
        url, media = labels.database_url(), Path(labels.lake.root) / "landing"
    click.echo(f"labeling app on http://{host}:{port} (label store {url.split('@')[-1]})")
    uvicorn.run(create_app(url, media), host=host, port=port, log_level="warning")


@labeling.command("add-account")
@click.argument("username")
@click.option("--role", type=click.Choice(ROLES), required=True)
@click.option("--password", default=None, help="Default: $MLPLANE_LABELING_PASSWORD, else asked for.")
@click.option("--data-dir", default=None)
def add_account(username: str, role: str, password: str | None, data_dir: str | None) -> None:
    """Create an account (the password is stored scrypt-hashed)."""
    from ground_truth import accounts

    password = (
        password
        or os.environ.get("MLPLANE_LABELING_PASSWORD")
        or click.prompt("password", hide_input=True, confirmation_prompt=True)
    )
    with _store(data_dir) as labels:
        try:
            accounts.create_account(labels.get_client(), username, password, accounts.Role(role))
        except ValueError as error:
            raise click.ClickException(str(error)) from error
    click.echo(f"created {role} {username}")


@labeling.command("tasks")
@click.option("--data-dir", default=None)
def tasks(data_dir: str | None) -> None:
    """Each task with its agreement and progress."""
    from ground_truth import queue, review

    with _store(data_dir) as labels:
        engine = labels.get_client()
        for task in queue.list_tasks(engine):
            quality = review.task_quality(engine, task)
            click.echo(
                json.dumps(
                    {
                        "task": task.spec.name,
                        "items": quality.items,
                        "complete": quality.complete,
                        "resolved": quality.resolved,
                        "disputes_open": quality.disputed_open,
                        "krippendorff_alpha": quality.krippendorff_alpha,
                        "krippendorff_alpha_interval": [
                            quality.krippendorff_alpha_low,
                            quality.krippendorff_alpha_high,
                        ],
                        "method": quality.method,
                        "answers": quality.answers,
                        "flagged": [a.annotator for a in quality.annotators if a.flagged],
                    }
                )
            )


@labeling.command("refit")
@click.argument("task")
@click.option("--data-dir", default=None)
def refit(task: str, data_dir: str | None) -> None:
    """Fit TASK's annotator model (Dawid-Skene) on every answer so far and store it for the queue; an
    adaptive task's items gain or lose open slots by it. The queue and release assets do this too."""
    from ground_truth import queue, review

    with _store(data_dir) as labels:
        engine = labels.get_client()
        try:
            found = queue.get_task(engine, task)
        except queue.NotFound as error:
            raise click.ClickException(str(error)) from error
        model, slots = review.refresh_model(engine, found)
    if model is None:
        raise click.ClickException(f"task {task!r} takes free text: it has no annotator model")
    click.echo(json.dumps({"task": task, "method": model.method, "iterations": model.iterations, **slots}))


@labeling.command("seed-gold")
@click.argument("task")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", default=None)
def seed_gold(task: str, path: str, data_dir: str | None) -> None:
    """Add gold questions to TASK from PATH, one JSON object a line: {"key", "gold_label"} and optionally
    "title", "description", "thumbnail" (an expert's known answers; served at random, never marked)."""
    from pydantic import ValidationError

    from ground_truth import queue
    from ground_truth.schema import ItemIn

    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    try:
        seeded = [ItemIn.model_validate({"queue": "seeded_gold", **json.loads(line)}) for line in lines]
    except (ValueError, ValidationError) as error:
        raise click.ClickException(f"{path}: {error}") from error
    if missing := [i.key for i in seeded if i.gold_label is None]:
        raise click.ClickException(f"{path}: no gold_label for {missing[:5]}")
    with _store(data_dir) as labels:
        engine = labels.get_client()
        try:
            added = queue.add_items(engine, queue.get_task(engine, task), seeded)
        except (queue.NotFound, ValueError) as error:
            raise click.ClickException(str(error)) from error
    click.echo(json.dumps({"task": task, "gold_questions_added": added}))


@labeling.command("simulate")
@click.argument("task", default="content_violation")
@click.option("--url", default="http://127.0.0.1:8700", show_default=True, help="The running labeling app.")
@click.option("--annotators", default=4, show_default=True)
@click.option("--accuracy", default=0.95, show_default=True, help="Each simulated annotator's accuracy.")
@click.option("--data-dir", default=None)
def simulate_annotators(task: str, url: str, annotators: int, accuracy: float, data_dir: str | None) -> None:
    """Label TASK with simulated annotators (and a reviewer) through the app's HTTP API, for the demo.
    Creates accounts sim-annN / sim-rev0 with $MLPLANE_LABELING_PASSWORD (default 'simulated-pass')."""
    from demo.labeling_round import TASK, simulated_round
    from orchestration.profiles import local_data_dir

    if task != TASK:
        raise click.ClickException(f"the simulator's answer key covers the {TASK} task only")
    with _store(data_dir) as labels:
        done = simulated_round(labels.get_client(), url, Path(data_dir or local_data_dir()), annotators, accuracy)
    click.echo(json.dumps({"answers": done.answers, "disputes_settled": done.disputes_settled}))
