//! Load-path benchmark: positioned reads into the caller's buffer vs mmap-then-copy, on a
//! generated GGUF file, with the page cache dropped (cold) and kept (warm).
//!
//! `cargo run --release -p brink-engine --example gguf_load_bench -- [MB] [DIR]`
//! (default 512 MB in the system temp dir). Cold runs drop the file from the page cache with
//! posix_fadvise(DONTNEED) (Linux); a disk's own cache may still serve some reads.

use std::path::Path;
use std::time::{Duration, Instant};

use brink_engine::gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo};

const TENSOR_MB: u64 = 16;

type Loader = dyn Fn(&GgufFile, &mut [u8]) -> Result<(), Box<dyn std::error::Error>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mb: u64 = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(512);
    let dir = args.get(2).map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("brink-load-bench-{}.gguf", std::process::id()));

    let written = write_model(&path, mb)?;
    let result = run(&path, written);
    std::fs::remove_file(&path)?;
    result
}

/// `mb` MB of Q8_0 tensors of TENSOR_MB each, with a vocabulary-sized metadata array.
fn write_model(path: &Path, mb: u64) -> Result<u64, Box<dyn std::error::Error>> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "bench")?;
    let tokens: Vec<String> = (0..151_936).map(|i| format!("tok{i}")).collect();
    w.set("tokenizer.ggml.tokens", tokens)?;
    let rows = TENSOR_MB * (1 << 20) / 34; // 34 bytes per 32-weight Q8_0 block
    let n = mb.div_ceil(TENSOR_MB);
    for i in 0..n {
        w.add_tensor(&format!("blk.{i}.weight"), &[32, rows], GgmlType::Q8_0)?;
    }
    let file = std::fs::File::create(path)?;
    let mut out = w.begin(std::io::BufWriter::with_capacity(8 << 20, &file), path)?;
    let mut data = vec![0u8; (rows * 34) as usize];
    for i in 0..n {
        data.iter_mut().enumerate().for_each(|(j, b)| *b = (j as u64 ^ i) as u8);
        out.write_tensor(&data)?;
    }
    out.finish()?;
    file.sync_all()?;
    Ok(n * rows * 34)
}

fn run(path: &Path, bytes: u64) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let f = GgufFile::open(path)?;
    println!("open (header with a 151,936-token vocabulary, {} tensors): {:.1?}", f.tensors().len(), start.elapsed());
    // A pre-faulted destination, as pinned or staging memory would be.
    let mut dst = vec![1u8; bytes as usize];
    let mb = bytes as f64 / 1e6;
    println!("{mb:.0} MB of tensor data, {} CPUs", std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("{:<34} {:>10} {:>10}", "path", "cold MB/s", "warm MB/s");
    let paths: [(&str, &Loader); 4] = [
        ("pread into buffer (1 thread)", &|f, d| pread_all(f, d, 1)),
        ("pread into buffer (4 threads)", &|f, d| pread_all(f, d, 4)),
        ("mmap then copy", &mmap_copy),
        ("mmap, touch one byte per page", &mmap_touch),
    ];
    for (name, load) in paths {
        let mut best = [Duration::MAX; 2];
        for _ in 0..3 {
            for (i, cold) in [true, false].into_iter().enumerate() {
                if cold {
                    drop_cache(&f);
                }
                let t = Instant::now();
                load(&f, &mut dst)?;
                best[i] = best[i].min(t.elapsed());
            }
        }
        let rate = |d: Duration| mb / d.as_secs_f64();
        println!("{name:<34} {:>10.0} {:>10.0}", rate(best[0]), rate(best[1]));
    }
    // The paths must have loaded the same bytes.
    let last = f.tensors().last().ok_or("no tensors")?;
    assert_eq!(&dst[dst.len() - last.size() as usize..], f.map()?.tensor_bytes(last)?);
    Ok(())
}

/// Destination slices, one per tensor, in file order.
fn slices<'a>(f: &'a GgufFile, mut dst: &'a mut [u8]) -> Vec<(&'a TensorInfo, &'a mut [u8])> {
    f.tensors()
        .iter()
        .map(|t| {
            let (head, tail) = std::mem::take(&mut dst).split_at_mut(t.size() as usize);
            dst = tail;
            (t, head)
        })
        .collect()
}

fn pread_all(f: &GgufFile, dst: &mut [u8], threads: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut jobs = slices(f, dst);
    let per = jobs.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> =
            jobs.chunks_mut(per).map(|chunk| s.spawn(move || chunk.iter_mut().try_for_each(|(t, d)| f.read_tensor_into(t, d)))).collect();
        handles.into_iter().try_for_each(|h| h.join().expect("reader thread panicked"))
    })?;
    Ok(())
}

fn mmap_copy(f: &GgufFile, dst: &mut [u8]) -> Result<(), Box<dyn std::error::Error>> {
    let map = f.map()?;
    for (t, d) in slices(f, dst) {
        d.copy_from_slice(map.tensor_bytes(t)?);
    }
    Ok(())
}

fn mmap_touch(f: &GgufFile, dst: &mut [u8]) -> Result<(), Box<dyn std::error::Error>> {
    let map = f.map()?;
    let mut sum = 0u8;
    for t in f.tensors() {
        sum = map.tensor_bytes(t)?.iter().step_by(4096).fold(sum, |a, &b| a.wrapping_add(b));
    }
    dst[0] = sum;
    Ok(())
}

#[cfg(target_os = "linux")]
fn drop_cache(f: &GgufFile) {
    use std::os::fd::AsRawFd;
    for part in f.parts() {
        let Ok(file) = std::fs::File::open(part.path()) else { continue };
        // SAFETY: a plain syscall on a file descriptor we own; DONTNEED only drops clean pages.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

#[cfg(not(target_os = "linux"))]
fn drop_cache(_: &GgufFile) {}
