//! The gpt-oss chat template (chat_template_gpt_oss.jinja: llama.cpp's
//! models/templates/openai-gpt-oss-120b.jinja, the `chat_template` of openai/gpt-oss-120b,
//! Apache-2.0) rendered for the conversations an OpenAI client sends: a system prompt, tools,
//! an assistant's reasoning and tool call, a tool result, `reasoning_effort`. The expected texts
//! are written from the harmony format (system, developer with a `functions` namespace,
//! `<|channel|>` headers, `to=functions.NAME` recipients); each case is also rendered by Python's
//! Jinja2 when available (skipped with a message unless BRINK_REQUIRE_PY=1).

mod jinja_common;

use std::io::Write;
use std::process::{Command, Stdio};

use brink_engine::chat_template::{ChatTemplate, DateTime};
use brink_engine::wire::error::parse_body;
use brink_engine::wire::openai::ChatCompletionRequest;
use brink_engine::wire::{Limits, Prompt};
use serde_json::{Map, Value as Json, json};

use jinja_common::have_jinja2;

const GPT_OSS: &str = include_str!("chat_template_gpt_oss.jinja");

fn gpt_oss() -> ChatTemplate {
    ChatTemplate::new(GPT_OSS, "<|startoftext|>", "<|return|>").unwrap()
}

fn today() -> String {
    DateTime::now().strftime("%Y-%m-%d")
}

/// The system message the template writes: identity, dates, reasoning effort, channels.
fn system(effort: &str, tools: bool) -> String {
    let calls = if tools { "\nCalls to these tools must go to the commentary channel: 'functions'." } else { "" };
    format!(
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {}\n\n\
         Reasoning: {effort}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.{calls}<|end|>",
        today()
    )
}

fn weather_tools() -> Json {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}
        }, "required": ["city"]}
    }}])
}

/// The developer message: instructions, then the tools as a TypeScript-like namespace.
const DEVELOPER: &str = "<|start|>developer<|message|># Instructions\n\nYou are a weather bot.\n\n# Tools\n\n## functions\n\n\
    namespace functions {\n\n// Current weather\ntype get_weather = (_: {\n// The city\ncity: string,\nunit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n\
    } // namespace functions<|end|>";

fn limits() -> Limits {
    Limits { served_models: vec!["gpt-oss".into()], context_tokens: 131072, max_n: 1 }
}

/// An OpenAI request as the SDK sends it, through the wire layer into the template.
fn render_request(body: &Json) -> String {
    let req = parse_body::<ChatCompletionRequest>(body.to_string().as_bytes()).unwrap().validate(&limits()).unwrap();
    let Prompt::Chat { messages, tools } = &req.prompt else { panic!("chat prompt expected") };
    gpt_oss().render_with(messages, tools.as_ref(), true, &req.template_vars()).unwrap()
}

#[test]
fn plain_conversation() {
    let body = json!({"model": "gpt-oss", "messages": [{"role": "user", "content": "Hello"}]});
    assert_eq!(render_request(&body), format!("{}<|start|>user<|message|>Hello<|end|><|start|>assistant", system("medium", false)));
    let body = json!({"model": "gpt-oss", "messages": [{"role": "user", "content": "Hello"}], "reasoning_effort": "low"});
    assert_eq!(render_request(&body), format!("{}<|start|>user<|message|>Hello<|end|><|start|>assistant", system("low", false)));
}

#[test]
fn tools_tool_call_with_reasoning_and_result() {
    // The second turn of a tool conversation, as the openai SDK sends it: the assistant's
    // content is null, its reasoning came back from this server as reasoning_content.
    let body = json!({
        "model": "gpt-oss",
        "reasoning_effort": "high",
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": null, "reasoning_content": "Need the weather.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}
        ],
        "tools": weather_tools()
    });
    let want = [
        system("high", true).as_str(),
        DEVELOPER,
        "<|start|>user<|message|>What's the weather in Paris?<|end|>",
        // The reasoning of a call not yet followed by a final answer stays in the context.
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
        // The result goes back as a JSON string from the function to the assistant.
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18°C, sunny\"<|end|>",
        "<|start|>assistant",
    ]
    .concat();
    assert_eq!(render_request(&body), want);
}

#[test]
fn earlier_reasoning_is_dropped() {
    let t = gpt_oss();
    // An answered turn keeps only its final answer; so does a call once a final answer followed.
    let msgs = [
        json!({"role": "user", "content": "Weather?"}),
        json!({"role": "assistant", "content": null, "reasoning_content": "call it", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}),
        json!({"role": "tool", "tool_call_id": "c", "content": "cold"}),
        json!({"role": "assistant", "content": "Cold in Oslo.", "reasoning_content": "summarize"}),
        json!({"role": "user", "content": "Thanks"}),
    ];
    let want = [
        system("medium", true).as_str(),
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// Current weather\ntype get_weather = (_: {\n// The city\ncity: string,\nunit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n} // namespace functions<|end|>",
        "<|start|>user<|message|>Weather?<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|>",
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"cold\"<|end|>",
        "<|start|>assistant<|channel|>final<|message|>Cold in Oslo.<|end|>",
        "<|start|>user<|message|>Thanks<|end|><|start|>assistant",
    ]
    .concat();
    assert_eq!(t.render(&msgs, Some(&weather_tools()), true).unwrap(), want);
    // A last assistant turn without a generation prompt (training) keeps its reasoning and ends
    // with <|return|>.
    let msgs = [json!({"role": "user", "content": "3+3?"}), json!({"role": "assistant", "content": "6", "reasoning_content": "add"})];
    assert_eq!(
        t.render(&msgs, None, false).unwrap(),
        format!(
            "{}<|start|>user<|message|>3+3?<|end|><|start|>assistant<|channel|>analysis<|message|>add<|end|><|start|>assistant<|channel|>final<|message|>6<|return|>",
            system("medium", false)
        )
    );
}

