//! ggml's CPU argsort (`ggml_compute_forward_argsort_f32`) is `std::sort` of the indices with
//! `data[a] > data[b]` (descending). `std::sort` is not stable, so which of two equal values
//! comes first depends on the algorithm: libstdc++'s introsort (llama.cpp on Linux is built with
//! GCC and libstdc++). To pick the same experts as llama.cpp when router probabilities tie, this
//! is that algorithm, step for step: median-of-three quicksort with an unguarded partition down
//! to runs of 16, heapsort past 2·⌊log2 n⌋ levels, then one insertion sort.
//!
//! The loops that libstdc++ leaves unguarded (it relies on the comparison being a strict weak
//! order) carry bound checks here, which change nothing for ordered input and keep NaNs from
//! running off the slice.

const THRESHOLD: usize = 16;

/// Indices of `data` in descending order of value, ties ordered as libstdc++'s `std::sort`.
pub fn argsort_desc(data: &[f32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..data.len() as u32).collect();
    let less = |a: u32, b: u32| data[a as usize] > data[b as usize];
    stl_sort(&mut idx, &less);
    idx
}

fn stl_sort(v: &mut [u32], less: &impl Fn(u32, u32) -> bool) {
    if v.len() > 1 {
        introsort_loop(v, 0, v.len(), 2 * v.len().ilog2() as usize, less);
        final_insertion_sort(v, less);
    }
}

fn introsort_loop(v: &mut [u32], first: usize, mut last: usize, mut depth: usize, less: &impl Fn(u32, u32) -> bool) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

fn partition_pivot(v: &mut [u32], first: usize, last: usize, less: &impl Fn(u32, u32) -> bool) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    unguarded_partition(v, first + 1, last, first, less)
}

