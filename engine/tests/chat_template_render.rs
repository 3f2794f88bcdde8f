//! Chat templates: the real Qwen3 template (chat_template_qwen3.jinja, the `chat_template` of
//! Qwen/Qwen3-0.6B and Qwen3-30B-A3B's tokenizer_config.json, Apache-2.0) rendered for plain,
//! thinking and tool-calling conversations; templates read from GGUF metadata; and a cross-check
//! of every case against Python's Jinja2 set up as `transformers` sets it up
//! (pip install 'jinja2==3.1.6'), skipped with a message when unavailable unless BRINK_REQUIRE_PY=1.

mod jinja_common;

use std::io::Write;
use std::process::{Command, Stdio};

use brink_engine::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
use brink_engine::gguf::{GgufFile, GgufWriter, Value};
use serde_json::{Map, Value as Json, json};

use jinja_common::have_jinja2;

const QWEN3: &str = include_str!("chat_template_qwen3.jinja");

fn qwen3() -> ChatTemplate {
    ChatTemplate::new(QWEN3, "<|endoftext|>", "<|im_end|>").unwrap()
}

fn weather_tools() -> Json {
    json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }])
}

fn weather_conversation() -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are a weather bot."}),
        json!({"role": "user", "content": "What's the weather in Paris and Tokyo?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "18°C, sunny"}),
        json!({"role": "tool", "tool_call_id": "c2", "content": "22°C, rain"}),
    ]
}

