//! Nanoseconds per hash for each stable-hash candidate, at four buffer
//! sizes: the minimum of 15 repetitions of each (docs/results/hashes.md).

use std::hint::black_box;
use std::time::Instant;
/// The hand-rolled hash `trace_ir::signature::stable_hash64` used before XXH3.
fn ours(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let step = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    let mut h = (&mut chunks)
        .fold(bytes.len() as u64, |h, c| step(h, u64::from_le_bytes(c.try_into().unwrap())));
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = step(h, u64::from_le_bytes(tail));
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
fn sip(b: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0, 0);
    h.write(b);
    h.finish()
}
fn main() {
    let cands: Vec<(&str, fn(&[u8]) -> u64)> = vec![
        ("current", ours),
        ("xxh3_64", xxhash_rust::xxh3::xxh3_64),
        ("xxh64", |b| xxhash_rust::xxh64::xxh64(b, 0)),
        ("rapidhash", |b| rapidhash::v3::rapidhash_v3(b)),
        ("siphash13", sip),
        ("blake3", |b| u64::from_le_bytes(blake3::hash(b).as_bytes()[..8].try_into().unwrap())),
    ];
    for &size in &[64usize, 256, 1024, 16384] {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let iters = (40_000_000 / size).max(1000);
        let mut row = format!("{size:>6} B:");
        for (name, f) in &cands {
            let mut best = f64::MAX;
            for _ in 0..15 {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(f(black_box(&data)));
                }
                best = best.min(t.elapsed().as_nanos() as f64 / iters as f64);
            }
            row += &format!("  {name} {best:.1} ns");
        }
        println!("{row}");
    }
}
