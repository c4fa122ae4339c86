"""open_clip imported without Hugging Face transformers (3 s of each process that loads CLIP), which stays
importable and comes back for open_clip's Hugging Face text towers."""

import subprocess
import sys

import pytest

from orchestration.profiles import PROJECT_ROOT

pytestmark = pytest.mark.services  # two fresh processes that load torch: 13 s, too long for the fast tier

CHECK = """
import sys
from ml.clip import COMPACT_MODEL, ClipSpec, enable_hf_text_towers, import_open_clip, load_model, model_config

# the project's compact config is known before any model loaded it (as the vision captioner reads it)
assert model_config(COMPACT_MODEL)["vision_cfg"]["image_size"] > 0
open_clip = import_open_clip()
model = load_model(ClipSpec())  # the compact config: no text tower of Hugging Face's
assert "transformers" not in sys.modules, "open_clip imported transformers"
assert open_clip.hf_model.transformers is None

import transformers  # not hidden from the rest of the process
from transformers import AutoModel

enable_hf_text_towers(open_clip)
assert open_clip.hf_model.transformers is transformers
assert open_clip.model.HFTextEncoder.__init__.__globals__["AutoModel"] is AutoModel
print("ok")
"""

ALREADY_IMPORTED = """
import transformers
from ml.clip import import_open_clip

assert import_open_clip().hf_model.transformers is transformers  # imported before: open_clip's as usual
print("ok")
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_open_clip_loads_the_compact_model_without_transformers_and_gives_it_back_for_hf_towers():
    assert _run(CHECK) == "ok"


def test_a_process_that_imported_transformers_keeps_open_clip_as_usual():
    assert _run(ALREADY_IMPORTED) == "ok"
