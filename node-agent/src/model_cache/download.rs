//! One file over http(s) into its partial file, resumed with `Range` from the partial's length,
//! sha256-verified as it streams. A server that ignores `Range` (200 instead of 206) restarts
//! the file cleanly; a dropped connection is retried from where it stopped.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncWriteExt, BufWriter};

use super::error::CacheError;
use super::source::Credentials;

/// Bytes of the current file so far, and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub bytes: u64,
    pub total: u64,
}

pub struct Fetch<'a> {
    pub url: &'a str,
    /// Lowercase hex.
    pub sha256: &'a str,
    pub partial: &'a Path,
    pub credentials: Option<&'a Credentials>,
    pub attempts: u32,
    pub retry_delay: Duration,
}

/// The partial file's bytes and their running digest.
struct Partial {
    hasher: Sha256,
    len: u64,
}

/// How one attempt ended, when it did not fail outright.
enum Attempt {
    Complete,
    /// Worth another attempt (dropped connection, 5xx, a restarted file).
    Retry(String),
}

/// Downloads `job.url` into `job.partial` and verifies it. `admit(total)` runs once, when the
/// size is first known and before any byte is written: the disk-budget check. Returns the size.
pub async fn fetch(
    client: &reqwest::Client,
    job: &Fetch<'_>,
    admit: &mut (dyn FnMut(u64) -> Result<(), CacheError> + Send),
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<u64, CacheError> {
    let mut partial = hash_existing(job.partial).await?;
    let mut total = None;
    let mut last = String::from("no attempt made");
    for attempt in 1..=job.attempts.max(1) {
        if attempt > 1 {
            tokio::time::sleep(job.retry_delay * (attempt - 1)).await;
        }
        match attempt_once(client, job, &mut partial, &mut total, admit, progress).await? {
            Attempt::Complete => return finish(job, partial, total.unwrap_or(0)).await,
            Attempt::Retry(why) => last = why,
        }
    }
    Err(CacheError::Interrupted {
        url: job.url.to_string(),
        attempts: job.attempts.max(1),
        at: partial.len,
        total: total.unwrap_or(0),
        last,
    })
}

/// Why the body stream stopped.
enum Stop {
    Ended,
    Broken(String),
    Overflow,
}

async fn attempt_once(
    client: &reqwest::Client,
    job: &Fetch<'_>,
    partial: &mut Partial,
    total: &mut Option<u64>,
    admit: &mut (dyn FnMut(u64) -> Result<(), CacheError> + Send),
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Attempt, CacheError> {
    let url = job.url;
    let mut request = client.get(url);
    if partial.len > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={}-", partial.len));
    }
    request = match job.credentials {
        Some(Credentials::Bearer(token)) => request.bearer_auth(token),
        Some(Credentials::Basic { user, password }) => request.basic_auth(user, Some(password)),
        None => request,
    };
    let mut response = match request.send().await {
        Ok(r) => r,
        // A URL that cannot be requested at all does not get better with retries.
        Err(e) if e.is_builder() => return Err(CacheError::Http { url: url.to_string(), message: error_chain(&e) }),
        Err(e) => return Ok(Attempt::Retry(error_chain(&e))),
    };
    let status = response.status().as_u16();
    let size = match status {
        206 => {
            let range = content_range(&response);
            match range {
                Some((Some(start), size)) if start == partial.len => size,
                // A range other than the one asked for: start again from byte 0.
                _ => {
                    restart(job.partial, partial).await?;
                    return Ok(Attempt::Retry(format!("the server answered 206 with Content-Range {range:?} for byte {}", partial.len)));
                }
            }
        }
        200 => {
            if partial.len > 0 {
                // The server ignored Range: the body is the whole file.
                restart(job.partial, partial).await?;
            }
            response.content_length().ok_or_else(|| CacheError::UnknownSize { url: url.to_string() })?
        }
        416 => {
            // Asked for bytes past the end: the partial is complete (a crash before the move)
            // when the server's size is its length; otherwise it is stale.
            if let Some((None, size)) = content_range(&response)
                && size == partial.len
            {
                admit_once(total, size, admit)?;
                return Ok(Attempt::Complete);
            }
            restart(job.partial, partial).await?;
            return Ok(Attempt::Retry("the server answered 416 to the resume; restarted".into()));
        }
        500..=599 => return Ok(Attempt::Retry(format!("the server answered {status}"))),
        _ => return Err(CacheError::Status { url: url.to_string(), status }),
    };
    if let Some(known) = *total
        && known != size
    {
        // The file changed on the server between attempts: what we have belongs to another file.
        restart(job.partial, partial).await?;
        *total = Some(size);
        return Ok(Attempt::Retry(format!("the server's size changed from {known} to {size}; restarted")));
    }
    admit_once(total, size, admit)?;

    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(job.partial)
        .await
        .map_err(|e| CacheError::io("opening the partial file", job.partial, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let stop = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                if partial.len + bytes.len() as u64 > size {
                    break Stop::Overflow;
                }
                out.write_all(&bytes).await.map_err(|e| CacheError::io("writing the partial file", job.partial, e))?;
                partial.hasher.update(&bytes);
                partial.len += bytes.len() as u64;
                progress(Progress { bytes: partial.len, total: size });
            }
            Ok(None) => break Stop::Ended,
            Err(e) => break Stop::Broken(error_chain(&e)),
        }
    };
    out.flush().await.map_err(|e| CacheError::io("writing the partial file", job.partial, e))?;
    out.into_inner().sync_all().await.map_err(|e| CacheError::io("syncing the partial file", job.partial, e))?;
    match stop {
        Stop::Overflow => {
            restart(job.partial, partial).await?;
            Ok(Attempt::Retry(format!("the server sent more than its {size} bytes; restarted")))
        }
        Stop::Broken(why) => Ok(Attempt::Retry(why)),
        Stop::Ended if partial.len == size => Ok(Attempt::Complete),
        Stop::Ended => Ok(Attempt::Retry(format!("the connection closed at byte {} of {size}", partial.len))),
    }
}

