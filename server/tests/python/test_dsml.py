"""DeepSeek-V3.2 as DeepSeek ships it (no chat template, `encoding/encoding_dsv32.py` renders its
prompts) through the real server: `/tokenize` of DeepSeek's own published tool conversation
equals that encoder's rendering (engine/tests/fixtures/dsml/golden.json, made by gen_dsml.py),
a plain chat answers through the official openai client, and `tools` on the chat endpoint are a
clear 400 until DSML calls are parsed from the output.
"""

import json
import shutil
from pathlib import Path

import openai
import pytest
from conftest import Server
from test_tool_parity import post

FIXTURES = Path(__file__).resolve().parents[3] / "engine/tests/fixtures"
GOLDEN = json.loads((FIXTURES / "dsml/golden.json").read_text(encoding="utf-8"))


def v32_dir(tmp_path):
    """The dsv32-dsa-bf16 fixture with its chat template taken out, as DeepSeek publishes V3.2."""
    dst = tmp_path / "dsv32"
    shutil.copytree(FIXTURES / "dsv32-dsa-bf16", dst)
    config = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["chat_template"]
    (dst / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    s = Server("--max-tokens", "8", model=str(v32_dir(tmp_path_factory.mktemp("dsml"))))
    yield s
    s.stop()


def test_tokenize_renders_deepseeks_published_tool_conversation_as_its_encoder(v32):
    # The server reads an OpenAI `developer` message as `system` (OpenAI's meaning of the role),
    # which the encoder renders differently: those cases are checked in the engine test only.
    cases = [c for c in GOLDEN["cases"] if all(m["role"] != "developer" for m in c["messages"])]
    assert len(cases) >= 5
    for case in cases:
        body = {"messages": case["messages"], "add_generation_prompt": True,
                "chat_template_kwargs": {"thinking": case["thinking"]}}
        if case["tools"]:
            body["tools"] = case["tools"]
        status, out = post(v32, "/tokenize", body)
        if "error" in case:
            assert status == 400, (case["name"], out)
            continue
        assert status == 200, (case["name"], out)
        assert out["tokens"] == case["ids"], case["name"]


def test_a_plain_chat_answers_and_tools_are_refused_until_dsml_calls_are_parsed(v32):
    c = v32.client()
    r = c.chat.completions.create(model=v32.model_id(), messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    tools = GOLDEN["cases"][0]["tools"]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=v32.model_id(), messages=[{"role": "user", "content": "hi"}],
                                  tools=tools, max_tokens=4)
    assert "DSML" in str(e.value)
