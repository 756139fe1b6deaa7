//! What one op costs the engine itself, apart from its arithmetic: chains of
//! 1000 elementwise ops on 8 floats, in Strict (each op compiled once, then
//! looked up and run), and in DeferAndFuse (recorded, then one flush that hits
//! the program cache). Criterion reports time per chain; divide by 1000.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deferfuse::{Context, DType, Mode};

const CHAIN: usize = 1000;

fn per_op(c: &mut Criterion) {
    let mut group = c.benchmark_group("per_op");
    group.throughput(Throughput::Elements(CHAIN as u64));
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = Context::with_mode(mode).unwrap();
        let x = ctx.ones(&[8], DType::F32).unwrap();
        for (op, by_tensor) in [("mul_tensor", true), ("mul_rust_scalar", false)] {
            group.bench_function(format!("{mode}/{op}"), |b| {
                b.iter(|| {
                    let mut y = x.clone();
                    for _ in 0..CHAIN {
                        y = if by_tensor { y.mul(&x) } else { y.mul(1.0) }.unwrap();
                    }
                    y.to_vec::<f32>().unwrap()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, per_op);
criterion_main!(benches);
