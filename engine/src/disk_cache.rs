//! Tier 3 of the cache: compiled artifacts on disk, shared across processes
//! of one user.
//!
//! What is read back from here is run (a native program, a PJRT executable),
//! so nothing in it is trusted until it is proved to be ours (the threat
//! model is in `docs/cache-security.md`):
//!
//! - the directory is created `0700` and its files `0600`; a directory that
//!   another user owns, or that is group- or world-writable, is refused with
//!   one warning and the context runs without the disk tier;
//! - every entry carries an HMAC-SHA256 of its format, key and payload under
//!   a per-user key of 32 random bytes (the `key` file, `0600`, made on first
//!   use), so a process that cannot read the key cannot forge an entry, and
//!   an entry cannot be moved to another key;
//! - entries are opened without following links or blocking, must be regular
//!   files, and are read up to a size limit ([`crate::fs_guard`]).
//!
//! Each entry is one file named by a stable hash of its key (names only: the
//! hash is public and proves nothing). The file holds a magic line, the MAC,
//! the key length, the full key and the payload. An entry that is missing its
//! MAC, truncated, corrupt, too large, not a regular file, or that its user
//! cannot parse or load ([`DiskCache::reject`]) is logged, counted in
//! `rejected`, removed, and rebuilt. Writes go to a temporary file that is
//! renamed into place, so readers in other processes see a whole entry or
//! none. A byte budget is kept by evicting the least recently used entries
//! (reads refresh an entry's modification time).
//!
//! Processes that start together (the ranks of one job) build each entry
//! once: a builder holds an exclusive `flock` on the key's `.lock` file from
//! its miss to its store ([`DiskCache::lock`]), and the others wait on it,
//! then read what it stored. The kernel drops the lock of a process that
//! dies; a holder that hangs is waited for [`LOCK_WAIT`] at most.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use trace_ir::signature::stable_hash64;
use trace_ir::{Error, Result};

use crate::fs_guard::{read_regular, ReadError};

/// The first line of every entry; v1 entries (an unkeyed checksum) are
/// rejected and rebuilt.
const MAGIC: &str = "deferfuse-cache v2";
const SUFFIX: &str = "entry";
const LOCK_SUFFIX: &str = "lock";
/// How long a process waits for another that builds the same entry before
/// it builds the entry itself.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// The per-directory secret the entries are authenticated with.
pub const KEY_FILE: &str = "key";
const KEY_BYTES: usize = 32;
const MAC_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// How much a [`DiskCache`] keeps and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskCacheLimits {
    /// The directory's budget: least recently used entries are evicted past it.
    pub budget_bytes: u64,
    /// The largest entry file read (or written); a larger one is rejected.
    pub max_entry_bytes: u64,
}

impl DiskCacheLimits {
    /// The limits `config` sets.
    pub fn from_config(config: &crate::config::Config) -> DiskCacheLimits {
        DiskCacheLimits {
            budget_bytes: config.cache_bytes,
            max_entry_bytes: config.cache_max_entry_bytes,
        }
    }
}

impl Default for DiskCacheLimits {
    fn default() -> Self {
        DiskCacheLimits {
            budget_bytes: crate::config::DEFAULT_CACHE_BYTES,
            max_entry_bytes: crate::config::DEFAULT_CACHE_MAX_ENTRY_BYTES,
        }
    }
}

/// An on-disk cache directory with a byte budget.
pub struct DiskCache {
    dir: PathBuf,
    limits: DiskCacheLimits,
    key: [u8; KEY_BYTES],
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for DiskCache {
    // Not derived: the key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache").field("dir", &self.dir).field("limits", &self.limits).finish()
    }
}

/// Counters of the disk cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskCacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries that were refused (not authentic, truncated, corrupt, too
    /// large, not a regular file, or unusable by their reader), removed and
    /// rebuilt.
    pub rejected: u64,
}

