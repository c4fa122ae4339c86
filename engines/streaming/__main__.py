"""`python -m engines.streaming PUSHER.json`: the pusher process (FlinkResource starts it)."""

import sys
from pathlib import Path

from engines.streaming.pusher import run_pusher

run_pusher(Path(sys.argv[1]))
