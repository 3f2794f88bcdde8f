//! Which replicas a request goes to, in the order to try them: pure (no clock, no I/O), so the
//! whole policy is one table test.
//!
//! Candidates are the healthy replicas that serve the request's model and whose context (where
//! known) holds the tokens the request asks for. A replica's **load** is what it is busy with now:
//! the requests it reported at its last poll that are not the gateway's own (those are counted
//! fresh, by the gateway's in-flight count), plus the gateway's requests in flight to it now, plus
//! its KV cache use (a fraction in 0..1: it orders replicas of equal request counts by the memory
//! they have left, and never outweighs a whole request).
//!
//! A request with a prompt key has a **home**: the replica it went to last time (kept by the
//! gateway when it moved), else the replica rendezvous hashing gives the key. The home holds the
//! prompt's prefix in its cache, so the request goes there first — but only while the home has
//! **room**: a free slot where its slots are known (the gateway's `--upstream-slots`, or the
//! deployment's `serving.concurrency`), else no queue and a load within `load_bound` of the least
//! loaded candidate; and a KV cache that is not full. Without room, the request goes to the least
//! loaded candidate that has room, which becomes the key's home: two agents whose keys hash to
//! one small replica then live on two replicas instead of evicting each other's prefix there turn
//! after turn. When no candidate has room, the home keeps it unless its load exceeds the least
//! loaded candidate's by more than `load_bound` (every replica would queue it; the home at least
//! has the prefix). The rest follow by load, so a retry goes to the next least loaded replica;
//! ties keep the order of the replicas.

/// One replica as the decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// Stable name of the replica (its URL): the rendezvous hash is over it, so the choice for a
    /// key does not move when another replica comes or goes.
    pub name: &'a str,
    pub healthy: bool,
    pub models: &'a [String],
    /// Requests running and waiting in the replica at its last poll (0 when it reports none).
    pub running: f64,
    pub waiting: f64,
    /// The gateway's own requests in flight to it when that poll's `/metrics` answered.
    pub ours_at_poll: u64,
    /// The gateway's requests in flight to it now.
    pub in_flight: u64,
    /// Sequences it runs at once, when known.
    pub slots: Option<u64>,
    /// KV cache in use by sequences, 0..=1, when it reports it.
    pub kv_use: Option<f64>,
    /// Tokens per sequence, when known.
    pub context: Option<u64>,
}

impl Candidate<'_> {
    /// Requests at the replica that are not the gateway's (as of the last poll): its reported
    /// running + waiting less the gateway's own then.
    pub fn others(&self) -> f64 {
        (self.running + self.waiting - self.ours_at_poll as f64).max(0.0)
    }

    /// Requests the replica holds now, as far as the gateway can tell.
    pub fn occupied(&self) -> f64 {
        self.others() + self.in_flight as f64
    }

    /// What candidates are ordered by.
    pub fn load(&self) -> f64 {
        self.occupied() + self.kv_use.unwrap_or(0.0)
    }

    /// None of the gateway's requests to it finished since its last poll, so what that poll said
    /// of a queue or a full cache still holds (a finished request freed its slot and blocks).
    fn poll_still_current(&self) -> bool {
        self.in_flight >= self.ours_at_poll
    }

    /// Why the replica cannot take one more request without making it wait, if so.
    fn busy(&self, least_load: f64, load_bound: f64) -> Option<Busy> {
        if self.kv_use.is_some_and(|k| k >= KV_FULL) && self.poll_still_current() {
            return Some(Busy::KvFull);
        }
        match self.slots {
            Some(slots) if self.occupied() >= slots as f64 => Some(Busy::NoFreeSlot),
            Some(_) => None,
            None if self.waiting > 0.0 && self.poll_still_current() => Some(Busy::Queue),
            None if self.load() > least_load + load_bound => Some(Busy::LoadBound),
            None => None,
        }
    }

    fn admits(&self, need_tokens: Option<u64>) -> bool {
        match (self.context, need_tokens) {
            (Some(context), Some(need)) => need <= context,
            _ => true,
        }
    }
}

/// KV cache use at which a replica has no room: a new sequence would wait for blocks.
pub const KV_FULL: f64 = 0.95;