fn admit_once(total: &mut Option<u64>, size: u64, admit: &mut (dyn FnMut(u64) -> Result<(), CacheError> + Send)) -> Result<(), CacheError> {
    if total.is_none() {
        admit(size)?;
        *total = Some(size);
    }
    Ok(())
}

/// Compares the digest; a mismatch removes the file (it would only be resumed into another
/// mismatch) and names the URL and both digests.
async fn finish(job: &Fetch<'_>, partial: Partial, size: u64) -> Result<u64, CacheError> {
    let actual = hex(&partial.hasher.finalize());
    if actual != job.sha256 {
        tokio::fs::remove_file(job.partial).await.map_err(|e| CacheError::io("removing the bad download", job.partial, e))?;
        return Err(CacheError::Checksum { url: job.url.to_string(), expected: job.sha256.to_string(), actual });
    }
    Ok(size)
}

async fn restart(path: &Path, partial: &mut Partial) -> Result<(), CacheError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CacheError::io("removing the partial file", path, e)),
    }
    *partial = Partial { hasher: Sha256::new(), len: 0 };
    Ok(())
}

/// The digest of what an earlier run left in the partial file, so the resumed bytes extend it.
async fn hash_existing(path: &Path) -> Result<Partial, CacheError> {
    let owned = path.to_path_buf();
    let hashed = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Partial>> {
        let mut file = match std::fs::File::open(&owned) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut hasher = Sha256::new();
        let len = std::io::copy(&mut file, &mut hasher)?;
        Ok(Some(Partial { hasher, len }))
    })
    .await
    .map_err(|e| CacheError::Task(e.to_string()))?;
    let hashed = hashed.map_err(|e| CacheError::io("reading the partial file", path, e))?;
    Ok(hashed.unwrap_or(Partial { hasher: Sha256::new(), len: 0 }))
}

/// `Content-Range: bytes START-END/TOTAL` as (Some(START), TOTAL), or `bytes */TOTAL` as
/// (None, TOTAL); None when absent or malformed.
pub(super) fn content_range(response: &reqwest::Response) -> Option<(Option<u64>, u64)> {
    parse_content_range(response.headers().get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?)
}

fn parse_content_range(value: &str) -> Option<(Option<u64>, u64)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let total = total.trim().parse().ok()?;
    if range.trim() == "*" {
        return Some((None, total));
    }
    let (start, end) = range.split_once('-')?;
    let (start, end): (u64, u64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    (start <= end && end < total).then_some((Some(start), total))
}

/// reqwest's message with its causes ("error sending request: connection reset ...").
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of a whole file, off the async threads (a model is tens of GB).
pub async fn sha256_file(path: &Path) -> Result<String, CacheError> {
    let owned = path.to_path_buf();
    let digest = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut hasher = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&owned)?, &mut hasher)?;
        Ok(hex(&hasher.finalize()))
    })
    .await
    .map_err(|e| CacheError::Task(e.to_string()))?;
    digest.map_err(|e| CacheError::io("hashing", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_forms() {
        assert_eq!(parse_content_range("bytes 100-199/200"), Some((Some(100), 200)));
        assert_eq!(parse_content_range("bytes */200"), Some((None, 200)));
        assert_eq!(parse_content_range("bytes 0-0/1"), Some((Some(0), 1)));
        for bad in ["bytes 100-199/150", "bytes 5-4/10", "items 0-1/2", "bytes 0-1", "bytes x-1/2", ""] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0, 0x0f, 0xab]), "000fab");
    }
}
