//! A node's heartbeat Lease over time, and the hysteresis that keeps a flapping heartbeat from
//! bouncing replicas. Time is an input (seconds, any fixed origin such as the Unix epoch).
//!
//! The rule:
//! - A heartbeat is **expired** while `now - renewTime > leaseDuration`.
//! - **Blips are tolerated**: an expired heartbeat keeps the node's replicas for `grace_s`; only
//!   an outage that lasts longer is **lost** and gets its replicas replaced.
//! - **Settling**: after any outage the node gets no *new* replicas until its heartbeat has been
//!   fresh for `settle_s`, so a replica is not moved back onto a node that just came back.
//! - **Flapping**: `flap_count` outages (the ongoing one included) within `flap_window_s` make
//!   the node flapping, however short each was: its replicas are replaced (once: they leave the
//!   node) and it gets none until `flap_window_s` passes with too few outages in it.
//!
//! An outage is an expiry that a read saw (`now` past `renewTime + leaseDuration`), ending at the
//! next renewal. Reads come from Lease watch events and from the controller's periodic requeue
//! of each node (at least twice per lease duration), so an outage longer than the requeue is
//! always seen; a shorter blip may go unseen, which is harmless: no decision was taken on it.
//! A gap between two renew times alone is not an outage: a relisting cache skips renewals.

use std::fmt;

/// The hysteresis settings. [`Default`] suits a 15-40 s agent lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatPolicy {
    /// How long an expired heartbeat keeps its node's replicas.
    pub grace_s: u64,
    /// How long a heartbeat must be fresh after an outage before new replicas go to the node.
    pub settle_s: u64,
    /// Outages within `flap_window_s` that make a node flapping; 0 turns the rule off.
    pub flap_count: usize,
    pub flap_window_s: u64,
}

impl Default for HeartbeatPolicy {
    fn default() -> Self {
        HeartbeatPolicy { grace_s: 60, settle_s: 120, flap_count: 3, flap_window_s: 600 }
    }
}

/// One period during which the lease was expired and was then renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    pub expired_at_s: u64,
    pub renewed_at_s: u64,
}

/// Upper bound on remembered outages: the flap rule needs only the recent ones.
const MAX_OUTAGES: usize = 64;

/// What the controller keeps per node between reconciles and updates from Lease events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatHistory {
    pub lease_duration_s: u64,
    /// The latest `renewTime` seen; `None` while the node has no Lease.
    pub last_renew_s: Option<u64>,
    /// Completed outages, oldest first, pruned to the flap window.
    pub outages: Vec<Outage>,
    /// A read saw the lease of `last_renew_s` expired: the next renewal ends an outage.
    pub expiry_seen: bool,
}

/// A node's heartbeat as the decisions see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatState {
    Fresh,
    /// The node has no heartbeat Lease (no agent runs there).
    NoLease,
    /// Fresh again after an outage, for less than the settle time.
    Settling {
        fresh_for_s: u64,
        settle_s: u64,
    },
    /// Expired for less than the grace: replicas stay, none are added.
    Expired {
        for_s: u64,
    },
    /// Expired for the grace or longer: replicas are replaced.
    Lost {
        for_s: u64,
    },
    /// Too many outages lately: replicas are replaced and none are added.
    Flapping {
        outages: usize,
        window_s: u64,
    },
}

impl HeartbeatState {
    /// New replicas may go to the node.
    pub fn accepts_replicas(self) -> bool {
        self == HeartbeatState::Fresh
    }

    /// The node's replicas must be replaced.
    pub fn evicts(self) -> bool {
        matches!(self, HeartbeatState::NoLease | HeartbeatState::Lost { .. } | HeartbeatState::Flapping { .. })
    }
}

impl fmt::Display for HeartbeatState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatState::Fresh => write!(f, "heartbeat fresh"),
            HeartbeatState::NoLease => write!(f, "no heartbeat lease (is the agent running?)"),
            HeartbeatState::Settling { fresh_for_s, settle_s } => {
                write!(f, "heartbeat back for {fresh_for_s} s after an outage (settling for {settle_s} s)")
            }
            HeartbeatState::Expired { for_s } | HeartbeatState::Lost { for_s } => write!(f, "heartbeat expired {for_s} s ago"),
            HeartbeatState::Flapping { outages, window_s } => write!(f, "heartbeat flapping: {outages} outages within {window_s} s"),
        }
    }
}

impl HeartbeatHistory {
    pub fn new(lease_duration_s: u64) -> Self {
        HeartbeatHistory { lease_duration_s, last_renew_s: None, outages: Vec::new(), expiry_seen: false }
    }

