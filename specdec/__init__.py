"""specdec: a speculative decoding engine."""

from specdec.engine import Completion, Engine
from specdec.llm import LLM
from specdec.params import SamplingParams

__all__ = ["LLM", "Completion", "Engine", "SamplingParams"]
