//! Criterion benchmarks of each workload in Strict and DeferAndFuse (quick sizes).

use benches::{workload, Size, NAMES};
use criterion::{criterion_group, criterion_main, Criterion};
use deferfuse::{Context, Mode};

fn workloads(c: &mut Criterion) {
    let mut group = c.benchmark_group("workloads");
    group.sample_size(10);
    for name in NAMES {
        for mode in [Mode::Strict, Mode::DeferAndFuse] {
            let ctx = Context::with_mode(mode).unwrap();
            let w = workload(&ctx, name, Size::Quick).unwrap();
            group.bench_function(format!("{name}/{mode}"), |b| {
                b.iter(|| {
                    let out = (w.step)(&w.inputs).unwrap();
                    ctx.sync().unwrap();
                    out
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, workloads);
criterion_main!(benches);
