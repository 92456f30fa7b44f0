"""How calls run: one pipeline (:mod:`.pipeline`), one small-call cache keyed on layout
(:mod:`.cache`), and the recording that replays a call on new tensors (:mod:`.recording`)."""

from .cache import CallCache, layout_key
from .pipeline import Op, run_call
from .recording import Recording, UnreplayableCall

__all__ = ["CallCache", "Op", "Recording", "UnreplayableCall", "layout_key", "run_call"]