fn refused(dir: &Path, why: impl std::fmt::Display) -> Error {
    Error::io(format!("on-disk cache {}", dir.display()), why)
}

impl DiskCache {
    /// Opens (creating, `0700`) `dir` and its key. Refuses a directory, or a
    /// key file, that this user does not own or that others can write: the
    /// entries are run, so whoever can write them must be this user. The
    /// engine version is part of every key, so several versions can share
    /// one directory.
    pub fn open(dir: impl Into<PathBuf>, limits: DiskCacheLimits) -> Result<DiskCache> {
        let dir = dir.into();
        create_private_dir(&dir).map_err(|e| refused(&dir, format!("cannot create it: {e}")))?;
        let meta = fs::metadata(&dir).map_err(|e| refused(&dir, e))?;
        if !meta.is_dir() {
            return Err(refused(&dir, "it is not a directory"));
        }
        check_private(&meta, "the directory").map_err(|why| refused(&dir, why))?;
        let key = load_or_create_key(&dir)?;
        Ok(DiskCache {
            dir,
            limits,
            key,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        })
    }

    /// [`DiskCache::open`], or `None` after a warning, said once per process
    /// and directory: a refused cache costs recompiles, not the run.
    pub fn open_or_warn(dir: impl Into<PathBuf>, limits: DiskCacheLimits) -> Option<DiskCache> {
        let dir = dir.into();
        DiskCache::open(&dir, limits)
            .map_err(|e| {
                crate::warn::warn_once(&format!("disk cache {}", dir.display()), || {
                    format!(
                        "{e}; running without the on-disk cache (set {} to a directory of \
                         your own, or to off)",
                        crate::config::ENV_CACHE_DIR
                    )
                })
            })
            .ok()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limits(&self) -> DiskCacheLimits {
        self.limits
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

    /// Waits until no other process builds the entry of `key`, then holds
    /// that right until the guard drops: a caller that missed builds and
    /// stores the entry under it, so that processes racing for the same key
    /// build it once. `None` (no lock file, or a holder past [`LOCK_WAIT`])
    /// means: build without it, as if alone.
    pub fn lock(&self, key: &[u8]) -> Option<KeyLock> {
        let path = self.path_of(key).with_extension(LOCK_SUFFIX);
        let file = open_lock_file(&path)
            .map_err(
                |e| tracing::warn!(path = %path.display(), error = %e, "cannot open cache lock"),
            )
            .ok()?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Some(KeyLock { _file: file }),
                Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "building a cache entry without its lock");
                    return None;
                }
            }
        }
    }

    /// The payload stored under `key`, if an authentic entry exists.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let path = self.path_of(key);
        let (file, bytes) = match read_regular(&path, self.limits.max_entry_bytes) {
            Ok(read) => read,
            Err(ReadError::Missing) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Err(why) => {
                self.reject_file(&path, &why.to_string());
                return None;
            }
        };
        match decode(&bytes, key, &self.key) {
            Ok(payload) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                // Refresh the entry for LRU eviction, through the descriptor
                // that was read (the name may point elsewhere by now);
                // failing to is harmless.
                let _ = file.set_modified(SystemTime::now());
                Some(payload.to_vec())
            }
            Err(why) => {
                self.reject_file(&path, why);
                None
            }
        }
    }

    /// Throws away the entry of `key` that [`DiskCache::get`] returned but
    /// its reader could not use (a program that does not parse or compile,
    /// an executable that does not load): it counts as rejected, not as a
    /// hit, and the caller rebuilds and stores it again.
    pub fn reject(&self, key: &[u8], why: &str) {
        let _ = self.hits.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
        self.reject_file(&self.path_of(key), why);
    }

    fn reject_file(&self, path: &Path, why: &str) {
        tracing::warn!(path = %path.display(), why, "rejecting cache entry; it will be rebuilt");
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Removes the name only: a link's target is never touched.
        let _ = fs::remove_file(path);
    }

    /// Stores `payload` under `key` atomically, then evicts old entries if the
    /// directory is over budget. Failures are logged, not returned: a cache
    /// that cannot write only costs a recompile.
    pub fn put(&self, key: &[u8], payload: &[u8]) {
        let path = self.path_of(key);
        let entry = encode(key, payload, &self.key);
        if entry.len() as u64 > self.limits.max_entry_bytes {
            // It would be rejected on reading; say so once, since the
            // program then recompiles in every process.
            crate::warn::warn_once(&format!("cache entry limit {}", self.dir.display()), || {
                format!(
                    "a {}-byte entry is over the {}-byte limit of {} and is not stored ({})",
                    entry.len(),
                    self.limits.max_entry_bytes,
                    self.dir.display(),
                    crate::config::ENV_CACHE_MAX_ENTRY_BYTES
                )
            });
            return;
        }
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
            std::process::id(),
            stable_hash64(
                format!("{:?}{:?}", std::thread::current().id(), SystemTime::now()).as_bytes()
            )
        ));
        let written = create_private_file(&tmp).and_then(|mut f| {
            f.write_all(&entry)?;
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
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = entry_files(&self.dir)
            .into_iter()
            .filter_map(|path| {
                // Not following links: a link is a file of its own size.
                let meta = fs::symlink_metadata(&path).ok()?;
                Some((meta.modified().ok()?, meta.len(), path))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.limits.budget_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                // Its lock file too, so that the directory stays bounded (a
                // builder racing with this may then build once more).
                let _ = fs::remove_file(path.with_extension(LOCK_SUFFIX));
                tracing::debug!(path = %path.display(), "evicted cache entry");
            }
            total = total.saturating_sub(len);
        }
    }
}

