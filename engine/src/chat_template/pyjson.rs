//! The `tojson` filter as Hugging Face's chat templates get it: Python's `json.dumps(x,
//! ensure_ascii=False, indent=None, separators=None, sort_keys=False)`. Its spacing (`", "`,
//! `": "`), key order and float spelling end up in prompts (tool schemas, tool-call arguments), so
//! they must be Python's exactly; minijinja's own `tojson` is compact and HTML-escapes.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Formatting options, as `json.dumps` takes them.
#[derive(Clone, Debug)]
pub struct JsonStyle {
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        JsonStyle { indent: None, item_separator: ", ".into(), key_separator: ": ".into(), sort_keys: false, ensure_ascii: false }
    }
}

impl JsonStyle {
    /// Reads `indent`, `separators`, `sort_keys` and `ensure_ascii` keyword arguments.
    pub fn from_kwargs(kwargs: &Kwargs) -> Result<JsonStyle, Error> {
        let mut style = JsonStyle::default();
        let indent: Option<Value> = kwargs.get("indent")?;
        if let Some(indent) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
            style.indent = Some(match (indent.as_i64(), indent.as_str()) {
                (Some(n), _) => " ".repeat(usize::try_from(n).unwrap_or(0)),
                (None, Some(s)) => s.to_string(),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an integer or a string, not {}", indent.kind()),
                    ));
                }
            });
            // json.dumps drops the space after commas when indenting.
            style.item_separator = ",".into();
        }
        let separators: Option<Value> = kwargs.get("separators")?;
        if let Some(seps) = separators.filter(|v| !v.is_none() && !v.is_undefined()) {
            let pair: Vec<Value> = seps.try_iter()?.collect();
            match pair.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    style.item_separator = item.as_str().unwrap_or_default().to_string();
                    style.key_separator = key.as_str().unwrap_or_default().to_string();
                }
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings")),
            }
        }
        style.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
        style.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
        kwargs.assert_all_used()?;
        Ok(style)
    }
}

/// The filter: `{{ value | tojson }}`, `{{ value | tojson(indent=2) }}`.
pub fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let style = JsonStyle::from_kwargs(&kwargs)?;
    let mut out = String::new();
    dump(value, &style, 0, &mut out)?;
    // Safe: templates build prompts, not HTML; nothing may be escaped further.
    Ok(Value::from_safe_string(out))
}

/// Serializes `value` as `json.dumps` would.
pub fn dump(value: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => push_number(value, out)?,
        ValueKind::String => push_string(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            push_container(out, style, depth, ('[', ']'), items.len(), |i, out| dump(&items[i], style, depth + 1, out))?;
        }
        ValueKind::Map | ValueKind::Plain => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            push_container(out, style, depth, ('{', '}'), entries.len(), |i, out| {
                push_string(&entries[i].0, style.ensure_ascii, out);
                out.push_str(&style.key_separator);
                dump(&entries[i].1, style, depth + 1, out)
            })?;
        }
        ValueKind::Undefined => return Err(Error::new(ErrorKind::UndefinedError, "tojson: an undefined value is not JSON serializable")),
        other => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: a value of type {other} is not JSON serializable"))),
    }
    Ok(())
}

fn push_container(
    out: &mut String,
    style: &JsonStyle,
    depth: usize,
    (open, close): (char, char),
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(i, out)?;
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Map keys as Python converts them: strings as they are, numbers and constants spelled out.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            push_number(key, &mut s)?;
            Ok(s)
        }
        other => Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: keys must be strings, not {other}"))),
    }
}

fn push_number(value: &Value, out: &mut String) -> Result<(), Error> {
    if value.is_integer() {
        // Integers print in full (any width minijinja holds).
        out.push_str(&value.to_string());
        return Ok(());
    }
    let x = f64::try_from(value.clone())?;
    out.push_str(&python_float_repr(x));
    Ok(())
}

/// Python's `repr(float)`: the shortest digits that round-trip, in positional notation for
/// decimal exponents -4..16 and as `1e+16`/`1.5e-07` otherwise; `NaN`/`Infinity` as json writes them.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` gives the shortest round-trip digits: "1.2345e3", "5e-7", "0e0".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{first}{frac}e{exp_sign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

fn push_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases: [(f64, &str); 16] = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (std::f64::consts::PI, "3.141592653589793"),
            (f64::INFINITY, "Infinity"),
            (f64::NAN, "NaN"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn strings_escape_like_json_dumps() {
        let mut out = String::new();
        push_string("a\"b\\c\nd\te\u{1}f é 中 👍 \u{7f}", false, &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\te\\u0001f é 中 👍 \u{7f}\"");
        let mut out = String::new();
        push_string("é👍", true, &mut out);
        assert_eq!(out, "\"\\u00e9\\ud83d\\udc4d\"");
    }
}