    /// Records the Lease as read at `now_s`: its `renewTime` (`None`: deleted or never
    /// renewed) and `leaseDurationSeconds`. A renew time older than the latest one (a lagging
    /// cache) is ignored. Call it on every read, before [`HeartbeatHistory::assess`].
    pub fn observe(&mut self, renew_s: Option<u64>, lease_duration_s: u64, now_s: u64, policy: &HeartbeatPolicy) {
        match (self.last_renew_s, renew_s) {
            (Some(last), Some(renew)) if renew > last => {
                if self.expiry_seen {
                    // Ended under the lease that was in force while it lasted.
                    self.outages.push(Outage { expired_at_s: last.saturating_add(self.lease_duration_s), renewed_at_s: renew });
                }
                self.last_renew_s = Some(renew);
                self.expiry_seen = false;
            }
            (None, Some(renew)) => self.last_renew_s = Some(renew),
            _ => {}
        }
        self.lease_duration_s = lease_duration_s;
        if let Some(last) = self.last_renew_s
            && now_s > last.saturating_add(lease_duration_s)
        {
            self.expiry_seen = true;
        }
        // Kept for the flap window, and for the settle time (which may be longer).
        let horizon = now_s.saturating_sub(policy.flap_window_s.max(policy.settle_s));
        self.outages.retain(|o| o.renewed_at_s >= horizon);
        if self.outages.len() > MAX_OUTAGES {
            self.outages.drain(..self.outages.len() - MAX_OUTAGES);
        }
    }

