//! The three cache tiers: hits on repeated op sequences, rebuilt corrupt disk
//! entries, and one cache directory filled by two processes at once.

use std::path::{Path, PathBuf};

use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

fn block(ctx: &Context, seed: u64, scale: f64) -> Result<Tensor> {
    let x = ctx.randn(&[64, 32], DType::F32, seed)?;
    let h = x.mul(scale)?.tanh()?.add(&x)?;
    h.softmax(-1)?.mul(&h)?.sum(&[-1], false)
}

fn fused(cache_dir: Option<PathBuf>) -> Context {
    Context::new(Config { mode: Mode::DeferAndFuse, cache_dir, ..Config::default() }).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("deferfuse-cache-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_same_op_sequence_on_new_data_and_scalars_hits_tier_1() {
    let ctx = fused(None);
    let first = block(&ctx, 1, 0.5).unwrap().to_vec::<f32>().unwrap();
    let after_first = ctx.stats().cache;
    // New data (another seed is another literal, so build the input outside
    // the measured sequence) and a new scalar value.
    let x = ctx.from_vec((0..64 * 32).map(|i| (i % 17) as f32 * 0.1).collect(), &[64, 32]).unwrap();
    let run = |scale: f64| {
        let h = x.mul(scale).unwrap().tanh().unwrap().add(&x).unwrap();
        h.softmax(-1).unwrap().mul(&h).unwrap().sum(&[-1], false).unwrap()
    };
    // 0.5 and 3.0 would be literals the rewrites see (see `is_rewrite_literal`).
    let a = run(0.3).to_vec::<f32>().unwrap();
    let misses = ctx.stats().cache.tier1.misses;
    let b = run(0.125).to_vec::<f32>().unwrap();
    let c = run(7.5).to_vec::<f32>().unwrap();
    let stats = ctx.stats().cache;
    assert_eq!(stats.tier1.misses, misses, "a new scalar value recompiled: {stats:?}");
    assert!(stats.tier1.hits >= 2, "{stats:?}");
    assert!(after_first.rewrite_ns > 0 && after_first.tier1.misses >= 1);
    assert_eq!(first.len(), 64);
    assert_ne!(a, b);
    assert_ne!(b, c);
    // The fused program was a handful of kernels, and the rewrites lifted the softmax.
    let report = ctx.last_flush().unwrap();
    assert!(report.kernels < report.trace_nodes, "{report:?}");
}

#[test]
fn strict_reuses_single_op_executables() {
    let ctx = Context::with_mode(Mode::Strict).unwrap();
    let x = ctx.ones(&[16], DType::F32).unwrap();
    let mut y = x.clone();
    for _ in 0..50 {
        y = y.mul(0.5).unwrap().add(&x).unwrap();
    }
    y.to_vec::<f32>().unwrap();
    let stats = ctx.stats().cache;
    assert!(stats.tier2.misses <= 4, "{stats:?}");
    assert!(stats.tier1.hits >= 95, "{stats:?}");
}

#[test]
fn a_corrupt_disk_entry_is_rebuilt_and_the_result_is_still_right() {
    let dir = temp_dir("corrupt");
    let expected = block(&fused(None), 3, 0.5).unwrap().to_vec::<f32>().unwrap();

    let first = fused(Some(dir.clone()));
    assert_eq!(block(&first, 3, 0.5).unwrap().to_vec::<f32>().unwrap(), expected);
    let entries = entries(&dir);
    assert!(!entries.is_empty(), "nothing was written to {}", dir.display());

    // A second process (a new context) hits tier 3 and skips rewriting.
    let second = fused(Some(dir.clone()));
    assert_eq!(block(&second, 3, 0.5).unwrap().to_vec::<f32>().unwrap(), expected);
    let stats = second.stats().cache;
    assert!(stats.tier3.hits >= 1 && stats.rewrite_ns == 0, "{stats:?}");

    // Corrupt every entry: detected, rebuilt, same numbers.
    for path in &entries {
        let mut bytes = std::fs::read(path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        std::fs::write(path, &bytes).unwrap();
    }
    let third = fused(Some(dir.clone()));
    assert_eq!(block(&third, 3, 0.5).unwrap().to_vec::<f32>().unwrap(), expected);
    let stats = third.stats().cache;
    assert!(stats.tier3.rejected >= 1 && stats.rewrite_ns > 0, "{stats:?}");
    let fourth = fused(Some(dir.clone()));
    block(&fourth, 3, 0.5).unwrap().to_vec::<f32>().unwrap();
    assert!(fourth.stats().cache.tier3.hits >= 1, "the rebuilt entry was not stored");
    let _ = std::fs::remove_dir_all(&dir);
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    walk(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "entry")).collect()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Run by `two_processes_fill_one_cache_directory` in child processes.
#[test]
fn child_fills_the_cache() {
    let Ok(dir) = std::env::var("DEFERFUSE_TEST_CACHE_CHILD") else { return };
    let ctx = fused(Some(dir.into()));
    for seed in 0..20 {
        let got = block(&ctx, seed % 5, 0.5).unwrap().to_vec::<f32>().unwrap();
        let want = block(&fused(None), seed % 5, 0.5).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want, "seed {seed}");
    }
}

#[test]
fn two_processes_fill_one_cache_directory() {
    let dir = temp_dir("two-processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_fills_the_cache", "--test-threads", "1"])
                .env("DEFERFUSE_TEST_CACHE_CHILD", &dir)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    assert!(!entries(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A block with a matmul epilogue, a row reduction and a reshape, at batch
/// size `batch`, on inputs made from `batch`.
fn sized_block(ctx: &Context, w: &Tensor, batch: usize) -> Result<Vec<f32>> {
    let x = ctx.from_vec(
        (0..batch * 32).map(|i| ((i * 7) % 23) as f32 * 0.1 - 1.0).collect(),
        &[batch, 32],
    )?;
    let h = x.matmul(&w.t()?)?.add(0.25)?.tanh()?;
    let s = h.softmax(-1)?.mul(&h)?;
    s.reshape(&[batch, 8, 8])?.sum(&[-1], false)?.to_vec::<f32>()
}

#[test]
fn a_new_batch_size_compiles_nothing_on_the_native_backend() {
    let ctx = fused(None);
    let reference =
        Context::new(Config { mode: Mode::Strict, fusion: false, ..Config::default() }).unwrap();
    let w = ctx.randn(&[64, 32], DType::F32, 3).unwrap();
    let w_ref = reference.from_vec(w.to_vec::<f32>().unwrap(), &[64, 32]).unwrap();
    sized_block(&ctx, &w, 6).unwrap();
    let planned = ctx.stats().cache;
    for batch in [24, 40, 6, 24] {
        let got = sized_block(&ctx, &w, batch).unwrap();
        let want = sized_block(&reference, &w_ref, batch).unwrap();
        assert_eq!(got.len(), batch * 8);
        let tol = deferfuse::differential::tolerance(DType::F32);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                deferfuse::differential::close(*g as f64, *e as f64, tol),
                "batch {batch}, element {i}: {g} vs {e}"
            );
        }
    }
    let stats = ctx.stats().cache;
    assert_eq!(stats.tier2.misses, planned.tier2.misses, "a new batch size compiled: {stats:?}");
    assert_eq!(
        (stats.rewrite_ns, stats.plan_ns, stats.compile_ns),
        (planned.rewrite_ns, planned.plan_ns, planned.compile_ns)
    );
    assert_eq!(stats.resized, 2, "batch 24 and 40 are resized from batch 6, then found: {stats:?}");
}

/// Attention over heads split with reshape, permute and slices: the
/// matmuls read their operands through strided views.
fn sized_attention(ctx: &Context, w: &Tensor, batch: usize) -> Result<Vec<f32>> {
    let (seq, width, heads) = (16, 32, 4);
    let x = ctx.from_vec(
        (0..batch * seq * width).map(|i| ((i * 5) % 19) as f32 * 0.1 - 0.9).collect(),
        &[batch, seq, width],
    )?;
    let qkv = x.matmul(w)?;
    let head = |i: i64| -> Result<Tensor> {
        let part = qkv.slice(-1, i * width as i64, (i + 1) * width as i64, 1)?;
        part.reshape(&[batch, seq, heads, width / heads])?.permute(&[0, 2, 1, 3])
    };
    let (q, k, v) = (head(0)?, head(1)?, head(2)?);
    let scores = q.matmul(&k.transpose(-1, -2)?)?.mul(0.35)?.softmax(-1)?;
    let out = scores.matmul(&v)?.permute(&[0, 2, 1, 3])?.reshape(&[batch, seq, width])?;
    out.to_vec::<f32>()
}

#[test]
fn strided_views_resize_with_the_batch() {
    let ctx = fused(None);
    let reference =
        Context::new(Config { mode: Mode::Strict, fusion: false, ..Config::default() }).unwrap();
    let w = ctx.randn(&[32, 96], DType::F32, 4).unwrap();
    let w_ref = reference.from_vec(w.to_vec::<f32>().unwrap(), &[32, 96]).unwrap();
    sized_attention(&ctx, &w, 2).unwrap();
    let program = ctx.last_flush().expect("a flush ran");
    let planned = ctx.stats().cache;
    // (Not 8: a batch equal to the head size is another shape class.)
    for batch in [6, 5, 2, 6] {
        let got = sized_attention(&ctx, &w, batch).unwrap();
        let want = sized_attention(&reference, &w_ref, batch).unwrap();
        assert_eq!(got.len(), batch * 16 * 32);
        let tol = deferfuse::differential::tolerance(DType::F32);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                deferfuse::differential::close(*g as f64, *e as f64, tol),
                "batch {batch}, element {i}: {g} vs {e}"
            );
        }
    }
    let stats = ctx.stats().cache;
    assert!(program.kernels > 1, "the block was fused into {} kernels", program.kernels);
    assert_eq!(stats.tier2.misses, planned.tier2.misses, "a new batch size compiled: {stats:?}");
    assert_eq!((stats.rewrite_ns, stats.plan_ns), (planned.rewrite_ns, planned.plan_ns));
    assert_eq!(stats.resized, 2, "batch 6 and 5 are resized from batch 2, then found: {stats:?}");
}

