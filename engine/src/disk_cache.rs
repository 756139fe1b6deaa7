//! Tier 3 of the cache: compiled artifacts on disk, shared across processes.
//!
//! Each entry is one file named by a stable hash of its key. The file holds a
//! magic line, a checksum of the payload, the full key and the payload, so a
//! truncated, corrupt or foreign file (another key that hashed alike, another
//! engine version) is detected, logged, and rebuilt, never trusted. Writes go
//! to a temporary file that is renamed into place, so readers in other
//! processes see a whole entry or none. A byte budget is kept by evicting the
//! least recently used entries (reads refresh an entry's modification time).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use trace_ir::signature::stable_hash64;

const MAGIC: &str = "deferfuse-cache v1";
const SUFFIX: &str = "entry";

/// An on-disk cache directory with a byte budget.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    budget_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
}

/// Counters of the disk cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskCacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries found corrupt or foreign, and rebuilt.
    pub rejected: u64,
}

impl DiskCache {
    /// Opens (creating) `dir`. The engine version is part of every key, so
    /// several versions can share one directory without trusting each other.
    pub fn open(dir: impl Into<PathBuf>, budget_bytes: u64) -> std::io::Result<DiskCache> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(DiskCache {
            dir,
            budget_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stats(&self) -> DiskCacheStats {
        DiskCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    /// The file an entry with this key lives in.
    pub fn path_of(&self, key: &[u8]) -> PathBuf {
        self.dir.join(format!("{:016x}.{SUFFIX}", stable_hash64(key)))
    }

    /// The payload stored under `key`, if a valid entry exists.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let path = self.path_of(key);
        let Ok(bytes) = fs::read(&path) else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        match decode(&bytes, key) {
            Ok(payload) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                // Refresh the entry for LRU eviction; failing to is harmless.
                let _ = fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Some(payload.to_vec())
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), why, "rejecting cache entry; it will be rebuilt");
                self.rejected.fetch_add(1, Ordering::Relaxed);
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores `payload` under `key` atomically, then evicts old entries if the
    /// directory is over budget. Failures are logged, not returned: a cache
    /// that cannot write only costs a recompile.
    pub fn put(&self, key: &[u8], payload: &[u8]) {
        let path = self.path_of(key);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
            std::process::id(),
            stable_hash64(
                format!("{:?}{:?}", std::thread::current().id(), SystemTime::now()).as_bytes()
            )
        ));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&encode(key, payload))?;
            f.sync_all()
        });
        if let Err(e) = written.and_then(|_| fs::rename(&tmp, &path)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write cache entry");
            let _ = fs::remove_file(&tmp);
            return;
        }
        self.evict();
    }

    /// Deletes least recently used entries until the directory fits its budget.
    fn evict(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else { return };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == SUFFIX))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.budget_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                tracing::debug!(path = %path.display(), "evicted cache entry");
            }
            total = total.saturating_sub(len);
        }
    }
}

/// `MAGIC \n checksum(hex) \n key-length \n key payload`.
fn encode(key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(key.len() + payload.len());
    body.extend_from_slice(key);
    body.extend_from_slice(payload);
    let mut out = format!("{MAGIC}\n{:016x}\n{}\n", stable_hash64(&body), key.len()).into_bytes();
    out.extend_from_slice(&body);
    out
}

fn decode<'a>(bytes: &'a [u8], key: &[u8]) -> Result<&'a [u8], &'static str> {
    let mut lines = bytes.splitn(4, |&b| b == b'\n');
    if lines.next() != Some(MAGIC.as_bytes()) {
        return Err("not a deferfuse cache entry of this format");
    }
    let checksum = lines
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(|l| u64::from_str_radix(l, 16).ok());
    let key_len = lines
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(|l| l.parse::<usize>().ok());
    let (Some(checksum), Some(key_len), Some(body)) = (checksum, key_len, lines.next()) else {
        return Err("truncated header");
    };
    if stable_hash64(body) != checksum {
        return Err("checksum mismatch (truncated or corrupt)");
    }
    if body.len() < key_len || &body[..key_len] != key {
        return Err("entry belongs to another key");
    }
    Ok(&body[key_len..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("deferfuse-disk-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_trip_and_corruption_is_rejected() {
        let cache = DiskCache::open(temp_dir("rt"), 1 << 20).unwrap();
        assert_eq!(cache.get(b"k1"), None);
        cache.put(b"k1", b"payload one");
        assert_eq!(cache.get(b"k1").as_deref(), Some(&b"payload one"[..]));

        // Flip a byte of the payload: the checksum catches it.
        let path = cache.path_of(b"k1");
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(b"k1"), None);
        // Truncate it.
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(cache.get(b"k1"), None);
        // Garbage.
        fs::write(&path, b"hello").unwrap();
        assert_eq!(cache.get(b"k1"), None);
        assert_eq!(cache.stats().rejected, 3);
        // Rebuilt by the next put.
        cache.put(b"k1", b"payload one");
        assert_eq!(cache.get(b"k1").as_deref(), Some(&b"payload one"[..]));
    }

    #[test]
    fn a_foreign_entry_under_the_same_file_name_is_rejected() {
        let cache = DiskCache::open(temp_dir("foreign"), 1 << 20).unwrap();
        cache.put(b"key-a", b"a");
        // Pretend key-b hashed to key-a's file.
        fs::copy(cache.path_of(b"key-a"), cache.path_of(b"key-b")).unwrap();
        assert_eq!(cache.get(b"key-b"), None);
        assert_eq!(cache.stats().rejected, 1);
    }

    #[test]
    fn eviction_keeps_the_budget_and_the_recent_entries() {
        let cache = DiskCache::open(temp_dir("evict"), 3000).unwrap();
        let payload = vec![7u8; 900];
        for i in 0..6u8 {
            cache.put(&[i], &payload);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let total: u64 =
            fs::read_dir(cache.dir()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert!(total <= 3000, "total {total}");
        assert!(cache.get(&[5]).is_some());
        assert!(cache.get(&[0]).is_none());
    }
}
