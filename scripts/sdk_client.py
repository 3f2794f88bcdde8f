"""Drives a running `brink-agent serve` with the official OpenAI and Anthropic Python SDKs.

Usage: sdk_client.py BASE_URL MODEL [watchdog|prefix-cache|gpt-oss]. Prints one JSON object with what each call returned; the
Rust test (engine/tests/server_http.rs) checks it against the tokenizer and the raw HTTP answers.
Errors are caught per call and reported by SDK exception class and status, so a failing call
names itself instead of ending the script.

`watchdog` mode runs against a server with an injected hang (engine/tests/server_watchdog.rs):
four poison requests (OpenAI and Anthropic, streaming and not; distinct prompt lengths, so each
stalls the engine once) must each make the SDK raise its error class, and a retried poison
prompt must then be served.

`prefix-cache` mode sends one long prompt repeatedly through both APIs, streaming and not, and
reports every prefix-cache count the SDKs expose: OpenAI's `prompt_tokens_details.cached_tokens`
(the streamed one from the `include_usage` chunk), Anthropic's `cache_read_input_tokens` from
`message_start`, from `message_delta` and from the final message.
"""
import json
import sys
import time

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
ant = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there, how are you?"}]
out = {}


def error(e):
    return {"class": type(e).__name__, "status": getattr(e, "status_code", None), "message": str(e)}