/// Why a prompt's home did not take its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Its slots are all taken.
    NoFreeSlot,
    /// Its slots are not known and it reported requests waiting.
    Queue,
    /// Its slots are not known and its load exceeds the least loaded candidate's by more than
    /// the bound.
    LoadBound,
    /// Its KV cache is (nearly) full.
    KvFull,
}

impl Busy {
    /// The `reason` label of `brink_gateway_affinity_moves_total`.
    pub fn label(self) -> &'static str {
        match self {
            Busy::NoFreeSlot => "no_free_slot",
            Busy::Queue => "queue",
            Busy::LoadBound => "load_bound",
            Busy::KvFull => "kv_full",
        }
    }
}

/// What happened to the prompt key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// No key, or nothing to try.
    None,
    /// The first replica is the key's home.
    Hit,
    /// The home (an index into the candidates) had no room; the first replica is the key's new
    /// home.
    Moved { from: usize, why: Busy },
}

/// The decision: indexes into the candidate slice, first to try first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub order: Vec<usize>,
    pub affinity: Affinity,
}

impl Pick {
    /// The first replica is the prompt key's home (counted as an affinity hit).
    pub fn affinity_hit(&self) -> bool {
        self.affinity == Affinity::Hit
    }
}

/// What a request brings to the decision besides the candidates.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ask<'a> {
    pub model: &'a str,
    /// Its prompt's affinity key.
    pub key: Option<u64>,
    /// The replica (by name) the key went to last, when it moved off its rendezvous choice.
    pub home: Option<&'a str>,
    /// Tokens the request needs in one sequence, when the gateway can tell (its `max_tokens`):
    /// replicas of a smaller context are no candidates.
    pub need_tokens: Option<u64>,
}

/// With slots unknown, by how many requests a prompt's home may exceed the least loaded
/// candidate's load.
pub const DEFAULT_LOAD_BOUND: f64 = 4.0;

