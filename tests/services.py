"""Addresses of the real PostgreSQL and Redis the tests use. A missing server is an error, never a skip."""

import os

import redis

POSTGRES = os.environ.get("MLPLANE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432")
REDIS = os.environ.get("MLPLANE_TEST_REDIS_URL", "127.0.0.1:6379")


def postgres_url(database: str) -> str:
    return f"{POSTGRES.rstrip('/')}/{database}"


def redis_client() -> redis.Redis:
    host, port = REDIS.split(":")
    return redis.Redis(host=host, port=int(port))


def create_database(name: str) -> str:
    """A fresh database on the real server; returns its URL."""
    _admin(f'CREATE DATABASE "{name}"')
    return postgres_url(name)


def drop_database(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(statement: str) -> None:
    import psycopg2

    conn = psycopg2.connect(postgres_url("postgres"))
    try:
        conn.autocommit = True
        conn.cursor().execute(statement)
    finally:
        conn.close()
