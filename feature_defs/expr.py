"""A small expression language for feature definitions.

One expression compiles to a polars expression (offline tables) and to a SQL fragment (Flink SQL
for streaming jobs), so a filter or a row-level transform means the same thing in both engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl


class Expr:
    """Base of every expression node. Operators build new nodes."""

    def columns(self) -> set[str]:
        raise NotImplementedError

    def to_polars(self) -> pl.Expr:
        raise NotImplementedError

    def to_sql(self) -> str:
        raise NotImplementedError

    # comparisons and boolean logic
    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryOp("==", self, _wrap(other))

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return BinaryOp("!=", self, _wrap(other))

    def __lt__(self, other: Any) -> Expr:
        return BinaryOp("<", self, _wrap(other))

    def __le__(self, other: Any) -> Expr:
        return BinaryOp("<=", self, _wrap(other))

    def __gt__(self, other: Any) -> Expr:
        return BinaryOp(">", self, _wrap(other))

    def __ge__(self, other: Any) -> Expr:
        return BinaryOp(">=", self, _wrap(other))

    def __and__(self, other: Any) -> Expr:
        return BinaryOp("&", self, _wrap(other))

    def __or__(self, other: Any) -> Expr:
        return BinaryOp("|", self, _wrap(other))

    def __invert__(self) -> Expr:
        return Func("not", (self,))

    # arithmetic
    def __add__(self, other: Any) -> Expr:
        return BinaryOp("+", self, _wrap(other))

    def __sub__(self, other: Any) -> Expr:
        return BinaryOp("-", self, _wrap(other))

    def __mul__(self, other: Any) -> Expr:
        return BinaryOp("*", self, _wrap(other))

    def __truediv__(self, other: Any) -> Expr:
        return BinaryOp("/", self, _wrap(other))

    # functions
    def isin(self, values: list | tuple) -> Expr:
        return IsIn(self, tuple(values))

    def is_null(self) -> Expr:
        return Func("is_null", (self,))

    def is_not_null(self) -> Expr:
        return Func("is_not_null", (self,))

    def fill_null(self, value: Any) -> Expr:
        return Func("fill_null", (self, _wrap(value)))

    def log1p(self) -> Expr:
        return Func("log1p", (self,))

    def str_len(self) -> Expr:
        return Func("str_len", (self,))

    def __hash__(self) -> int:
        return hash(repr(self))


def _wrap(value: Any) -> Expr:
    return value if isinstance(value, Expr) else Lit(value)


@dataclass(frozen=True, eq=False)
class Col(Expr):
    name: str

    def columns(self) -> set[str]:
        return {self.name}

    def to_polars(self) -> pl.Expr:
        return pl.col(self.name)

    def to_sql(self) -> str:
        return f"`{self.name}`"

    def __repr__(self) -> str:
        return f"col({self.name!r})"


@dataclass(frozen=True, eq=False)
class Lit(Expr):
    value: Any

    def columns(self) -> set[str]:
        return set()

    def to_polars(self) -> pl.Expr:
        return pl.lit(self.value)

    def to_sql(self) -> str:
        return _sql_literal(self.value)

    def __repr__(self) -> str:
        return f"lit({self.value!r})"


_POLARS_BINARY = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "&": lambda a, b: a & b,
    "|": lambda a, b: a | b,
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}
_SQL_BINARY = {"==": "=", "!=": "<>", "&": "AND", "|": "OR"}


@dataclass(frozen=True, eq=False)
class BinaryOp(Expr):
    op: str
    left: Expr
    right: Expr

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def to_polars(self) -> pl.Expr:
        return _POLARS_BINARY[self.op](self.left.to_polars(), self.right.to_polars())

    def to_sql(self) -> str:
        op = _SQL_BINARY.get(self.op, self.op)
        if self.op == "/":  # SQL integer division truncates; polars' "/" does not
            return f"(CAST({self.left.to_sql()} AS DOUBLE) / {self.right.to_sql()})"
        return f"({self.left.to_sql()} {op} {self.right.to_sql()})"

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


@dataclass(frozen=True, eq=False)
class IsIn(Expr):
    operand: Expr
    values: tuple

    def columns(self) -> set[str]:
        return self.operand.columns()

    def to_polars(self) -> pl.Expr:
        return self.operand.to_polars().is_in(list(self.values))

    def to_sql(self) -> str:
        return f"({self.operand.to_sql()} IN ({', '.join(_sql_literal(v) for v in self.values)}))"

    def __repr__(self) -> str:
        return f"{self.operand!r}.isin({list(self.values)!r})"


@dataclass(frozen=True, eq=False)
class Func(Expr):
    name: str
    args: tuple[Expr, ...]

    def columns(self) -> set[str]:
        return set().union(*(a.columns() for a in self.args))

    def to_polars(self) -> pl.Expr:
        a = [x.to_polars() for x in self.args]
        match self.name:
            case "not":
                return ~a[0]
            case "is_null":
                return a[0].is_null()
            case "is_not_null":
                return a[0].is_not_null()
            case "fill_null":
                return a[0].fill_null(a[1])
            case "log1p":
                return a[0].cast(pl.Float64).log1p()
            case "str_len":
                return a[0].str.len_chars().cast(pl.Int64)
        raise ValueError(f"unknown function {self.name!r}")

    def to_sql(self) -> str:
        a = [x.to_sql() for x in self.args]
        match self.name:
            case "not":
                return f"(NOT {a[0]})"
            case "is_null":
                return f"({a[0]} IS NULL)"
            case "is_not_null":
                return f"({a[0]} IS NOT NULL)"
            case "fill_null":
                return f"COALESCE({a[0]}, {a[1]})"
            case "log1p":
                return f"LN(1 + CAST({a[0]} AS DOUBLE))"
            case "str_len":
                return f"CHAR_LENGTH({a[0]})"
        raise ValueError(f"unknown function {self.name!r}")

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.args))})"


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def col(name: str) -> Col:
    """A column of the feature view's source."""
    return Col(name)


def lit(value: Any) -> Lit:
    return Lit(value)