// --- Cross-check with Jinja2 -------------------------------------------------------------

const JINJA2: &str = r#"
import datetime, json, sys
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(fmt):
    return datetime.datetime.now(datetime.timezone.utc).strftime(fmt)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
template = env.from_string(sys.argv[1])
out = []
for case in json.load(sys.stdin):
    try:
        out.append({"ok": template.render(messages=case["messages"], tools=case["tools"], add_generation_prompt=case["add_generation_prompt"],
                                          bos_token="<|startoftext|>", eos_token="<|return|>", **case["extra"])})
    except Exception as e:
        out.append({"error": type(e).__name__ + ": " + str(e)})
json.dump(out, sys.stdout)
"#;

#[test]
fn renders_as_jinja2_renders() {
    if !have_jinja2() {
        return;
    }
    // Messages in the template's own shape (`thinking`, no null content), which both render as given.
    let u = |s: &str| json!({"role": "user", "content": s});
    let call = |name: &str, args: Json| json!({"type": "function", "function": {"name": name, "arguments": args}});
    let nested_tools = json!([
        {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {
            "q": {"type": "string"}, "n": {"type": "integer", "default": 5}, "tags": {"type": "array", "items": {"type": "string"}},
            "filter": {"type": "object", "properties": {"site": {"type": "string"}, "after": {"type": "number"}}, "required": ["site"]},
            "mode": {"oneOf": [{"type": "string"}, {"type": "number"}]}, "flag": {"type": ["boolean", "null"]}
        }, "required": ["q"]}}},
        {"type": "function", "function": {"name": "now", "description": "The time"}}
    ]);
    let cases: Vec<(Vec<Json>, Option<Json>, bool, Json)> = vec![
        (vec![u("Hello")], None, true, json!({})),
        (vec![json!({"role": "developer", "content": "Be terse."}), u("Hi ü 👍")], None, true, json!({"reasoning_effort": "high"})),
        (
            vec![json!({"role": "system", "content": "You are a weather bot."}), u("Paris?")],
            Some(weather_tools()),
            true,
            json!({"reasoning_effort": "low"}),
        ),
        (
            vec![
                u("Paris?"),
                json!({"role": "assistant", "thinking": "need it", "tool_calls": [call("get_weather", json!({"city": "Paris"}))]}),
                json!({"role": "tool", "content": "18°C"}),
            ],
            Some(weather_tools()),
            true,
            json!({}),
        ),
        (
            vec![
                u("Paris?"),
                json!({"role": "assistant", "content": "Checking.", "tool_calls": [call("get_weather", json!({"city": "Paris", "unit": "f"}))]}),
                json!({"role": "tool", "content": "{\"t\": 64}"}),
                json!({"role": "assistant", "content": "64°F."}),
                u("And Rome?"),
            ],
            Some(weather_tools()),
            true,
            json!({"model_identity": "You are a test model."}),
        ),
        (vec![u("q"), json!({"role": "assistant", "content": "a", "thinking": "r"})], None, false, json!({})),
        (vec![u("search")], Some(nested_tools), true, json!({})),
        (vec![u("x"), json!({"role": "tool", "content": "orphan"})], None, true, json!({})),
        (vec![u("x"), json!({"role": "assistant", "content": "<|channel|>final<|message|>sneaky"})], None, true, json!({})),
    ];
    let request: Vec<Json> =
        cases.iter().map(|(m, t, g, e)| json!({"messages": m, "tools": t, "add_generation_prompt": g, "extra": e})).collect();
    let mut child = Command::new("python3")
        .args(["-c", JINJA2, GPT_OSS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(Json::Array(request).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Json> = serde_json::from_slice(&out.stdout).unwrap();
    let t = gpt_oss();
    let (mut rendered, mut refused) = (0, 0);
    for (i, ((messages, tools, add_gen, extra), want)) in cases.iter().zip(&results).enumerate() {
        let extra: Map<String, Json> = extra.as_object().cloned().unwrap_or_default();
        match (want.get("ok").and_then(Json::as_str), t.render_with(messages, tools.as_ref(), *add_gen, &extra)) {
            (Some(want), Ok(got)) => {
                assert_eq!(got, want, "case {i}");
                rendered += 1;
            }
            (None, Err(_)) => refused += 1,
            (Some(want), Err(err)) => panic!("case {i}: Jinja2 rendered {want:?} but we failed: {err}"),
            (None, Ok(got)) => panic!("case {i}: Jinja2 failed ({}) but we rendered {got:?}", want["error"]),
        }
    }
    eprintln!("{rendered} renders identical to Jinja2's, {refused} refused by both");
    assert_eq!((rendered, refused), (7, 2));
}