#[test]
fn qwen3_plain_and_thinking_prompts() {
    let t = qwen3();
    let msgs = [ChatMessage::user("Hello")];
    assert_eq!(t.render(&msgs, None, true).unwrap(), "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    let no_think = json!({"enable_thinking": false});
    assert_eq!(
        t.render_with(&msgs, None, true, no_think.as_object().unwrap()).unwrap(),
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    // An earlier answer loses its reasoning; the system prompt goes first.
    let msgs = [
        ChatMessage::system("Be brief."),
        ChatMessage::user("2+2?"),
        ChatMessage::assistant("<think>\nadd them\n</think>\n\n4"),
        ChatMessage::user("And 3+3?"),
    ];
    assert_eq!(
        t.render(&msgs, None, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    // The last answer keeps it (from reasoning_content as well as from <think> in the content).
    let mut answer = ChatMessage::assistant("6");
    answer.reasoning_content = Some("add again".into());
    let msgs = [ChatMessage::user("3+3?"), answer];
    assert_eq!(
        t.render(&msgs, None, false).unwrap(),
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nadd again\n</think>\n\n6<|im_end|>\n"
    );
}

#[test]
fn qwen3_tools_and_tool_calls() {
    let expected = concat!(
        "<|im_start|>system\nYou are a weather bot.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n",
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\nWhat's the weather in Paris and Tokyo?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n18°C, sunny\n</tool_response>\n<tool_response>\n22°C, rain\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    );
    assert_eq!(qwen3().render(&weather_conversation(), Some(&weather_tools()), true).unwrap(), expected);
}

#[test]
fn qwen3_refuses_what_python_refuses() {
    // The original Qwen3 template calls .startswith on user content: null content is an error
    // in Jinja2 too, reported rather than rendered wrongly.
    let msgs = [json!({"role": "user", "content": null})];
    let err = qwen3().render(&msgs, None, true).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render { .. }), "{err}");
    let err = qwen3().render(&[json!({"content": "x"})], None, true).unwrap_err();
    assert_eq!(err.to_string(), "message 0: has no \"role\"");
}

fn write_gguf(keys: &[(&str, Value)]) -> (tempfile::TempDir, GgufFile) {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "qwen3moe").unwrap();
    for (k, v) in keys {
        w.set(k, v.clone()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    w.write_file(&path, &[]).unwrap();
    let file = GgufFile::open(&path).unwrap();
    (dir, file)
}

#[test]
fn templates_come_from_gguf_metadata() {
    let tokens = Value::from(vec!["<s>", "</s>", "a"]);
    let (_d, file) = write_gguf(&[
        ("tokenizer.ggml.tokens", tokens.clone()),
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
        ("tokenizer.chat_template", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}".into()),
    ]);
    let t = ChatTemplate::from_gguf(file.metadata()).unwrap().unwrap();
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
    assert_eq!(t.render(&[ChatMessage::user("hi")], None, false).unwrap(), "<s>hi</s>");

    let (_d, file) = write_gguf(&[("tokenizer.ggml.tokens", tokens.clone())]);
    assert!(ChatTemplate::from_gguf(file.metadata()).unwrap().is_none());

    let (_d, file) = write_gguf(&[("tokenizer.chat_template", Value::U32(1))]);
    let err = ChatTemplate::from_gguf(file.metadata()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.chat_template") && err.contains("expected string, found u32"), "{err}");

    let (_d, file) = write_gguf(&[
        ("tokenizer.ggml.tokens", tokens.clone()),
        ("tokenizer.ggml.eos_token_id", Value::U32(3)),
        ("tokenizer.chat_template", "x".into()),
    ]);
    let err = ChatTemplate::from_gguf(file.metadata()).unwrap_err().to_string();
    assert!(
        err.contains("model.gguf")
            && err.contains("tokenizer.ggml.eos_token_id")
            && err.contains("token id 3 is outside the vocabulary of 3 tokens"),
        "{err}"
    );

    let (_d, file) = write_gguf(&[("tokenizer.chat_template", "{% if %}".into())]);
    assert!(matches!(ChatTemplate::from_gguf(file.metadata()).unwrap_err(), ChatTemplateError::Syntax { .. }));
}

// --- Cross-check with Jinja2 -------------------------------------------------------------

const JINJA2: &str = r#"
import json, sys
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
out = []
for case in json.load(sys.stdin):
    try:
        template = env.from_string(case["template"])
        text = template.render(messages=case["messages"], tools=case["tools"], add_generation_prompt=case["add_generation_prompt"],
                               bos_token="<s>", eos_token="</s>", **case["extra"])
        out.append({"ok": text})
    except Exception as e:
        out.append({"error": type(e).__name__ + ": " + str(e)})
json.dump(out, sys.stdout)
"#;

/// Llama-3-style: BOS, a header per message, content trimmed.
const LLAMA3_STYLE: &str = "{{- bos_token }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n";

/// Mistral-style: roles must alternate; the system prompt joins the first user turn.
const MISTRAL_STYLE: &str = "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n";

/// Exercises filters and tests HF templates lean on.
const FILTERS: &str = "{%- for m in messages -%}\n{{ loop.index }}:{{ m.role | upper }}:{{ m.content | length }}:{{ m.content | replace('a', 'A') }}:{{ (m.content ~ '!') | title }}\n{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson(indent=2, sort_keys=true) }}{% endfor %}{% endif %}\n{% if not loop.last %}{% continue %}{% endif %}\n{{- messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}\n{%- endfor %}\n{{- tools | tojson if tools else 'no tools' }}{{ tools is none }}{{ messages[-1].content.split(' ') | last }}";

struct Case {
    template: &'static str,
    messages: Vec<Json>,
    tools: Option<Json>,
    add_generation_prompt: bool,
    extra: Map<String, Json>,
}

fn case(template: &'static str, messages: Vec<Json>, tools: Option<Json>, add_generation_prompt: bool, extra: Json) -> Case {
    Case { template, messages, tools, add_generation_prompt, extra: extra.as_object().cloned().unwrap_or_default() }
}

fn cases() -> Vec<Case> {
    let u = |s: &str| json!({"role": "user", "content": s});
    let a = |s: &str| json!({"role": "assistant", "content": s});
    let sys = |s: &str| json!({"role": "system", "content": s});
    let unicode_tools = json!([{"type": "function", "function": {
        "name": "convertir", "description": "Convertit des °C en °F — 温度 \"quoted\" \\ back\nslash",
        "parameters": {"type": "object", "properties": {"c": {"type": "number", "minimum": -273.15, "default": 0.0, "examples": [1e-7, 1e21, 37]}, "precise": {"type": "boolean", "default": false}}, "required": ["c"], "additionalProperties": null}
    }}]);
    let multi_step = vec![
        u("Plan a trip."),
        json!({"role": "assistant", "content": "<think>\nneed weather\n</think>\n\nChecking.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3, "units": ["C", "F"]}}}]}),
        json!({"role": "tool", "content": "cold"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]}),
        json!({"role": "tool", "content": "<tool_response>warm</tool_response>"}),
        json!({"role": "assistant", "content": "<think>compare</think>Rome is warmer."}),
    ];
    let mut all = vec![
        case(QWEN3, vec![u("Hello")], None, true, json!({})),
        case(QWEN3, vec![u("Hello")], None, true, json!({"enable_thinking": false})),
        case(QWEN3, vec![u("Hello")], None, true, json!({"enable_thinking": true})),
        case(QWEN3, vec![sys("S"), u("q1"), a("<think>\nr1\n</think>\n\na1"), u("q2"), a("a2")], None, false, json!({})),
        case(QWEN3, vec![sys("S"), u("q1"), a("<think>r1</think>a1"), u("q2")], None, true, json!({})),
        case(QWEN3, weather_conversation(), Some(weather_tools()), true, json!({})),
        case(QWEN3, weather_conversation(), Some(unicode_tools.clone()), false, json!({})),
        case(QWEN3, vec![u("Umlaute äöü, 中文, emoji 👍, tabs\tand\nnewlines \"quotes\"")], Some(unicode_tools.clone()), true, json!({})),
        case(QWEN3, multi_step.clone(), Some(weather_tools()), true, json!({})),
        case(QWEN3, multi_step.clone(), None, false, json!({"enable_thinking": false})),
        case(QWEN3, vec![sys("only system")], None, true, json!({})),
        case(
            QWEN3,
            vec![u("x"), json!({"role": "assistant", "content": "", "reasoning_content": "why", "tool_calls": []})],
            None,
            false,
            json!({}),
        ),
        case(LLAMA3_STYLE, vec![sys("  padded system  "), u("hi"), a("hello"), u("bye")], None, true, json!({})),
        case(MISTRAL_STYLE, vec![sys("Be nice."), u("hi"), a("hello"), u("bye")], None, false, json!({})),
        case(MISTRAL_STYLE, vec![u("hi"), u("again")], None, false, json!({})),
        case(MISTRAL_STYLE, vec![u("hi"), json!({"role": "tool", "content": "t"})], None, false, json!({})),
        case(FILTERS, multi_step, Some(weather_tools()), false, json!({})),
        case(FILTERS, vec![u("a banana a day"), a("apple pie")], None, false, json!({})),
    ];
    // Qwen3 over many generated conversations: roles, thinking, tool calls and responses mixed.
    let mut state = 12345u64;
    let mut rand = move |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let texts = ["plain", "<think>\nr\n</think>\n\nanswer", "<think>r</think>", "multi\nline\n", "ü中👍", "", " spaced "];
    for _ in 0..60 {
        let mut msgs = Vec::new();
        if rand(2) == 0 {
            msgs.push(sys(texts[rand(texts.len() as u64) as usize]));
        }
        msgs.push(u(texts[rand(texts.len() as u64) as usize]));
        for _ in 0..rand(6) {
            let text = texts[rand(texts.len() as u64) as usize];
            msgs.push(match rand(4) {
                0 => u(text),
                1 => a(text),
                2 => json!({"role": "assistant", "content": text, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"k": text, "n": rand(100)}}}]}),
                _ => json!({"role": "tool", "content": text}),
            });
        }
        let tools = if rand(2) == 0 { Some(weather_tools()) } else { None };
        let extra = if rand(3) == 0 { json!({"enable_thinking": false}) } else { json!({}) };
        all.push(case(QWEN3, msgs, tools, rand(2) == 0, extra));
    }
    all
}

#[test]
fn renders_as_jinja2_renders() {
    if !have_jinja2() {
        return;
    }
    let cases = cases();
    let request: Vec<Json> = cases
        .iter()
        .map(|c| json!({"template": c.template, "messages": c.messages, "tools": c.tools, "add_generation_prompt": c.add_generation_prompt, "extra": c.extra}))
        .collect();
    let mut child =
        Command::new("python3").args(["-c", JINJA2]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(Json::Array(request).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Json> = serde_json::from_slice(&out.stdout).unwrap();

    let (mut rendered, mut refused) = (0, 0);
    for (i, (c, want)) in cases.iter().zip(&results).enumerate() {
        let t = ChatTemplate::new(c.template, "<s>", "</s>").unwrap();
        let got = t.render_with(&c.messages, c.tools.as_ref(), c.add_generation_prompt, &c.extra);
        match (want.get("ok").and_then(Json::as_str), got) {
            (Some(want), Ok(got)) => {
                assert_eq!(got, want, "case {i}: {:?}", c.messages);
                rendered += 1;
            }
            (None, Err(err)) => {
                // Jinja2's TemplateError from raise_exception carries the same message.
                let python = want["error"].as_str().unwrap();
                if let ChatTemplateError::Raised { message } = &err {
                    assert_eq!(python, format!("TemplateError: {message}"), "case {i}");
                }
                refused += 1;
            }
            (Some(want), Err(err)) => panic!("case {i}: Jinja2 rendered {want:?} but we failed: {err}"),
            (None, Ok(got)) => panic!("case {i}: Jinja2 failed ({}) but we rendered {got:?}", want["error"]),
        }
    }
    eprintln!("{rendered} renders identical to Jinja2's, {refused} refused by both");
    assert!(rendered >= 70 && refused >= 2, "{rendered} rendered, {refused} refused");
}
