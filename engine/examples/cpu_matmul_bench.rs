//! CPU matmul throughput: GFLOP/s (2·rows·cols per token) of `cpu::matmul` on one thread and on
//! two, for q4_0, q8_0 and q4_K weights of 768 × 2048 (a Qwen3-30B-A3B expert's gate/up), for one
//! token (decode) and for 64 (prefill), activation quantization included. On a shared machine
//! the wall-clock rate depends on what else runs; GFLOP per CPU-second does not.
//!
//! `cargo run --release -p brink-engine --example cpu_matmul_bench -- [ROWS] [COLS]`

use std::time::{Duration, Instant};

use brink_engine::ggml_cpu::{WeightKind, WeightMatrix, matmul};
use brink_engine::gguf::GgmlType;
use brink_kernels::testdata::{hash2, uniform_pm1};
use half::f16;

/// Random blocks whose f16 scale fields hold small finite values, as a model's would.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let kind = WeightKind::of(ty).expect("a CPU type");
    let (bs, bb) = (kind.block_size(), kind.block_bytes());
    let mut data: Vec<u8> = (0..(rows * cols / bs * bb) as u64).map(|i| hash2(1, i) as u8).collect();
    let scale_fields: &[usize] = if ty == GgmlType::Q4_K { &[0, 2] } else { &[0] };
    for block in data.chunks_exact_mut(bb) {
        for &at in scale_fields {
            block[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        }
    }
    data
}

/// CPU time of the whole process (all threads).
fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// GFLOP/s of the best wall-clock run over about a second, and GFLOP per CPU-second over all
/// runs (what the code does per core, whatever else the machine is running).
fn gflops(w: &WeightMatrix, x: &[f32], n: usize) -> (f64, f64) {
    let mut y = vec![0.0; n * w.rows];
    let flop = 2.0 * (w.rows * w.cols * n) as f64;
    let (mut best, mut runs, start, cpu0) = (Duration::MAX, 0u32, Instant::now(), process_cpu_time());
    while start.elapsed() < Duration::from_secs(1) || runs < 3 {
        let t = Instant::now();
        matmul(w, x, n, &mut y);
        best = best.min(t.elapsed());
        runs += 1;
    }
    let cpu = (process_cpu_time() - cpu0).as_secs_f64();
    std::hint::black_box(&y);
    (flop / best.as_secs_f64() / 1e9, flop * runs as f64 / cpu / 1e9)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(768);
    let cols: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2048);
    println!("matmul {rows} x {cols}: GFLOP/s of the best wall-clock run, and GFLOP per CPU-second");
    println!("{:<6} {:>7} {:>10} {:>10} {:>12} {:>12}", "type", "tokens", "1 thread", "2 threads", "1 t / CPU-s", "2 t / CPU-s");
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K] {
        let data = weights(ty, rows, cols);
        let w = WeightMatrix::new(ty, rows, cols, &data)?;
        for n in [1, 64] {
            let x: Vec<f32> = (0..(n * cols) as u64).map(|i| uniform_pm1(2, i)).collect();
            let mut rates = Vec::new();
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
                rates.push(pool.install(|| gflops(&w, &x, n)));
            }
            println!("{:<6} {:>7} {:>10.2} {:>10.2} {:>12.2} {:>12.2}", ty.name(), n, rates[0].0, rates[1].0, rates[0].1, rates[1].1);
        }
    }
    Ok(())
}
