//! The disk-budget decision, kept pure: which cached models to evict so that a model of `need`
//! bytes plus the reserve fits in the budget. Never a model in use; least recently used first;
//! and nothing at all when even evicting every unused model would not make room (evicting in
//! vain would only cost the next download).

/// One cached model as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub key: String,
    pub size: u64,
    /// When it was last used (any monotonic unit); smaller is older.
    pub last_used: u64,
    pub in_use: bool,
}

/// The disk the decision works within.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes the cache may hold in all.
    pub budget: u64,
    /// Bytes always kept free inside the budget (logs, the index, a partial of another model).
    pub reserve: u64,
    /// Bytes on disk that are not cached models but count against the budget (partial downloads).
    pub other_used: u64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a model of {need} bytes does not fit the cache's budget of {budget} bytes (reserve {reserve}): \
     {in_use} bytes are held by models in use and {other_used} by partial downloads, \
     so at most {room} bytes could be freed for it; nothing was evicted"
)]
pub struct NoRoom {
    pub need: u64,
    pub budget: u64,
    pub reserve: u64,
    pub in_use: u64,
    pub other_used: u64,
    /// What the budget would have left after evicting every unused model.
    pub room: u64,
}

/// The keys to evict, oldest first, so that `need` bytes fit; empty when they already fit.
pub fn plan_eviction(entries: &[Candidate], budget: Budget, need: u64) -> Result<Vec<String>, NoRoom> {
    let used: u64 = entries.iter().map(|e| e.size).sum::<u64>() + budget.other_used;
    // Saturating: a budget smaller than what is already on disk simply has no room.
    let limit = budget.budget.saturating_sub(budget.reserve);
    let fits = |used: u64| used.checked_add(need).is_some_and(|total| total <= limit);
    if fits(used) {
        return Ok(Vec::new());
    }
    let mut unused: Vec<&Candidate> = entries.iter().filter(|e| !e.in_use).collect();
    // Ties broken by key so the decision does not depend on the index's order.
    unused.sort_by(|a, b| a.last_used.cmp(&b.last_used).then_with(|| a.key.cmp(&b.key)));
    let mut used = used;
    let mut evict = Vec::new();
    for e in unused {
        if fits(used) {
            break;
        }
        used -= e.size;
        evict.push(e.key.clone());
    }
    if fits(used) {
        return Ok(evict);
    }
    let in_use: u64 = entries.iter().filter(|e| e.in_use).map(|e| e.size).sum();
    Err(NoRoom {
        need,
        budget: budget.budget,
        reserve: budget.reserve,
        in_use,
        other_used: budget.other_used,
        room: limit.saturating_sub(in_use + budget.other_used),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(key: &str, size: u64, last_used: u64, in_use: bool) -> Candidate {
        Candidate { key: key.to_string(), size, last_used, in_use }
    }

    fn b(budget: u64, reserve: u64, other_used: u64) -> Budget {
        Budget { budget, reserve, other_used }
    }

    #[test]
    fn table() {
        type Case = (&'static str, Vec<Candidate>, Budget, u64, Result<Vec<&'static str>, u64>);
        // (name, entries, budget, need, Ok(evicted keys) or Err(room))
        let cases: Vec<Case> = vec![
            ("empty cache, fits", vec![], b(100, 10, 0), 90, Ok(vec![])),
            ("empty cache, one byte over", vec![], b(100, 10, 0), 91, Err(90)),
            ("fits beside others", vec![c("a", 30, 1, false), c("b", 20, 2, false)], b(100, 0, 0), 50, Ok(vec![])),
            (
                "evicts the oldest only",
                vec![c("a", 30, 5, false), c("b", 30, 1, false), c("c", 30, 3, false)],
                b(100, 0, 0),
                30,
                Ok(vec!["b"]),
            ),
            (
                "evicts oldest first until it fits",
                vec![c("a", 30, 5, false), c("b", 30, 1, false), c("c", 30, 3, false)],
                b(100, 0, 0),
                60,
                Ok(vec!["b", "c"]),
            ),
            (
                "skips the in-use model even when oldest",
                vec![c("old", 50, 0, true), c("new", 40, 9, false)],
                b(100, 0, 0),
                50,
                Ok(vec!["new"]),
            ),
            ("in use blocks: nothing evicted", vec![c("old", 50, 0, true), c("new", 40, 9, false)], b(100, 0, 0), 60, Err(50)),
            ("reserve counts", vec![c("a", 40, 1, false)], b(100, 20, 0), 50, Ok(vec!["a"])),
            ("reserve alone too big", vec![], b(100, 100, 0), 1, Err(0)),
            ("partials count", vec![c("a", 40, 1, false)], b(100, 0, 30), 40, Ok(vec!["a"])),
            ("partials can block", vec![c("a", 40, 1, false)], b(100, 0, 70), 40, Err(30)),
            ("tie on last use broken by key", vec![c("z", 50, 1, false), c("y", 50, 1, false)], b(100, 0, 0), 50, Ok(vec!["y"])),
            ("zero need always fits", vec![c("a", 100, 1, true)], b(100, 0, 0), 0, Ok(vec![])),
            ("budget below usage, no unused", vec![c("a", 150, 1, true)], b(100, 0, 0), 1, Err(0)),
            ("huge sizes do not overflow", vec![c("a", u64::MAX / 2, 1, false)], b(u64::MAX, 0, 0), u64::MAX, Ok(vec!["a"])),
        ];
        for (name, entries, budget, need, want) in cases {
            let got = plan_eviction(&entries, budget, need);
            match (&got, &want) {
                (Ok(keys), Ok(want)) => assert_eq!(keys, want, "{name}"),
                (Err(e), Err(room)) => {
                    assert_eq!(e.room, *room, "{name}: {e}");
                    assert_eq!(e.need, need, "{name}");
                }
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn no_room_message_names_the_numbers() {
        let e = plan_eviction(&[c("a", 60, 1, true)], b(100, 10, 5), 50).unwrap_err();
        let msg = e.to_string();
        for part in ["50 bytes", "budget of 100", "reserve 10", "60 bytes are held by models in use", "5 by partial", "at most 25 bytes"] {
            assert!(msg.contains(part), "{msg} lacks {part}");
        }
    }
}
