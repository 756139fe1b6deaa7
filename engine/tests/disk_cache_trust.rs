//! Tier 3 treats its directory as something others may have written to: a
//! directory it does not own, or that others can write, is refused; an entry
//! not authenticated under the per-user key (forged with a public checksum),
//! truncated, too large, a link, a FIFO, or one that verifies but does not
//! parse or compile, is rejected, removed and rebuilt, and the op still
//! gives the right numbers. See docs/cache-security.md.

#![cfg(unix)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use deferfuse::disk_cache::{DiskCache, DiskCacheLimits, KEY_FILE};
use deferfuse::{Config, Context, GeluApproximation, Mode, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// One fused flush whose program holds a GELU (the op a forger turns into
/// a ReLU below).
fn gelu_block(ctx: &Context) -> Result<Vec<f32>> {
    let x =
        ctx.from_vec((0..64 * 16).map(|i| (i % 29) as f32 * 0.25 - 3.5).collect(), &[64, 16])?;
    x.gelu(GeluApproximation::Tanh)?.mul(&x)?.sum(&[-1], false)?.to_vec::<f32>()
}

fn expected() -> Vec<f32> {
    gelu_block(&Context::with_mode(Mode::DeferAndFuse).unwrap()).unwrap()
}

fn cached(dir: &Path) -> Context {
    cached_with(dir, Config::default().cache_max_entry_bytes)
}

fn cached_with(dir: &Path, max_entry_bytes: u64) -> Context {
    Context::new(Config {
        cache_dir: Some(dir.into()),
        cache_max_entry_bytes: max_entry_bytes,
        ..Config::with_mode(Mode::DeferAndFuse)
    })
    .unwrap()
}

/// A fresh path under the temp dir (not created), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("deferfuse-trust-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    /// The store the native backend's programs live in.
    fn store(&self) -> PathBuf {
        self.0.join("cpu")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn entries(store: &Path) -> Vec<PathBuf> {
    deferfuse::disk_cache::entry_files(store)
}

/// The only entry of a store that one flush filled.
fn the_entry(store: &Path) -> PathBuf {
    let all = entries(store);
    assert_eq!(all.len(), 1, "{all:?}");
    all[0].clone()
}

/// An entry's parts: the magic line, the key and the payload (the layout is
/// in disk_cache.rs: magic, MAC, key length, key, payload).
fn parts(entry: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut lines = entry.splitn(4, |&b| b == b'\n');
    let magic = lines.next().unwrap().to_vec();
    let _mac = lines.next().unwrap();
    let key_len: usize = std::str::from_utf8(lines.next().unwrap()).unwrap().parse().unwrap();
    let body = lines.next().unwrap();
    (magic, body[..key_len].to_vec(), body[key_len..].to_vec())
}

/// An entry in the right layout with a tag anyone can compute: what someone
/// who can write the directory but not read its key can produce.
fn forged(magic: &[u8], key: &[u8], payload: &[u8], tag: &[u8]) -> Vec<u8> {
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = magic.to_vec();
    out.extend_from_slice(format!("\n{hex}\n{}\n", key.len()).as_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    out
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn a_new_cache_directory_and_its_files_are_private() {
    let dir = TempDir::new("modes");
    assert_eq!(gelu_block(&cached(&dir.0)).unwrap(), expected());
    assert_eq!(mode_of(&dir.0), 0o700, "the cache directory deferfuse created");
    assert_eq!(mode_of(&dir.store()), 0o700, "the store");
    assert_eq!(mode_of(&dir.store().join(KEY_FILE)), 0o600, "the key");
    assert_eq!(std::fs::metadata(dir.store().join(KEY_FILE)).unwrap().len(), 32);
    assert_eq!(mode_of(&the_entry(&dir.store())), 0o600, "an entry");
}

/// Runs the block on a store that must be refused: the numbers are right,
/// the disk tier saw nothing, and nothing was written into the store.
fn assert_refused_and_still_right(dir: &TempDir, why: &str) {
    let err = DiskCache::open(dir.store(), DiskCacheLimits::default()).unwrap_err().to_string();
    assert!(err.contains(&dir.store().display().to_string()) && err.contains(why), "{err}");
    let ctx = cached(&dir.0);
    assert_eq!(gelu_block(&ctx).unwrap(), expected());
    let stats = ctx.stats().cache.tier3;
    assert_eq!(stats, Default::default(), "the refused store was used: {stats:?}");
    assert!(entries(&dir.store()).is_empty(), "an entry was written into a refused store");
}

#[test]
fn a_group_or_world_writable_directory_is_refused_and_the_run_is_still_right() {
    for mode in [0o770, 0o703, 0o1777] {
        let dir = TempDir::new("writable");
        std::fs::create_dir_all(dir.store()).unwrap();
        std::fs::set_permissions(dir.store(), std::fs::Permissions::from_mode(mode)).unwrap();
        assert_refused_and_still_right(&dir, "group- or world-writable");
    }
}

#[test]
fn a_directory_owned_by_another_user_is_refused_and_the_run_is_still_right() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: giving a directory to another user needs root");
        return;
    }
    let dir = TempDir::new("owner");
    std::fs::create_dir_all(dir.store()).unwrap();
    std::os::unix::fs::chown(dir.store(), Some(65534), Some(65534)).unwrap(); // nobody
    assert_refused_and_still_right(&dir, "owned by uid 65534");
}

#[test]
fn a_key_file_others_can_read_or_that_is_a_link_is_refused() {
    let dir = TempDir::new("key-mode");
    gelu_block(&cached(&dir.0)).unwrap();
    let key = dir.store().join(KEY_FILE);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = DiskCache::open(dir.store(), DiskCacheLimits::default()).unwrap_err().to_string();
    assert!(err.contains("mode 0644"), "{err}");
    let ctx = cached(&dir.0);
    assert_eq!(gelu_block(&ctx).unwrap(), expected());
    assert_eq!(ctx.stats().cache.tier3.hits, 0);

    // A link to a key somewhere else is not followed.
    let elsewhere = TempDir::new("key-elsewhere");
    std::fs::create_dir_all(&elsewhere.0).unwrap();
    let target = elsewhere.0.join("key");
    std::fs::write(&target, [7u8; 32]).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(&key).unwrap();
    std::os::unix::fs::symlink(&target, &key).unwrap();
    let err = DiskCache::open(dir.store(), DiskCacheLimits::default()).unwrap_err().to_string();
    assert!(err.contains("symbolic link"), "{err}");
}

const CHILD_VAR: &str = "DEFERFUSE_TEST_REFUSED_STORE";

/// Run by the next test in a child process: two contexts on a refused store.
#[test]
fn child_opens_a_refused_store_twice() {
    let Ok(dir) = std::env::var(CHILD_VAR) else { return };
    for _ in 0..2 {
        assert_eq!(gelu_block(&cached(Path::new(&dir))).unwrap(), expected());
    }
}

#[test]
fn a_refused_directory_is_warned_about_once_per_process() {
    let dir = TempDir::new("warn-once");
    std::fs::create_dir_all(dir.store()).unwrap();
    std::fs::set_permissions(dir.store(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_opens_a_refused_store_twice",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_VAR, &dir.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("deferfuse: warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains(&dir.store().display().to_string())
            && warnings[0].contains("without the on-disk cache")
            && warnings[0].contains("TORCH_TPU_CACHE_DIR"),
        "{}",
        warnings[0]
    );
}

/// The rebuilt entry is stored again and authentic: a new context hits it.
fn assert_rebuilt(dir: &TempDir) {
    let ctx = cached(&dir.0);
    assert_eq!(gelu_block(&ctx).unwrap(), expected());
    let stats = ctx.stats().cache;
    assert_eq!((stats.tier3.hits, stats.tier3.rejected), (1, 0), "{stats:?}");
}

/// Runs the block after the entry was tampered with: the numbers are
/// right, one entry was rejected, and the program was prepared again.
fn assert_rejected_and_right(dir: &TempDir) {
    let ctx = cached(&dir.0);
    assert_eq!(gelu_block(&ctx).unwrap(), expected());
    let stats = ctx.stats().cache;
    assert_eq!((stats.tier3.hits, stats.tier3.rejected), (0, 1), "{stats:?}");
    assert!(stats.rewrite_ns > 0, "the program was not prepared again: {stats:?}");
}

#[test]
fn a_program_edited_from_gelu_to_relu_with_a_recomputed_checksum_is_rejected() {
    let dir = TempDir::new("forged");
    gelu_block(&cached(&dir.0)).unwrap();
    let path = the_entry(&dir.store());
    let (magic, key, payload) = parts(&std::fs::read(&path).unwrap());
    let text = String::from_utf8(payload).unwrap();
    assert!(text.contains("\"gelu_tanh\""), "{text}");
    let relu = text.replace("\"gelu_tanh\"", "\"relu\"").into_bytes();
    // Tags anyone can compute: a plain SHA-256 of the body, and HMACs under
    // keys a forger might guess. None is under the store's key.
    let mut body = key.clone();
    body.extend_from_slice(&relu);
    let mut tags = vec![Sha256::digest(&body).to_vec()];
    for guess in [[0u8; 32], [0xffu8; 32]] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&guess).unwrap();
        mac.update(&magic);
        mac.update(&(key.len() as u64).to_le_bytes());
        mac.update(&key);
        mac.update(&relu);
        tags.push(mac.finalize().into_bytes().to_vec());
    }
    for tag in tags {
        std::fs::write(&path, forged(&magic, &key, &relu, &tag)).unwrap();
        assert_rejected_and_right(&dir);
        let rebuilt = std::fs::read(&path).unwrap();
        assert!(
            !String::from_utf8_lossy(&rebuilt).contains("\"relu\""),
            "the forgery is still there"
        );
    }
    assert_rebuilt(&dir);
}

#[test]
fn an_authentic_payload_moved_under_another_key_is_rejected() {
    let dir = TempDir::new("moved");
    let ctx = cached(&dir.0);
    gelu_block(&ctx).unwrap();
    // A second program, with its own authentic entry.
    let x = ctx.from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2]).unwrap();
    x.relu().unwrap().exp().unwrap().sum(&[-1], false).unwrap().to_vec::<f32>().unwrap();
    let all = entries(&dir.store());
    assert_eq!(all.len(), 2);
    let is_gelu =
        |p: &PathBuf| String::from_utf8_lossy(&std::fs::read(p).unwrap()).contains("gelu");
    let ours = all.iter().find(|p| is_gelu(p)).unwrap();
    let theirs = all.iter().find(|p| !is_gelu(p)).unwrap();
    // Their payload and their valid tag, under our key: the tag covers the
    // key, so it fails.
    let (magic, key, _) = parts(&std::fs::read(ours).unwrap());
    let their_entry = std::fs::read(theirs).unwrap();
    let (_, _, their_payload) = parts(&their_entry);
    let their_tag = their_entry.split(|&b| b == b'\n').nth(1).unwrap();
    let tag: Vec<u8> = (0..their_tag.len() / 2)
        .map(|i| {
            u8::from_str_radix(std::str::from_utf8(&their_tag[2 * i..2 * i + 2]).unwrap(), 16)
                .unwrap()
        })
        .collect();
    std::fs::write(ours, forged(&magic, &key, &their_payload, &tag)).unwrap();
    assert_rejected_and_right(&dir);
    assert_rebuilt(&dir);
}