/// The right to build one entry ([`DiskCache::lock`]): closing the file
/// releases the lock.
#[derive(Debug)]
pub struct KeyLock {
    _file: fs::File,
}

/// Opens (creating it `0600` if needed) a key's lock file, never through a link.
fn open_lock_file(path: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    }
    options.open(path)
}

/// The entry files of the store in `dir`, sorted by name (none when it
/// cannot be read).
pub fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> = read
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == SUFFIX))
        .collect();
    out.sort();
    out
}

/// Creates `dir` and any missing parents `0700`.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Creates a new file `0600`, failing if anything (a link included) is there.
fn create_private_file(path: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    }
    options.open(path)
}

/// Owned by this user and writable by no one else.
#[cfg(unix)]
fn check_private(meta: &fs::Metadata, what: &str) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = crate::fs_guard::effective_uid();
    if meta.uid() != me {
        return Err(format!(
            "{what} is owned by uid {}, not by this user (uid {me}), who would run what it holds",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{what} is group- or world-writable (mode {:04o}), so others could plant entries \
             in it; chmod go-w it, or use another directory",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_: &fs::Metadata, _: &str) -> std::result::Result<(), String> {
    Ok(())
}

/// The directory's key: read, or made on first use. Two processes that race
/// to make it agree: each writes its own temporary file, and only the first
/// hard link to the name succeeds; the other reads the winner's key.
fn load_or_create_key(dir: &Path) -> Result<[u8; KEY_BYTES]> {
    let path = dir.join(KEY_FILE);
    let bad_key = |why: String| refused(dir, format!("the key file {}: {why}", path.display()));
    for _ in 0..3 {
        match read_regular(&path, KEY_BYTES as u64) {
            Ok((file, bytes)) => {
                let meta = file.metadata().map_err(|e| bad_key(e.to_string()))?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::MetadataExt;
                    if meta.mode() & 0o077 != 0 {
                        return Err(bad_key(format!(
                            "others can read or write it (mode {:04o}; it must be 0600)",
                            meta.mode() & 0o7777
                        )));
                    }
                }
                check_private(&meta, "it").map_err(bad_key)?;
                return bytes.try_into().map_err(|b: Vec<u8>| {
                    bad_key(format!("it holds {} bytes, not {KEY_BYTES}", b.len()))
                });
            }
            Err(ReadError::Missing) => {}
            Err(ReadError::TooLarge { .. }) => {
                return Err(bad_key(format!("it holds more than {KEY_BYTES} bytes")))
            }
            Err(why) => return Err(bad_key(why.to_string())),
        }
        let mut key = [0u8; KEY_BYTES];
        getrandom::fill(&mut key)
            .map_err(|e| refused(dir, format!("no random bytes for a key: {e}")))?;
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix)
            .map_err(|e| refused(dir, format!("no random bytes for a key: {e}")))?;
        let tmp = dir.join(format!(
            ".{KEY_FILE}.{}.{:016x}.tmp",
            std::process::id(),
            u64::from_ne_bytes(suffix)
        ));
        let made = create_private_file(&tmp).and_then(|mut f| {
            f.write_all(&key)?;
            f.sync_all()
        });
        if let Err(e) = made {
            let _ = fs::remove_file(&tmp);
            return Err(bad_key(format!("cannot create it: {e}")));
        }
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(key),
            // Another process made it first: read theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(bad_key(format!("cannot create it: {e}"))),
        }
    }
    Err(bad_key("it keeps appearing and disappearing".into()))
}

