"""Exceptions with messages a user can act on.

Every error the engine raises on bad input derives from `SpecdecError`, so the CLI and the
server can turn it into a one-line message (or an HTTP error body) instead of a traceback.
"""


class SpecdecError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class ModelNotFoundError(SpecdecError):
    """A model name, path or package that does not exist."""


class ModelIntegrityError(SpecdecError):
    """A weight file that is truncated, corrupt or has the wrong checksum."""


class UnsupportedModelError(SpecdecError):
    """An architecture or configuration the native transformer does not implement."""


class TokenizerMismatchError(SpecdecError):
    """Two models that must share a tokenizer do not."""


class InvalidParameterError(SpecdecError, ValueError):
    """A sampling or engine parameter outside its valid range."""


class ContextLengthError(SpecdecError, ValueError):
    """A prompt (plus the tokens asked for) that does not fit the model's context."""


class DistributedError(SpecdecError):
    """A tensor-parallel rank failed, died or hung; raised on rank 0 with the reason."""


class IncompatibleDraftError(SpecdecError):
    """A drafter built for another target (hidden size or vocabulary differ)."""