/// Stores `payload` under the key of the store's one entry, through the
/// cache itself: an authentic entry whose content is bad.
fn store_authentic(dir: &TempDir, payload: &[u8]) {
    let (_, key, _) = parts(&std::fs::read(the_entry(&dir.store())).unwrap());
    let cache = DiskCache::open(dir.store(), DiskCacheLimits::default()).unwrap();
    cache.put(&key, payload);
    assert_eq!(cache.get(&key).as_deref(), Some(payload), "the planted entry verifies");
}

#[test]
fn an_authentic_entry_that_does_not_parse_or_compile_is_rejected_and_rebuilt() {
    let dir = TempDir::new("bad-program");
    gelu_block(&cached(&dir.0)).unwrap();
    let (_, _, payload) = parts(&std::fs::read(the_entry(&dir.store())).unwrap());
    let mut program: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    // Parses, but returns a value no kernel writes: the backend refuses it.
    program["outputs"] = serde_json::json!([999_999]);
    let does_not_compile = serde_json::to_vec(&program).unwrap();
    for bad in [&does_not_compile[..], b"{ not a program"] {
        store_authentic(&dir, bad);
        assert_rejected_and_right(&dir);
        assert_rebuilt(&dir);
    }
}

#[test]
fn a_truncated_entry_is_rejected_and_rebuilt() {
    let dir = TempDir::new("truncated");
    gelu_block(&cached(&dir.0)).unwrap();
    let path = the_entry(&dir.store());
    let bytes = std::fs::read(&path).unwrap();
    for keep in [bytes.len() - 1, bytes.len() / 2, 40, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        assert_rejected_and_right(&dir);
        assert_rebuilt(&dir);
    }
}

