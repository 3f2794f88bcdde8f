//! GGUF metadata values.
//!
//! Arrays are stored typed (`Vec<u32>`, not `Vec<Value>`) so that an array costs about what it
//! occupies in the file: this keeps the reader's memory bounded by the file's size.

/// The type of a metadata value, with its id in GGUF files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string: its u64 length; an
    /// array: its u32 element type and u64 length). Bounds element counts before allocating.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(Box<str>),
    Array(Box<Array>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: elements of one type. Nested arrays may each have their own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<Box<str>>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type as an error message shows it: `u32`, `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => a.type_description(),
            other => other.value_type().name().to_string(),
        }
    }

    /// Any integer variant, widened (every GGUF integer fits in i128).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An f32 or f64 value as f64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! typed_slices {
    ($($variant:ident => $fn_name:ident: $t:ty),* $(,)?) => {
        impl Array {
            $(
                pub fn $fn_name(&self) -> Option<&[$t]> {
                    match self {
                        Array::$variant(v) => Some(v),
                        _ => None,
                    }
                }
            )*
        }
        $(
            impl From<Vec<$t>> for Array {
                fn from(v: Vec<$t>) -> Self {
                    Array::$variant(v)
                }
            }
            impl From<Vec<$t>> for Value {
                fn from(v: Vec<$t>) -> Self {
                    Value::Array(Box::new(Array::$variant(v)))
                }
            }
        )*
    };
}

typed_slices! {
    U8 => as_u8: u8, I8 => as_i8: i8, U16 => as_u16: u16, I16 => as_i16: i16,
    U32 => as_u32: u32, I32 => as_i32: i32, F32 => as_f32: f32, Bool => as_bool: bool,
    String => as_strs: Box<str>, Array => as_arrays: Array, U64 => as_u64: u64, I64 => as_i64: i64,
    F64 => as_f64: f64,
}

impl Array {
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn type_description(&self) -> String {
        format!("array of {}", self.element_type())
    }

    /// The elements of any integer array as i64 (`None` for other arrays, or a u64 above
    /// `i64::MAX`). Converters differ in which integer type they write for e.g. token types.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn widen<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            Array::U8(v) => widen(v, |x| Some(x.into())),
            Array::I8(v) => widen(v, |x| Some(x.into())),
            Array::U16(v) => widen(v, |x| Some(x.into())),
            Array::I16(v) => widen(v, |x| Some(x.into())),
            Array::U32(v) => widen(v, |x| Some(x.into())),
            Array::I32(v) => widen(v, |x| Some(x.into())),
            Array::U64(v) => widen(v, |x| i64::try_from(x).ok()),
            Array::I64(v) => Some(v.clone()),
            _ => None,
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        })*
    };
}

scalar_from! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64,
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v.into_boxed_str())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(Box::new(v))
    }
}

impl From<Vec<&str>> for Array {
    fn from(v: Vec<&str>) -> Self {
        Array::String(v.into_iter().map(Box::from).collect())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Array::from(v).into()
    }
}

impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Self {
        Array::String(v.into_iter().map(String::into_boxed_str).collect()).into()
    }
}
