"""Qwen3.5's native tool calls through the official openai client, on the tiny Qwen3.5-MoE
fixture (HF transformers goldens, `engine/tests/fixtures/qwen3.5-moe`): the format is chosen
from the published chat template (Qwen3.5 XML); `tool_choice: auto` is served and never leaves
call markup in `content`; forcing a Qwen3.5 XML call is refused with a clear 400 (the XML's
typed free-text values have no grammar yet; hermes calls can be forced)."""

from pathlib import Path

import openai
import pytest
from conftest import Server

QWEN35 = Path(__file__).resolve().parents[3] / "engine/tests/fixtures/qwen3.5-moe"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}


def test_qwen35_tools_auto_is_served_and_a_forced_xml_call_is_a_clear_400():
    assert QWEN35.is_dir(), QWEN35
    s = Server("--max-tokens", "64", model=str(QWEN35))
    try:
        c, m = s.client(), s.model_id()
        messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
        for stream in (False, True):
            if stream:
                chunks = list(c.chat.completions.create(model=m, messages=messages, tools=[TOOL], max_tokens=24,
                                                        temperature=0, stream=True))
                content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            else:
                r = c.chat.completions.create(model=m, messages=messages, tools=[TOOL], max_tokens=24, temperature=0)
                content = r.choices[0].message.content or ""
                assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
            assert "<tool_call>" not in content and "</tool_call>" not in content, content
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=m, messages=messages, tools=[TOOL], tool_choice="required", max_tokens=24)
        assert "QwenXml" in str(e.value) and "not supported" in str(e.value), str(e.value)
    finally:
        s.stop()