def expect_failure(call, api_error):
    """Runs `call`; reports whether the SDK raised, whether as its API error class, and when."""
    t0 = time.monotonic()
    try:
        call()
        return {"raised": False, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 -- reported, the Rust test asserts the class
        return {**error(e), "raised": True, "is_api_error": isinstance(e, api_error), "seconds": time.monotonic() - t0}


def watchdog():
    poison = lambda words: "word " * words  # noqa: E731
    res = {}
    res["openai"] = expect_failure(lambda: oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": poison(95)}], max_tokens=4), openai.APIError)

    def openai_stream():
        for _ in oai.chat.completions.create(model=model, messages=[{"role": "user", "content": poison(115)}],
                                             max_tokens=4, stream=True):
            pass
    res["openai_stream"] = expect_failure(openai_stream, openai.APIError)
    res["anthropic"] = expect_failure(lambda: ant.messages.create(
        model=model, messages=[{"role": "user", "content": poison(135)}], max_tokens=4), anthropic.APIError)

    def anthropic_stream():
        with ant.messages.stream(model=model, messages=[{"role": "user", "content": poison(155)}], max_tokens=4) as s:
            for _ in s.text_stream:
                pass
    res["anthropic_stream"] = expect_failure(anthropic_stream, anthropic.APIError)
    # The first poison again: the quarantine serves it in smaller chunks.
    try:
        r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": poison(95)}], max_tokens=4)
        res["retry_after_quarantine"] = {"ok": True, "completion_tokens": r.usage.completion_tokens}
    except Exception as e:  # noqa: BLE001
        res["retry_after_quarantine"] = {"ok": False, **error(e)}
    print(json.dumps(res))


def prefix_cache():
    system = "".join(f"Rule {i}: answer in at most {i % 7 + 3} words. " for i in range(12))  # ~290 tokens: within the test server's 512 positions
    question = [{"role": "user", "content": "Why share prompt prefixes?"}]
    chat = [{"role": "system", "content": system}] + question
    res = {}

    def openai_once(name):
        r = oai.chat.completions.create(model=model, messages=chat, max_tokens=4, temperature=0)
        res[name] = {"prompt_tokens": r.usage.prompt_tokens, "cached_tokens": r.usage.prompt_tokens_details.cached_tokens}
    openai_once("openai_first")  # fills the cache
    openai_once("openai")
    usage = None
    for chunk in oai.chat.completions.create(model=model, messages=chat, max_tokens=4, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    res["openai_stream"] = {"prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.prompt_tokens_details.cached_tokens}

    m = ant.messages.create(model=model, system=system, messages=question, max_tokens=4, temperature=0)
    res["anthropic"] = {"input_tokens": m.usage.input_tokens, "cache_read_input_tokens": m.usage.cache_read_input_tokens}
    seen = {}
    with ant.messages.stream(model=model, system=system, messages=question, max_tokens=4, temperature=0) as s:
        for event in s:
            if event.type == "message_start":
                seen["message_start"] = event.message.usage.cache_read_input_tokens
            elif event.type == "message_delta":
                seen["message_delta"] = event.usage.cache_read_input_tokens
        final = s.get_final_message()
    res["anthropic_stream"] = {**seen, "input_tokens": final.usage.input_tokens,
                               "cache_read_input_tokens": final.usage.cache_read_input_tokens}
    print(json.dumps(res))


def gpt_oss():
    res = {}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ant_tools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": tools[0]["function"]["parameters"]}]

    def extra(obj, key):
        return (obj.model_extra or {}).get(key)

    def openai_once(messages, **kw):
        r = oai.chat.completions.create(model=model, messages=messages, max_tokens=128, temperature=0, **kw)
        m = r.choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in m.tool_calls or []]
        return {"content": m.content, "reasoning": extra(m, "reasoning_content"), "finish": r.choices[0].finish_reason,
                "calls": calls}

    def openai_stream(messages, **kw):
        content, reasoning, finish, calls = "", "", None, {}
        for chunk in oai.chat.completions.create(model=model, messages=messages, max_tokens=128, temperature=0,
                                                 stream=True, **kw):
            for c in chunk.choices:
                content += c.delta.content or ""
                reasoning += extra(c.delta, "reasoning_content") or ""
                finish = c.finish_reason or finish
                for t in c.delta.tool_calls or []:
                    call = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = t.id or call["id"]
                    if t.function is not None:
                        call["name"] += t.function.name or ""
                        call["arguments"] += t.function.arguments or ""
        calls = [{**c, "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())]
        return {"content": content, "reasoning": reasoning, "finish": finish, "calls": calls}

    ask = [{"role": "user", "content": "ALPHA: what is 2+2?"}]
    res["openai"] = openai_once(ask, reasoning_effort="high")
    res["openai_stream"] = openai_stream(ask, reasoning_effort="high")
    res["openai_low"] = openai_once(ask, reasoning_effort="low")

    weather = [{"role": "user", "content": "GAMMA: weather in Paris?"}]
    for name, call in [("openai_tools", openai_once), ("openai_tools_stream", openai_stream)]:
        first = call(weather, tools=tools)
        res[name] = first
        if first["calls"]:
            c = first["calls"][0]
            back = weather + [
                {"role": "assistant", "content": None, "tool_calls": [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": json.dumps(c["arguments"])}}]},
                {"role": "tool", "tool_call_id": c["id"], "content": "sunny"}]
            res[name + "_result"] = call(back, tools=tools)

    def blocks(content):
        out = []
        for b in content:
            if b.type == "thinking":
                out.append({"type": "thinking", "text": b.thinking})
            elif b.type == "text":
                out.append({"type": "text", "text": b.text})
            elif b.type == "tool_use":
                out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        return out

    def anthropic_once(messages, **kw):
        m = ant.messages.create(model=model, messages=messages, max_tokens=128, temperature=0, **kw)
        return {"blocks": blocks(m.content), "stop_reason": m.stop_reason}

    def anthropic_stream(messages, **kw):
        events = []
        with ant.messages.stream(model=model, messages=messages, max_tokens=128, temperature=0, **kw) as s:
            for event in s:
                if event.type == "content_block_start":
                    events.append(event.content_block.type)
            final = s.get_final_message()
        return {"blocks": blocks(final.content), "stop_reason": final.stop_reason, "block_starts": events}

    ask = [{"role": "user", "content": "BETA: what is 2+2?"}]
    res["anthropic"] = anthropic_once(ask)
    res["anthropic_stream"] = anthropic_stream(ask)
    weather = [{"role": "user", "content": "DELTA: weather in Paris?"}]
    for name, call in [("anthropic_tools", anthropic_once), ("anthropic_tools_stream", anthropic_stream)]:
        first = call(weather, tools=ant_tools)
        res[name] = first
        uses = [b for b in first["blocks"] if b["type"] == "tool_use"]
        if uses:
            u = uses[0]
            back = weather + [
                {"role": "assistant", "content": [{"type": "tool_use", "id": u["id"], "name": u["name"], "input": u["input"]}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "sunny"}]}]
            res[name + "_result"] = call(back, tools=ant_tools)
    print(json.dumps(res))


if len(sys.argv) > 3 and sys.argv[3] == "gpt-oss":
    gpt_oss()
    sys.exit(0)
if len(sys.argv) > 3 and sys.argv[3] == "watchdog":
    watchdog()
    sys.exit(0)
if len(sys.argv) > 3 and sys.argv[3] == "prefix-cache":
    prefix_cache()
    sys.exit(0)


r = oai.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
out["openai"] = {"text": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
                 "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens}

text, finish, usage = "", None, None
for chunk in oai.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, stream=True,
                                         stream_options={"include_usage": True}):
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
    if chunk.usage is not None:
        usage = chunk.usage
out["openai_stream"] = {"text": text, "finish": finish, "prompt_tokens": usage.prompt_tokens,
                        "completion_tokens": usage.completion_tokens}

m = ant.messages.create(model=model, system="You are terse.", messages=messages[1:], max_tokens=12, temperature=0)
out["anthropic"] = {"text": "".join(b.text for b in m.content if b.type == "text"), "stop_reason": m.stop_reason,
                    "input_tokens": m.usage.input_tokens, "output_tokens": m.usage.output_tokens,
                    "cache_read_input_tokens": m.usage.cache_read_input_tokens or 0}

with ant.messages.stream(model=model, system="You are terse.", messages=messages[1:], max_tokens=12,
                         temperature=0) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
out["anthropic_stream"] = {"text": streamed, "stop_reason": final.stop_reason, "input_tokens": final.usage.input_tokens,
                           "output_tokens": final.usage.output_tokens,
                           "cache_read_input_tokens": final.usage.cache_read_input_tokens or 0}

# A tool-call round trip in each API's shape: the earlier call and its result go back in. The
# assistant turns carry some text: the synthetic model's minimal template concatenates `content`
# and cannot render the null content of a call-only turn (real Qwen3 templates can).
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
try:
    r = oai.chat.completions.create(model=model, max_tokens=4, tools=tools, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    out["openai_tools"] = {"finish": r.choices[0].finish_reason, "prompt_tokens": r.usage.prompt_tokens}
except openai.APIError as e:
    out["openai_tools"] = error(e)
try:
    m = ant.messages.create(model=model, max_tokens=4, tools=[{"name": "get_weather", "description": "Weather of a city",
                            "input_schema": tools[0]["function"]["parameters"]}], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    out["anthropic_tools"] = {"stop_reason": m.stop_reason, "input_tokens": m.usage.input_tokens}
except anthropic.APIError as e:
    out["anthropic_tools"] = error(e)

errors = {}
for name, call in {
    "openai_unknown_model": lambda: oai.chat.completions.create(model="gpt-4o", messages=messages, max_tokens=2),
    "openai_absurd_max_tokens": lambda: oai.chat.completions.create(model=model, messages=messages, max_tokens=10**12),
    "openai_empty_messages": lambda: oai.chat.completions.create(model=model, messages=[], max_tokens=2),
    "anthropic_unknown_model": lambda: ant.messages.create(model="claude-x", messages=messages[1:], max_tokens=2),
    "anthropic_empty_messages": lambda: ant.messages.create(model=model, messages=[], max_tokens=2),
}.items():
    try:
        call()
        errors[name] = {"class": None, "status": 200}
    except (openai.APIError, anthropic.APIError) as e:
        errors[name] = error(e)
out["errors"] = errors
print(json.dumps(out))
