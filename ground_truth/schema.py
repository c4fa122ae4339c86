"""Typed specs of the labeling flow: roles, task schemas, what an annotator is shown."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field, model_validator


class Role(StrEnum):
    annotator = "annotator"  # labels items, blind to everyone else's labels
    reviewer = "reviewer"  # sees all labels of disputed items and adjudicates
    admin = "admin"  # accounts, tasks, items


class Subject(StrEnum):
    item = "item"  # one catalogue item
    user_item = "user_item"  # a (user, item) pair, e.g. "would this user want this item?"


class TaskSpec(BaseModel):
    """What is labelled and how. `labels=None` asks for free text."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,62}$")
    subject: Subject = Subject.item
    question: str = Field(min_length=1, max_length=500)
    instructions: str = Field(default="", max_length=5000)
    labels: list[str] | None = Field(default=None, description="The label set; None for free text")
    annotators_per_item: int = Field(default=3, ge=1, le=20)
    show_model_score: bool = False
    gold_share: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Share of served items that are gold questions with a known answer"
    )
    adaptive: bool = Field(
        default=False,
        description="Ask for answers one at a time until the item's posterior reaches `confidence` (at most "
        "`max_answers`); False: exactly `annotators_per_item` answers per item",
    )
    max_answers: int = Field(default=5, ge=1, le=20, description="Most answers an item gets when adaptive")
    confidence: float = Field(
        default=0.9,
        gt=0.5,
        lt=1.0,
        description="Posterior at which an adaptive item stops being asked, and at which the annotator model "
        "settles a disagreement without a reviewer",
    )
    min_gold_accuracy: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="An annotator whose gold-question accuracy interval lies wholly below this is flagged",
    )
    flagged_weight: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Weight of a flagged annotator's answers in the annotator model"
    )
    min_alpha: float = Field(
        default=0.667,
        ge=-1.0,
        le=1.0,
        description="Release floor on Krippendorff's alpha (0.667: Krippendorff's lowest for tentative conclusions)",
    )

    @model_validator(mode="after")
    def _labels_distinct(self) -> TaskSpec:
        if self.labels is not None:
            if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
                raise ValueError("labels must be at least two distinct values (or None for free text)")
            if any(not label or len(label) > 64 for label in self.labels):
                raise ValueError("each label must be 1-64 characters")
        elif self.adaptive:
            raise ValueError("adaptive answers need a label set: a free-text answer has no posterior")
        return self

    @property
    def first_answers(self) -> int:
        """Answer slots an item starts with: one when adaptive (more are added while it is uncertain)."""
        return 1 if self.adaptive else self.annotators_per_item

    @property
    def answers_rule(self) -> str:
        """How many answers an item gets, as the queue asks for them (the admin page, a release's card)."""
        if self.adaptive:
            return f"adaptive, until {self.confidence:.0%} sure or {self.max_answers} answers"
        return f"k={self.annotators_per_item}"


class ItemIn(BaseModel):
    """One thing to label, as a queue-filling source hands it over."""

    key: str = Field(min_length=1, max_length=128, description="item id, or 'user:item' for pairs")
    queue: str = Field(min_length=1, max_length=64, description="the source queue that asked for it")
    title: str = Field(default="", max_length=500)
    description: str = Field(default="", max_length=5000)
    thumbnail: str | None = Field(default=None, max_length=300, description="path under the media root")
    model_score: float | None = None
    priority: float = 0.0  # higher is served first
    gold_label: str | None = None  # a known answer makes it a gold question


class Shown(BaseModel):
    """What an annotator sees of one item: never another person's label."""

    item_id: int
    key: str
    title: str
    description: str
    thumbnail_url: str | None
    model_score: float | None
    labels: list[str] | None
    question: str
    instructions: str


CONTENT_VIOLATION = TaskSpec(
    name="content_violation",
    question="Is this item a disguised copy of someone else's design (an IP violation)?",
    instructions="Compare the thumbnail, title and description with designs you know. Answer 'violation' "
    "only for copies of another creator's work; 'ok' otherwise. Keys: 1 = violation, 2 = ok, "
    "s = skip, u = undo.",
    labels=["violation", "ok"],
    show_model_score=False,
    gold_share=0.1,
    adaptive=True,  # until `confidence` (0.9) sure or `max_answers` (5) answers
)

RECOMMENDATION_RELEVANCE = TaskSpec(
    name="recommendation_relevance",
    subject=Subject.user_item,
    question="Given what this user bought and played, would they want this item?",
    labels=["relevant", "not_relevant"],
    show_model_score=True,
    gold_share=0.0,
    adaptive=True,
)
