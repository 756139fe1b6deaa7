//! Runs one compiled PJRT program many times and checks that the process's
//! resident memory does not grow (every device buffer, event and error the
//! backend creates is freed). Its own test binary, so no other test
//! allocates meanwhile.

#![cfg(feature = "pjrt")]

mod pjrt_common;

use pjrt_common::*;
use runtime::{Backend, HostData};
use trace_ir::{BinaryOp, DType, Op, ReduceOp, Trace, UnaryOp};

/// Resident set size in bytes, from /proc/self/statm.
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize = s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("statm format");
    pages * 4096
}

#[test]
fn thousand_cached_runs_do_not_grow_rss() {
    let be = pjrt();
    let m = meta(&[64, 64], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    let w = t.push_parameter(m.clone());
    let y = t.push(Op::MatMul, &[x, w]).unwrap();
    let z = t.push(Op::Unary { kind: UnaryOp::Tanh }, &[y]).unwrap();
    let s = t.push(Op::Binary { kind: BinaryOp::Add }, &[z, x]).unwrap();
    let r = t.push(Op::Reduce { kind: ReduceOp::Sum, axes: [1usize].into_iter().collect(), keepdim: false }, &[s]).unwrap();
    t.outputs = vec![s, r];
    let inputs = [data(&m, 1, -1.0, 1.0), data(&m, 2, -1.0, 1.0)];
    let once = |be: &runtime::pjrt::PjrtBackend| -> Vec<HostData> { run_on(be, &t, &inputs).unwrap() };
    // Warm up: compile, let allocators and the plugin's thread pools settle.
    for _ in 0..100 {
        once(&be);
    }
    let before = rss();
    for _ in 0..1000 {
        once(&be);
    }
    let after = rss();
    let stats = be.cache_stats();
    assert_eq!(stats.compiles, 1, "{stats:?}");
    assert_eq!(be.memory().stats().live_bytes, 0, "buffers still counted as live");
    let grown = after.saturating_sub(before);
    eprintln!("rss before {before} after {after} (grew {grown} bytes over 1000 runs)");
    assert!(grown < 4 << 20, "rss grew by {grown} bytes over 1000 runs");
}
