"""Agent loops against the real server: the `openai-agents` SDK over `/v1/responses`, and a
Claude-Code-style loop with the `anthropic` client over `/v1/messages`. Each runs two tool
rounds (tool choice forced, one call per round, so random weights still call the tools with
schema-valid arguments) and then finishes with tool choice `none`."""

import asyncio
import json

import anthropic
import jsonschema
import openai

ROUNDS = 2


def test_openai_agents_sdk_runs_two_tool_rounds_and_finishes(server):
    run_agents_sdk(server)


def run_agents_sdk(server):
    """The `openai-agents` SDK over `/v1/responses` on `server`: two forced tool rounds, then a
    structured answer (shared with the per-family runs in test_tool_parity.py)."""
    from typing import Annotated, Literal

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from agents.tool_context import ToolContext
    from pydantic import BaseModel, Field

    set_tracing_disabled(True)
    seen = []

    class Verdict(BaseModel):
        """The final answer: a structured output, so random weights still end it (the grammar
        closes the JSON and the turn)."""

        umbrella: Literal["yes", "no"]

    # Bounded argument types: with random weights an unbounded string never ends.
    @function_tool
    def lookup(ctx: ToolContext, city: Literal["Paris", "Rome", "Oslo"], days: Annotated[int, Field(ge=1, le=7)]) -> str:
        """The weather forecast for a city."""
        seen.append((city, days))
        if len(seen) == ROUNDS:
            # The run works on its own copy of the agent: switch the copy to answering.
            ctx.agent.model_settings = ModelSettings(tool_choice="none", temperature=0, max_tokens=64)
        return f"sunny for {days} days in {city}"

    client = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    agent = Agent(
        name="forecaster",
        instructions="Use the lookup tool, then answer.",
        tools=[lookup],
        output_type=Verdict,
        model=OpenAIResponsesModel(model=server.model_id(), openai_client=client),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                     max_tokens=200),
        reset_tool_choice=False,
    )

    async def run():
        try:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=ROUNDS + 2)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(seen) == ROUNDS, seen
    assert all(c in ("Paris", "Rome", "Oslo") and 1 <= d <= 7 for c, d in seen)
    assert isinstance(result.final_output, Verdict)
    kinds = [i.type for i in result.new_items]
    assert kinds.count("tool_call_item") == ROUNDS and kinds.count("tool_call_output_item") == ROUNDS
    assert kinds[-1] == "message_output_item"


def test_a_messages_api_agent_loop_runs_two_tool_rounds_and_finishes(server):
    run_messages_loop(server)


def run_messages_loop(server):
    """A Claude-Code-style loop with the `anthropic` client over `/v1/messages` on `server`: two
    forced tool rounds, then an answer with tool choice `none` (shared with test_tool_parity.py)."""
    tool = {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 40}},
            "required": ["path"],
            "additionalProperties": False,
        },
    }
    client = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Summarise README.md."}]
    rounds = 0
    while True:
        choice = {"type": "tool", "name": "read_file", "disable_parallel_tool_use": True} if rounds < ROUNDS \
            else {"type": "none"}
        r = client.messages.create(model=server.model_id(), max_tokens=200 if rounds < ROUNDS else 16,
                                   extra_body={"temperature": 0}, system="You are a coding agent.", tools=[tool],
                                   tool_choice=choice, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        if r.stop_reason != "tool_use":
            break
        assert len(uses) == 1
        jsonschema.validate(uses[0].input, tool["input_schema"])
        rounds += 1
        result = json.dumps({"path": uses[0].input["path"], "text": "# Deltafin\nAn inference server."})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": uses[0].id, "content": result}]})
        assert rounds <= ROUNDS
    assert rounds == ROUNDS and not uses
    assert r.stop_reason in ("end_turn", "max_tokens")
