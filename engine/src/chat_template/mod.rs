//! Chat templates: a model's `tokenizer.chat_template` (Jinja) rendered with minijinja the way
//! Hugging Face's `apply_chat_template` renders it, so that a conversation becomes the prompt
//! the model was trained on.
//!
//! What templates get, as in `transformers`: `messages`, `tools` (or none), `add_generation_prompt`,
//! `bos_token`, `eos_token`, any extra variables (`enable_thinking`, ...), the functions
//! `raise_exception(message)` and `strftime_now(format)`, a `tojson` filter that writes what
//! Python's `json.dumps` writes, Python string and dict methods (`.strip()`, `.startswith()`,
//! `.items()`, ...), and `trim_blocks`/`lstrip_blocks` whitespace handling.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use brink_engine::chat_template::{ChatMessage, ChatTemplate};
//! use brink_engine::gguf::GgufFile;
//! let file = GgufFile::open("model.gguf")?;
//! let template = match ChatTemplate::from_gguf(file.metadata())? {
//!     Some(t) => t,
//!     None => ChatTemplate::chatml()?,
//! };
//! let prompt = template.render(&[ChatMessage::user("Hello!")], None, true)?;
//! # Ok(()) }
//! ```

mod clock;
mod error;
mod harmony;
mod message;
pub mod pyjson;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;
use serde_json::{Map, Value as Json, json};

use crate::gguf::Metadata;
use crate::tokenizer::keys;

pub use clock::DateTime;
pub use error::ChatTemplateError;
pub use message::{ChatMessage, kind as json_kind, normalize as normalize_messages};

const TEMPLATE_NAME: &str = "chat_template";

/// Prefix of the error `raise_exception` returns, so the template's own message can be told
/// apart from other render errors.
const RAISED: &str = "raise_exception: ";

