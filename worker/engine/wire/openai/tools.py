"""OpenAI's tools and reasoning fields, shared by chat and Responses: function tools and the tool choice, tool calls
and tool results in a conversation, `reasoning_effort`; and the parts of an answer they add (tool calls, reasoning,
`completion_tokens_details.reasoning_tokens`).

Hosted tools (file search, web search, code interpreter, computer use, remote MCP, image generation, ...) run on
OpenAI's servers; this server runs only the model, so a line that declares one fails with `unsupported_tool`,
naming it. Tool calls the model makes come back for the caller to run, as on OpenAI.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import Field

from worker.engine.generation import BodyError, Generated, Reasoning, Tool, ToolCall, ToolChoice
from worker.engine.tools import MAX_TOOLS
from worker.engine.wire.base import Strict

FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
HOSTED_TOOLS = (
    "file_search, web_search, code_interpreter, computer use, remote MCP, image generation, shell and custom tools"
)


class FunctionDefinition(Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def tool(self) -> Tool:
        return Tool(
            self.name, self.description, self.parameters or {"type": "object", "properties": {}}, bool(self.strict)
        )


class ChatTool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


class AllowedToolRef(Strict):
    type: Literal["function"]
    function: FunctionName


class AllowedTools(Strict):
    mode: Literal["auto", "required"]
    tools: list[AllowedToolRef] = Field(min_length=1, max_length=MAX_TOOLS)


class AllowedToolsChoice(Strict):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ChatToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class FunctionCallText(Strict):
    name: str
    arguments: str


class ChatToolCall(Strict):
    """A call an earlier assistant turn made (`tool_calls` of an assistant message)."""

    id: str
    type: Literal["function"]
    function: FunctionCallText

    def template_form(self) -> dict[str, Any]:
        function = {"name": self.function.name, "arguments": self.function.arguments}
        return {"id": self.id, "type": "function", "function": function}


def check_tools(value: Any) -> Any:
    """Refuse hosted and custom tools by name, and too many tools, before the field is validated (a BodyError
    passes through pydantic unwrapped)."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_TOOLS:
        raise BodyError(
            f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, "
            f"but got an array with length {len(value)} instead.",
            code="array_above_max_length",
            param="tools",
        )
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise BodyError(
                f"tools[{index}]: tool type {kind!r} is not supported here: this server runs function tools only "
                f"(the model's calls come back for you to run); {HOSTED_TOOLS} run on OpenAI's servers",
                code="unsupported_tool",
                param=f"tools[{index}]",
            )
    return value


def tool_choice(
    choice: ChatToolChoice | None, tools: list[Tool], *, parallel: bool | None
) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The request's tools and tool choice in neutral terms (an allowed-tools choice keeps only those tools)."""
    mode: Literal["auto", "none", "required", "named"] = "auto" if tools else "none"
    name = None
    if isinstance(choice, str):
        mode = choice
    elif isinstance(choice, NamedToolChoice):
        mode, name = "named", choice.function.name
    elif isinstance(choice, AllowedToolsChoice):
        allowed = {ref.function.name for ref in choice.allowed_tools.tools}
        _known(allowed, tools)
        tools = [tool for tool in tools if tool.name in allowed]
        mode = choice.allowed_tools.mode
    if mode in ("required", "named") and not tools:
        raise BodyError(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            code="invalid_value",
            param="tool_choice",
        )
    if name is not None:
        _known({name}, tools)
    return tuple(tools), ToolChoice(mode=mode, name=name, parallel=parallel is not False)


def _known(names: set[str], tools: list[Tool]) -> None:
    missing = sorted(names - {tool.name for tool in tools})
    if missing:
        raise BodyError(
            f"Invalid value for 'tool_choice': function {missing[0]!r} is not among the request's tools.",
            code="invalid_value",
            param="tool_choice",
        )


def reasoning_of(
    effort: str | None,
    *,
    budget: int | None = None,
    asked: bool = False,
    param: str = "reasoning_effort",
) -> Reasoning | None:
    """`reasoning_effort` (or Responses' `reasoning.effort`) as a neutral thinking switch: None when nothing was
    asked; "none" turns thinking off (accepted on every model); any other effort, or a thinking budget (vLLM's
    `thinking_token_budget`), turns it on, on models that can think."""
    if effort is None and budget is None and not asked:
        return None
    return Reasoning(
        enabled=effort != "none",
        budget_tokens=budget,
        effort=effort,
        param=param,
        refusal=f"Unsupported parameter: '{param}' is not supported with this model.",
    )


