//! Deterministic fuzzing of the GGUF header reader: mutations of valid files (bit flips, byte
//! changes, truncations, insertions, deletions, integer fields set to extremes). Every input must
//! give Ok or Err without panicking, an accepted file must satisfy the layout invariants, and
//! the reader's heap use while parsing must stay under a small multiple of the input's length.

mod gguf_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;

use brink_engine::gguf::{Array, PartHeader, Value};
use gguf_common::*;

/// Counts the live heap bytes of the current thread while enabled, and their peak.
struct CountingAlloc;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // try_with: the allocator also runs while thread-locals are torn down.
    let _ = TRACKING.try_with(|on| {
        if on.get() {
            let live = LIVE.get() + delta;
            LIVE.set(live);
            PEAK.set(PEAK.get().max(live));
        }
    });
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Peak as if old and new coexisted, which a moving realloc does.
            track(new_size as isize);
            track(-(layout.size() as isize));
        }
        p
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Peak heap bytes of `f` on this thread, and its result.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.set(0);
    PEAK.set(0);
    TRACKING.set(true);
    let out = f();
    TRACKING.set(false);
    (out, PEAK.get().max(0) as usize)
}

/// Allowed heap use: 4 bytes per input byte, plus a constant for the error's path and message.
const ALLOC_FACTOR: usize = 4;
const ALLOC_SLACK: usize = 4 << 10;

/// (offset, width) of every integer field of a valid file, found from what the reader parsed.
fn integer_fields(h: &PartHeader) -> Vec<(usize, usize)> {
    fn array_fields(a: &Array, at: &mut usize, out: &mut Vec<(usize, usize)>) {
        out.push((*at, 4)); // element type
        out.push((*at + 4, 8)); // length
        *at += 12;
        match a {
            Array::String(v) => {
                for s in v {
                    out.push((*at, 8));
                    *at += 8 + s.len();
                }
            }
            Array::Array(v) => v.iter().for_each(|inner| array_fields(inner, at, out)),
            other => {
                let width = other.element_type().min_encoded_size() as usize;
                for _ in 0..other.len() {
                    if width >= 4 {
                        out.push((*at, width));
                    }
                    *at += width;
                }
            }
        }
    }
    let mut out = vec![(4, 4), (8, 8), (16, 8)];
    for e in h.metadata.entries() {
        let offset = e.offset as usize;
        out.push((offset - 8 - e.key.len(), 8)); // key length
        out.push((offset, 4)); // value type
        let mut at = offset + 4;
        match &e.value {
            Value::String(_) => out.push((at, 8)),
            Value::Array(a) => array_fields(a, &mut at, &mut out),
            v => {
                let width = v.value_type().min_encoded_size() as usize;
                if width >= 4 {
                    out.push((at, width));
                }
            }
        }
    }
    for t in &h.tensors {
        let at = t.info_offset() as usize;
        out.push((at, 8)); // name length
        let n_dims_at = at + 8 + t.name().len();
        out.push((n_dims_at, 4));
        for i in 0..t.dims().len() {
            out.push((n_dims_at + 4 + 8 * i, 8));
        }
        let type_at = n_dims_at + 4 + 8 * t.dims().len();
        out.push((type_at, 4));
        out.push((type_at + 4, 8));
    }
    out
}

fn extreme(rng: &mut Rng, len: usize) -> u64 {
    let choices =
        [0, 1, 2, 31, 32, 33, 255, 1 << 31, u32::MAX as u64, 1 << 32, 1 << 63, u64::MAX, u64::MAX - 31, len as u64, len as u64 - 1];
    match rng.below(4) {
        0 => rng.next(),
        1 => rng.below(64),
        _ => choices[rng.below(choices.len() as u64) as usize],
    }
}

fn mutate(seed: &[u8], fields: &[(usize, usize)], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        let len = b.len();
        let pos = rng.below(len as u64) as usize;
        match rng.below(9) {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    let p = rng.below(len as u64) as usize;
                    b[p] ^= 1 << rng.below(8);
                }
            }
            1 => b[pos] = rng.next() as u8,
            2 => b[pos] = [0x00, 0xff, 0x80, 0x7f, 0x01][rng.below(5) as usize],
            3 => b.truncate(rng.below(len as u64) as usize),
            4 => {
                let insert = bytes(1 + rng.below(16) as usize, rng.next());
                b.splice(pos..pos, insert);
            }
            5 => {
                let end = (pos + 1 + rng.below(16) as usize).min(len);
                b.drain(pos..end);
            }
            6 | 7 => {
                // An integer field of the seed set to an extreme value.
                let (at, width) = fields[rng.below(fields.len() as u64) as usize];
                let v = extreme(rng, len);
                if at + width <= b.len() {
                    b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
                }
            }
            _ => {
                // Any 8 bytes set to an extreme value.
                let v = extreme(rng, len).to_le_bytes();
                let n = v.len().min(len - pos);
                b[pos..pos + n].copy_from_slice(&v[..n]);
            }
        }
    }
    b
}