fn move_median_to_first(v: &mut [u32], result: usize, a: usize, b: usize, c: usize, less: &impl Fn(u32, u32) -> bool) {
    let pick = if less(v[a], v[b]) {
        if less(v[b], v[c]) {
            b
        } else if less(v[a], v[c]) {
            c
        } else {
            a
        }
    } else if less(v[a], v[c]) {
        a
    } else if less(v[b], v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn unguarded_partition(v: &mut [u32], mut first: usize, mut last: usize, pivot: usize, less: &impl Fn(u32, u32) -> bool) -> usize {
    loop {
        while first < v.len() - 1 && less(v[first], v[pivot]) {
            first += 1;
        }
        last -= 1;
        while last > 0 && less(v[pivot], v[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        v.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(v: &mut [u32], less: &impl Fn(u32, u32) -> bool) {
    if v.len() > THRESHOLD {
        insertion_sort(&mut v[..THRESHOLD], less);
        for i in THRESHOLD..v.len() {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, less);
    }
}

fn insertion_sort(v: &mut [u32], less: &impl Fn(u32, u32) -> bool) {
    for i in 1..v.len() {
        if less(v[i], v[0]) {
            v[..=i].rotate_right(1);
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

fn unguarded_linear_insert(v: &mut [u32], mut last: usize, less: &impl Fn(u32, u32) -> bool) {
    let val = v[last];
    while last > 0 && less(val, v[last - 1]) {
        v[last] = v[last - 1];
        last -= 1;
    }
    v[last] = val;
}

/// libstdc++'s `__partial_sort(first, last, last)`: make_heap, then sort_heap.
fn heap_sort(v: &mut [u32], less: &impl Fn(u32, u32) -> bool) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        // __pop_heap(first, last, last): the top goes to `last`, the old `last` sifts in.
        let value = v[last];
        v[last] = v[0];
        adjust_heap(&mut v[..last], 0, last, value, less);
    }
}

fn adjust_heap(v: &mut [u32], mut hole: usize, len: usize, value: u32, less: &impl Fn(u32, u32) -> bool) {
    let top = hole;
    let mut child = hole;
    while len >= 1 && child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(v[child], v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && len >= 2 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // __push_heap(first, hole, top, value)
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(v[parent], value) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_kernels::testdata::hash2;

    /// Values drawn from a few levels, so that ties are everywhere.
    fn tied(seed: u64, n: usize, levels: u64) -> Vec<f32> {
        (0..n as u64).map(|i| (hash2(seed, i) % levels) as f32 * 0.125).collect()
    }

    #[test]
    fn sorts_descending() {
        for n in [0, 1, 2, 3, 16, 17, 100, 128, 1000] {
            for seed in 0..5 {
                let data = tied(seed, n, if seed % 2 == 0 { 4 } else { 1 << 30 });
                let idx = argsort_desc(&data);
                let mut seen = idx.clone();
                seen.sort();
                assert_eq!(seen, (0..n as u32).collect::<Vec<_>>(), "a permutation");
                assert!(idx.windows(2).all(|w| data[w[0] as usize] >= data[w[1] as usize]), "n {n} seed {seed}");
            }
        }
    }

    #[test]
    fn short_rows_keep_ties_in_index_order() {
        // Up to 16 values libstdc++ only runs the insertion sort, which is stable.
        let data = [1.0, 3.0, 1.0, 3.0, 2.0, 1.0, 3.0, 2.0];
        assert_eq!(argsort_desc(&data), vec![1, 3, 6, 4, 7, 0, 2, 5]);
    }

    #[test]
    fn heapsort_fallback_sorts() {
        // Depth limit 0 from the start: the heap sort does all the work.
        for seed in 0..20 {
            let data = tied(seed, 300, 7);
            let mut idx: Vec<u32> = (0..300).collect();
            let less = |a: u32, b: u32| data[a as usize] > data[b as usize];
            introsort_loop(&mut idx, 0, 300, 0, &less);
            final_insertion_sort(&mut idx, &less);
            assert!(idx.windows(2).all(|w| data[w[0] as usize] >= data[w[1] as usize]));
        }
    }

    #[test]
    fn nan_does_not_run_off_the_slice() {
        let mut data = tied(3, 200, 5);
        data[7] = f32::NAN;
        data[150] = f32::NAN;
        let idx = argsort_desc(&data);
        assert_eq!(idx.len(), 200);
    }

    /// The same order as libstdc++'s std::sort on tie-heavy rows, where a C++ compiler is at
    /// hand; skipped with a message otherwise, and a failure when BRINK_REQUIRE_CXX=1 (as
    /// scripts/test sets: CI has g++, which llama.cpp's build needs too).
    #[test]
    fn ties_match_libstdcxx() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("argsort.cpp");
        let bin = dir.path().join("argsort");
        std::fs::write(
            &src,
            r#"#include <algorithm>
#include <cstdio>
#include <vector>
int main() {
    int n;
    while (std::scanf("%d", &n) == 1) {
        std::vector<float> d(n);
        for (auto & v : d) std::scanf("%f", &v);
        std::vector<int> idx(n);
        for (int i = 0; i < n; i++) idx[i] = i;
        std::sort(idx.begin(), idx.end(), [&](int a, int b) { return d[a] > d[b]; });
        for (int i = 0; i < n; i++) std::printf("%d ", idx[i]);
        std::printf("\n");
    }
}
"#,
        )
        .unwrap();
        let built = std::process::Command::new("g++").args(["-O2", "-o"]).arg(&bin).arg(&src).status();
        if !matches!(built, Ok(s) if s.success()) {
            let why = match built {
                Ok(s) => format!("g++ failed ({s}) to build the libstdc++ reference"),
                Err(e) => format!("no g++ to build the libstdc++ reference ({e})"),
            };
            assert!(std::env::var("BRINK_REQUIRE_CXX").as_deref() != Ok("1"), "BRINK_REQUIRE_CXX=1 but {why}");
            eprintln!("SKIP ties_match_libstdcxx: {why}");
            return;
        }
        let cases: Vec<Vec<f32>> = (0..60u64).map(|s| tied(s, [8, 16, 17, 33, 64, 128, 256, 1000][s as usize % 8], 2 + s % 6)).collect();
        let input: String =
            cases.iter().map(|c| format!("{} {}\n", c.len(), c.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "))).collect();
        let mut child =
            std::process::Command::new(&bin).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
        assert_eq!(lines.len(), cases.len());
        for (c, line) in cases.iter().zip(lines) {
            let want: Vec<u32> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
            assert_eq!(argsort_desc(c), want, "row of {}", c.len());
        }
    }
}
