//! The differential run at scale: generated traces, made well conditioned
//! (`deferfuse::differential::checked_trace`), run fused and op by op and
//! must agree within the written tolerances.
//!
//! ```text
//! cargo run --release -p deferfuse --example differential -- --traces 1000000
//! ```
//!
//! Trace `i` is built from bytes that depend only on `i`, so `--from i
//! --traces 1 --verbose` replays one. It prints the count, the time, what the
//! compared traces covered (ops, dtypes, ranks, shape classes) and every
//! mismatch; it exits 1 on a mismatch or when an op or a dtype of the IR was
//! never compared.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use deferfuse::differential::{check_trace, checked_trace, trace_bytes};
use trace_ir::{BinaryOp, DType, ShapeClass, Trace, UnaryOp};

/// What the compared traces held.
#[derive(Default)]
struct Coverage {
    ops: BTreeMap<&'static str, u64>,
    dtypes: BTreeMap<&'static str, u64>,
    ranks: BTreeMap<usize, u64>,
    /// Values with a dimension of size 0, and of size 1 (broadcasting).
    empty: u64,
    unit: u64,
    classes: HashSet<u64>,
}

impl Coverage {
    fn add(&mut self, trace: &Trace) {
        for node in &trace.nodes {
            *self.ops.entry(node.op.name()).or_default() += 1;
            *self.dtypes.entry(node.meta.dtype.name()).or_default() += 1;
            *self.ranks.entry(node.meta.shape.len()).or_default() += 1;
            self.empty += u64::from(node.meta.shape.contains(&0));
            self.unit += u64::from(node.meta.shape.contains(&1));
        }
        self.classes.insert(ShapeClass::of(trace).signature.stable_hash());
    }

    fn merge(&mut self, other: Coverage) {
        for (k, n) in other.ops {
            *self.ops.entry(k).or_default() += n;
        }
        for (k, n) in other.dtypes {
            *self.dtypes.entry(k).or_default() += n;
        }
        for (k, n) in other.ranks {
            *self.ranks.entry(k).or_default() += n;
        }
        self.empty += other.empty;
        self.unit += other.unit;
        self.classes.extend(other.classes);
    }

    /// The ops and dtypes of the IR that no compared trace held.
    fn missing(&self) -> Vec<&'static str> {
        let fixed = [
            "parameter",
            "full",
            "arange",
            "rand",
            "randn",
            "where",
            "cast",
            "sum",
            "mean",
            "max",
            "min",
            "prod",
            "argmax",
            "argmin",
            "expand",
            "reshape",
            "permute",
            "slice",
            "concat",
            "matmul",
            "softmax",
            "log_softmax",
            "layer_norm",
            "rms_norm",
        ];
        let ops = UnaryOp::ALL
            .iter()
            .map(|k| k.name())
            .chain(BinaryOp::ALL.iter().map(|k| k.name()))
            .chain(fixed);
        let dtypes = DType::ALL.iter().map(|d| d.name());
        ops.filter(|op| !self.ops.contains_key(op))
            .chain(dtypes.filter(|d| !self.dtypes.contains_key(d)))
            .collect()
    }
}

fn main() {
    let mut traces = 10_000u64;
    let mut from = 0u64;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut verbose = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value =
            || args.next().and_then(|v| v.parse().ok()).expect("a number after the flag");
        match a.as_str() {
            "--traces" => traces = value(),
            "--from" => from = value(),
            "--threads" => threads = value() as usize,
            "--verbose" => verbose = true,
            _ => {
                eprintln!("usage: differential [--traces N] [--from I] [--threads T] [--verbose]");
                std::process::exit(2);
            }
        }
    }
    let start = Instant::now();
    let next = AtomicU64::new(from);
    let failed = AtomicU64::new(0);
    let coverage = Mutex::new(Coverage::default());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let backend = runtime::CpuBackend::new(runtime::MemoryTracker::new());
                let mut seen = Coverage::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= from + traces {
                        break;
                    }
                    let bytes = trace_bytes(i);
                    let trace = checked_trace(&bytes);
                    seen.add(&trace);
                    let seed = trace_ir::signature::stable_hash64(&bytes);
                    // A panic is a mismatch too: say which trace, then go on.
                    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        check_trace(&trace, seed, &backend)
                    }));
                    let checked = checked.unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("a panic");
                        Err(format!("panicked: {what}\ntrace: {}", trace.to_json()))
                    });
                    if let Err(msg) = checked {
                        failed.fetch_add(1, Ordering::Relaxed);
                        // The first line says what differs; the rest is the trace.
                        let shown = if verbose { &msg } else { msg.lines().next().unwrap_or("") };
                        eprintln!("trace {i}: {shown}");
                    }
                }
                coverage.lock().unwrap().merge(seen);
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let failed = failed.into_inner();
    let coverage = coverage.into_inner().unwrap();
    let list = |m: &BTreeMap<&str, u64>| {
        m.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    };
    println!("ops: {}", list(&coverage.ops));
    println!("dtypes: {}", list(&coverage.dtypes));
    let ranks: Vec<String> = coverage.ranks.iter().map(|(r, n)| format!("{r}: {n}")).collect();
    println!(
        "ranks: {}; values with a size-0 dim {}, with a size-1 dim {}; {} shape classes",
        ranks.join(", "),
        coverage.empty,
        coverage.unit,
        coverage.classes.len()
    );
    let rate = traces as f64 / secs;
    println!(
        "{traces} traces from {from} in {secs:.1} s ({rate:.0}/s, {threads} threads): \
         {failed} mismatches"
    );
    let missing = coverage.missing();
    if !missing.is_empty() {
        println!("never compared: {}", missing.join(", "));
    }
    std::process::exit(i32::from(failed > 0 || !missing.is_empty()));
}
