//! A GGUF file's metadata: keys in file order, looked up by binary search, with typed getters
//! whose errors name the file, the key and the expected and actual types.

use std::path::{Path, PathBuf};

use super::error::{ErrorKind, GgufError, KeyProblem};
use super::value::{Array, Value};

/// One key/value pair and where its value sits in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key: Box<str>,
    pub value: Value,
    /// Byte offset of the value's type field (0 for metadata not read from a file).
    pub offset: u64,
}

/// Metadata of one GGUF file, in file order.
#[derive(Clone, Debug)]
pub struct Metadata {
    path: PathBuf,
    entries: Vec<Entry>,
    /// Entry indices sorted by key. u32 keeps the index small next to the entries (see the
    /// reader's memory bound); the reader refuses more than u32::MAX entries.
    sorted: Vec<u32>,
}

impl Metadata {
    /// Builds the metadata of `path`; a key that appears twice is an error at its second place.
    pub fn new(path: &Path, entries: Vec<Entry>) -> Result<Self, GgufError> {
        let count = u32::try_from(entries.len()).map_err(|_| {
            GgufError::new(
                path,
                None,
                ErrorKind::CountTooLarge { what: "metadata entry", count: entries.len() as u64, remaining: 0, max: u32::MAX.into() },
            )
        })?;
        let mut sorted: Vec<u32> = (0..count).collect();
        sorted.sort_unstable_by(|&a, &b| entries[a as usize].key.cmp(&entries[b as usize].key).then(a.cmp(&b)));
        if let Some(w) = sorted.windows(2).find(|w| entries[w[0] as usize].key == entries[w[1] as usize].key) {
            let second = &entries[w[1] as usize];
            return Err(GgufError::at(path, second.offset, ErrorKind::DuplicateKey { key: second.key.to_string() }));
        }
        Ok(Metadata { path: path.to_path_buf(), entries, sorted })
    }

