"""A local OpenAI-compatible chat-completions server, for real provider clients.

`ChatOpenAI` (the real client, its real HTTP stack) talks to it over loopback, so
the standard integration suite runs without a network or a real model. Its
answers are deterministic and just clever enough for that suite: a tool call
when tools are offered and the user has not been answered yet (arguments built
from the tool's JSON schema, numbers taken from the prompt), an object matching
the schema for structured output, text otherwise (cut at a stop sequence);
streaming is Server-Sent Events, chunk by word, with usage when asked for.
`fail_next` makes the next request fail with a real HTTP error (a 429 with
Retry-After, a 401, a 503), which the client raises as its own exception types.
Like the real providers it is strict about tool-call ids in the history: longer
than 40 characters (OpenAI's limit) or outside ``[a-zA-Z0-9_-]`` (Anthropic's) is a
400 naming the field, as OpenAI words it.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = ["FakeOpenAI"]

_WORDS = re.compile(r"\S+\s*")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


class _Synth:
    """A value for a JSON schema, taken from the prompt where it can be."""

    def __init__(self, prompt: str, defs: dict[str, Any]) -> None:
        self.numbers = [int(n) for n in re.findall(r"-?\d+", prompt)]
        self.prompt = prompt
        self.defs = defs

    def value(self, schema: dict[str, Any], name: str = "") -> Any:
        if "$ref" in schema:
            return self.value(self.defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), name)
        for key in ("anyOf", "oneOf", "allOf"):
            if key in schema:
                options = [s for s in schema[key] if s.get("type") != "null"]
                return self.value(options[0] if options else {}, name)
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        if kind == "object":
            properties = schema.get("properties") or {}
            return {key: self.value(sub, key) for key, sub in properties.items()}
        if kind == "array":
            return [self.value(schema.get("items") or {}, name)]
        if kind == "integer":
            return self.numbers[0] if self.numbers else 3
        if kind == "number":
            return float(self.numbers[0]) if self.numbers else 3.0
        if kind == "boolean":
            return True
        return self.string(name, str(schema.get("description", "")))

    def string(self, name: str, description: str) -> str:
        quoted = re.findall(r"'([^']+)'|\"([^\"]+)\"", self.prompt)
        if quoted and name not in ("setup", "punchline"):
            first = quoted[0]
            return first[0] or first[1]
        if name == "setup" or "set up" in description:
            return "Why did the cat sit on the computer?"
        if name == "punchline" or "punchline" in description or "answer" in description:
            return "To keep an eye on the mouse."
        return f"a {name or 'value'}"


def _reply(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for a request: content and/or tool calls."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    prompt = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "user")
    latest_user = next(
        (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        synth = _Synth(latest_user, schema.get("$defs") or {})
        return {"content": json.dumps(synth.value(schema))}
    if fmt.get("type") == "json_object":
        return {"content": json.dumps({"setup": "Why?", "punchline": "Because."})}
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)
    if tools and choice != "none" and (forced or last.get("role") == "user"):
        tool = _chosen(tools, choice, latest_user)
        function = tool.get("function") or {}
        parameters = function.get("parameters") or {}
        synth = _Synth(latest_user, parameters.get("$defs") or {})
        args = synth.value({**parameters, "type": "object"}) if parameters else {}
        call = {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": function.get("name"), "arguments": json.dumps(args)},
        }
        return {"content": None, "tool_calls": [call]}
    if last.get("role") == "tool":
        return {"content": f"The tool answered: {_text(last.get('content'))}"}
    text = f"Hello! You said: {latest_user or prompt}".strip()
    for stop in body.get("stop") or []:
        if stop and stop in text:
            text = text[: text.index(stop)]
    return {"content": text or "Hello!"}


_CALL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _invalid_call_id(body: dict[str, Any]) -> str | None:
    """OpenAI's 400 message for the first tool-call id a provider would reject."""
    for index, message in enumerate(body.get("messages") or []):
        fields = [(f"messages[{index}].tool_call_id", message.get("tool_call_id"))]
        fields += [
            (f"messages[{index}].tool_calls[{n}].id", call.get("id"))
            for n, call in enumerate(message.get("tool_calls") or [])
        ]
        for field, value in fields:
            if value is None:
                continue
            if len(value) > 40:
                return (
                    f"Invalid '{field}': string too long. Expected a string with maximum "
                    f"length 40, but got a string with length {len(value)} instead."
                )
            if not _CALL_ID.match(value):
                return f"Invalid '{field}': string does not match pattern ^[a-zA-Z0-9_-]+$."
    return None


def _chosen(tools: list[dict[str, Any]], choice: Any, prompt: str) -> dict[str, Any]:
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        for tool in tools:
            if (tool.get("function") or {}).get("name") == wanted:
                return tool
    for tool in tools:
        if str((tool.get("function") or {}).get("name")) in prompt:
            return tool
    return tools[0]


def _usage(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, int]:
    prompt = sum(_tokens(_text(m.get("content"))) for m in body.get("messages") or [])
    completion = _tokens(reply.get("content") or json.dumps(reply.get("tool_calls")))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **reply},
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
            }
        ],
        "usage": _usage(body, reply),
    }


def _chunks(body: dict[str, Any], reply: dict[str, Any]) -> Iterator[dict[str, Any]]:
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for word in _WORDS.findall(reply.get("content") or ""):
        yield chunk({"content": word})
    for index, call in enumerate(reply.get("tool_calls") or []):
        head = {"index": index, "id": call["id"], "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": call["function"]["name"]}}]})
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "function": {"arguments": call["function"]["arguments"]}}
                ]
            }
        )
    yield chunk({}, "tool_calls" if reply.get("tool_calls") else "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": _usage(body, reply)}


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "FakeOpenAI/1"

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append(body)  # type: ignore[attr-defined]
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self.send_error(404, "only /v1/chat/completions")
            return
        faults = self.server.faults  # type: ignore[attr-defined]
        invalid = _invalid_call_id(body)
        if faults or invalid:
            status, headers = faults.pop(0) if faults else (400, {})
            detail = {"message": invalid or f"fake {status}", "type": "invalid_request_error"}
            error = json.dumps({"error": detail}).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        reply = _reply(body)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for item in _chunks(body, reply):
                self.wfile.write(f"data: {json.dumps(item)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        data = json.dumps(_completion(body, reply)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeOpenAI:
    """The server on 127.0.0.1 (a free port), in a thread; a context manager."""

    def __init__(self) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.requests = []  # type: ignore[attr-defined]
        self._server.faults = []  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received, in order."""
        return self._server.requests  # type: ignore[attr-defined, no-any-return]

    def fail_next(self, status: int, headers: dict[str, str] | None = None) -> None:
        """Answer the next request with an HTTP error (e.g. 429 with Retry-After)."""
        self._server.faults.append((status, dict(headers or {})))  # type: ignore[attr-defined]

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
