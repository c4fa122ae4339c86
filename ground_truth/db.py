"""The label store's tables (SQLAlchemy Core): SQLite by default, PostgreSQL in production.

An item of a task has k answer slots (k = annotators_per_item), created with the item. Claiming a
slot is one conditional UPDATE, which both databases apply atomically, so no item ever gets more
than k answers; a unique (item, holder) constraint keeps one person to one slot of an item.
Gold questions get a slot per annotator on demand (slot number NULL). An adaptive task's item starts
with one slot and gains one at a time while its label posterior is uncertain (ground_truth/queue.py)."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine

metadata = MetaData()

tasks = Table(
    "gt_tasks",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(63), nullable=False, unique=True),
    Column("spec", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

accounts = Table(
    "gt_accounts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("username", String(64), nullable=False, unique=True),
    Column("password_hash", String(300), nullable=False),
    Column("role", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

sessions = Table(
    "gt_sessions",
    metadata,
    Column("token_hash", String(64), primary_key=True),
    Column("account_id", Integer, ForeignKey("gt_accounts.id"), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

items = Table(
    "gt_items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("task_id", Integer, ForeignKey("gt_tasks.id"), nullable=False),
    Column("key", String(128), nullable=False),
    Column("title", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("thumbnail", String(300)),
    Column("model_score", Float),
    Column("priority", Float, nullable=False),
    Column("gold_label", String(64)),  # a known answer: served as a gold question
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("task_id", "key", name="gt_items_task_key"),
)
# the next item to serve is the first open slot in this order: read off the index, no sort of the task
ITEMS_BY_PRIORITY = Index("gt_items_task_priority", items.c.task_id, items.c.priority.desc(), items.c.id)
# the media route serves a file only when an item shows it: one indexed lookup per image
ITEMS_BY_THUMBNAIL = Index("gt_items_thumbnail", items.c.thumbnail)

item_sources = Table(
    "gt_item_sources",
    metadata,
    Column("item_id", Integer, ForeignKey("gt_items.id"), primary_key=True),
    Column("queue", String(64), primary_key=True),
    Column("added_at", DateTime(timezone=True), nullable=False),
)

slots = Table(
    "gt_slots",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("item_id", Integer, ForeignKey("gt_items.id"), nullable=False, index=True),
    Column("slot", Integer),  # 0..k-1; NULL for a gold question's per-annotator slot
    Column("holder", Integer, ForeignKey("gt_accounts.id"), index=True),
    Column("leased_until", DateTime(timezone=True)),
    Column("label", Text),
    Column("answered_at", DateTime(timezone=True)),
    UniqueConstraint("item_id", "slot", name="gt_slots_item_slot"),
    UniqueConstraint("item_id", "holder", name="gt_slots_item_holder"),
)

skips = Table(
    "gt_skips",
    metadata,
    Column("item_id", Integer, ForeignKey("gt_items.id"), primary_key=True),
    Column("account_id", Integer, ForeignKey("gt_accounts.id"), primary_key=True),
)
SKIPS_BY_ACCOUNT = Index("gt_skips_account", skips.c.account_id, skips.c.item_id)

verdicts = Table(
    "gt_verdicts",
    metadata,
    Column("item_id", Integer, ForeignKey("gt_items.id"), primary_key=True),
    Column("reviewer_id", Integer, ForeignKey("gt_accounts.id"), nullable=False),
    Column("label", Text, nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=False),
)

# the newest fitted annotator model of a task (ground_truth/annotator_model.py): the queue reads it after
# each answer of an adaptive task to decide whether the item needs another answer
models = Table(
    "gt_models",
    metadata,
    Column("task_id", Integer, ForeignKey("gt_tasks.id"), primary_key=True),
    Column("model", JSON, nullable=False),
    Column("answers", Integer, nullable=False),  # answers it was fitted on
    Column("fitted_at", DateTime(timezone=True), nullable=False),
)

# how far a store has been upgraded (ground_truth/migrations.py): one row
schema_version = Table("gt_schema_version", metadata, Column("version", Integer, nullable=False))


def connect(url: str) -> Engine:
    """An engine with the tables (and indexes added since a store was made) created and the rows of a
    store made by an older version upgraded (ground_truth/migrations.py). SQLite takes one
    writer at a time: in this process requests queue for its single pooled connection (first come, first
    served), and every transaction is BEGIN IMMEDIATE so another process's writer is waited for (30 s)
    instead of failing with 'locked'.

    SQLite runs in WAL mode with synchronous=NORMAL: a commit is not fsynced (the WAL is, at each
    checkpoint), so an answer survives the app's crash but the last commits may be lost to a power cut
    or an OS crash. With FULL every answer waited for an fsync (about 25 ms here) behind every other
    annotator's, which was most of the labeling round trip; production runs on PostgreSQL."""
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"timeout": 30, "check_same_thread": False}, pool_size=1, max_overflow=0, pool_timeout=60
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
            dbapi_connection.execute("PRAGMA journal_mode=WAL")
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")
            dbapi_connection.execute("PRAGMA foreign_keys=ON")

        @event.listens_for(engine, "begin")
        def _begin_immediate(connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        engine = create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True)
    metadata.create_all(engine)
    # create_all skips the indexes of existing tables
    for index in (ITEMS_BY_PRIORITY, ITEMS_BY_THUMBNAIL, SKIPS_BY_ACCOUNT):
        index.create(engine, checkfirst=True)
    from ground_truth.migrations import upgrade  # it reads this module's tables

    upgrade(engine)
    return engine
