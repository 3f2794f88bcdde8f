//! GPT-2's byte-to-character table: byte-level BPE vocabularies spell every byte as a printable
//! character (printable Latin-1 bytes as themselves, the other 68 bytes as U+0100 upwards), so
//! decoding a token maps its characters back to bytes.

use std::sync::LazyLock;

/// The character GPT-2 uses for each byte.
pub fn byte_to_char(byte: u8) -> char {
    TABLES.0[byte as usize]
}

/// The byte a character stands for, or `None` for a character outside the table.
pub fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    if is_printable(code) {
        return Some(code as u8);
    }
    let shifted = usize::try_from(code.checked_sub(256)?).ok()?;
    TABLES.1.get(shifted).copied()
}

/// Bytes GPT-2 keeps as their own Latin-1 character: '!'..='~', '¡'..='¬', '®'..='ÿ'.
fn is_printable(b: u32) -> bool {
    (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
}

/// (byte -> char, and for U+0100 + n: the n-th non-printable byte).
static TABLES: LazyLock<([char; 256], Vec<u8>)> = LazyLock::new(|| {
    let mut chars = ['\0'; 256];
    let mut shifted = Vec::new();
    for (b, slot) in chars.iter_mut().enumerate() {
        let b = b as u8;
        *slot = if is_printable(b.into()) {
            char::from(b)
        } else {
            shifted.push(b);
            // At most 256 + 68: always a scalar value.
            char::from_u32(255 + shifted.len() as u32).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
    }
    (chars, shifted)
});

/// Decodes a byte-level token's text to its bytes; characters outside the table (which a
/// well-formed vocabulary never has) are kept as their UTF-8.
pub fn decode_token(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection_matching_gpt2() {
        let chars: Vec<char> = (0..=255u8).map(byte_to_char).collect();
        let mut sorted = chars.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        // Well-known entries: space is 'Ġ', newline 'Ċ', tab 'ĉ', 0x00 'Ā', 0xAD 'Ń'.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(0xad), 'Ń');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(char_to_byte('\u{0200}'), None);
        assert_eq!(char_to_byte('中'), None);
    }
}