/// `f` in another thread, which must finish within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("still running after {limit:?}"))
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

#[test]
fn a_link_to_dev_zero_and_a_fifo_as_entries_are_rejected_quickly() {
    let dir = TempDir::new("special");
    gelu_block(&cached(&dir.0)).unwrap();
    let path = the_entry(&dir.store());
    for plant in ["link to /dev/zero", "fifo"] {
        std::fs::remove_file(&path).unwrap();
        match plant {
            "fifo" => mkfifo(&path),
            _ => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
        }
        let root = dir.0.clone();
        let start = Instant::now();
        let (got, stats) = within(Duration::from_secs(60), move || {
            let ctx = cached(&root);
            (gelu_block(&ctx).unwrap(), ctx.stats().cache)
        });
        assert!(start.elapsed() < Duration::from_secs(20), "{plant}: {:?}", start.elapsed());
        assert_eq!(got, expected(), "{plant}");
        assert_eq!(stats.tier3.rejected, 1, "{plant}: {stats:?}");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file(), "{plant}: not rebuilt");
        assert_rebuilt(&dir);
    }
}

#[test]
fn an_entry_over_the_size_limit_is_rejected_and_not_written() {
    let dir = TempDir::new("too-large");
    gelu_block(&cached(&dir.0)).unwrap();
    let path = the_entry(&dir.store());
    let len = std::fs::metadata(&path).unwrap().len();
    // The same entry is over a smaller limit: rejected, rebuilt in memory,
    // and not stored (it would be rejected again).
    let ctx = cached_with(&dir.0, len - 1);
    assert_eq!(gelu_block(&ctx).unwrap(), expected());
    assert_eq!(ctx.stats().cache.tier3.rejected, 1);
    assert!(entries(&dir.store()).is_empty());
    // A huge sparse file under the default limit is refused from its size.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(DiskCacheLimits::default().max_entry_bytes + 1).unwrap();
    let start = Instant::now();
    assert_rejected_and_right(&dir);
    assert!(start.elapsed() < Duration::from_secs(20));
    assert_rebuilt(&dir);
}