/// `x[:, ::step]` scaled and summed: each step is another trace (a slice's
/// step is an attribute of its shape class, unlike its bounds).
fn strided(x: &Tensor, step: usize) -> Result<f32> {
    x.slice(-1, 0, 64, step)?.mul(0.5)?.sum_all()?.item::<f32>()
}

/// Column `c` of `x` holds `c` in each of its 4 rows: the sum of `strided`
/// is `4 * 0.5 * (0 + step + 2 step + ...)`, exact in f32.
fn strided_sum(step: usize) -> f32 {
    (0..64).step_by(step).map(|c| 2 * c).sum::<usize>() as f32
}

#[test]
fn a_loop_that_slices_with_a_new_bound_each_step_compiles_once() {
    let ctx = Context::with_mode(Mode::DeferAndFuse).unwrap();
    let x = ctx.from_vec((0..3 * 512).map(|i| (i % 512) as f32).collect(), &[3, 512]).unwrap();
    // The sum over the first b columns of 3 rows: 3 * 0.5 * b(b-1)/2.
    let sliced = |bound: usize| -> Result<f32> {
        x.slice(-1, 0, bound as i64, 1)?.mul(0.5)?.sum_all()?.item::<f32>()
    };
    let want = |b: usize| 0.75 * (b * (b - 1)) as f32;
    // Bound 3 equals the row count, another shape class (equal sizes share
    // a symbol), which the class of bound 2 serves: one class, planned once.
    assert_eq!(sliced(2).unwrap(), want(2));
    assert_eq!(sliced(3).unwrap(), want(3));
    let planned = ctx.stats().cache;
    assert_eq!(planned.tier1.misses, 1, "{planned:?}");
    for bound in 4..=300 {
        assert_eq!(sliced(bound).unwrap(), want(bound), "bound {bound}");
    }
    let stats = ctx.stats().cache;
    assert_eq!(stats.tier1.misses, 1, "a new bound was planned again: {stats:?}");
    assert_eq!(stats.tier2.misses, planned.tier2.misses, "a new bound compiled: {stats:?}");
    assert_eq!((stats.rewrite_ns, stats.plan_ns), (planned.rewrite_ns, planned.plan_ns));
    assert_eq!(stats.resized, 298, "bounds 3 to 300 are resized from bound 2: {stats:?}");
    assert_eq!(stats.tier1.entries, 1, "{stats:?}");
}

