"""Continuous batching: 8 clients at once get exactly the tokens each gets alone, and their
requests share batched passes."""

import threading

from conftest import Server

PROMPTS = [f"Client {i} asks about {topic}" for i, topic in enumerate(
    ["rivers", "stars", "bread", "music", "stones", "birds", "clocks", "rain"])]


def run(client, model, i):
    kw = dict(temperature=0) if i % 2 == 0 else dict(temperature=0.9, seed=100 + i, top_p=0.9)
    if i < 4:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[i]}],
                                           max_tokens=24 + i, extra_body={"ignore_eos": True}, **kw)
        return r.choices[0].message.content, r.usage.completion_tokens
    chunks = client.completions.create(model=model, prompt=PROMPTS[i], max_tokens=24 + i, stream=True,
                                       extra_body={"ignore_eos": True}, **kw)
    return "".join(c.choices[0].text for c in chunks if c.choices), None


def test_eight_concurrent_clients_get_their_solo_tokens():
    s = Server("--max-batch", "8", "--prefill-chunk", "16", "--state-cache", "0")
    try:
        c, m = s.client(), s.model_id()
        alone = [run(c, m, i) for i in range(8)]
        steps0 = s.metric("deltafin_engine_steps_total")
        tokens0 = s.metric("deltafin_generation_tokens_total", endpoint="chat_completions") + s.metric(
            "deltafin_generation_tokens_total", endpoint="completions")
        results = [None] * 8
        barrier = threading.Barrier(8)

        def worker(i):
            client = s.client()
            barrier.wait()
            results[i] = run(client, m, i)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == alone
        steps = s.metric("deltafin_engine_steps_total") - steps0
        tokens = s.metric("deltafin_generation_tokens_total", endpoint="chat_completions") + s.metric(
            "deltafin_generation_tokens_total", endpoint="completions") - tokens0
        assert tokens == sum(24 + i for i in range(8))
        assert steps < tokens, f"requests should share passes: {steps} passes for {tokens} tokens"
    finally:
        s.stop()
