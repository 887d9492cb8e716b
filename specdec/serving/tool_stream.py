"""Tool calls read out of an answer as it grows: OpenAI's streamed `delta.tool_calls`.

One parser serves both paths: the streamed answer feeds it each text delta, the
non-streamed one feeds it the whole text at once and merges what comes out, so a call
reads the same either way. Its output for a text does not depend on how the text was cut
into deltas: everything it cannot yet decide (a partial `<tool_call>` tag, whitespace that
may precede one, a call's name still being written) is held back until it can.

The shape follows `specdec.serving.tools`: a forced call (tool_choice "required" or named)
is the whole answer, `{"name": ..., "arguments": {...}}`; with "auto" each
`<tool_call>{...}</tool_call>` block (Hermes / Qwen) is one call and the text outside the
blocks is the content. A call's `arguments` are the JSON text the model wrote for them,
streamed as it is written (the first delta of a call carries its id, type and name).
A block whose name is not one of the tools is dropped; one whose keys come in another
order is sent whole when it closes.
"""

from __future__ import annotations

import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The start of a call object up to its arguments' value: `{"name": "X", "arguments":`.
HEADER = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:'
)


class ToolCallParser:
    """Text in, OpenAI deltas out (`feed` per text delta, `finish` at the end)."""

    def __init__(self, names: set[str], forced: bool) -> None:
        self.names = names
        self.forced = forced
        self.text = ""  # everything fed so far
        self.pos = 0  # how far `text` is decided
        self.calls = 0  # calls started
        self.in_block = forced  # inside a call (a forced answer is one)
        self.block_start = 0
        self.args: _ValueScanner | None = None  # the current call's arguments, once named
        self.skip = False  # the current block is done or dropped: wait for its end
        self.withheld = ""  # trailing whitespace of the content, sent once text follows

    def feed(self, text: str) -> dict:
        """The delta for `text` (the answer's next characters): {} when nothing is decided."""
        self.text += text
        return self._advance(final=False)

    def finish(self) -> dict:
        """The delta for whatever was held back, now that the answer is complete."""
        return self._advance(final=True)

    @property
    def called(self) -> bool:
        return self.calls > 0

    # ---- the scan ---------------------------------------------------------------------------

    def _advance(self, final: bool) -> dict:
        out = _Delta()
        while self.pos < len(self.text) or final:
            if not self.in_block:
                if not self._content(out, final):
                    break
            elif not self._block(out, final):
                break
        if final:
            if not self.called and self.withheld:
                out.content(self.withheld)
            self.withheld = ""
        return out.body()

    def _content(self, out: _Delta, final: bool) -> bool:
        """Text outside any block, up to the next tag; False once nothing more is decided."""
        rest = self.text[self.pos :]
        at = rest.find(OPEN)
        if at >= 0:
            self._send_content(out, rest[:at], before_tag=True)
            self.pos += at + len(OPEN)
            self.in_block, self.block_start, self.args, self.skip = True, self.pos, None, False
            return True
        keep = 0 if final else _partial(rest, OPEN)
        self._send_content(out, rest[: len(rest) - keep], before_tag=False)
        self.pos += len(rest) - keep
        return False

    def _send_content(self, out: _Delta, text: str, before_tag: bool) -> None:
        text = self.withheld + text
        stripped = text.rstrip()
        if stripped:
            out.content(stripped)
        self.withheld = "" if before_tag else text[len(stripped) :]

    def _block(self, out: _Delta, final: bool) -> bool:
        """Inside a call; False once nothing more is decided."""
        end = -1 if self.forced else self.text.find(CLOSE, self.block_start)
        if self.skip:
            if end < 0:
                self.pos = len(self.text)
                return False
            return self._close(end)
        if self.args is None:
            head = HEADER.match(self.text, self.block_start)
            if head is None:
                if end < 0 and not final:
                    return False  # the name is still being written
                block = self.text[self.block_start : end if end >= 0 else len(self.text)]
                self._whole(out, block)
                self.skip = True
                return self._close(end) if end >= 0 else self._stop()
            name = json.loads(f'"{head.group(1)}"')
            if name not in self.names:
                self.skip = True
                return True
            out.call(self.calls, name)
            self.calls += 1
            self.args = _ValueScanner(head.end())
        # A close tag still being written is not part of the arguments.
        if end >= 0:
            limit = end
        elif self.forced or final:
            limit = len(self.text)
        else:
            limit = len(self.text) - _partial(self.text, CLOSE)
        piece, done = self.args.scan(self.text, limit)
        if piece:
            out.arguments(self.calls - 1, piece)
        self.pos = max(self.pos, self.args.pos)
        if done or end >= 0:
            self.skip = True
            return True if end >= 0 or not final else self._stop()
        return False if not final else self._stop()

    def _whole(self, out: _Delta, block: str) -> None:
        """A call whose keys are not in the expected order, read once it is complete."""
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return
        if not isinstance(call, dict) or call.get("name") not in self.names:
            return
        arguments = call.get("arguments", call.get("parameters", {}))
        out.call(self.calls, call["name"])
        out.arguments(self.calls, json.dumps(arguments))
        self.calls += 1

    def _close(self, end: int) -> bool:
        self.pos = end + len(CLOSE)
        self.in_block = False
        return True

    def _stop(self) -> bool:
        self.pos = len(self.text)
        return False


class _ValueScanner:
    """Where one JSON value ends, read a piece at a time (strings and nesting tracked)."""

    def __init__(self, start: int) -> None:
        self.pos = start  # next character to read
        self.started = False
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.scalar = False  # a number / true / false / null: ends at a delimiter

    def scan(self, text: str, limit: int) -> tuple[str, bool]:
        """(the value's characters in text[pos:limit], whether the value is complete)."""
        begin = self.pos
        i = self.pos
        while i < limit:
            ch = text[i]
            if not self.started:
                if ch.isspace():
                    i += 1
                    begin = i
                    continue
                self.started = True
                self.scalar = ch not in '{["'
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.pos = i + 1
                        return text[begin : i + 1], True
            elif self.scalar:
                if ch in ",}] \t\r\n":
                    self.pos = i
                    return text[begin:i], True
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return text[begin : i + 1], True
            i += 1
        if self.scalar:  # a number may go on: hold it until its delimiter, read it again
            self.pos, self.started = begin, False
            return "", False
        self.pos = limit
        return text[begin:limit], False


def _partial(text: str, tag: str) -> int:
    """How many trailing characters of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class _Delta:
    """One chunk's delta under construction: content, then fragments per call index."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: dict[int, dict] = {}

    def content(self, text: str) -> None:
        self.text += text

    def call(self, index: int, name: str) -> None:
        self.calls[index] = {
            "index": index,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }

    def arguments(self, index: int, text: str) -> None:
        entry = self.calls.setdefault(index, {"index": index, "function": {"arguments": ""}})
        entry["function"]["arguments"] += text

    def body(self) -> dict:
        body: dict = {}
        if self.text:
            body["content"] = self.text
        if self.calls:
            body["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return body


def merged_calls(parser: ToolCallParser, text: str) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a whole answer, as the streamed deltas add up."""
    content, calls = "", {}
    for delta in (parser.feed(text), parser.finish()):
        content += delta.get("content", "")
        for part in delta.get("tool_calls", ()):
            if part["index"] not in calls:
                calls[part["index"]] = {k: v for k, v in part.items() if k != "index"}
                calls[part["index"]]["function"] = dict(part["function"])
            else:
                calls[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    if not calls:
        return content, None
    return content or None, [calls[i] for i in sorted(calls)]
