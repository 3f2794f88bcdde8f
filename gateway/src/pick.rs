//! Which replicas a request goes to, in the order to try them: pure (no clock, no I/O), so the
//! whole policy is one table test.
//!
//! Candidates are the healthy replicas that serve the request's model. A request with a prompt
//! key goes first to the replica rendezvous hashing gives for that key (the replica that served
//! the same prompt prefix before holds its KV blocks, and agent clients resend the same long
//! system prompt), unless that replica carries more than `load_bound` requests over the least
//! loaded candidate: then least load wins. The rest follow by load, so a retry goes to the next
//! least loaded replica; ties keep the order of `--upstream`.

/// One replica as the decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// Stable name of the replica (its URL): the rendezvous hash is over it, so the choice for a
    /// key does not move when another replica comes or goes.
    pub name: &'a str,
    pub healthy: bool,
    pub models: &'a [String],
    /// Requests the replica reported (running + waiting), 0 when it reports none.
    pub reported_load: f64,
    /// Requests the gateway has in flight to it now.
    pub in_flight: u64,
}

impl Candidate<'_> {
    pub fn load(&self) -> f64 {
        self.reported_load + self.in_flight as f64
    }
}

/// The decision: indexes into the candidate slice, first to try first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub order: Vec<usize>,
    /// The first replica is the prompt key's rendezvous choice (counted as an affinity hit).
    pub affinity_hit: bool,
}

/// By how many requests the affinity choice may exceed the least loaded candidate's load.
pub const DEFAULT_LOAD_BOUND: f64 = 4.0;

pub fn pick(candidates: &[Candidate], model: &str, prompt_key: Option<u64>, load_bound: f64) -> Pick {
    let mut order: Vec<usize> =
        (0..candidates.len()).filter(|&i| candidates[i].healthy && candidates[i].models.iter().any(|m| m == model)).collect();
    // Stable sort: equal loads keep the --upstream order.
    order.sort_by(|&a, &b| candidates[a].load().total_cmp(&candidates[b].load()));
    let Some(key) = prompt_key else {
        return Pick { order, affinity_hit: false };
    };
    let Some(&least) = order.first() else {
        return Pick { order, affinity_hit: false };
    };
    let names: Vec<&str> = order.iter().map(|&i| candidates[i].name).collect();
    let Some(pos) = rendezvous_choice(key, &names) else {
        return Pick { order, affinity_hit: false };
    };
    let chosen = order[pos];
    if candidates[chosen].load() > candidates[least].load() + load_bound {
        return Pick { order, affinity_hit: false };
    }
    order.remove(pos);
    order.insert(0, chosen);
    Pick { order, affinity_hit: true }
}

/// The affinity key of a prompt: a hash of its first `chars` characters; none for an empty
/// prompt or with affinity off (`chars == 0`).
pub fn prompt_key(prompt: &str, chars: usize) -> Option<u64> {
    if chars == 0 || prompt.is_empty() {
        return None;
    }
    let end = prompt.char_indices().nth(chars).map_or(prompt.len(), |(i, _)| i);
    Some(fnv1a(&prompt.as_bytes()[..end]))
}

/// The replica (an index into `names`) that rendezvous hashing gives `key` among `names`, as
/// [`pick`] takes it: the same whatever the order of `names`.
pub fn rendezvous_choice(key: u64, names: &[&str]) -> Option<usize> {
    (0..names.len()).max_by_key(|&i| rendezvous_weight(key, names[i]))
}