/// What an accepted file must satisfy.
fn check_invariants(h: &PartHeader, len: usize) {
    assert!(h.alignment.is_power_of_two());
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for t in &h.tensors {
        assert_eq!(t.file_offset() % h.alignment, 0);
        assert!(t.file_offset() >= h.data_start);
        assert!(t.file_offset() + t.size() <= len as u64);
        assert_eq!(t.size(), brink_engine::gguf::tensor_bytes(t.ggml_type(), t.dims()).unwrap());
        ranges.push((t.file_offset(), t.file_offset() + t.size()));
    }
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
}

#[test]
fn fuzz_header_reader() {
    const INPUTS: usize = 1_000_000;
    let (sample, sample_data) = sample_model();
    let seeds: Vec<Vec<u8>> = vec![
        small_model(32, 3),
        small_model(64, 2),
        small_model(1, 3),
        small_model(4096, 3),
        sample.to_bytes(&refs(&sample_data)).unwrap(),
        brink_engine::gguf::GgufWriter::new().to_bytes(&[]).unwrap(),
    ];
    let seed_fields: Vec<Vec<(usize, usize)>> = seeds.iter().map(|s| integer_fields(&parse(s).unwrap())).collect();

    let mut rng = Rng(0x5eed);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut worst_excess = 0isize;
    let start = std::time::Instant::now();
    for i in 0..INPUTS {
        let s = i % seeds.len();
        let input = mutate(&seeds[s], &seed_fields[s], &mut rng);
        let (outcome, peak) = peak_heap(|| {
            let r = parse(&input);
            let name = match &r {
                Ok(h) => {
                    check_invariants(h, input.len());
                    "ok".to_string()
                }
                Err(e) => {
                    let d = format!("{:?}", e.kind);
                    d.split([' ', '(', '{']).next().unwrap_or_default().to_string()
                }
            };
            drop(r);
            name
        });
        let allowed = ALLOC_FACTOR * input.len() + ALLOC_SLACK;
        assert!(peak <= allowed, "input {i} (seed {s}, {} bytes): peak heap {peak} > {allowed}", input.len());
        worst_excess = worst_excess.max(peak as isize - (ALLOC_FACTOR * input.len()) as isize);
        *outcomes.entry(outcome).or_default() += 1;
    }
    println!("gguf fuzz: {INPUTS} inputs in {:.1?}; outcomes: {outcomes:?}", start.elapsed());
    println!("gguf fuzz: worst heap peak beyond {ALLOC_FACTOR} x input length: {worst_excess} bytes (allowed {ALLOC_SLACK})");
    // The mutations must reach past the header checks: most kinds of error, and some Ok.
    for kind in ["ok", "Truncated", "CountTooLarge", "BadMagic", "UnsupportedVersion", "UnknownValueType", "UnknownTensorType", "BadShape"]
    {
        assert!(outcomes.get(kind).copied().unwrap_or(0) > 0, "no input ended in {kind}: {outcomes:?}");
    }
}

#[test]
fn allocation_is_bounded_for_maximal_claims() {
    // A 64-byte file claiming as much as the reader could be made to reserve.
    for (tensors, entries) in [(u64::MAX, 0), (0, u64::MAX), (1, 2), (1 << 20, 1 << 20)] {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&tensors.to_le_bytes());
        b.extend_from_slice(&entries.to_le_bytes());
        b.resize(64, 0xff);
        let (r, peak) = peak_heap(|| parse(&b).map(|_| ()));
        assert!(r.is_err());
        assert!(peak <= ALLOC_SLACK, "peak {peak}");
    }
    // A valid file of many tiny entries: the heaviest per-byte structure the reader keeps.
    let mut w = brink_engine::gguf::GgufWriter::new();
    for i in 0..5000 {
        w.set(&format!("{}", i % 10_000 + 10_000), Value::U8(1)).unwrap();
    }
    let b = w.to_bytes(&[]).unwrap();
    let (r, peak) = peak_heap(|| parse(&b).map(|h| h.metadata.len()));
    assert_eq!(r.unwrap(), 5000);
    println!("5000 tiny entries: {} bytes of file, peak heap {peak} ({:.2} x)", b.len(), peak as f64 / b.len() as f64);
    assert!(peak <= ALLOC_FACTOR * b.len() + ALLOC_SLACK);
    // And of many tiny tensors.
    let mut w = brink_engine::gguf::GgufWriter::new();
    w.set_alignment(1).unwrap();
    for i in 0..5000 {
        w.add_tensor(&format!("{}", i + 10_000), &[1], brink_engine::gguf::GgmlType::I8).unwrap();
    }
    let data = vec![[0u8; 1]; 5000];
    let b = w.to_bytes(&data.iter().map(|d| d.as_slice()).collect::<Vec<_>>()).unwrap();
    let (r, peak) = peak_heap(|| parse(&b).map(|h| h.tensors.len()));
    assert_eq!(r.unwrap(), 5000);
    println!("5000 tiny tensors: {} bytes of file, peak heap {peak} ({:.2} x)", b.len(), peak as f64 / b.len() as f64);
    assert!(peak <= ALLOC_FACTOR * b.len() + ALLOC_SLACK);
}