#[test]
fn the_cache_variables_parse_and_bad_values_list_the_valid_ones() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    let config = Config::from_vars(vars(&[
        ("TORCH_TPU_CACHE_MAX_ENTRY_BYTES", "1024"),
        ("TORCH_TPU_CACHE_ENTRIES", " 16 "),
        ("TORCH_TPU_CACHE_MEMORY_BYTES", "4096"),
    ]))
    .unwrap();
    assert_eq!(
        (config.cache_max_entry_bytes, config.cache_entries, config.cache_memory_bytes),
        (1024, 16, 4096)
    );
    let defaults = Config::from_vars(|_| None).unwrap();
    assert_eq!(
        (defaults.cache_max_entry_bytes, defaults.cache_entries, defaults.cache_memory_bytes),
        (256 << 20, 1024, 64 << 20)
    );
    for var in [
        "TORCH_TPU_CACHE_MAX_ENTRY_BYTES",
        "TORCH_TPU_CACHE_ENTRIES",
        "TORCH_TPU_CACHE_MEMORY_BYTES",
    ] {
        for bad in ["0", "-1", "lots"] {
            let e = Config::from_vars(|k| (k == var).then(|| bad.to_string())).unwrap_err();
            let e = e.to_string();
            assert!(e.contains(var) && e.contains(bad) && e.contains("positive"), "{e}");
        }
    }
}
