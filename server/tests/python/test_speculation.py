"""Speculative decoding through the real server: the same requests give the same output with
drafting forced on (draft head for chat, Qwen drafter for completions, n-gram fallback) as with
drafting off, and the deltafin_spec_decode_* series count what was drafted and accepted."""

from conftest import Server

PROMPTS = ["Hello there", "abc abc abc abc", "The quick brown fox", "1 2 3 4 1 2 3 4 1 2", "x"]


def outputs(server):
    c, m = server.client(), server.model_id()
    out = []
    for i, p in enumerate(PROMPTS):
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "top_p": 0.9, "seed": 7 + i}
        chat = c.chat.completions.create(model=m, messages=[{"role": "user", "content": p}], max_tokens=24,
                                         extra_body={"ignore_eos": True}, **sampling)
        comp = c.completions.create(model=m, prompt=p, max_tokens=24, extra_body={"ignore_eos": True}, **sampling)
        out.append((chat.choices[0].message.content, chat.usage.completion_tokens,
                    comp.choices[0].text, comp.usage.completion_tokens))
    return out


def test_drafts_never_change_what_the_server_returns():
    off = Server("--spec", "off")
    try:
        want = outputs(off)
        assert off.metric("deltafin_spec_decode_drafts_total", draft="dspark") == 0
    finally:
        off.stop()
    on = Server("--spec", "on")
    try:
        got = outputs(on)
        assert got == want
        assert on.metric("deltafin_spec_decode_drafts_total", draft="dspark") > 0, "chat used the draft head"
        drafted = on.metric("deltafin_spec_decode_drafts_total", draft="qwen") + on.metric(
            "deltafin_spec_decode_drafts_total", draft="ngram")
        assert drafted > 0, "completions drafted with the Qwen drafter or n-gram"
        proposed = on.metric("deltafin_spec_decode_draft_tokens_total", draft="dspark")
        accepted = on.metric("deltafin_spec_decode_accepted_tokens_total", draft="dspark")
        assert 0 <= accepted <= proposed
        count = on.metric("deltafin_spec_decode_accepted_length_count", draft="dspark")
        assert count == on.metric("deltafin_spec_decode_drafts_total", draft="dspark")
    finally:
        on.stop()


def test_the_models_own_mtp_module_drafts_without_changing_the_output():
    """GLM-5's published MTP layer (fixture glm5-dsa-fp8) as the drafter, chat and completions,
    greedy and seeded: the same output as target-only decoding, and the `mtp` series count its
    drafts. The memory plan reserves the module's bytes; a checkpoint without one is refused at
    start, saying why."""
    import re
    from pathlib import Path

    def reserve(server):
        found = [re.search(r"reserve ([0-9.]+) (KiB|MiB)", line) for line in server.log]
        value, unit = next(m.groups() for m in found if m)
        return float(value) * (1 if unit == "KiB" else 1024)

    glm5 = str(Path(__file__).resolve().parents[3] / "engine/tests/fixtures/glm5-dsa-fp8")
    off = Server("--spec", "off", model=glm5)
    try:
        want = outputs(off)
        plain_reserve = reserve(off)
    finally:
        off.stop()
    on = Server("--spec", "on", "--draft-mtp", "--no-ngram", model=glm5)
    try:
        assert outputs(on) == want
        drafts = on.metric("deltafin_spec_decode_drafts_total", draft="mtp")
        assert drafts > 0, "the MTP module drafted"
        assert on.metric("deltafin_spec_decode_draft_tokens_total", draft="mtp") >= drafts
        # The MTP layer's tensors (about 0.35 MiB here) come out of the budget.
        assert reserve(on) > plain_reserve + 256, (reserve(on), plain_reserve)
    finally:
        on.stop()
    import subprocess

    from conftest import BIN

    dsv3 = str(Path(glm5).parent / "dsv3-bf16")
    run = subprocess.run([BIN, "serve", "--model", dsv3, "--port", "0", "--draft-mtp"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0 and "no multi-token-prediction module" in run.stderr, run.stderr
