"""Chat templates rendered with jinja2 as transformers renders them, without importing it.

A Hub chat template is untrusted code: it runs in jinja2's immutable sandbox, with the names
transformers gives it (`raise_exception`, `strftime_now`, a JSON `tojson` that does not
escape HTML, a `dict` and a `namespace` that cannot reach interpreter internals), and sees
only plain JSON data built from the caller's messages, tools and keyword arguments.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

# Names a message's reasoning may come under; templates read the first (transformers fills
# it, and `thinking` for templates that read that, from whichever the caller used).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def select_template(chat_template: str | dict | None, tools) -> str:
    """The template to render: a model may keep several by name (`default`, `tool_use`)."""
    if isinstance(chat_template, dict):
        if tools is not None and "tool_use" in chat_template:
            return chat_template["tool_use"]
        if "default" in chat_template:
            return chat_template["default"]
        raise ValueError(
            "this model has several chat templates and none is the default: "
            f"{sorted(chat_template)}"
        )
    if chat_template is None:
        raise ValueError("this tokenizer has no chat template")
    return chat_template


def render(
    template: str,
    conversation: list[dict],
    tools: list[dict] | None,
    documents: list[dict] | None,
    add_generation_prompt: bool,
    variables: dict[str, Any],
) -> str:
    """One conversation through `template`. `variables` (the special tokens, then the
    caller's keyword arguments) are visible to the template as top-level names."""
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError(
                    "Tools should either be a JSON schema, or a callable function with type "
                    "hints and a docstring suitable for auto-conversion to a schema."
                )
    if documents is not None:
        for document in documents:
            if not isinstance(document, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    chat = plain_data(conversation)
    for message in chat:
        if not isinstance(message, dict):
            raise TypeError(
                "Chat messages should be dicts, dataclasses or pydantic models, "
                f"but got {message!r}."
            )
    return compiled(template).render(
        messages=alias_reasoning(chat),
        tools=plain_data(tools),
        documents=plain_data(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_data(variables),
    )


def alias_reasoning(chat: list[dict]) -> list[dict]:
    """Reasoning under any of its names is also given as `reasoning_content` and `thinking`."""
    out = []
    for message in chat:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def plain_data(value: Any) -> Any:
    """`value` rebuilt from JSON types only: rich objects (arrays, images, enums) carry
    methods the sandbox does not know to block, so anything else becomes `<TypeName>`."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray":
        return plain_data(value.item())  # a numpy scalar (np.bool_(False) must stay falsy)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


@lru_cache(maxsize=16)
def compiled(template: str):
    """The template compiled in the sandbox (cached: a server renders one per request)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text (for training
        masks); rendering only needs it to pass its body through."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):  # noqa: A002 - the name templates call it with
        return datetime.now().strftime(format)

    class TemplateDict:
        """`dict(...)` for templates, without the class itself (no attribute tricks)."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore names (no way to CPython internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    "Chat templates cannot store underscore-prefixed attributes on a "
                    f"namespace, but got {name!r}."
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
