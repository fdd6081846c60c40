#!/usr/bin/env python3
"""The context-memory acceptance load (issue 35): against a running `deltafin serve`, 8
concurrent 8k-token prompts (half of them sharing a 6k-token prefix) and, alongside, 200 short
requests. Every answer must be 200, 429 or a 400 naming the context budget; prints the tally.

Usage: context_pool.py URL [LONG_TOKENS] [SHARED_TOKENS]  (stdlib only)
"""
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

URL = sys.argv[1].rstrip("/")
LONG = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
SHARED = int(sys.argv[3]) if len(sys.argv) > 3 else 6144
VOCAB = 500  # ids below the built-in vocabulary's special tokens


def ids(n, salt):
    return [(i * 37 + salt * 101 + 5) % VOCAB for i in range(n)]


def post(prompt, max_tokens):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(URL + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=1800) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}
    except (urllib.error.URLError, ConnectionError) as e:
        return 0, {"error": {"message": str(e)}}


def main():
    prefix = ids(SHARED, 1)
    longs = [prefix + ids(LONG - SHARED, 10 + i) for i in range(4)]
    longs += [ids(LONG, 20 + i) for i in range(4)]
    shorts = [ids(32, 100 + i) for i in range(200)]
    with ThreadPoolExecutor(max_workers=64) as pool:
        long_f = [pool.submit(post, p, 16) for p in longs]
        short_f = [pool.submit(post, p, 8) for p in shorts]
        results = [("long", f.result()) for f in long_f] + [("short", f.result()) for f in short_f]
    tally, bad = {}, []
    for kind, (status, body) in results:
        key = f"{kind} {status}"
        if status == 400:
            message = json.dumps(body)
            ok = "context" in message and "budget" in message
            key += " (context budget)" if ok else " (other)"
            if not ok:
                bad.append(message)
        elif status not in (200, 429):
            bad.append(f"{status} {json.dumps(body)[:300]}")
        tally[key] = tally.get(key, 0) + 1
    print("answers:", json.dumps(tally, sort_keys=True))
    for b in bad[:5]:
        print("unexpected:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