/// The ChatML template llama.cpp falls back to when a model has none.
pub const CHATML: &str = "{%- for message in messages -%}\n\
    {{- '<|im_start|>' + message.role + '\\n' -}}\n\
    {%- if message.content is string -%}{{- message.content -}}{%- endif -%}\n\
    {{- '<|im_end|>\\n' -}}\n\
    {%- endfor -%}\n\
    {%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// A compiled chat template. `Sync`: one can render for many requests at once.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether text-part arrays are joined into one string before rendering (false only for
    /// templates that render typed content and not plain strings).
    join_text_parts: bool,
    /// A harmony (gpt-oss) template, whose messages are adapted first ([`harmony::adapt`]).
    harmony: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("join_text_parts", &self.join_text_parts)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates see under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(|e| syntax_error(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |format: &str| DateTime::now().strftime(format));
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(|e| syntax_error(&e))?;
        let mut template = ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            join_text_parts: true,
            harmony: harmony::is_harmony(source),
        };
        template.join_text_parts = template.probe_join_text_parts();
        Ok(template)
    }

    /// The ChatML fallback for models without a template.
    pub fn chatml() -> Result<ChatTemplate, ChatTemplateError> {
        Self::new(CHATML, "", "")
    }

    /// The model's `tokenizer.chat_template`, with its BOS and EOS token texts; `None` when the
    /// model has no template.
    pub fn from_gguf(meta: &Metadata) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let Some(source) = meta.optional(keys::CHAT_TEMPLATE, Metadata::get_str)? else {
            return Ok(None);
        };
        let bos = special_token_text(meta, keys::BOS_ID)?;
        let eos = special_token_text(meta, keys::EOS_ID)?;
        Self::new(source, &bos, &eos).map(Some)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders a conversation. `messages` are OpenAI-style messages ([`ChatMessage`], or any
    /// serializable value of that shape such as `serde_json::Value`); `tools` is the request's
    /// array of tool definitions.
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&Json>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, tools, add_generation_prompt, &Map::new())
    }

    /// [`render`](Self::render) with extra template variables (`enable_thinking`, ...). They
    /// cannot replace the standard ones (`messages`, `tools`, ...).
    pub fn render_with<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, ChatTemplateError> {
        let messages = messages
            .iter()
            .enumerate()
            .map(|(index, m)| serde_json::to_value(m).map_err(|e| ChatTemplateError::Message { index, problem: e.to_string() }))
            .collect::<Result<Vec<_>, _>>()?;
        let mut messages = message::normalize(messages, self.join_text_parts)?;
        if self.harmony {
            harmony::adapt(&mut messages);
        }
        let tools = match tools {
            None | Some(Json::Null) => Json::Null,
            Some(Json::Array(list)) => {
                if let Some((i, t)) = list.iter().enumerate().find(|(_, t)| !t.is_object()) {
                    return Err(ChatTemplateError::Tools { problem: format!("tools[{i}] must be an object, found {}", message::kind(t)) });
                }
                Json::Array(list.clone())
            }
            Some(other) => return Err(ChatTemplateError::Tools { problem: format!("expected an array, found {}", message::kind(other)) }),
        };
        self.render_json(messages, tools, add_generation_prompt, extra)
    }

    fn render_json(
        &self,
        messages: Vec<Json>,
        tools: Json,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, ChatTemplateError> {
        let mut context = extra.clone();
        for (key, value) in [
            ("messages", Json::Array(messages)),
            ("tools", tools),
            ("add_generation_prompt", Json::Bool(add_generation_prompt)),
            ("bos_token", Json::String(self.bos_token.clone())),
            ("eos_token", Json::String(self.eos_token.clone())),
        ] {
            context.insert(key.to_string(), value);
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| render_error(&e))?;
        template.render(Value::from(Serde(&context))).map_err(|e| render_error(&e))
    }

    /// llama.cpp's capability probe, reduced to the one question that changes the prompt: does
    /// the template print string content, or only content given as typed parts?
    fn probe_join_text_parts(&self) -> bool {
        const PROBE: &str = "brink-probe-3f9c";
        let shows = |content: Json| {
            let msg = json!({"role": "user", "content": content});
            self.render_json(vec![msg], Json::Null, false, &Map::new()).is_ok_and(|s| s.contains(PROBE))
        };
        shows(json!(PROBE)) || !shows(json!([{"type": "text", "text": PROBE}]))
    }
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

fn special_token_text(meta: &Metadata, key: &'static str) -> Result<String, ChatTemplateError> {
    let Some(id) = meta.optional(key, Metadata::get_u32)? else {
        return Ok(String::new());
    };
    let tokens = meta.get_str_array(keys::TOKENS)?;
    tokens.get(id as usize).map(|t| t.to_string()).ok_or_else(|| ChatTemplateError::TokenId {
        path: meta.path().display().to_string(),
        key,
        id,
        vocab_size: tokens.len(),
    })
}

/// minijinja's message with its chain of causes (a filter's error is the cause of a render error).
fn describe(error: &minijinja::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

fn syntax_error(error: &minijinja::Error) -> ChatTemplateError {
    ChatTemplateError::Syntax { message: describe(error) }
}

fn render_error(error: &minijinja::Error) -> ChatTemplateError {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(raised) = e.downcast_ref::<minijinja::Error>().and_then(|e| e.detail()).and_then(|d| d.strip_prefix(RAISED)) {
            return ChatTemplateError::Raised { message: raised.to_string() };
        }
        current = e.source();
    }
    ChatTemplateError::Render { message: describe(error) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: Json) -> Result<String, ChatTemplateError> {
        let t = ChatTemplate::new(source, "<s>", "</s>")?;
        t.render(messages.as_array().unwrap(), None, false)
    }

    #[test]
    fn shareable_between_threads() {
        fn sync<T: Send + Sync>() {}
        sync::<ChatTemplate>();
        sync::<crate::tokenizer::Tokenizer>();
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::chatml().unwrap();
        let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi"), ChatMessage::tool_call("f", json!({}))];
        assert_eq!(
            t.render(&msgs, None, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.render(&msgs[1..2], None, false).unwrap(), "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn hugging_face_whitespace_rules_and_variables() {
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
        // Booleans print as Python prints them.
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}{{ bos_token }}{{ eos_token }}";
        assert_eq!(render(src, json!([{"role": "user", "content": "a"}, {"role": "x", "content": "b"}])).unwrap(), "[a]\n<s></s>");
        let t = ChatTemplate::new("{{ add_generation_prompt }} {{ tools is none }} {{ flag }}", "", "").unwrap();
        let extra = json!({"flag": 7, "messages": "ignored"});
        assert_eq!(t.render_with::<Json>(&[], None, true, extra.as_object().unwrap()).unwrap(), "True True 7");
        let tools = json!([{"type": "function"}]);
        assert_eq!(t.render::<Json>(&[], Some(&tools), false).unwrap(), "False False ");
    }

    #[test]
    fn python_methods_namespace_slices_and_loop_controls() {
        let src = "{%- set ns = namespace(n=0) -%}\
            {%- for m in messages[::-1] -%}{%- if loop.index0 > 1 %}{% break %}{% endif -%}\
            {%- set ns.n = ns.n + 1 -%}{{ m.content.strip().upper().split(',')[-1] }}|{%- endfor -%}\
            {{ ns.n }}{{ messages[0].content.startswith(' a') }}{{ messages[0].get('missing', 'd') }}";
        let msgs = json!([{"role": "u", "content": " a,b "}, {"role": "u", "content": "c"}, {"role": "u", "content": "x,y"}]);
        assert_eq!(render(src, msgs).unwrap(), "Y|C|2Trued");
    }

    #[test]
    fn tojson_writes_what_json_dumps_writes() {
        let src = "{{ messages[0].x | tojson }}\n{{ messages[0].x | tojson(indent=2) }}\n{{ messages[0].x | tojson(sort_keys=true, separators=(',', ':')) }}";
        let msgs = json!([{"role": "u", "x": {"b": [1, 2.0, 1e20], "a": "é\"<>&\n", "c": {}, "d": [], "e": null, "f": true}}]);
        assert_eq!(
            render(src, msgs).unwrap(),
            "{\"b\": [1, 2.0, 1e+20], \"a\": \"é\\\"<>&\\n\", \"c\": {}, \"d\": [], \"e\": null, \"f\": true}\n\
             {\n  \"b\": [\n    1,\n    2.0,\n    1e+20\n  ],\n  \"a\": \"é\\\"<>&\\n\",\n  \"c\": {},\n  \"d\": [],\n  \"e\": null,\n  \"f\": true\n}\n\
             {\"a\":\"é\\\"<>&\\n\",\"b\":[1,2.0,1e+20],\"c\":{},\"d\":[],\"e\":null,\"f\":true}"
        );
        let err = render("{{ nothing | tojson }}", json!([])).unwrap_err();
        assert!(matches!(&err, ChatTemplateError::Render { message } if message.contains("not JSON serializable")), "{err}");
        let err = render("{{ 1 | tojson(bogus=1) }}", json!([])).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn template_errors_carry_the_template_message() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok";
        assert_eq!(render(src, json!([{"role": "user", "content": ""}])).unwrap(), "ok");
        let err = render(src, json!([{"role": "assistant", "content": ""}])).unwrap_err();
        match err {
            ChatTemplateError::Raised { message } => {
                assert_eq!(message, "Conversation roles must alternate user/assistant/user/assistant/...")
            }
            other => panic!("{other:?}"),
        }
        let err = ChatTemplate::new("{% for m in messages %}{{ m.role }", "", "").unwrap_err();
        assert!(matches!(&err, ChatTemplateError::Syntax { message } if message.contains("unexpected `}`")), "{err}");
        let err = render("{{ messages[0].content.nope.deeper }}", json!([{"role": "user", "content": "x"}])).unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render { .. }), "{err}");
        let t = ChatTemplate::chatml().unwrap();
        let err = t.render::<Json>(&[], Some(&json!({"not": "a list"})), false).unwrap_err();
        assert_eq!(err.to_string(), "tools: expected an array, found an object");
        let err = t.render::<Json>(&[], Some(&json!([1])), false).unwrap_err();
        assert_eq!(err.to_string(), "tools: tools[0] must be an object, found a number");
    }

    #[test]
    fn strftime_now_is_available() {
        let year = render("{{ strftime_now('%Y') }}", json!([])).unwrap();
        assert_eq!(year, DateTime::now().strftime("%Y"));
        assert!(year.parse::<i64>().unwrap() >= 2024);
    }

    #[test]
    fn text_parts_are_joined_unless_the_template_only_reads_parts() {
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]);
        let string_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(render(string_template, parts.clone()).unwrap(), "a\nb");
        let typed_template = "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(typed_template, "", "").unwrap();
        assert!(!t.join_text_parts);
        assert_eq!(t.render(parts.as_array().unwrap(), None, false).unwrap(), "<a><b>");
    }
}
