#!/usr/bin/env python3
"""Drives a running `brink-agent serve` over HTTP and prints what it measured (stdlib only, so
it runs on a GPU node as is). Used by scripts/gpu-serve.

  serve_probe.py BASE load      prompts past 8192 tokens, a 24k prompt with and without prefix
                                reuse (time to first token), concurrent prompts whose batch
                                crosses 8192, decode tokens/s at 1 and 8 streams
  serve_probe.py BASE watchdog  a poison prompt (the server runs with --inject-fault) in flight,
                                a small request queued during the stall, the poison resent
Prints one JSON object per measurement, prefixed 'probe:'.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

BASE = sys.argv[1].rstrip("/")
WORDS = "the quick brown fox jumps over the lazy dog while a small cat sleeps near the warm fire".split()


def say(**kv):
    print("probe: " + json.dumps(kv), flush=True)


def text(n_words, salt=0):
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n_words))


def post(path, body, timeout=900):
    t0 = time.time()
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.time() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:400], time.time() - t0
    except Exception as e:  # connection reset etc.: reported, never hidden
        return -1, repr(e), time.time() - t0


def stream(prompt, max_tokens, timeout=900):
    """Streams a completion; returns (status, ttft_s, total_s, tokens, usage, error)."""
    body = {"model": "brink", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(BASE + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    ttft, n, usage, error = None, 0, None, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    error = ev["error"]
                    continue
                if ev.get("usage"):
                    usage = ev["usage"]
                for c in ev.get("choices", []):
                    if c.get("text"):
                        n += 1
                        if ttft is None:
                            ttft = time.time() - t0
            return 200, ttft, time.time() - t0, n, usage, error
    except urllib.error.HTTPError as e:
        return e.code, None, time.time() - t0, 0, None, e.read().decode(errors="replace")[:400]
    except Exception as e:
        return -1, None, time.time() - t0, 0, None, repr(e)


def metrics():
    with urllib.request.urlopen(BASE + "/metrics", timeout=30) as r:
        return {l.split(" ")[0]: l.split(" ")[-1] for l in r.read().decode().splitlines() if l and not l.startswith("#")}


def completion(words, salt=0, max_tokens=8, name=""):
    s, out, dt = post("/v1/completions", {"model": "brink", "prompt": text(words, salt), "max_tokens": max_tokens, "temperature": 0})
    usage = out.get("usage") if isinstance(out, dict) else None
    say(what=name or f"completion {words} words", status=s, seconds=round(dt, 3), usage=usage,
        error=None if s == 200 else out)
    return s, usage


def load():
    completion(20, name="warm-up")
    # Past the 8192-token threshold at top_k 8 (tokens x top_k = 8192 x 8 and beyond).
    completion(6200, name="prompt past 8192 tokens")
    # A 24k-token agent prompt, then the same prefix with another question: reuse.
    prefix = text(16000, 3)
    for name, suffix in (("24k prompt, cold", " first question"), ("24k prompt, same prefix", " second question")):
        s, ttft, total, n, usage, err = stream(prefix + suffix, 16)
        say(what=name, status=s, ttft_s=ttft and round(ttft, 3), total_s=round(total, 3), tokens=n, usage=usage, error=err)
    # Concurrent prompts whose batch total crosses 8192.
    res = []
    def one(i):
        res.append(completion(3000, salt=10 + i, name=f"concurrent 3000 words #{i}"))
    th = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    t0 = time.time()
    [t.start() for t in th]
    [t.join() for t in th]
    say(what="3 concurrent prompts", seconds=round(time.time() - t0, 3), statuses=[r[0] for r in res],
        prompt_tokens=sum((r[1] or {}).get("prompt_tokens", 0) for r in res))
    # Decode throughput.
    for streams in (1, 8):
        out = []
        def dec(i):
            out.append(stream(text(64, 50 + i), 128))
        th = [threading.Thread(target=dec, args=(i,)) for i in range(streams)]
        t0 = time.time()
        [t.start() for t in th]
        [t.join() for t in th]
        wall = time.time() - t0
        toks = sum(o[3] for o in out)
        say(what=f"decode, {streams} streams", statuses=[o[0] for o in out], tokens=toks, seconds=round(wall, 3),
            tokens_per_s=round(toks / wall, 1), ttft_s=[o[1] and round(o[1], 3) for o in out])
    say(what="metrics", metrics={k: v for k, v in metrics().items() if k.startswith("brink_")})


def watchdog(poison_words):
    m0 = metrics()
    results = {}
    def poison(key, streaming):
        if streaming:
            results[key] = stream(text(poison_words, 99), 8)
        else:
            results[key] = post("/v1/completions", {"model": "brink", "prompt": text(poison_words, 99), "max_tokens": 8})
    t0 = time.time()
    p = threading.Thread(target=poison, args=("poison", False))
    p.start()
    time.sleep(2.0)  # the poison is in flight (and hung)
    q = threading.Thread(target=lambda: results.__setitem__("queued", post("/v1/completions", {
        "model": "brink", "prompt": text(30, 5), "max_tokens": 8})))
    q.start()
    p.join()
    say(what="poison in flight", status=results["poison"][0], seconds=round(time.time() - t0, 3),
        body=str(results["poison"][1])[:300])
    q.join()
    say(what="request queued during the stall", status=results["queued"][0], seconds=round(results["queued"][2], 3))
    m1 = metrics()
    # The same poison again: quarantined (smaller chunks, or refused), never a second stall.
    t1 = time.time()
    s, out, dt = post("/v1/completions", {"model": "brink", "prompt": text(poison_words, 99), "max_tokens": 8})
    m2 = metrics()
    say(what="poison resent", status=s, seconds=round(dt, 3), usage=out.get("usage") if isinstance(out, dict) else None,
        error=None if s == 200 else out)
    say(what="watchdog metrics", before={k: v for k, v in m0.items() if "stall" in k or "restart" in k},
        after_stall={k: v for k, v in m1.items() if "stall" in k or "restart" in k},
        after_resend={k: v for k, v in m2.items() if "stall" in k or "restart" in k})


if __name__ == "__main__":
    mode = sys.argv[2]
    if mode == "load":
        load()
    elif mode == "watchdog":
        watchdog(int(sys.argv[3]) if len(sys.argv) > 3 else 9000)
    else:
        sys.exit(f"unknown mode {mode}")