    /// The state at `now_s` under `policy`.
    pub fn assess(&self, now_s: u64, policy: &HeartbeatPolicy) -> HeartbeatState {
        let Some(last) = self.last_renew_s else {
            return HeartbeatState::NoLease;
        };
        let expired_at = last.saturating_add(self.lease_duration_s);
        let ongoing = now_s > expired_at;
        let horizon = now_s.saturating_sub(policy.flap_window_s);
        let recent = self.outages.iter().filter(|o| o.renewed_at_s >= horizon).count() + usize::from(ongoing);
        if policy.flap_count > 0 && recent >= policy.flap_count {
            return HeartbeatState::Flapping { outages: recent, window_s: policy.flap_window_s };
        }
        if ongoing {
            let for_s = now_s - expired_at;
            return if for_s >= policy.grace_s { HeartbeatState::Lost { for_s } } else { HeartbeatState::Expired { for_s } };
        }
        match self.outages.last() {
            Some(o) if now_s.saturating_sub(o.renewed_at_s) < policy.settle_s => {
                HeartbeatState::Settling { fresh_for_s: now_s.saturating_sub(o.renewed_at_s), settle_s: policy.settle_s }
            }
            _ => HeartbeatState::Fresh,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: HeartbeatPolicy = HeartbeatPolicy { grace_s: 60, settle_s: 120, flap_count: 3, flap_window_s: 600 };

    /// A lease renewed every 10 s (duration 40 s) except during `gaps` (start, end): the agent
    /// renews at the first multiple of 10 at or after `end`. Observed every `every` seconds.
    fn run(gaps: &[(u64, u64)], until: u64, every: u64) -> HeartbeatHistory {
        let mut h = HeartbeatHistory::new(40);
        let mut renew = None;
        let mut t = 0;
        while t <= until {
            if !gaps.iter().any(|&(a, b)| t >= a && t < b) && t % 10 == 0 {
                renew = Some(t);
            }
            if t % every == 0 {
                h.observe(renew, 40, t, &P);
            }
            t += 1;
        }
        h
    }

    #[test]
    fn states_over_time() {
        use HeartbeatState::*;
        // (name, gaps, now, observe every, expected)
        type Row = (&'static str, Vec<(u64, u64)>, u64, u64, HeartbeatState);
        let table: Vec<Row> = vec![
            ("steady", vec![], 1000, 5, Fresh),
            ("a gap shorter than the lease is no outage", vec![(500, 530)], 1000, 5, Fresh),
            // Last renewal 490, expired at 530; at 560 expired 30 s: within the 60 s grace.
            ("blip within grace", vec![(495, 2000)], 560, 5, Expired { for_s: 30 }),
            ("grace boundary: 59 s still expired", vec![(495, 2000)], 589, 1, Expired { for_s: 59 }),
            ("grace boundary: 60 s lost", vec![(495, 2000)], 590, 1, Lost { for_s: 60 }),
            // Renewed at 560 after expiring at 530: 40 s fresh at 600, settling until 680.
            ("recovered, settling", vec![(495, 560)], 600, 5, Settling { fresh_for_s: 40, settle_s: 120 }),
            ("settle boundary: 120 s fresh", vec![(495, 560)], 680, 1, Fresh),
            ("two outages: not flapping", vec![(495, 560), (695, 760)], 900, 5, Fresh),
            (
                "three outages in the window: flapping",
                vec![(95, 160), (295, 360), (495, 560)],
                600,
                5,
                Flapping { outages: 3, window_s: 600 },
            ),
            // The third is ongoing (expired at 530, within grace) and already counts.
            (
                "two done and one ongoing: flapping",
                vec![(95, 160), (295, 360), (495, 2000)],
                540,
                5,
                Flapping { outages: 3, window_s: 600 },
            ),
            // The first outage ended at 160; at 761 it is out of the window.
            ("flapping ends once the window is quiet", vec![(95, 160), (295, 360), (495, 560)], 761, 1, Fresh),
            (
                "flapping still at the window's edge",
                vec![(95, 160), (295, 360), (495, 560)],
                760,
                1,
                Flapping { outages: 3, window_s: 600 },
            ),
            // Read every 20 s: each 30 s outage (140-170, ...) is seen by the read at 160, ...
            ("outages seen by periodic reads", vec![(105, 170), (305, 370), (505, 570)], 600, 20, Flapping { outages: 3, window_s: 600 }),
            // ... read every 100 s, none is (each read finds a renewal under 10 s old).
            ("blips between reads go unseen", vec![(105, 170), (305, 370), (505, 570)], 600, 100, Fresh),
            // Read every 100 s while renewed every 10 s: skipped renewals are no outage.
            ("sparse reads of a steady lease", vec![], 1000, 100, Fresh),
        ];
        for (name, gaps, now, every, want) in table {
            let h = run(&gaps, now, every);
            assert_eq!(h.assess(now, &P), want, "{name}: {h:?}");
        }
    }

    #[test]
    fn no_lease_and_stale_reads() {
        let mut h = HeartbeatHistory::new(40);
        assert_eq!(h.assess(100, &P), HeartbeatState::NoLease);
        h.observe(Some(100), 40, 100, &P);
        // An older read (a lagging cache) neither moves the renew time back nor makes an outage.
        h.observe(Some(20), 40, 101, &P);
        assert_eq!(h.last_renew_s, Some(100));
        assert!(h.outages.is_empty());
        assert_eq!(h.assess(140, &P), HeartbeatState::Fresh);
        assert_eq!(h.assess(141, &P), HeartbeatState::Expired { for_s: 1 });
    }

    #[test]
    fn a_settle_time_longer_than_the_flap_window_holds() {
        let p = HeartbeatPolicy { settle_s: 900, flap_window_s: 600, ..P };
        let mut h = HeartbeatHistory::new(40);
        h.observe(Some(0), 40, 0, &p);
        h.observe(Some(0), 40, 50, &p);
        h.observe(Some(100), 40, 100, &p);
        for t in (100..=1000).step_by(10) {
            h.observe(Some(t), 40, t, &p);
        }
        assert_eq!(h.outages, vec![Outage { expired_at_s: 40, renewed_at_s: 100 }]);
        assert_eq!(h.assess(999, &p), HeartbeatState::Settling { fresh_for_s: 899, settle_s: 900 });
        assert_eq!(h.assess(1000, &p), HeartbeatState::Fresh);
    }

    #[test]
    fn outages_are_bounded() {
        let p = HeartbeatPolicy { flap_window_s: u64::MAX, ..P };
        let mut h = HeartbeatHistory::new(1);
        for i in 0..200u64 {
            // Each read, 5 s after a renewal, sees the 1 s lease expired.
            h.observe(Some(i * 10), 1, i * 10 + 5, &p);
        }
        assert_eq!(h.outages.len(), MAX_OUTAGES);
        assert_eq!(h.outages.last().map(|o| o.renewed_at_s), Some(1990));
    }

    #[test]
    fn which_states_place_and_evict() {
        use HeartbeatState::*;
        let table = [
            (Fresh, true, false),
            (NoLease, false, true),
            (Settling { fresh_for_s: 1, settle_s: 2 }, false, false),
            (Expired { for_s: 1 }, false, false),
            (Lost { for_s: 60 }, false, true),
            (Flapping { outages: 3, window_s: 600 }, false, true),
        ];
        for (s, accepts, evicts) in table {
            assert_eq!((s.accepts_replicas(), s.evicts()), (accepts, evicts), "{s:?}");
        }
    }
}