#[test]
fn the_in_memory_tiers_stay_at_their_bound_and_a_trace_evicted_recompiles_right() {
    const BOUND: usize = 8;
    let config = Config { cache_entries: BOUND, ..Config::with_mode(Mode::DeferAndFuse) };
    let ctx = Context::new(config).unwrap();
    let x = ctx.from_vec((0..4 * 64).map(|i| (i % 64) as f32).collect(), &[4, 64]).unwrap();
    let mut peak_entries = 0;
    for step in 1..=40 {
        assert_eq!(strided(&x, step).unwrap(), strided_sum(step), "step {step}");
        let stats = ctx.stats().cache;
        peak_entries = peak_entries.max(stats.tier1.entries).max(stats.tier2.entries);
    }
    let stats = ctx.stats().cache;
    assert_eq!(peak_entries, BOUND as u64, "{stats:?}");
    assert_eq!(stats.tier1.entries, BOUND as u64, "{stats:?}");
    assert_eq!(stats.tier1.misses, 40, "{stats:?}");
    assert_eq!(stats.tier1.evictions, 40 - BOUND as u64, "{stats:?}");
    assert!(stats.tier2.evictions >= 40 - BOUND as u64, "{stats:?}");
    assert!(stats.tier1.bytes > 0 && stats.tier2.bytes > 0, "{stats:?}");

    // The first trace was evicted long ago: it misses, compiles again and
    // gives the same number; the last one is still there.
    let compile_before = stats.tier2.misses;
    assert_eq!(strided(&x, 1).unwrap(), strided_sum(1));
    assert_eq!(strided(&x, 40).unwrap(), strided_sum(40));
    let after = ctx.stats().cache;
    assert_eq!(after.tier1.misses, 41, "{after:?}");
    assert_eq!(after.tier2.misses, compile_before + 1, "{after:?}");
    assert_eq!(after.tier1.entries, BOUND as u64);
}