    /// The file this metadata was read from (named in errors).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|e| (&*e.key, &e.value))
    }

    pub fn entry(&self, key: &str) -> Option<&Entry> {
        let i = self.sorted.binary_search_by(|&i| (*self.entries[i as usize].key).cmp(key)).ok()?;
        Some(&self.entries[self.sorted[i] as usize])
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entry(key).map(|e| &e.value)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entry(key).is_some()
    }

    fn error(&self, key: &str, offset: Option<u64>, problem: KeyProblem) -> GgufError {
        GgufError::new(&self.path, offset, ErrorKind::Metadata { key: key.to_string(), problem })
    }

    fn require(&self, key: &str) -> Result<&Entry, GgufError> {
        self.entry(key).ok_or_else(|| self.error(key, None, KeyProblem::Missing))
    }

    fn typed<'a, T>(&'a self, key: &str, expected: &'static str, f: impl FnOnce(&'a Value) -> Option<T>) -> Result<T, GgufError> {
        let entry = self.require(key)?;
        f(&entry.value)
            .ok_or_else(|| self.error(key, Some(entry.offset), KeyProblem::WrongType { expected, found: entry.value.type_description() }))
    }

    /// An integer of any GGUF integer type whose value fits in `T`.
    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let entry = self.require(key)?;
        let v = entry.value.as_integer().ok_or_else(|| {
            self.error(key, Some(entry.offset), KeyProblem::WrongType { expected, found: entry.value.type_description() })
        })?;
        T::try_from(v).map_err(|_| self.error(key, Some(entry.offset), KeyProblem::OutOfRange { expected, value: v.to_string() }))
    }

    pub fn get_u8(&self, key: &str) -> Result<u8, GgufError> {
        self.integer(key, "u8")
    }
    pub fn get_i8(&self, key: &str) -> Result<i8, GgufError> {
        self.integer(key, "i8")
    }
    pub fn get_u16(&self, key: &str) -> Result<u16, GgufError> {
        self.integer(key, "u16")
    }
    pub fn get_i16(&self, key: &str) -> Result<i16, GgufError> {
        self.integer(key, "i16")
    }
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "u32")
    }
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.integer(key, "i32")
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "u64")
    }
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.integer(key, "i64")
    }
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        self.integer(key, "usize")
    }

    /// An f32 value, or an f64 one narrowed to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "f32", |v| v.as_float().map(|f| f as f32))
    }

    /// An f64 or f32 value.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.typed(key, "f64", Value::as_float)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", Value::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        self.typed(key, "array", Value::as_array)
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[Box<str>], GgufError> {
        self.typed(key, "array of string", |v| v.as_array()?.as_strs())
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        self.typed(key, "array of f32", |v| v.as_array()?.as_f32())
    }

    /// An array of any integer type, as i64.
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.typed(key, "array of integers", |v| v.as_array()?.to_i64_vec())
    }

    /// `Ok(None)` when `key` is absent, else what `get` says:
    /// `metadata.optional("qwen3moe.rope.freq_base", Metadata::get_f32)?`.
    pub fn optional<'a, T>(&'a self, key: &str, get: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>) -> Result<Option<T>, GgufError> {
        if self.contains(key) { get(self, key).map(Some) } else { Ok(None) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(entries: Vec<(&str, Value)>) -> Result<Metadata, GgufError> {
        let entries = entries.into_iter().enumerate().map(|(i, (k, v))| Entry { key: k.into(), value: v, offset: 100 + i as u64 });
        Metadata::new(Path::new("m.gguf"), entries.collect())
    }

    #[test]
    fn getters_convert_integers_that_fit_and_name_the_key() {
        let m = md(vec![("a", Value::U8(7)), ("b", Value::I64(-1)), ("c", "x".into()), ("d", Value::U64(u64::MAX))]).unwrap();
        assert_eq!(m.get_u32("a").unwrap(), 7);
        assert_eq!(m.get_i8("b").unwrap(), -1);
        let e = m.get_u32("b").unwrap_err();
        assert!(matches!(&e.kind, ErrorKind::Metadata { key, problem: KeyProblem::OutOfRange { .. } } if key == "b"), "{e}");
        assert_eq!(e.offset, Some(101));
        let e = m.get_u32("c").unwrap_err();
        assert_eq!(e.to_string(), "m.gguf at byte 102: metadata key \"c\": expected u32, found string");
        let e = m.get_u32("zz").unwrap_err();
        assert_eq!(e.to_string(), "m.gguf: metadata key \"zz\": missing");
        assert_eq!(m.get_u64("d").unwrap(), u64::MAX);
        assert!(m.get_i64("d").is_err());
        assert_eq!(m.optional("zz", Metadata::get_u32).unwrap(), None);
        assert_eq!(m.optional("a", Metadata::get_u32).unwrap(), Some(7));
        assert!(m.optional("c", Metadata::get_u32).is_err());
    }

    #[test]
    fn arrays_and_order() {
        let m = md(vec![("z", vec!["a", "b"].into()), ("y", vec![1i32, -2].into()), ("x", vec![1.5f32].into())]).unwrap();
        assert_eq!(m.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["z", "y", "x"]);
        assert_eq!(m.get_str_array("z").unwrap().len(), 2);
        assert_eq!(m.get_int_array("y").unwrap(), vec![1, -2]);
        assert_eq!(m.get_f32_array("x").unwrap(), &[1.5]);
        let e = m.get_str_array("y").unwrap_err();
        assert!(e.to_string().contains("expected array of string, found array of i32"), "{e}");
    }

    #[test]
    fn duplicate_keys_are_refused_at_the_second() {
        let e = md(vec![("a", Value::U8(1)), ("b", Value::U8(1)), ("a", Value::U8(2))]).unwrap_err();
        assert!(matches!(&e.kind, ErrorKind::DuplicateKey { key } if key == "a"));
        assert_eq!(e.offset, Some(102));
    }
}