pub fn pick(candidates: &[Candidate], ask: &Ask, load_bound: f64) -> Pick {
    let mut order: Vec<usize> = (0..candidates.len())
        .filter(|&i| {
            let c = &candidates[i];
            c.healthy && c.models.iter().any(|m| m == ask.model) && c.admits(ask.need_tokens)
        })
        .collect();
    // Stable sort: equal loads keep the replicas' order.
    order.sort_by(|&a, &b| candidates[a].load().total_cmp(&candidates[b].load()));
    let none = |order| Pick { order, affinity: Affinity::None };
    let (Some(key), Some(&least)) = (ask.key, order.first()) else {
        return none(order);
    };
    let least_load = candidates[least].load();
    let pos = match ask.home.and_then(|h| order.iter().position(|&i| candidates[i].name == h)) {
        Some(pos) => pos,
        None => {
            let names: Vec<&str> = order.iter().map(|&i| candidates[i].name).collect();
            let Some(pos) = rendezvous_choice(key, &names) else { return none(order) };
            pos
        }
    };
    let home = order[pos];
    let first = |mut order: Vec<usize>, pos: usize| {
        let i = order.remove(pos);
        order.insert(0, i);
        order
    };
    let Some(why) = candidates[home].busy(least_load, load_bound) else {
        return Pick { order: first(order, pos), affinity: Affinity::Hit };
    };
    if let Some(to) = order.iter().position(|&i| i != home && candidates[i].busy(least_load, load_bound).is_none()) {
        return Pick { order: first(order, to), affinity: Affinity::Moved { from: home, why } };
    }
    // Nowhere has room: the home (which holds the prefix) queues it, within the bound.
    if candidates[home].load() <= least_load + load_bound {
        return Pick { order: first(order, pos), affinity: Affinity::Hit };
    }
    Pick { order, affinity: Affinity::Moved { from: home, why: Busy::LoadBound } }
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

    /// One replica's state in a table row (named r0, r1, ... by position).
    #[derive(Clone)]
    struct R {
        healthy: bool,
        models: &'static [&'static str],
        running: f64,
        waiting: f64,
        ours_at_poll: u64,
        in_flight: u64,
        slots: Option<u64>,
        kv_use: Option<f64>,
        context: Option<u64>,
    }

    /// A healthy replica of models a and b, idle, telling nothing of its slots, cache or context.
    fn r() -> R {
        R {
            healthy: true,
            models: &["a", "b"],
            running: 0.0,
            waiting: 0.0,
            ours_at_poll: 0,
            in_flight: 0,
            slots: None,
            kv_use: None,
            context: None,
        }
    }

    impl R {
        fn down(self) -> R {
            R { healthy: false, ..self }
        }
        fn serves(self, models: &'static [&'static str]) -> R {
            R { models, ..self }
        }
        /// Reported running and waiting at the last poll.
        fn reported(self, running: f64, waiting: f64) -> R {
            R { running, waiting, ..self }
        }
        /// The gateway's requests in flight at the last poll and now.
        fn ours(self, at_poll: u64, now: u64) -> R {
            R { ours_at_poll: at_poll, in_flight: now, ..self }
        }
        fn slots(self, n: u64) -> R {
            R { slots: Some(n), ..self }
        }
        fn kv(self, k: f64) -> R {
            R { kv_use: Some(k), ..self }
        }
        fn context(self, n: u64) -> R {
            R { context: Some(n), ..self }
        }
    }

    fn name(i: usize) -> String {
        format!("http://r{i}")
    }

    fn run(rows: &[R], ask: &Ask) -> Pick {
        let names: Vec<String> = (0..rows.len()).map(name).collect();
        let served: Vec<Vec<String>> = rows.iter().map(|r| r.models.iter().map(|s| s.to_string()).collect()).collect();
        let cands: Vec<Candidate> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| Candidate {
                name: &names[i],
                healthy: r.healthy,
                models: &served[i],
                running: r.running,
                waiting: r.waiting,
                ours_at_poll: r.ours_at_poll,
                in_flight: r.in_flight,
                slots: r.slots,
                kv_use: r.kv_use,
                context: r.context,
            })
            .collect();
        pick(&cands, ask, DEFAULT_LOAD_BOUND)
    }

    /// The rendezvous choice of `key` among the replicas `among` (r0, r1, ... by index).
    fn choice(key: u64, among: &[usize]) -> usize {
        *among.iter().max_by_key(|&&i| rendezvous_weight(key, &name(i))).unwrap()
    }

    /// The first key that satisfies `want`, found by search (the hash is fixed, so this is
    /// deterministic).
    fn key_where(want: impl Fn(u64) -> bool) -> u64 {
        (0u64..100_000).find(|&k| want(k)).expect("some key satisfies it")
    }

    fn ask(model: &'static str, key: Option<u64>) -> Ask<'static> {
        Ask { model, key, home: None, need_tokens: None }
    }

    #[test]
    fn the_table() {
        use Affinity::{Hit, Moved};
        const NO_KEY: Affinity = Affinity::None;
        let k1 = key_where(|k| choice(k, &[0, 1, 2]) == 1);
        let k2 = key_where(|k| choice(k, &[0, 1, 2]) == 2);
        // Picks r1 among all three and r2 once r1 is out.
        let k1_then_2 = key_where(|k| choice(k, &[0, 1, 2]) == 1 && choice(k, &[0, 2]) == 2);
        let home = |key, home: &'static str| Ask { home: Some(home), ..ask("a", Some(key)) };
        let need = |tokens| Ask { need_tokens: Some(tokens), ..ask("a", None) };
        /// Name, replicas, the ask, the order wanted, the affinity wanted.
        type Case<'a> = (&'a str, Vec<R>, Ask<'a>, Vec<usize>, Affinity);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            // Load, without a key.
            ("no key: least load first, the rest by load",
             vec![r().reported(3.0, 0.0), r().reported(1.0, 0.0), r().reported(1.0, 1.0)], ask("a", None), vec![1, 2, 0], NO_KEY),
            ("no key: the gateway's in-flight requests count as load",
             vec![r().ours(0, 2), r().reported(1.0, 0.0)], ask("a", None), vec![1, 0], NO_KEY),
            ("the gateway's own requests in a poll are not counted twice",
             vec![r().reported(2.0, 0.0).ours(2, 2), r().reported(1.0, 0.0).ours(0, 1)], ask("a", None), vec![0, 1], NO_KEY),
            ("a poll older than the gateway's own finished requests: they are gone",
             vec![r().reported(3.0, 0.0).ours(3, 0), r().reported(1.0, 0.0)], ask("a", None), vec![0, 1], NO_KEY),
            ("KV use separates equal request counts",
             vec![r().reported(1.0, 0.0).kv(0.8), r().reported(1.0, 0.0).kv(0.2), r().reported(1.0, 0.0)], ask("a", None), vec![2, 1, 0], NO_KEY),
            ("KV use never outweighs a whole request",
             vec![r().reported(1.0, 0.0).kv(0.0), r().kv(0.99)], ask("a", None), vec![1, 0], NO_KEY),
            ("ties keep the replicas' order",
             vec![r(), r(), r()], ask("a", None), vec![0, 1, 2], NO_KEY),
            ("unhealthy replicas are never tried",
             vec![r().down(), r().reported(5.0, 0.0), r().reported(9.0, 0.0)], ask("a", None), vec![1, 2], NO_KEY),
            ("only replicas serving the model",
             vec![r().serves(&["a"]), r().serves(&["b"]), r().reported(3.0, 0.0)], ask("b", None), vec![1, 2], NO_KEY),
            ("unknown model: nothing to try",
             vec![r().serves(&["a"]), r().serves(&["b"])], ask("c", None), vec![], NO_KEY),
            ("everything unhealthy: nothing to try",
             vec![r().down(), r().down()], ask("a", Some(k1)), vec![], NO_KEY),
            // Context.
            ("a context smaller than the request needs: not a candidate",
             vec![r().context(4096), r().context(32768).reported(3.0, 0.0), r()], need(8192), vec![2, 1], NO_KEY),
            ("exactly the context is admitted",
             vec![r().context(8192)], need(8192), vec![0], NO_KEY),
            ("no context holds it: nothing to try",
             vec![r().context(4096), r().context(2048)], need(8192), vec![], NO_KEY),
            // Affinity, slots unknown: the load bound and the queue.
            ("the key's replica first, though busier (within the bound), then by load",
             vec![r().reported(2.0, 0.0), r().reported(3.0, 0.0).ours(0, 1), r()], ask("a", Some(k1)), vec![1, 2, 0], Hit),
            ("exactly at the bound still goes to the key's replica",
             vec![r(), r().reported(4.0, 0.0), r().reported(1.0, 0.0)], ask("a", Some(k1)), vec![1, 0, 2], Hit),
            ("over the bound: moved to the least loaded",
             vec![r(), r().reported(4.0, 0.0).ours(0, 1), r().reported(1.0, 0.0)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::LoadBound }),
            ("a reported queue: moved",
             vec![r().reported(1.0, 0.0), r().reported(1.0, 1.0), r().reported(1.0, 0.0)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::Queue }),
            ("a reported queue, but one of the gateway's requests finished since: room again",
             vec![r().reported(1.0, 0.0), r().reported(1.0, 1.0).ours(2, 1), r().reported(1.0, 0.0)], ask("a", Some(k1)),
             vec![1, 0, 2], Hit),
            ("the key's replica unhealthy: the key picks among the rest",
             vec![r(), r().down(), r()], ask("a", Some(k1_then_2)), vec![2, 0], Hit),
            ("another key, another replica",
             vec![r(), r(), r()], ask("a", Some(k2)), vec![2, 0, 1], Hit),
            // Affinity with slots known: a free slot or not, whatever the bound says.
            ("one slot, taken by another agent's request: moved to a free one (the measured case)",
             vec![r().slots(1), r().slots(1).reported(1.0, 0.0).ours(1, 1), r().slots(1)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::NoFreeSlot }),
            ("one slot, taken by a request that is not the gateway's",
             vec![r().slots(1), r().slots(1).reported(1.0, 0.0), r().slots(1)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::NoFreeSlot }),
            ("one slot, the agent's own last turn still in the poll but finished: the slot is free",
             vec![r().slots(1), r().slots(1).reported(1.0, 0.0).ours(1, 0), r().slots(1)], ask("a", Some(k1)),
             vec![1, 0, 2], Hit),
            ("a free slot of four: the home, though the others are idle",
             vec![r().slots(4), r().slots(4).reported(3.0, 0.0), r().slots(4)], ask("a", Some(k1)), vec![1, 0, 2], Hit),
            ("the move goes to the least loaded replica that has room",
             vec![r().slots(1).reported(0.0, 0.0).ours(0, 1), r().slots(2).reported(2.0, 0.0), r().slots(4).reported(2.0, 0.0)],
             ask("a", Some(k1)), vec![2, 0, 1], Moved { from: 1, why: Busy::NoFreeSlot }),
            ("no room anywhere: the home keeps it within the bound",
             vec![r().slots(1).ours(0, 1), r().slots(1).ours(0, 2), r().slots(1).ours(0, 1)], ask("a", Some(k1)), vec![1, 0, 2], Hit),
            ("no room anywhere and the home far busier: the least loaded",
             vec![r().slots(1).ours(0, 1), r().slots(1).ours(0, 6), r().slots(1).ours(0, 2)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::LoadBound }),
            // KV.
            ("the home's KV cache full: moved",
             vec![r().slots(4), r().slots(4).reported(1.0, 0.0).kv(0.97).ours(1, 1), r().slots(4)], ask("a", Some(k1)),
             vec![0, 2, 1], Moved { from: 1, why: Busy::KvFull }),
            ("a full cache in a poll older than a finished request of the gateway's: room",
             vec![r().slots(4), r().slots(4).reported(1.0, 0.0).kv(0.97).ours(1, 0), r().slots(4)], ask("a", Some(k1)),
             vec![1, 0, 2], Hit),
            // The key's home, once moved.
            ("a moved key goes to its new home",
             vec![r().slots(1), r().slots(1).ours(0, 1), r().slots(1)], home(k1, "http://r0"), vec![0, 2, 1], Hit),
            ("and stays there when its old rendezvous replica is free again (no ping-pong)",
             vec![r().slots(1), r().slots(1), r().slots(1)], home(k1, "http://r0"), vec![0, 1, 2], Hit),
            ("a home that is not a candidate: the rendezvous choice",
             vec![r(), r(), r().down()], home(k1, "http://r2"), vec![1, 0], Hit),
        ];
        for (what, rows, ask, order, affinity) in cases {
            let got = run(&rows, &ask);
            assert_eq!(got, Pick { order, affinity }, "{what}");
        }
    }

    /// The measured case as a sequence: three one-slot replicas, two agents whose keys hash to
    /// the same replica and a third elsewhere, each resending its prompt turn after turn, the
    /// gateway keeping each key's home as the decision moves it. No agent ever lands on another's
    /// replica after the first move.
    #[test]
    fn agents_sharing_a_home_settle_on_separate_replicas() {
        let a = key_where(|k| choice(k, &[0, 1, 2]) == 1);
        let b = key_where(|k| k > a && choice(k, &[0, 1, 2]) == 1);
        let c = key_where(|k| choice(k, &[0, 1, 2]) == 2);
        let keys = [a, b, c];
        let mut homes: [Option<String>; 3] = [None, None, None];
        let mut busy = [0u64; 3];
        let mut answered_by: Vec<Vec<usize>> = vec![Vec::new(); 3];
        // Each round, the three agents send their turns one after another while the earlier
        // ones still run (so each sees the others' requests in flight), then all finish.
        for _round in 0..5 {
            for (agent, &key) in keys.iter().enumerate() {
                let rows: Vec<R> = busy.iter().map(|&n| r().slots(1).ours(0, n)).collect();
                let ask = Ask { home: homes[agent].as_deref(), ..ask("a", Some(key)) };
                let got = run(&rows, &ask);
                let to = got.order[0];
                if let Affinity::Moved { .. } = got.affinity {
                    homes[agent] = Some(name(to));
                }
                busy[to] += 1;
                answered_by[agent].push(to);
            }
            busy = [0; 3];
        }
        let mut firsts: Vec<usize> = answered_by.iter().map(|v| v[0]).collect();
        firsts.sort();
        assert_eq!(firsts, vec![0, 1, 2], "each agent on its own replica: {answered_by:?}");
        for v in &answered_by {
            assert!(v.iter().all(|&x| x == v[0]), "an agent changed replicas: {answered_by:?}");
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
