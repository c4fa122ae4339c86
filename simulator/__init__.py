"""Deterministic simulator of a 3D-item marketplace: writes landing files and their answer key."""

from .config import SimulatorConfig
from .events import DayEvents, generate_day_events
from .files import DIMENSIONS, EVENT_STREAMS, SCHEMAS
from .simulator import MALFORMED_KINDS, Simulator, simulate

__all__ = [
    "DIMENSIONS",
    "EVENT_STREAMS",
    "MALFORMED_KINDS",
    "SCHEMAS",
    "DayEvents",
    "Simulator",
    "SimulatorConfig",
    "generate_day_events",
    "simulate",
]
