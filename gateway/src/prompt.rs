//! What a request asks for, read from its JSON body: the model, and the prompt text the affinity
//! key is made from.

use serde_json::Value as Json;

/// The body's `model`, or the message of the 400 the request gets.
pub fn model(body: &Json) -> Result<&str, String> {
    let Some(obj) = body.as_object() else {
        return Err("the request body must be a JSON object".into());
    };
    match obj.get("model") {
        None => Err("the request body has no `model`: name the model to run".into()),
        Some(Json::String(m)) if !m.trim().is_empty() => Ok(m),
        Some(Json::String(_)) => Err("`model` is empty: name the model to run".into()),
        Some(_) => Err("`model` must be a string naming the model to run".into()),
    }
}

/// The tokens a request asks to generate (`max_completion_tokens`, else `max_tokens`, as the
/// engine reads them) with the field's name: a replica whose context is smaller refuses it
/// (`check_max_tokens` in engine/src/wire/request.rs). None when absent or not a positive
/// integer (the replica's own 400 then says what is wrong).
pub fn requested_tokens(body: &Json) -> Option<(&'static str, u64)> {
    let field = ["max_completion_tokens", "max_tokens"].into_iter().find(|f| !matches!(body.get(*f), None | Some(Json::Null)))?;
    Some((field, body[field].as_u64().filter(|&n| n > 0)?))
}

/// The first `chars` characters of the prompt: Anthropic's `system`, then every message's text
/// (chat and Anthropic messages), or `prompt` (completions). Only text parts count; anything
/// else in the body (sampling, tools) leaves the key alone.
pub fn prefix(body: &Json, chars: usize) -> String {
    let mut out = Prefix { text: String::new(), left: chars };
    if chars == 0 {
        return out.text;
    }
    out.content(body.get("system"));
    if let Some(messages) = body.get("messages").and_then(Json::as_array) {
        for m in messages {
            out.content(m.get("content"));
        }
    }
    match body.get("prompt") {
        Some(Json::String(s)) => out.push(s),
        Some(Json::Array(parts)) => {
            for p in parts {
                match p {
                    Json::String(s) => out.push(s),
                    // A prompt of token ids: the ids are the text.
                    Json::Number(n) => out.push(&format!("{n},")),
                    Json::Array(ids) => ids.iter().for_each(|id| out.push(&format!("{id},"))),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out.text
}

struct Prefix {
    text: String,
    left: usize,
}

impl Prefix {
    fn push(&mut self, s: &str) {
        if self.left == 0 {
            return;
        }
        let end = s.char_indices().nth(self.left).map_or(s.len(), |(i, _)| i);
        let piece = &s[..end];
        self.left -= piece.chars().count();
        self.text.push_str(piece);
        if self.left > 0 {
            // A separator, so ["ab", "c"] and ["a", "bc"] differ.
            self.text.push('\n');
            self.left -= 1;
        }
    }

    /// A message's content: a string, or parts of which the `text` ones count.
    fn content(&mut self, content: Option<&Json>) {
        match content {
            Some(Json::String(s)) => self.push(s),
            Some(Json::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Json::as_str) {
                        self.push(t);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod requested_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requested_tokens_as_the_engine_reads_them() {
        assert_eq!(requested_tokens(&json!({"max_tokens": 100})), Some(("max_tokens", 100)));
        assert_eq!(requested_tokens(&json!({"max_completion_tokens": 50, "max_tokens": 100})), Some(("max_completion_tokens", 50)));
        assert_eq!(requested_tokens(&json!({"max_completion_tokens": null, "max_tokens": 7})), Some(("max_tokens", 7)));
        // What the engine refuses itself, with its own message.
        assert_eq!(requested_tokens(&json!({"max_completion_tokens": "x", "max_tokens": 7})), None);
        assert_eq!(requested_tokens(&json!({"max_tokens": 0})), None);
        assert_eq!(requested_tokens(&json!({"max_tokens": -3})), None);
        assert_eq!(requested_tokens(&json!({})), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_is_required_and_a_string() {
        assert_eq!(model(&json!({"model": "m"})), Ok("m"));
        assert!(model(&json!({})).unwrap_err().contains("no `model`"));
        assert!(model(&json!({"model": 3})).unwrap_err().contains("must be a string"));
        assert!(model(&json!({"model": " "})).unwrap_err().contains("empty"));
        assert!(model(&json!([1])).unwrap_err().contains("JSON object"));
    }

    #[test]
    fn prefix_reads_each_api() {
        let chat = json!({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]});
        assert_eq!(prefix(&chat, 100), "sys\nhi\n");
        let anthropic = json!({"system": [{"type": "text", "text": "S"}], "messages": [{"role": "user", "content": "U"}]});
        assert_eq!(prefix(&anthropic, 100), "S\nU\n");
        assert_eq!(prefix(&json!({"prompt": "once upon"}), 100), "once upon\n");
        assert_eq!(prefix(&json!({"prompt": [1, 2]}), 100), "1,\n2,\n");
        assert_eq!(prefix(&json!({"model": "m"}), 100), "");
    }

    #[test]
    fn prefix_stops_at_the_limit_in_characters() {
        let body = json!({"messages": [{"content": "ééééé"}, {"content": "later"}]});
        assert_eq!(prefix(&body, 3), "ééé");
        assert_eq!(prefix(&body, 6), "ééééé\n");
        assert_eq!(prefix(&body, 7), "ééééé\nl");
        assert_eq!(prefix(&body, 0), "");
    }
}
