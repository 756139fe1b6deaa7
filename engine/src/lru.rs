//! A map bounded in entries and in bytes that evicts its least recently used
//! entries: the in-memory cache tiers. A program that keeps minting new
//! traces (a slice bound that changes every step) would otherwise grow them
//! without end.
//!
//! Eviction scans for the oldest entry, O(entries); it runs only on inserts,
//! which follow a compile that costs far more. Lookups cost one hash lookup
//! and a counter.

use std::hash::Hash;

use ahash::AHashMap;

struct Slot<V> {
    value: V,
    bytes: u64,
    /// When the entry was last used: larger is more recent.
    used: u64,
}

pub(crate) struct Lru<K, V> {
    map: AHashMap<K, Slot<V>>,
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    clock: u64,
    evictions: u64,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// At most `max_entries` entries (at least one) and `max_bytes` bytes;
    /// the entry just inserted is kept even when it alone is over the bytes.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        Lru {
            map: AHashMap::new(),
            max_entries: max_entries.max(1),
            max_bytes,
            bytes: 0,
            clock: 0,
            evictions: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub fn get(&mut self, key: &K) -> Option<&V> {
        let now = self.tick();
        let slot = self.map.get_mut(key)?;
        slot.used = now;
        Some(&slot.value)
    }

    /// Runs `f` on the entry of `key` (marking it used), then takes its new
    /// size from `weigh` and evicts others if the tier is now over its bytes.
    pub fn update<R>(
        &mut self,
        key: &K,
        f: impl FnOnce(&mut V) -> R,
        weigh: impl FnOnce(&V) -> u64,
    ) -> Option<R> {
        let now = self.tick();
        let slot = self.map.get_mut(key)?;
        slot.used = now;
        let result = f(&mut slot.value);
        let bytes = weigh(&slot.value);
        self.bytes = self.bytes - slot.bytes + bytes;
        slot.bytes = bytes;
        self.evict_except(key);
        Some(result)
    }

    /// Inserts (or replaces) `key`, then evicts the least recently used
    /// other entries until the bounds hold.
    pub fn insert(&mut self, key: K, value: V, bytes: u64) {
        let used = self.tick();
        if let Some(old) = self.map.insert(key.clone(), Slot { value, bytes, used }) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        self.evict_except(&key);
    }

    fn evict_except(&mut self, keep: &K) {
        while self.map.len() > self.max_entries
            || (self.bytes > self.max_bytes && self.map.len() > 1)
        {
            let oldest = self
                .map
                .iter()
                .filter(|(k, _)| *k != keep)
                .min_by_key(|(_, slot)| slot.used)
                .map(|(k, _)| k.clone());
            let Some(oldest) = oldest else { break };
            if let Some(slot) = self.map.remove(&oldest) {
                self.bytes -= slot.bytes;
                self.evictions += 1;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut lru = Lru::new(2, u64::MAX);
        lru.insert("a", 1, 10);
        lru.insert("b", 2, 10);
        assert_eq!(lru.get(&"a"), Some(&1)); // b is now the oldest
        lru.insert("c", 3, 10);
        assert_eq!((lru.len(), lru.evictions(), lru.bytes()), (2, 1, 20));
        assert!(lru.get(&"b").is_none() && lru.get(&"a").is_some());
    }

    #[test]
    fn the_byte_bound_holds_and_keeps_the_newest_entry() {
        let mut lru = Lru::new(100, 25);
        lru.insert(1, (), 10);
        lru.insert(2, (), 10);
        lru.insert(3, (), 10);
        assert_eq!((lru.len(), lru.bytes(), lru.evictions()), (2, 20, 1));
        lru.insert(4, (), 1000);
        assert_eq!((lru.len(), lru.bytes()), (1, 1000));
        assert!(lru.get(&4).is_some());
        // Growing an entry counts too.
        let mut lru = Lru::new(100, 25);
        lru.insert(1, 0u64, 10);
        lru.insert(2, 0u64, 10);
        lru.update(&1, |v| *v = 20, |v| *v);
        assert_eq!((lru.len(), lru.bytes()), (1, 20));
    }
}
