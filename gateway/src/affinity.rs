//! Where each prompt key lives when it moved off its rendezvous choice (its home had no room, see
//! [`crate::pick`]): the next request with that key goes to the new home, so two keys that hash
//! to one busy replica end up on two replicas instead of taking turns evicting each other's
//! prefix there.

use std::collections::HashMap;
use std::sync::Mutex;

/// Most keys remembered; past it an arbitrary one is forgotten (that key goes back to its
/// rendezvous choice, and moves again if that has no room).
pub const MAX_HOMES: usize = 65_536;

#[derive(Default)]
pub struct Homes {
    homes: Mutex<HashMap<(String, u64), String>>,
}

impl Homes {
    /// The replica (its base URL) the key of `model` moved to last, if it moved.
    pub fn home(&self, model: &str, key: u64) -> Option<String> {
        self.homes.lock().unwrap_or_else(|p| p.into_inner()).get(&(model.to_string(), key)).cloned()
    }

    pub fn set_home(&self, model: &str, key: u64, upstream: &str) {
        let mut homes = self.homes.lock().unwrap_or_else(|p| p.into_inner());
        if homes.len() >= MAX_HOMES
            && !homes.contains_key(&(model.to_string(), key))
            && let Some(any) = homes.keys().next().cloned()
        {
            homes.remove(&any);
        }
        homes.insert((model.to_string(), key), upstream.to_string());
    }

    pub fn len(&self) -> usize {
        self.homes.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_key_is_remembered_per_model_and_bounded() {
        let h = Homes::default();
        assert_eq!(h.home("m", 1), None);
        h.set_home("m", 1, "http://a");
        h.set_home("m", 1, "http://b");
        assert_eq!(h.home("m", 1).as_deref(), Some("http://b"));
        assert_eq!(h.home("other", 1), None);
        for k in 0..(MAX_HOMES as u64 + 10) {
            h.set_home("n", k, "http://c");
        }
        assert_eq!(h.len(), MAX_HOMES);
        assert_eq!(h.home("n", MAX_HOMES as u64 + 9).as_deref(), Some("http://c"));
    }
}
