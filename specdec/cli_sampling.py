"""`specdec generate`'s sampling flags: the SamplingParams a server request would build.

The server takes penalties, `logit_bias`, logprobs and `response_format` from the request
body (`specdec.serving.protocol`); these flags give the command line the same fields, read
into the same `SamplingParams`, so one check (`specdec.params`) judges both. Bad values
are `InvalidParameterError`s naming the flag, never a traceback.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.errors import InvalidParameterError
from specdec.params import MAX_TOP_LOGPROBS, Grammar, SamplingParams


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The flags for penalties, biases, logprobs and structured output."""
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        metavar="F",
        help="subtracted from the logit of every token already generated, in [-2, 2] "
        "(OpenAI's presence_penalty)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        metavar="F",
        help="times a token's count so far, subtracted from its logit, in [-2, 2] "
        "(OpenAI's frequency_penalty)",
    )
    p.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS in [-100, 100] to token ID's logit (repeatable; OpenAI's logit_bias)",
    )
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help=f"report each token's log probability and its N most likely alternatives "
        f"(0-{MAX_TOP_LOGPROBS}); with --json, a `logprobs` list in the chat API's shape",
    )
    structured = p.add_mutually_exclusive_group()
    structured.add_argument(
        "--json-object",
        action="store_true",
        help="constrain the output to one JSON object (response_format json_object)",
    )
    structured.add_argument(
        "--json-schema",
        default=None,
        metavar="FILE",
        help="constrain the output to JSON valid under the schema in FILE "
        "(response_format json_schema)",
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The request every prompt of `generate` makes, from its parsed flags."""
    if args.logprobs is not None and not 0 <= args.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidParameterError(
            f"--logprobs {args.logprobs}: alternatives per token must be in [0, {MAX_TOP_LOGPROBS}]"
        )
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        logit_bias=parse_logit_bias(args.logit_bias),
        logprobs=args.logprobs,
        grammar=_grammar(args),
    )


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """`["15=-100", "42=5"]` -> {15: -100.0, 42: 5.0}; a token given twice is an error."""
    bias: dict[int, float] = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            token_id, amount = int(token), float(value)
        except ValueError:
            raise InvalidParameterError(
                f"--logit-bias {item!r}: write TOKEN_ID=BIAS, e.g. 15=-100"
            ) from None
        if token_id in bias:
            raise InvalidParameterError(f"--logit-bias: token {token_id} is given twice")
        bias[token_id] = amount
    return bias


def _grammar(args: argparse.Namespace) -> Grammar | None:
    if args.json_object:
        return Grammar("json_object")
    if args.json_schema is None:
        return None
    path = Path(args.json_schema).expanduser()
    try:
        schema = json.loads(path.read_text())
    except OSError as err:
        raise InvalidParameterError(f"--json-schema {path}: {err.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidParameterError(f"--json-schema {path}: not JSON ({err})") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidParameterError(f"--json-schema {path}: a schema is an object or a boolean")
    return Grammar("json_schema", json.dumps(schema))
