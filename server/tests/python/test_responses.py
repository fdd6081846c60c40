"""The OpenAI Responses API (`/v1/responses`) through the official `openai` client: text
streamed and not with the event sequence, forced function calls (required and named) with
schema-valid arguments, a `function_call_output` follow-up, `previous_response_id` (and an
unknown id refused), and `text.format` json_schema output that validates. Random weights:
only constrained output is asserted on content."""

import json

import httpx
import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]},
}
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER, TIME)}


def create(server, **kw):
    args = dict(model=server.model_id(), input="Tell me about the sea.", temperature=0, max_output_tokens=24)
    args.update(kw)
    return server.client().responses.create(**args)


def calls(response):
    return [o for o in response.output if o.type == "function_call"]


def test_text_response_and_stream_agree(server):
    r = create(server, instructions="Be brief.")
    assert r.object == "response" and r.id.startswith("resp_") and r.model == server.model_id()
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.output_text == msg.content[0].text
    assert 0 < r.usage.output_tokens <= 24 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Be brief."
    events = list(create(server, instructions="Be brief.", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] == ("response.completed" if r.status == "completed" else "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text
    final = events[-1].response
    assert final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens
    assert final.output[0].id == events[2].item.id


def test_the_stream_helper_parses_the_events(server):
    with server.client().responses.stream(model=server.model_id(), input="Hi", temperature=0,
                                          max_output_tokens=200, tools=[WEATHER], tool_choice="required",
                                          parallel_tool_calls=False) as s:
        deltas = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        final = s.get_final_response()
    call = calls(final)[0]
    assert "".join(deltas) == call.arguments
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_function_calls_have_valid_arguments(server, choice):
    r = create(server, input="What is the weather in Paris?", tools=[WEATHER, TIME], tool_choice=choice,
               max_output_tokens=200)
    found = calls(r)
    assert found, r.output
    for c in found:
        assert c.id.startswith("fc_") and c.call_id and c.status == "completed"
        if isinstance(choice, dict):
            assert c.name == "get_weather"
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    # Streamed, the call reassembles to exactly the non-streamed one.
    events = list(create(server, input="What is the weather in Paris?", tools=[WEATHER, TIME], tool_choice=choice,
                         max_output_tokens=200, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done[0].arguments == found[0].arguments
    assert args.startswith(found[0].arguments)
    # Call ids are minted per response (unique across turns), so only names and arguments match.
    assert [(c.name, c.arguments) for c in calls(events[-1].response)] == [(c.name, c.arguments) for c in found]


def test_function_call_output_follow_up_is_answered(server):
    first = create(server, input="Weather in Paris?", tools=[WEATHER], tool_choice="required", max_output_tokens=200)
    call = calls(first)[0]
    items = [{"role": "user", "content": "Weather in Paris?"}]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"})
    r = create(server, input=items, tools=[WEATHER], tool_choice="none", max_output_tokens=16)
    assert r.status in ("completed", "incomplete") and not calls(r)
    assert r.usage.input_tokens > first.usage.input_tokens


def test_previous_response_id_continues_a_text_conversation(server):
    first = create(server, input="Tell me about the sea.", instructions="Be brief.", max_output_tokens=12)
    second = create(server, previous_response_id=first.id, input="And the mountains?", instructions="Be brief.",
                    max_output_tokens=12)
    assert second.previous_response_id == first.id
    # The stored turn is a prefix of the new prompt: the engine reuses its state.
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # The same conversation sent in full renders the same prompt and gives the same answer.
    items = [{"role": "user", "content": "Tell me about the sea."}]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"role": "user", "content": "And the mountains?"})
    full = create(server, input=items, instructions="Be brief.", max_output_tokens=12)
    assert full.usage.input_tokens == second.usage.input_tokens
    assert full.output_text == second.output_text
    # Instructions are not carried over (this template renders a default system prompt without them).
    bare = create(server, previous_response_id=first.id, input="And the mountains?", max_output_tokens=1)
    assert bare.usage.input_tokens != second.usage.input_tokens and bare.instructions is None
    # A streamed turn is stored as well.
    events = list(create(server, previous_response_id=second.id, input="And the sky?", max_output_tokens=4,
                         stream=True))
    third = events[-1].response
    fourth = create(server, previous_response_id=third.id, input="Thanks.", max_output_tokens=2)
    assert fourth.usage.input_tokens > third.usage.input_tokens + third.usage.output_tokens
    # store: false keeps nothing.
    unstored = create(server, input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        create(server, previous_response_id=unstored.id, input="y")


def test_previous_response_id_continues_after_a_function_call(server):
    first = create(server, input="Weather in Paris?", tools=[WEATHER], tool_choice="required", max_output_tokens=200)
    call = calls(first)[0]
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = create(server, previous_response_id=first.id, input=follow, tools=[WEATHER], tool_choice="none",
                    max_output_tokens=16)
    assert second.previous_response_id == first.id
    # The stored turn is a prefix of the new prompt: the engine reuses its state.
    assert second.usage.input_tokens_details.cached_tokens > 0
    # The same conversation sent in full renders the same prompt.
    items = [{"role": "user", "content": "Weather in Paris?"}]
    items += [o.model_dump(exclude_none=True) for o in first.output] + follow
    full = create(server, input=items, tools=[WEATHER], tool_choice="none", max_output_tokens=16)
    assert full.usage.input_tokens == second.usage.input_tokens
    assert full.output_text == second.output_text


def test_an_unknown_previous_response_id_is_refused(server):
    with pytest.raises(openai.BadRequestError) as e:
        create(server, previous_response_id="resp_nope", input="hi")
    assert e.value.status_code == 400
    assert e.value.body["param"] == "previous_response_id" and "resp_nope" in e.value.body["message"]


def test_json_schema_text_format_validates(server):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
    r = create(server, input="A person, as JSON.", text=fmt, max_output_tokens=200)
    assert r.status == "completed", r.output
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    events = list(create(server, input="A person, as JSON.", text=fmt, max_output_tokens=200, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    r = create(server, input="JSON please.", text={"format": {"type": "json_object"}}, max_output_tokens=500)
    assert r.text.format.type == "json_object" and r.output_text.lstrip().startswith("{")
    # Free-form JSON from random weights may run to the limit; a finished one is an object.
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)
    else:
        assert r.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(tools=[{"type": "web_search"}]), "tools[0].type"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]),
         "input[0].content[0]"),
        (dict(tool_choice={"type": "function", "name": "nope"}, tools=[WEATHER]), "tool_choice"),
        (dict(text={"format": {"type": "json_schema", "name": "bad name", "schema": {}}}), "text.format.name"),
        (dict(extra_body={"conversation": "conv_1"}), "conversation"),
        (dict(max_output_tokens=100000), "max_output_tokens"),
    ],
)
def test_invalid_requests_are_openai_shaped_400s(server, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        create(server, **kw)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"


def test_metrics_count_the_responses_endpoint(server):
    before = server.metric("deltafin_requests_total", endpoint="responses", outcome="success")
    create(server, max_output_tokens=2)
    assert server.metric("deltafin_requests_total", endpoint="responses", outcome="success") == before + 1
    r = httpx.post(server.base + "/v1/responses", json={"input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_reasoning_comes_back_as_a_reasoning_item(thinking_model):
    from conftest import Server

    s = Server("--max-tokens", "512", model=thinking_model)
    try:
        m = s.model_id()
        r = s.client().responses.create(model=m, input="Tell me about the sea.", temperature=0, max_output_tokens=16)
        assert r.output[0].type == "reasoning" and r.output[0].content[0].type == "reasoning_text"
        thinking = r.output[0].content[0].text
        assert thinking and r.output[0].summary == []
        events = list(s.client().responses.create(model=m, input="Tell me about the sea.", temperature=0,
                                                  max_output_tokens=16, stream=True))
        assert events[2].type == "response.output_item.added" and events[2].item.type == "reasoning"
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thinking
        assert events[-1].response.output[0].content[0].text == thinking
        # Replayed reasoning items are accepted as the assistant's reasoning.
        items = [{"role": "user", "content": "Tell me about the sea."}]
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items.append({"role": "user", "content": "More."})
        assert s.client().responses.create(model=m, input=items, max_output_tokens=4).object == "response"
    finally:
        s.stop()