/// The MAC of an entry: the format line, the key's length, the key and the
/// payload, so no byte of the entry can change without it failing.
fn mac(secret: &[u8; KEY_BYTES], key: &[u8], payload: &[u8]) -> HmacSha256 {
    // HMAC pads a key shorter than the hash's block (64 bytes) with zeros;
    // padding it here gives the same MAC with no fallible constructor.
    let mut block = [0u8; 64];
    block[..KEY_BYTES].copy_from_slice(secret);
    let mut mac = <HmacSha256 as Mac>::new(&block.into());
    mac.update(MAGIC.as_bytes());
    mac.update(&(key.len() as u64).to_le_bytes());
    mac.update(key);
    mac.update(payload);
    mac
}

/// `MAGIC \n mac(hex) \n key-length \n key payload`.
fn encode(key: &[u8], payload: &[u8], secret: &[u8; KEY_BYTES]) -> Vec<u8> {
    let tag = mac(secret, key, payload).finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = format!("{MAGIC}\n{hex}\n{}\n", key.len()).into_bytes();
    out.reserve(key.len() + payload.len());
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    out
}

fn parse_hex(text: &[u8]) -> Option<[u8; MAC_BYTES]> {
    if text.len() != 2 * MAC_BYTES {
        return None;
    }
    let mut out = [0u8; MAC_BYTES];
    for (i, pair) in text.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

fn decode<'a>(
    bytes: &'a [u8],
    key: &[u8],
    secret: &[u8; KEY_BYTES],
) -> std::result::Result<&'a [u8], &'static str> {
    let mut lines = bytes.splitn(4, |&b| b == b'\n');
    if lines.next() != Some(MAGIC.as_bytes()) {
        return Err("not a deferfuse cache entry of this format");
    }
    let tag = lines.next().and_then(parse_hex);
    let key_len = lines
        .next()
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(|l| l.parse::<usize>().ok());
    let (Some(tag), Some(key_len), Some(body)) = (tag, key_len, lines.next()) else {
        return Err("truncated header");
    };
    if body.len() < key_len {
        return Err("truncated");
    }
    let (stored_key, payload) = body.split_at(key_len);
    // Constant-time comparison; checked before the key, so nothing of an
    // unauthenticated entry is looked at further.
    if mac(secret, stored_key, payload).verify_slice(&tag).is_err() {
        return Err("authentication failed: not written under this cache's key \
                    (forged, truncated or corrupt)");
    }
    if stored_key != key {
        return Err("entry belongs to another key");
    }
    Ok(payload)
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

    fn limits(budget_bytes: u64) -> DiskCacheLimits {
        DiskCacheLimits { budget_bytes, ..DiskCacheLimits::default() }
    }

    #[test]
    fn round_trip_and_corruption_is_rejected() {
        let cache = DiskCache::open(temp_dir("rt"), limits(1 << 20)).unwrap();
        assert_eq!(cache.get(b"k1"), None);
        cache.put(b"k1", b"payload one");
        assert_eq!(cache.get(b"k1").as_deref(), Some(&b"payload one"[..]));

        // Flip a byte of the payload: the MAC catches it.
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
        assert!(!path.exists(), "a rejected entry is removed");
        // Rebuilt by the next put.
        cache.put(b"k1", b"payload one");
        assert_eq!(cache.get(b"k1").as_deref(), Some(&b"payload one"[..]));
    }

    #[test]
    fn a_foreign_entry_under_the_same_file_name_is_rejected() {
        let cache = DiskCache::open(temp_dir("foreign"), limits(1 << 20)).unwrap();
        cache.put(b"key-a", b"a");
        // Pretend key-b hashed to key-a's file.
        fs::copy(cache.path_of(b"key-a"), cache.path_of(b"key-b")).unwrap();
        assert_eq!(cache.get(b"key-b"), None);
        assert_eq!(cache.stats().rejected, 1);
    }

    #[test]
    fn a_rejected_hit_is_not_counted_as_a_hit() {
        let cache = DiskCache::open(temp_dir("reject"), limits(1 << 20)).unwrap();
        cache.put(b"k", b"not loadable");
        assert!(cache.get(b"k").is_some());
        cache.reject(b"k", "the reader could not load it");
        assert_eq!(cache.stats(), DiskCacheStats { hits: 0, misses: 1, rejected: 1 });
        assert!(!cache.path_of(b"k").exists());
    }

    #[test]
    fn a_second_builder_waits_for_the_first() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let dir = temp_dir("lock");
        let first = DiskCache::open(&dir, limits(1 << 20)).unwrap();
        let second = DiskCache::open(&dir, limits(1 << 20)).unwrap();
        let held = first.lock(b"k").expect("first lock");
        let released = Arc::new(AtomicBool::new(false));
        let seen = released.clone();
        let waiter = std::thread::spawn(move || {
            let _lock = second.lock(b"k").expect("second lock");
            // Only reachable once the first builder stored and let go.
            assert!(seen.load(Ordering::SeqCst));
            second.get(b"k")
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        first.put(b"k", b"built once");
        released.store(true, Ordering::SeqCst);
        drop(held);
        assert_eq!(waiter.join().unwrap().as_deref(), Some(&b"built once"[..]));
        // Another key is never blocked by this one.
        let _other = first.lock(b"other").expect("independent key");
    }

    #[test]
    fn two_opens_share_one_key() {
        let dir = temp_dir("key");
        let a = DiskCache::open(&dir, limits(1 << 20)).unwrap();
        a.put(b"k", b"v");
        let b = DiskCache::open(&dir, limits(1 << 20)).unwrap();
        assert_eq!(b.get(b"k").as_deref(), Some(&b"v"[..]));
        assert_eq!(fs::read(dir.join(KEY_FILE)).unwrap().len(), KEY_BYTES);
    }

    #[test]
    fn eviction_keeps_the_budget_and_the_recent_entries() {
        let cache = DiskCache::open(temp_dir("evict"), limits(3000)).unwrap();
        let payload = vec![7u8; 900];
        for i in 0..6u8 {
            cache.put(&[i], &payload);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let total: u64 = fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.path().extension().is_some_and(|x| x == SUFFIX))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert!(total <= 3000, "total {total}");
        assert!(cache.get(&[5]).is_some());
        assert!(cache.get(&[0]).is_none());
    }
}
