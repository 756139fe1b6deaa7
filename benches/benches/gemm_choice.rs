//! Chooses the GEMM crate of the CPU backend: `gemm` against `matrixmultiply`
//! on the shapes the workloads use (f32, row-major).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn with_gemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    // SAFETY: the slices hold m*k, k*n and m*n elements with the strides given.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

fn with_matrixmultiply(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    // SAFETY: as above.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

fn gemm_choice(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_choice");
    group.sample_size(10);
    for (m, k, n) in [(256, 1024, 4096), (256, 4096, 1024), (128, 64, 128), (1024, 256, 256)] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut out = vec![0.0f32; m * n];
        let id = format!("{m}x{k}x{n}");
        group.bench_with_input(BenchmarkId::new("gemm", &id), &(), |bench, _| {
            bench.iter(|| with_gemm(m, k, n, &a, &b, &mut out))
        });
        group.bench_with_input(BenchmarkId::new("matrixmultiply", &id), &(), |bench, _| {
            bench.iter(|| with_matrixmultiply(m, k, n, &a, &b, &mut out))
        });
    }
    group.finish();
}

criterion_group!(benches, gemm_choice);
criterion_main!(benches);
