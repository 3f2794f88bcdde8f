//! Token ids back to text, as llama.cpp's `token_to_piece` and `detokenize` do it: each token
//! has a piece of bytes (byte-level characters mapped back to bytes, '▁' to spaces, `<0xXX>` to
//! its byte, special tokens as their text); control and unknown tokens are left out unless
//! special tokens are rendered; the pieces are joined and only then read as UTF-8, since one
//! character may be spread over several tokens.

use super::byte_level;
use super::vocab::{TokenAttr, TokenizerModel, parse_byte_token};

/// The piece of every token, with special tokens rendered (llama.cpp's piece cache).
pub fn pieces(model: TokenizerModel, tokens: &[Box<str>], attrs: &[TokenAttr]) -> Vec<Box<[u8]>> {
    tokens.iter().zip(attrs).map(|(text, &attr)| piece(model, text, attr).into_boxed_slice()).collect()
}

fn piece(model: TokenizerModel, text: &str, attr: TokenAttr) -> Vec<u8> {
    if attr.is_special() {
        return text.as_bytes().to_vec();
    }
    if attr.has(TokenAttr::NORMAL) {
        return match model {
            TokenizerModel::BytePairBpe => {
                let mut out = Vec::with_capacity(text.len());
                byte_level::decode_token(text, &mut out);
                out
            }
            TokenizerModel::SentencePiece => text.replace('▁', " ").into_bytes(),
        };
    }
    if attr.has(TokenAttr::BYTE) {
        // The vocabulary reader checked that byte tokens are spelled <0xXX>.
        return parse_byte_token(text).map(|b| vec![b]).unwrap_or_default();
    }
    // Unused and undefined tokens render as nothing.
    Vec::new()
}

/// Whether a token's piece is withheld when special tokens are not rendered.
pub fn is_hidden(attr: TokenAttr) -> bool {
    attr.has(TokenAttr::CONTROL.with(TokenAttr::UNKNOWN))
}

/// Joins the pieces of `ids` (already checked to be in range). With `strip_leading_space`
/// (SentencePiece's space prefix), one space is removed from the start of the first token's
/// piece, even if that piece is empty (then nothing is stripped), as llama.cpp does.
pub fn join(ids: &[u32], pieces: &[Box<[u8]>], attrs: &[TokenAttr], render_special: bool, strip_leading_space: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let attr = attrs[id as usize];
        if !render_special && is_hidden(attr) {
            continue;
        }
        let mut piece: &[u8] = &pieces[id as usize];
        if i == 0 && strip_leading_space && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        out.extend_from_slice(piece);
    }
    out
}

/// llama.cpp's `clean_spaces`: drops the space before `?!.,`, around a lone `'`, and before the
/// contractions 's 'm 're 've (but not 't 'd 'll, which it leaves alone).
pub fn clean_spaces(text: &[u8]) -> Vec<u8> {
    let pass1 = compact(text, |src, i, _| src[i - 1] == b' ' && matches!(src[i], b'?' | b'!' | b'.' | b','));
    let pass2 = lone_apostrophes(&pass1);
    compact(&pass2, |src, i, n| {
        if src[i - 1] != b' ' || src[i] != b'\'' || i + 1 >= n {
            return false;
        }
        match src[i + 1] {
            b's' | b'm' => true,
            b't' | b'd' => false,
            x1 => i + 2 < n && matches!((x1, src[i + 2]), (b'r', b'e') | (b'v', b'e')),
        }
    })
}

/// Copies `src`, dropping the space before position `i` where `drop_prev_space(src, i, len)`.
fn compact(src: &[u8], drop_prev_space: impl Fn(&[u8], usize, usize) -> bool) -> Vec<u8> {
    let mut out: Vec<u8> = src.iter().take(1).copied().collect();
    for i in 1..src.len() {
        if drop_prev_space(src, i, src.len()) {
            out.pop();
        }
        out.push(src[i]);
    }
    out
}

/// " ' " becomes "'". llama.cpp zeroes the skipped space in place, so it does not count as the
/// space before the next character.
fn lone_apostrophes(src: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = src.iter().take(1).copied().collect();
    let (mut i, mut skipped) = (1, false);
    while i < src.len() {
        let x = src[i];
        let after_space = !skipped && src[i - 1] == b' ';
        skipped = false;
        if x == b'\'' && i + 1 < src.len() && after_space && src[i + 1] == b' ' {
            out.pop();
            out.push(x);
            i += 2;
            skipped = true;
            continue;
        }
        out.push(x);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        String::from_utf8(clean_spaces(s.as_bytes())).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        assert_eq!(clean("Hello , world ! Yes ? no ."), "Hello, world! Yes? no.");
        assert_eq!(clean("rock ' n roll"), "rock'n roll");
        assert_eq!(clean("a ' ' b"), "a'' b");
        assert_eq!(clean("it 's I 'm we 're they 've"), "it's I'm we're they've");
        assert_eq!(clean("don 't I 'd we 'll"), "don 't I 'd we 'll");
        assert_eq!(clean(" ,"), ",");
        assert_eq!(clean(""), "");
        assert_eq!(clean("'"), "'");
        assert_eq!(clean("a 'x"), "a 'x");
    }

    #[test]
    fn pieces_per_model_and_type() {
        let bpe = TokenizerModel::BytePairBpe;
        let spm = TokenizerModel::SentencePiece;
        assert_eq!(piece(bpe, "Ġhello", TokenAttr::NORMAL), b" hello");
        assert_eq!(piece(bpe, "Ċ", TokenAttr::NORMAL), b"\n");
        // Special tokens keep their text as is (no byte mapping).
        assert_eq!(piece(bpe, "<|im_Ġend|>", TokenAttr::CONTROL), "<|im_Ġend|>".as_bytes());
        assert_eq!(piece(spm, "▁hello▁world", TokenAttr::NORMAL), b" hello world");
        assert_eq!(piece(spm, "<0x0A>", TokenAttr::BYTE), b"\n");
        assert_eq!(piece(spm, "<0xE4>", TokenAttr::BYTE), [0xe4]);
        assert!(piece(spm, "<unused1>", TokenAttr::UNUSED).is_empty());
        assert!(is_hidden(TokenAttr::CONTROL) && is_hidden(TokenAttr::UNKNOWN) && !is_hidden(TokenAttr::USER_DEFINED));
    }

    #[test]
    fn join_hides_control_tokens_and_strips_one_leading_space() {
        let attrs = [TokenAttr::CONTROL, TokenAttr::NORMAL, TokenAttr::NORMAL];
        let pieces: Vec<Box<[u8]>> = vec![b"<s>".to_vec().into(), b"  hi".to_vec().into(), b" there".to_vec().into()];
        assert_eq!(join(&[1, 2], &pieces, &attrs, false, true), b" hi there");
        assert_eq!(join(&[0, 1, 2], &pieces, &attrs, true, true), b"<s>  hi there");
        // A hidden first token still uses up the strip (llama.cpp strips only at index 0).
        assert_eq!(join(&[0, 1], &pieces, &attrs, false, true), b"  hi");
        assert_eq!(join(&[1], &pieces, &attrs, false, false), b"  hi");
    }
}
