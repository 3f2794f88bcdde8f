//! The GGUF header of a file over http(s), fetched with `Range` requests and never the whole
//! file: a Model's facts (shape class, size, KV bytes per token) are needed for placement before
//! any node downloads its tens of GB. The prefix grows (doubling) until the header (metadata
//! and tensor infos) parses, up to a cap.

use std::path::Path;

use brink_engine::gguf::{ErrorKind, GgufError, read_header};

use super::download::{content_range, error_chain};
use super::error::CacheError;
use super::source::Credentials;

/// How far the prefix may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangePolicy {
    /// Bytes of the first request.
    pub first_bytes: u64,
    /// Most bytes fetched from one file before giving up.
    pub cap_bytes: u64,
}

impl Default for RangePolicy {
    fn default() -> Self {
        // A Qwen3 header (151k-token vocabulary and merges) is a few MB: 1 MiB, 2, 4, 8.
        RangePolicy { first_bytes: 1 << 20, cap_bytes: 64 << 20 }
    }
}

/// A file's header bytes (from byte 0 to where its data section starts, or the file's end) and
/// the file's length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteHeader {
    pub prefix: Vec<u8>,
    pub file_len: u64,
}

/// What a prefix of a GGUF file says about its header.
#[derive(Debug)]
pub enum PrefixParse {
    /// The header parses: it ends (data section start) at this offset.
    Complete { data_start: u64 },
    /// The header runs past the prefix.
    NeedMore,
    /// The header is wrong whatever follows (the engine's error: names the file and offset).
    Invalid(GgufError),
}

/// Parses the header in `prefix` of a file `file_len` bytes long. The reader checks every count
/// and offset against `file_len`, so running out of prefix shows as an end-of-input read error.
pub fn parse_prefix(prefix: &[u8], file_len: u64, name: &Path) -> PrefixParse {
    match read_header(prefix, file_len, name) {
        Ok(h) => PrefixParse::Complete { data_start: h.data_start },
        Err(e)
            if (prefix.len() as u64) < file_len
                && matches!(&e.kind, ErrorKind::Io { source, .. } if source.kind() == std::io::ErrorKind::UnexpectedEof) =>
        {
            PrefixParse::NeedMore
        }
        Err(e) => PrefixParse::Invalid(e),
    }
}

/// The prefix length to ask for after `have` bytes did not hold the header: double, at least
/// the first request's size, at most the cap and the file; None when nothing more may be read.
pub fn next_len(have: u64, file_len: Option<u64>, policy: RangePolicy) -> Option<u64> {
    let want = have.saturating_mul(2).max(policy.first_bytes).min(policy.cap_bytes);
    let want = file_len.map_or(want, |len| want.min(len));
    (want > have).then_some(want)
}

/// Fetches `url`'s header with ranged GETs (`policy` bounds the bytes read).
pub async fn fetch(
    client: &reqwest::Client,
    url: &str,
    credentials: Option<&Credentials>,
    policy: RangePolicy,
) -> Result<RemoteHeader, CacheError> {
    let mut prefix: Vec<u8> = Vec::new();
    let mut file_len: Option<u64> = None;
    let name = Path::new(url);
    loop {
        if let Some(len) = file_len {
            match parse_prefix(&prefix, len, name) {
                PrefixParse::Complete { data_start } => {
                    // The bytes past the header are tensor data (or padding): not needed.
                    prefix.truncate(usize::try_from(data_start).unwrap_or(usize::MAX).min(prefix.len()));
                    return Ok(RemoteHeader { prefix, file_len: len });
                }
                PrefixParse::Invalid(e) => {
                    let at = e.offset.map(|o| format!(" at byte {o}")).unwrap_or_default();
                    return Err(CacheError::Http { url: url.to_string(), message: format!("the GGUF header{at}: {}", e.kind) });
                }
                PrefixParse::NeedMore => {}
            }
        }
        let have = prefix.len() as u64;
        let Some(want) = next_len(have, file_len, policy) else {
            return Err(CacheError::HeaderTooLarge { url: url.to_string(), cap: policy.cap_bytes });
        };
        file_len = Some(fetch_range(client, url, credentials, &mut prefix, want).await?);
    }
}