/// Highest-random-weight hashing: each (key, replica) pair gets a weight; the key goes to the
/// replica of highest weight. Hand-written hashes, so the choice is the same in every build.
fn rendezvous_weight(key: u64, replica: &str) -> u64 {
    splitmix64(key ^ splitmix64(fnv1a(replica.as_bytes())))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// (healthy, models, reported load, in flight) per replica, named r0, r1, ...
    type Row = (bool, &'static [&'static str], f64, u64);

    /// (what, replicas, model, prompt key, expected order, affinity hit)
    type Case = (&'static str, Vec<Row>, &'static str, Option<u64>, Vec<usize>, bool);

    fn run(rows: &[Row], model: &str, key: Option<u64>) -> Pick {
        let names: Vec<String> = (0..rows.len()).map(|i| format!("http://r{i}")).collect();
        let served: Vec<Vec<String>> = rows.iter().map(|r| models(r.1)).collect();
        let cands: Vec<Candidate> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| Candidate { name: &names[i], healthy: r.0, models: &served[i], reported_load: r.2, in_flight: r.3 })
            .collect();
        pick(&cands, model, key, DEFAULT_LOAD_BOUND)
    }

    /// The rendezvous choice of `key` among the replicas `among` (r0, r1, ... by index).
    fn choice(key: u64, among: &[usize]) -> usize {
        *among.iter().max_by_key(|&&i| rendezvous_weight(key, &format!("http://r{i}"))).unwrap()
    }

    /// The first key that satisfies `want`, found by search (the hash is fixed, so this is
    /// deterministic).
    fn key_where(want: impl Fn(u64) -> bool) -> u64 {
        (0u64..100_000).find(|&k| want(k)).expect("some key satisfies it")
    }

    #[test]
    fn the_table() {
        const AB: &[&str] = &["a", "b"];
        const A: &[&str] = &["a"];
        const B: &[&str] = &["b"];
        let k1_of_3 = key_where(|k| choice(k, &[0, 1, 2]) == 1);
        let k2_of_3 = key_where(|k| choice(k, &[0, 1, 2]) == 2);
        // Picks r1 among all three and r2 once r1 is out.
        let k1_then_2 = key_where(|k| choice(k, &[0, 1, 2]) == 1 && choice(k, &[0, 2]) == 2);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("no key: least load first, the rest by load",
             vec![(true, AB, 3.0, 0), (true, AB, 1.0, 0), (true, AB, 2.0, 0)], "a", None, vec![1, 2, 0], false),
            ("no key: in-flight counts as load",
             vec![(true, AB, 0.0, 2), (true, AB, 1.0, 0)], "a", None, vec![1, 0], false),
            ("ties keep the --upstream order",
             vec![(true, AB, 0.0, 0), (true, AB, 0.0, 0), (true, AB, 0.0, 0)], "a", None, vec![0, 1, 2], false),
            ("unhealthy replicas are never tried",
             vec![(false, AB, 0.0, 0), (true, AB, 5.0, 0), (true, AB, 9.0, 0)], "a", None, vec![1, 2], false),
            ("only replicas serving the model",
             vec![(true, A, 0.0, 0), (true, B, 0.0, 0), (true, AB, 3.0, 0)], "b", None, vec![1, 2], false),
            ("unknown model: nothing to try",
             vec![(true, A, 0.0, 0), (true, B, 0.0, 0)], "c", None, vec![], false),
            ("everything unhealthy: nothing to try",
             vec![(false, A, 0.0, 0), (false, A, 0.0, 0)], "a", Some(k1_of_3), vec![], false),
            ("the key's replica first, though busier (within the bound), then by load",
             vec![(true, AB, 2.0, 0), (true, AB, 3.0, 1), (true, AB, 0.0, 0)], "a", Some(k1_of_3), vec![1, 2, 0], true),
            ("exactly at the bound still goes to the key's replica",
             vec![(true, AB, 0.0, 0), (true, AB, 4.0, 0), (true, AB, 1.0, 0)], "a", Some(k1_of_3), vec![1, 0, 2], true),
            ("over the bound: least load instead, no hit",
             vec![(true, AB, 0.0, 0), (true, AB, 4.0, 1), (true, AB, 1.0, 0)], "a", Some(k1_of_3), vec![0, 2, 1], false),
            ("the key's replica unhealthy: the key picks among the rest",
             vec![(true, AB, 0.0, 0), (false, AB, 0.0, 0), (true, AB, 0.0, 0)], "a", Some(k1_then_2), vec![2, 0], true),
            ("another key, another replica",
             vec![(true, AB, 0.0, 0), (true, AB, 0.0, 0), (true, AB, 0.0, 0)], "a", Some(k2_of_3), vec![2, 0, 1], true),
        ];
        for (what, rows, model, key, order, hit) in cases {
            let got = run(&rows, model, key);
            assert_eq!(got, Pick { order, affinity_hit: hit }, "{what}");
        }
    }

    #[test]
    fn rendezvous_is_stable_when_another_replica_goes() {
        // Every key whose choice among 4 is not r3 keeps its choice when r3 goes.
        for k in 0..200u64 {
            let of4 = choice(k, &[0, 1, 2, 3]);
            if of4 != 3 {
                assert_eq!(of4, choice(k, &[0, 1, 2]), "key {k}");
            }
        }
    }

    #[test]
    fn keys_spread_over_replicas() {
        let to_r0 = (0..1000u64).filter(|&k| choice(k, &[0, 1]) == 0).count();
        assert!((350..=650).contains(&to_r0), "{to_r0} of 1000 keys went to r0");
    }

    #[test]
    fn prompt_key_uses_the_prefix_only() {
        let long_a = format!("{}{}", "x".repeat(100), "tail one");
        let long_b = format!("{}{}", "x".repeat(100), "another tail");
        assert_eq!(prompt_key(&long_a, 100), prompt_key(&long_b, 100));
        assert_ne!(prompt_key(&long_a, 101), prompt_key(&long_b, 101));
        // Characters, not bytes: a multi-byte character is never split.
        assert_eq!(prompt_key("ééé", 2), prompt_key("ééx", 2));
        assert_eq!(prompt_key("", 10), None);
        assert_eq!(prompt_key("abc", 0), None);
    }
}