def check_message(role: str, content: Any, tool_calls: list[ChatToolCall] | None, tool_call_id: str | None) -> None:
    """The rules OpenAI checks on a chat message's tool fields (raised as ValueError: pydantic names the message)."""
    if role == "tool" and not tool_call_id:
        raise ValueError("a message with role 'tool' needs 'tool_call_id' (the call it answers)")
    if role != "tool" and tool_call_id is not None:
        raise ValueError("'tool_call_id' belongs to messages with role 'tool'")
    if tool_calls is not None and role != "assistant":
        raise ValueError("'tool_calls' belongs to assistant messages")
    if content is None and not (role == "assistant" and tool_calls):
        raise ValueError("'content' is required (it may be null only on an assistant message with 'tool_calls')")


def template_message(
    message: dict[str, Any], tool_calls: list[ChatToolCall] | None, tool_call_id: str | None
) -> dict[str, Any]:
    """A chat message as vLLM's renderer takes it, with the tool calls it made or the call it answers."""
    if tool_calls:
        message["tool_calls"] = [call.template_form() for call in tool_calls]
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    return message


def answer_message(sequence: Generated) -> dict[str, Any]:
    """The assistant message of a chat answer: its text, the calls it made (`content` null beside calls without
    text, as OpenAI answers) and its reasoning (`reasoning_content`, DeepSeek's and vLLM's field)."""
    calls = sequence.tool_calls
    message: dict[str, Any] = {"role": "assistant", "content": sequence.text or (None if calls else "")}
    if calls:
        message["tool_calls"] = [call_json(call) for call in calls]
    if sequence.reasoning is not None:
        message["reasoning_content"] = sequence.reasoning
    return message


def call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": f"call_{call.id}", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def finish_reason(sequence: Generated, choice: ToolChoice) -> str:
    """OpenAI's finish reason: `tool_calls` when the answer calls tools, but `stop` for a call of a tool named in
    `tool_choice` (OpenAI answers so; vLLM's server too)."""
    if sequence.finish_reason == "tool_calls" and choice.mode == "named":
        return "stop"
    return sequence.finish_reason


# -- Responses: function tools, their calls and results as input items, reasoning ---------------------------


class ResponsesFunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_form(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class ResponsesNamedChoice(Strict):
    type: Literal["function"]
    name: str


class ResponsesToolRef(Strict):
    type: Literal["function"]
    name: str


class ResponsesAllowedChoice(Strict):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[ResponsesToolRef] = Field(min_length=1, max_length=MAX_TOOLS)


ResponsesToolChoice = Literal["none", "auto", "required"] | ResponsesNamedChoice | ResponsesAllowedChoice


def check_responses_choice(value: Any) -> Any:
    """A tool choice naming a hosted tool fails as `unsupported_tool` (not as a shapeless union error)."""
    if isinstance(value, dict) and value.get("type") not in ("function", "allowed_tools"):
        raise BodyError(
            f"tool_choice: tool type {value.get('type')!r} is not supported here: this server runs function "
            f"tools only; {HOSTED_TOOLS} run on OpenAI's servers",
            code="unsupported_tool",
            param="tool_choice",
        )
    return value


def chat_choice(choice: ResponsesToolChoice | None) -> Any:
    """A Responses tool choice in chat's shape."""
    if isinstance(choice, ResponsesNamedChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, ResponsesAllowedChoice):
        refs = [{"type": "function", "function": {"name": ref.name}} for ref in choice.tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.mode, "tools": refs}}
    return choice


class FunctionCallItem(Strict):
    """A call an earlier answer made, passed back in `input`."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(Strict):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(str(part.get("text") or "") for part in self.output if part.get("type") == "input_text")


class ReasoningItem(Strict):
    """An earlier answer's reasoning passed back: accepted, not rendered (templates drop earlier thinking)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ResponsesReasoning(Strict):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the deprecated name of `summary`


def add_item(messages: list[dict[str, Any]], item: FunctionCallItem | FunctionCallOutputItem | ReasoningItem) -> None:
    """A tool-related input item appended to chat messages: calls join the assistant turn before them."""
    if isinstance(item, FunctionCallItem):
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif isinstance(item, FunctionCallOutputItem):
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})


def response_items(sequence: Generated, *, complete: bool, summary: bool) -> list[dict[str, Any]]:
    """A Responses answer's output items: its reasoning, its message (unless it is only calls), its calls."""
    items: list[dict[str, Any]] = []
    if sequence.reasoning is not None:
        text = sequence.reasoning
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [{"type": "summary_text", "text": text}] if summary else [],
                "content": [{"type": "reasoning_text", "text": text}],
            }
        )
    if sequence.text or not sequence.tool_calls:
        content = [{"type": "output_text", "text": sequence.text, "annotations": [], "logprobs": []}]
        state = "completed" if complete else "incomplete"
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": state,
                "role": "assistant",
                "content": content,
            }
        )
    items += [
        {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex}",
            "call_id": f"call_{call.id}",
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        for call in sequence.tool_calls
    ]
    return items