/// Appends bytes `prefix.len()..want` of `url` to `prefix`; returns the file's length.
async fn fetch_range(
    client: &reqwest::Client,
    url: &str,
    credentials: Option<&Credentials>,
    prefix: &mut Vec<u8>,
    want: u64,
) -> Result<u64, CacheError> {
    let start = prefix.len() as u64;
    let mut request = client.get(url).header(reqwest::header::RANGE, format!("bytes={start}-{}", want - 1));
    request = match credentials {
        Some(Credentials::Bearer(token)) => request.bearer_auth(token),
        Some(Credentials::Basic { user, password }) => request.basic_auth(user, Some(password)),
        None => request,
    };
    let http_err = |e: reqwest::Error| CacheError::Http { url: url.to_string(), message: error_chain(&e) };
    let mut response = request.send().await.map_err(http_err)?;
    let file_len = match response.status().as_u16() {
        206 => match content_range(&response) {
            Some((Some(s), len)) if s == start => len,
            other => {
                let message = format!("asked for bytes {start}-{} and the server answered 206 with Content-Range {other:?}", want - 1);
                return Err(CacheError::Http { url: url.to_string(), message });
            }
        },
        // A server that ignores Range sends the whole file: fine when that is no more than was
        // asked for (a tiny file), otherwise reading on would download the model.
        200 => match response.content_length() {
            Some(len) if start == 0 && len <= want => len,
            _ => return Err(CacheError::NoRanges { url: url.to_string() }),
        },
        status => return Err(CacheError::Status { url: url.to_string(), status }),
    };
    // Never more than asked for, whatever the server sends.
    let end = want.min(file_len);
    while (prefix.len() as u64) < end {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = (end - prefix.len() as u64) as usize;
                prefix.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            // A range cut short (a dropped connection, a server that caps a range's size) still
            // moves the prefix on: the caller parses it and asks for the rest from there.
            Ok(None) | Err(_) if prefix.len() as u64 > start => break,
            Ok(None) => {
                let message = format!("the connection closed before the first byte of the range {start}-{}", end - 1);
                return Err(CacheError::Http { url: url.to_string(), message });
            }
            Err(e) => return Err(http_err(e)),
        }
    }
    Ok(file_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_engine::synth::{Preset, SynthSpec};

    const POLICY: RangePolicy = RangePolicy { first_bytes: 1000, cap_bytes: 8000 };

    #[test]
    fn the_range_doubles_up_to_the_cap_and_the_file() {
        assert_eq!(next_len(0, None, POLICY), Some(1000));
        assert_eq!(next_len(1000, Some(1 << 20), POLICY), Some(2000));
        assert_eq!(next_len(4000, Some(1 << 20), POLICY), Some(8000));
        assert_eq!(next_len(8000, Some(1 << 20), POLICY), None, "the cap");
        assert_eq!(next_len(2000, Some(3000), POLICY), Some(3000), "the file's end");
        assert_eq!(next_len(3000, Some(3000), POLICY), None);
        assert_eq!(next_len(300, Some(3000), POLICY), Some(1000), "at least the first request's size");
    }

    #[test]
    fn a_prefix_parses_once_it_holds_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        let full = brink_engine::gguf::GgufFile::open(&path).unwrap();
        let data_start = full.parts()[0].data_start();
        assert!(data_start < len / 2, "the test needs a header much smaller than the file");
        // Every prefix shorter than the header's end asks for more; from there on it parses.
        let header_end = full.tensors().iter().map(|t| t.info_offset()).max().unwrap();
        for cut in [0, 4, 24, 100, header_end as usize] {
            assert!(matches!(parse_prefix(&bytes[..cut], len, &path), PrefixParse::NeedMore), "cut {cut}");
        }
        for cut in [data_start as usize, data_start as usize + 1, bytes.len()] {
            let PrefixParse::Complete { data_start: got } = parse_prefix(&bytes[..cut], len, &path) else { panic!("cut {cut}") };
            assert_eq!(got, data_start);
        }
        // Not a GGUF file: wrong whatever follows.
        let mut bad = bytes[..64].to_vec();
        bad[0] = b'X';
        let PrefixParse::Invalid(e) = parse_prefix(&bad, len, &path) else { panic!("a bad magic must be invalid") };
        assert!(e.to_string().contains("not a GGUF file"), "{e}");
        // A whole file that is too short is invalid, not "need more".
        assert!(matches!(parse_prefix(&bytes[..100], 100, &path), PrefixParse::Invalid(_)));
    }
}
