"""Drives llama.cpp's `llama-server` behind the gateway with the official OpenAI and Anthropic SDKs.

Usage: sdk_llama_server.py GATEWAY_URL MODEL. Prints one JSON object with what each call returned;
the Rust test (gateway/tests/engine_e2e.rs) checks it: which engine answered (llama-server's
`system_fingerprint`), text and streamed chunks, tool calls, the model list. A failing call is
reported by its SDK exception class and status instead of ending the script.

Tool calls: a model of random weights never chooses to call a tool by itself. The forced calls
(`tool_choice` required / any) end their prompt with an assistant turn that opens the call the
way the chat template does (`<tool_call>` and a newline), which llama-server continues under its
tool-call grammar: the name and the arguments come from the engine, constrained to the one tool
and its one-value schema (`city` is the enum `["Paris"]`), so the call is complete within
`max_tokens` whatever the weights. Each call then goes back with its result, as a client's agent
loop sends it.
"""
import json
import sys

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
ant = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
user = [{"role": "user", "content": "Hello there, how are you?"}]
schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}}, "required": ["city"]}
oai_tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": schema}}]
ant_tools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": schema}]
ask = {"role": "user", "content": "Weather in Paris?"}
opening = {"role": "assistant", "content": "<tool_call>\n"}
# Whitespace between the call's JSON tokens is the grammar's only freedom (at most 22 characters a
# gap, about 15 gaps): this bounds the call.
CALL_TOKENS = 500
out = {}


def error(e):
    return {"error": {"class": type(e).__name__, "status": getattr(e, "status_code", None), "message": str(e)}}


def run(name, call):
    try:
        out[name] = call()
    except (openai.APIError, anthropic.APIError) as e:
        out[name] = error(e)


def openai_plain():
    r = oai.chat.completions.create(model=model, messages=user, max_tokens=8, temperature=0)
    return {"model": r.model, "fingerprint": r.system_fingerprint, "text": r.choices[0].message.content,
            "finish": r.choices[0].finish_reason, "completion_tokens": r.usage.completion_tokens}


def openai_stream():
    res = {"chunks": 0, "text_chunks": 0, "models": [], "fingerprints": [], "text": "", "finish": None, "usage": None}
    for chunk in oai.chat.completions.create(model=model, messages=user, max_tokens=8, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        res["chunks"] += 1
        res["models"].append(chunk.model)
        res["fingerprints"].append(chunk.system_fingerprint)
        for c in chunk.choices:
            res["text"] += c.delta.content or ""
            res["text_chunks"] += bool(c.delta.content)
            res["finish"] = c.finish_reason or res["finish"]
        if chunk.usage is not None:
            res["usage"] = chunk.usage.completion_tokens
    res["models"], res["fingerprints"] = sorted(set(res["models"])), sorted(set(map(str, res["fingerprints"])))
    return res


def anthropic_plain():
    m = ant.messages.create(model=model, system="You are terse.", messages=user, max_tokens=8, temperature=0)
    return {"model": m.model, "id": m.id, "text": "".join(b.text for b in m.content if b.type == "text"),
            "stop_reason": m.stop_reason, "output_tokens": m.usage.output_tokens}


def anthropic_stream():
    res = {"events": [], "text_deltas": 0}
    with ant.messages.stream(model=model, system="You are terse.", messages=user, max_tokens=8, temperature=0) as s:
        for event in s:
            if event.type not in res["events"]:
                res["events"].append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                res["text_deltas"] += 1
        final = s.get_final_message()
    return {**res, "model": final.model, "text": "".join(b.text for b in final.content if b.type == "text"),
            "stop_reason": final.stop_reason, "output_tokens": final.usage.output_tokens}


def openai_calls(message):
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in message.tool_calls or []]


def openai_tool_round_trip():
    r = oai.chat.completions.create(model=model, messages=[ask, opening], tools=oai_tools, tool_choice="required",
                                    max_tokens=CALL_TOKENS, temperature=0)
    call = r.choices[0].message
    res = {"fingerprint": r.system_fingerprint, "finish": r.choices[0].finish_reason, "calls": openai_calls(call),
           "prompt_tokens": r.usage.prompt_tokens}
    # The call (as the SDK parsed it) and its result go back; the model answers in text.
    back = [ask, {"role": "assistant", "content": call.content or "", "tool_calls": [c.model_dump() for c in call.tool_calls]}]
    back += [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in call.tool_calls]
    a = oai.chat.completions.create(model=model, messages=back, tools=oai_tools, max_tokens=4, temperature=0)
    res["answer"] = {"text": a.choices[0].message.content, "finish": a.choices[0].finish_reason,
                     "prompt_tokens": a.usage.prompt_tokens, "calls": openai_calls(a.choices[0].message)}
    return res


def openai_tool_stream():
    res = {"tool_deltas": 0, "finish": None, "fingerprints": []}
    calls = {}
    for chunk in oai.chat.completions.create(model=model, messages=[ask, opening], tools=oai_tools, tool_choice="required",
                                             max_tokens=CALL_TOKENS, temperature=0, stream=True):
        res["fingerprints"].append(str(chunk.system_fingerprint))
        for c in chunk.choices:
            res["finish"] = c.finish_reason or res["finish"]
            for d in c.delta.tool_calls or []:
                res["tool_deltas"] += 1
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += (d.function and d.function.name) or ""
                call["arguments"] += (d.function and d.function.arguments) or ""
    res["fingerprints"] = sorted(set(res["fingerprints"]))
    res["calls"] = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(calls.items())]
    return res


def anthropic_uses(message):
    return [{"name": b.name, "input": b.input} for b in message.content if b.type == "tool_use"]


def anthropic_tool_round_trip():
    m = ant.messages.create(model=model, messages=[ask, opening], tools=ant_tools, tool_choice={"type": "any"},
                            max_tokens=CALL_TOKENS, temperature=0)
    res = {"stop_reason": m.stop_reason, "uses": anthropic_uses(m)}
    back = [ask, {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
                                         for b in m.content if b.type == "tool_use"]}]
    a = ant.messages.create(model=model, messages=back, tools=ant_tools, max_tokens=4, temperature=0)
    res["answer"] = {"text": "".join(b.text for b in a.content if b.type == "text"), "stop_reason": a.stop_reason,
                     "uses": anthropic_uses(a)}
    return res


def anthropic_tool_stream():
    res = {"json_deltas": 0}
    with ant.messages.stream(model=model, messages=[ask, opening], tools=ant_tools, tool_choice={"type": "any"},
                             max_tokens=CALL_TOKENS, temperature=0) as s:
        for event in s:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                res["json_deltas"] += 1
        final = s.get_final_message()
    return {**res, "stop_reason": final.stop_reason, "uses": anthropic_uses(final)}


run("openai", openai_plain)
run("openai_stream", openai_stream)
run("anthropic", anthropic_plain)
run("anthropic_stream", anthropic_stream)
run("openai_tools", openai_tool_round_trip)
run("openai_tools_stream", openai_tool_stream)
run("anthropic_tools", anthropic_tool_round_trip)
run("anthropic_tools_stream", anthropic_tool_stream)
run("models", lambda: sorted(m.id for m in oai.models.list()))
run("anthropic_models", lambda: sorted(m.id for m in ant.models.list()))
# The engine's own refusal of a bad field, through the gateway as the engine gave it.
run("openai_absurd_max_tokens", lambda: oai.chat.completions.create(model=model, messages=user, max_tokens=10**12))
print(json.dumps(out))
