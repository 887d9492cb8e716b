"""specdec: a speculative decoding engine."""

from specdec.config import SamplingParams
from specdec.engine import Completion, Engine
from specdec.llm import LLM

__all__ = ["LLM", "Completion", "Engine", "SamplingParams"]
