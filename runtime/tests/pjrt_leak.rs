//! Runs one compiled PJRT program 10,000 times, each run fed by the last
//! one's device-resident output, and checks that the process's resident
//! memory does not grow (every device buffer, event and error the backend
//! creates is freed). Its own test binary, so no other test
//! allocates meanwhile.

#![cfg(feature = "pjrt")]

mod pjrt_common;

use pjrt_common::*;
use std::sync::Arc;

use rewrite_rules::program::Program;
use runtime::Backend;
use trace_ir::{BinaryOp, DType, Op, ReduceOp, Trace, UnaryOp};

/// Resident set size in bytes, from /proc/self/statm.
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize =
        s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("statm format");
    pages * 4096
}

#[test]
fn ten_thousand_device_resident_runs_do_not_grow_rss() {
    let be = pjrt();
    let m = meta(&[64, 64], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    let w = t.push_parameter(m.clone());
    let y = t.push(Op::MatMul, &[x, w]).unwrap();
    let z = t.push(Op::Unary { kind: UnaryOp::Tanh }, &[y]).unwrap();
    let s = t.push(Op::Binary { kind: BinaryOp::Add }, &[z, x]).unwrap();
    let r = t
        .push(
            Op::Reduce {
                kind: ReduceOp::Sum,
                axes: [1usize].into_iter().collect(),
                keepdim: false,
            },
            &[s],
        )
        .unwrap();
    t.outputs = vec![s, r];
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    let weight = be.upload(m.clone(), data(&m, 2, -0.1, 0.1)).unwrap();
    // Each run feeds the next: its first output is the next run's input, on
    // the device; every 100th run reads the reduction back to the host.
    let mut state = be.upload(m.clone(), data(&m, 1, -1.0, 1.0)).unwrap();
    let step = |i: usize, state: &mut Arc<runtime::Buffer>| {
        let mut outs = exe.run(vec![state.clone(), weight.clone()]).unwrap();
        let sums = outs.pop().unwrap();
        *state = outs.pop().unwrap();
        if i.is_multiple_of(100) {
            assert_eq!(be.download(&sums).unwrap().len(), 64);
        }
    };
    // Warm up: let allocators and the plugin's thread pools settle.
    for i in 0..500 {
        step(i, &mut state);
    }
    let live = be.memory().stats().live_bytes;
    let before = rss();
    for i in 0..10_000 {
        step(i, &mut state);
    }
    let after = rss();
    let stats = be.stats();
    assert_eq!(be.cache_stats().compiles, 1, "{stats:?}");
    assert_eq!(
        (stats.host_to_device, stats.device_to_host),
        (2, 105),
        "only reads download: {stats:?}"
    );
    assert_eq!(be.memory().stats().live_bytes, live, "device buffers accumulate");
    drop((state, weight));
    assert_eq!(be.memory().stats().live_bytes, 0, "buffers still counted as live");
    let grown = after.saturating_sub(before);
    eprintln!("rss before {before} after {after} (grew {grown} bytes over 10000 runs)");
    assert!(grown < 4 << 20, "rss grew by {grown} bytes over 10000 runs");
}