#[test]
fn the_byte_bound_of_the_in_memory_tiers_holds() {
    // A bound that holds only a couple of these programs.
    let probe = Context::with_mode(Mode::DeferAndFuse).unwrap();
    let x = probe.from_vec((0..4 * 64).map(|i| (i % 64) as f32).collect(), &[4, 64]).unwrap();
    strided(&x, 3).unwrap();
    let one = probe.stats().cache.tier2.bytes;
    assert!(one > 0);
    let config =
        Config { cache_memory_bytes: 2 * one + one / 2, ..Config::with_mode(Mode::DeferAndFuse) };
    let ctx = Context::new(config).unwrap();
    let x = ctx.from_vec((0..4 * 64).map(|i| (i % 64) as f32).collect(), &[4, 64]).unwrap();
    for step in 2..=20 {
        assert_eq!(strided(&x, step).unwrap(), strided_sum(step));
    }
    let stats = ctx.stats().cache;
    assert!(stats.tier2.bytes <= 2 * one + one / 2, "{stats:?}");
    assert!(stats.tier2.entries <= 3 && stats.tier2.evictions >= 16, "{stats:?}");
    assert!(stats.tier1.bytes <= 2 * one + one / 2, "{stats:?}");
}

#[test]
fn a_size_that_comes_to_equal_another_reuses_the_class_where_they_differ() {
    // A decoding step whose growing length reaches the width of a weight:
    // [n, 32] @ [32, 16] for n = 12, then n = 32, a class of its own.
    let ctx = fused(None);
    let reference =
        Context::new(Config { mode: Mode::Strict, fusion: false, ..Config::default() }).unwrap();
    let w = ctx.randn(&[32, 16], DType::F32, 5).unwrap();
    let w_ref = reference.from_vec(w.to_vec::<f32>().unwrap(), &[32, 16]).unwrap();
    let step = |ctx: &Context, w: &Tensor, n: usize| -> Vec<f32> {
        let x =
            ctx.from_vec((0..n * 32).map(|i| (i % 7) as f32 * 0.25).collect(), &[n, 32]).unwrap();
        x.matmul(w).unwrap().tanh().unwrap().mul(2.0).unwrap().to_vec::<f32>().unwrap()
    };
    step(&ctx, &w, 12);
    let planned = ctx.stats().cache;
    for n in [32, 16, 20] {
        let (got, want) = (step(&ctx, &w, n), step(&reference, &w_ref, n));
        let tol = deferfuse::differential::tolerance(DType::F32);
        assert!(got
            .iter()
            .zip(&want)
            .all(|(g, e)| deferfuse::differential::close(*g as f64, *e as f64, tol)));
    }
    let stats = ctx.stats().cache;
    assert_eq!(stats.tier1.misses, planned.tier1.misses, "a coinciding size missed: {stats:?}");
    assert_eq!(stats.rewrite_ns, planned.rewrite_ns);
    assert_eq!(stats.resized, planned.resized + 3, "{stats:?}");
}
