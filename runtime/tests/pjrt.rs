//! The PJRT backend on a real plugin (XLA's CPU plugin from the
//! `xla-cpu-pjrt` wheel; run `.ci/setup_python` first), compared with the
//! native CPU backend.

#![cfg(feature = "pjrt")]

mod pjrt_common;

use half::bf16;
use pjrt_common::*;
use rewrite_rules::program::Program;
use runtime::pjrt::{plugin_candidates, PjrtBackend, Plugin};
use runtime::{Backend, HostData, MemoryTracker};
use trace_ir::shape::shape;
use trace_ir::{ArgReduceOp, BinaryOp, DType, Distribution, Op, ReduceOp, Trace, UnaryOp};

fn ax(a: &[usize]) -> trace_ir::Axes {
    a.into()
}

#[test]
fn plugin_reports_its_versions() {
    let be = pjrt();
    let p = be.plugin();
    assert_eq!(p.api_version.0, 0, "{p:?}");
    assert!(p.api_version.1 > 0, "{p:?}");
    eprintln!("pjrt backend: {}", be.describe());
    assert_eq!(be.client().platform_name, "cpu", "{}", be.describe());
}

#[test]
fn smoke_add() {
    let be = pjrt();
    let mut t = Trace::new();
    let a = t.push_parameter(meta(&[2, 3], DType::F32));
    let b = t.push_parameter(meta(&[3], DType::F32));
    let c = t.push(Op::Binary { kind: BinaryOp::Add }, &[a, b]).unwrap();
    t.outputs = vec![c];
    let out = run_on(
        &be,
        &t,
        &[HostData::F32(vec![1., 2., 3., 4., 5., 6.]), HostData::F32(vec![10., 20., 30.])],
    )
    .unwrap();
    assert_eq!(out, vec![HostData::F32(vec![11., 22., 33., 14., 25., 36.])]);
}

#[test]
fn unary_ops_f32() {
    let be = pjrt();
    let m = meta(&[4, 5], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    let pos = t.push_parameter(m.clone());
    for kind in UnaryOp::ALL {
        if kind == UnaryOp::LogicalNot {
            continue;
        }
        let src =
            if matches!(kind, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt) { pos } else { x };
        let y = t.push(Op::Unary { kind }, &[src]).unwrap();
        t.outputs.push(y);
    }
    check(&be, "unary f32", &t, &[data(&m, 1, -3.0, 3.0), data(&m, 2, 0.1, 4.0)]);
}

#[test]
fn unary_ops_half_and_int() {
    let be = pjrt();
    for dt in [DType::BF16, DType::F16] {
        let m = meta(&[3, 4], dt);
        let mut t = Trace::new();
        let x = t.push_parameter(m.clone());
        for kind in [
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::GeluTanh,
            UnaryOp::Silu,
            UnaryOp::Neg,
            UnaryOp::Relu,
        ] {
            let y = t.push(Op::Unary { kind }, &[x]).unwrap();
            t.outputs.push(y);
        }
        check(&be, &format!("unary {dt}"), &t, &[data(&m, 3, -2.0, 2.0)]);
    }
    for dt in [DType::I32, DType::I64] {
        let m = meta(&[7], dt);
        let mut t = Trace::new();
        let x = t.push_parameter(m.clone());
        for kind in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Floor, UnaryOp::Sign] {
            let y = t.push(Op::Unary { kind }, &[x]).unwrap();
            t.outputs.push(y);
        }
        check(&be, &format!("unary {dt}"), &t, &[data(&m, 4, -5.0, 5.0)]);
    }
    let m = meta(&[6], DType::Bool);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    let y = t.push(Op::Unary { kind: UnaryOp::LogicalNot }, &[x]).unwrap();
    t.outputs.push(y);
    check(&be, "logical_not", &t, &[data(&m, 5, 0.0, 1.0)]);
}

#[test]
fn binary_ops_broadcast() {
    let be = pjrt();
    let (ma, mb) = (meta(&[2, 1, 4], DType::F32), meta(&[3, 1], DType::F32));
    let mut t = Trace::new();
    let a = t.push_parameter(ma.clone());
    let b = t.push_parameter(mb.clone());
    for kind in BinaryOp::ALL {
        if kind.is_logical() {
            continue;
        }
        let y = t.push(Op::Binary { kind }, &[a, b]).unwrap();
        t.outputs.push(y);
    }
    // Positive bases for pow.
    check(&be, "binary f32", &t, &[data(&ma, 6, 0.5, 3.0), data(&mb, 7, -2.0, 2.0)]);

    for dt in [DType::I32, DType::I64] {
        let (ma, mb) = (meta(&[4, 1], dt), meta(&[5], dt));
        let mut t = Trace::new();
        let a = t.push_parameter(ma.clone());
        let b = t.push_parameter(mb.clone());
        for kind in BinaryOp::ALL {
            if kind.is_logical() || kind == BinaryOp::Div {
                continue;
            }
            let y = t.push(Op::Binary { kind }, &[a, b]).unwrap();
            t.outputs.push(y);
        }
        let a_data = data(&ma, 8, -3.0, 4.0);
        let b_data = match dt {
            DType::I32 => HostData::I32(vec![-2, -1, 0, 2, 3]),
            _ => HostData::I64(vec![-2, -1, 0, 2, 3]),
        };
        check(&be, &format!("binary {dt}"), &t, &[a_data, b_data]);
    }

    let m = meta(&[2, 3], DType::Bool);
    let mut t = Trace::new();
    let a = t.push_parameter(m.clone());
    let b = t.push_parameter(meta(&[3], DType::Bool));
    for kind in [BinaryOp::LogicalAnd, BinaryOp::LogicalOr, BinaryOp::Eq, BinaryOp::Lt] {
        let y = t.push(Op::Binary { kind }, &[a, b]).unwrap();
        t.outputs.push(y);
    }
    check(
        &be,
        "binary bool",
        &t,
        &[
            HostData::Bool(vec![true, false, true, false, false, true]),
            HostData::Bool(vec![true, true, false]),
        ],
    );
}

#[test]
fn where_and_compare() {
    let be = pjrt();
    let (ma, mb) = (meta(&[3, 4], DType::F32), meta(&[4], DType::F32));
    let mut t = Trace::new();
    let a = t.push_parameter(ma.clone());
    let b = t.push_parameter(mb.clone());
    let c = t.push(Op::Binary { kind: BinaryOp::Gt }, &[a, b]).unwrap();
    let w = t.push(Op::Where, &[c, a, b]).unwrap();
    t.outputs = vec![c, w];
    check(&be, "where", &t, &[data(&ma, 9, -1.0, 1.0), data(&mb, 10, -1.0, 1.0)]);
}

#[test]
fn reductions() {
    let be = pjrt();
    let m = meta(&[3, 4, 5], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    for kind in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for (axes, keepdim) in [
            (vec![0], false),
            (vec![1, 2], true),
            (vec![2, 0], false),
            (vec![0, 1, 2], false),
            (vec![], false),
        ] {
            let y = t.push(Op::Reduce { kind, axes: ax(&axes), keepdim }, &[x]).unwrap();
            t.outputs.push(y);
        }
    }
    for kind in [ArgReduceOp::Argmax, ArgReduceOp::Argmin] {
        for axis in 0..3 {
            let y = t.push(Op::ArgReduce { kind, axis, keepdim: axis == 1 }, &[x]).unwrap();
            t.outputs.push(y);
        }
    }
    check(&be, "reduce f32", &t, &[data(&m, 11, 0.5, 1.5)]);

    for dt in [DType::I32, DType::I64, DType::BF16] {
        let m = meta(&[4, 6], dt);
        let mut t = Trace::new();
        let x = t.push_parameter(m.clone());
        for kind in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
            let y = t.push(Op::Reduce { kind, axes: ax(&[1]), keepdim: false }, &[x]).unwrap();
            t.outputs.push(y);
        }
        for kind in [ArgReduceOp::Argmax, ArgReduceOp::Argmin] {
            let y = t.push(Op::ArgReduce { kind, axis: 1, keepdim: false }, &[x]).unwrap();
            t.outputs.push(y);
        }
        check(&be, &format!("reduce {dt}"), &t, &[data(&m, 12, -3.0, 3.0)]);
    }
}

#[test]
fn argmax_ties_and_nan() {
    let be = pjrt();
    let m = meta(&[4, 4], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m);
    for kind in [ArgReduceOp::Argmax, ArgReduceOp::Argmin] {
        for axis in 0..2 {
            let y = t.push(Op::ArgReduce { kind, axis, keepdim: false }, &[x]).unwrap();
            t.outputs.push(y);
        }
    }
    let nan = f32::NAN;
    let v = vec![1., 3., 3., 0., nan, 2., nan, 2., 5., 5., 5., 5., -1., f32::NEG_INFINITY, 7., 7.];
    check(&be, "argmax ties/nan", &t, &[HostData::F32(v)]);
}

#[test]
fn matmul_batched() {
    let be = pjrt();
    for (sa, sb) in
        [(vec![3, 4], vec![4, 5]), (vec![2, 1, 3, 4], vec![5, 4, 6]), (vec![2, 3, 4], vec![4, 2])]
    {
        for dt in [DType::F32, DType::BF16] {
            let (ma, mb) = (meta(&sa, dt), meta(&sb, dt));
            let mut t = Trace::new();
            let a = t.push_parameter(ma.clone());
            let b = t.push_parameter(mb.clone());
            let y = t.push(Op::MatMul, &[a, b]).unwrap();
            t.outputs = vec![y];
            check(
                &be,
                &format!("matmul {sa:?} x {sb:?} {dt}"),
                &t,
                &[data(&ma, 13, -1.0, 1.0), data(&mb, 14, -1.0, 1.0)],
            );
        }
    }
}

#[test]
fn casts_between_all_dtypes() {
    let be = pjrt();
    for from in DType::ALL {
        let m = meta(&[9], from);
        let mut t = Trace::new();
        let x = t.push_parameter(m.clone());
        for to in DType::ALL {
            let y = t.push(Op::Cast { to }, &[x]).unwrap();
            t.outputs.push(y);
        }
        let input = match from {
            DType::F32 => HostData::F32(vec![-2.75, -1.5, -0.25, 0.0, 0.5, 1.0, 2.5, 100.75, -7.0]),
            DType::BF16 => HostData::BF16(
                [-2.75f32, -1.5, -0.25, 0.0, 0.5, 1.0, 2.5, 100.5, -7.0]
                    .map(bf16::from_f32)
                    .to_vec(),
            ),
            _ => data(&m, 15, -10.0, 10.0),
        };
        check(&be, &format!("cast from {from}"), &t, &[input]);
    }
}

#[test]
fn layout_ops() {
    let be = pjrt();
    let m = meta(&[4, 6], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(m.clone());
    let y = t.push_parameter(meta(&[4, 2], DType::F32));
    let s = t.push(Op::Slice { axis: 1, start: 1, stop: 6, step: 2 }, &[x]).unwrap();
    let p = t.push(Op::Permute { perm: ax(&[1, 0]) }, &[x]).unwrap();
    let r = t.push(Op::Reshape { shape: shape(&[2, 3, 4]) }, &[x]).unwrap();
    let e = t.push(Op::Expand { shape: shape(&[3, 4, 6]) }, &[x]).unwrap();
    let c = t.push(Op::Concat { axis: 1 }, &[x, y, s]).unwrap();
    let p3 = t.push(Op::Permute { perm: ax(&[2, 0, 1]) }, &[r]).unwrap();
    let f = t.push(Op::Full { value: 2.5, shape: shape(&[2, 2]), dtype: DType::F32 }, &[]).unwrap();
    let fi = t.push(Op::Full { value: -3.0, shape: shape(&[3]), dtype: DType::I32 }, &[]).unwrap();
    let fb = t.push(Op::Full { value: 1.0, shape: shape(&[]), dtype: DType::Bool }, &[]).unwrap();
    let a = t.push(Op::Arange { start: 1.0, step: 0.5, len: 7, dtype: DType::F32 }, &[]).unwrap();
    let ai = t.push(Op::Arange { start: -3.0, step: 2.0, len: 5, dtype: DType::I64 }, &[]).unwrap();
    let ab = t.push(Op::Arange { start: 0.0, step: 1.0, len: 4, dtype: DType::BF16 }, &[]).unwrap();
    t.outputs = vec![s, p, r, e, c, p3, f, fi, fb, a, ai, ab, x];
    check(
        &be,
        "layout",
        &t,
        &[data(&m, 16, -1.0, 1.0), data(&meta(&[4, 2], DType::F32), 17, -1.0, 1.0)],
    );
}

#[test]
fn row_gather_and_scatter_add() {
    let be = pjrt();
    let table = meta(&[5, 3], DType::F32);
    let mut t = Trace::new();
    let x = t.push_parameter(table.clone());
    let idx = t.push_parameter(meta(&[6], DType::I64));
    let upd = t.push_parameter(meta(&[6, 3], DType::F32));
    let col = t.push_parameter(meta(&[5], DType::BF16));
    let idx32 = t.push_parameter(meta(&[6], DType::I32));
    let g = t.push(Op::GatherRows, &[x, idx]).unwrap();
    let g1 = t.push(Op::GatherRows, &[col, idx32]).unwrap();
    let s = t.push(Op::ScatterAddRows { rows: 5 }, &[idx, upd]).unwrap();
    t.outputs = vec![g, g1, s];
    // Repeated rows add up; every index is in range (out of range, XLA and
    // the CPU backend agree only on the rule, not on a checked result).
    let rows = vec![4i64, 0, 2, 4, 4, 1];
    check(
        &be,
        "rows",
        &t,
        &[
            data(&table, 18, -1.0, 1.0),
            HostData::I64(rows.clone()),
            data(&meta(&[6, 3], DType::F32), 19, -1.0, 1.0),
            data(&meta(&[5], DType::BF16), 20, -1.0, 1.0),
            HostData::I32(rows.iter().map(|&i| i as i32).collect()),
        ],
    );
}

#[test]
fn fused_row_forms() {
    let be = pjrt();
    for dt in [DType::F32, DType::BF16] {
        let m = meta(&[3, 4, 8], dt);
        let mut t = Trace::new();
        let x = t.push_parameter(m.clone());
        let eps = t.push_parameter(meta(&[], dt));
        let sm = t.push(Op::Softmax { axis: 2 }, &[x]).unwrap();
        let sm0 = t.push(Op::Softmax { axis: 0 }, &[x]).unwrap();
        let lsm = t.push(Op::LogSoftmax { axis: 1 }, &[x]).unwrap();
        let ln = t.push(Op::LayerNorm { axes: ax(&[2]) }, &[x, eps]).unwrap();
        let ln2 = t.push(Op::LayerNorm { axes: ax(&[1, 2]) }, &[x, eps]).unwrap();
        let rms = t.push(Op::RmsNorm { axes: ax(&[2]) }, &[x, eps]).unwrap();
        t.outputs = vec![sm, sm0, lsm, ln, ln2, rms];
        let eps_v = match dt {
            DType::F32 => HostData::F32(vec![1e-5]),
            _ => HostData::BF16(vec![bf16::from_f32(1e-5)]),
        };
        check(&be, &format!("row forms {dt}"), &t, &[data(&m, 18, -3.0, 3.0), eps_v]);
    }
}

#[test]
fn scalars_empty_tensors_and_no_outputs() {
    let be = pjrt();
    let mut t = Trace::new();
    let s = t.push_parameter(meta(&[], DType::F32));
    let z = t.push_parameter(meta(&[0, 3], DType::F32));
    let e = t.push(Op::Unary { kind: UnaryOp::Exp }, &[s]).unwrap();
    let zs =
        t.push(Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[0]), keepdim: false }, &[z]).unwrap();
    let zn = t.push(Op::Unary { kind: UnaryOp::Neg }, &[z]).unwrap();
    t.outputs = vec![e, zs, zn, s];
    check(&be, "scalars and empty", &t, &[HostData::F32(vec![0.5]), HostData::F32(vec![])]);

    let mut t = Trace::new();
    let _x = t.push_parameter(meta(&[2], DType::F32));
    let out = run_on(&be, &t, &[HostData::F32(vec![1.0, 2.0])]).unwrap();
    assert!(out.is_empty());
}

#[test]
fn random_traces_match_cpu() {
    let be = pjrt();
    let mut checked = 0;
    for seed in 0..40u64 {
        let bytes: Vec<u8> = noise(200, seed + 100, 0.0, 256.0).iter().map(|&x| x as u8).collect();
        let g = trace_ir::generate::random_trace(&mut trace_ir::generate::Bytes::new(&bytes), 12);
        // Discontinuous ops only on exact inputs, domain edges guarded: a
        // 1-ulp difference between XLA's and our transcendentals must not
        // flip a comparison.
        let trace = trace_ir::generate::well_conditioned(&g.trace);
        if trace.outputs.is_empty() {
            continue;
        }
        let inputs: Vec<HostData> = trace
            .parameters()
            .iter()
            .enumerate()
            .map(|(i, &p)| data(trace.meta(p), seed * 10 + i as u64, 0.1, 2.0))
            .collect();
        check(&be, &format!("random trace {seed}"), &trace, &inputs);
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} traces checked");
}

#[test]
fn compile_cache_and_serialization() {
    let be = pjrt();
    let mut t = Trace::new();
    let x = t.push_parameter(meta(&[8], DType::F32));
    let y = t.push(Op::Unary { kind: UnaryOp::Tanh }, &[x]).unwrap();
    t.outputs = vec![y];
    let input = data(&meta(&[8], DType::F32), 19, -1.0, 1.0);
    let a = run_on(&be, &t, std::slice::from_ref(&input)).unwrap();
    let b = run_on(&be, &t, std::slice::from_ref(&input)).unwrap();
    assert_eq!(a, b);
    // Each run uploads its input and holds it alone, so the run donates it:
    // the module and its donating variant compile once each, then both hit.
    let stats = be.cache_stats();
    assert_eq!((stats.compiles, stats.hits), (2, 2), "{stats:?}");
    assert_eq!(be.stats().donated, 2);

    // Serialize the executable and load it back.
    let exe = be.compile_trace(&t).unwrap();
    let bytes = exe.loaded().unwrap().serialize().unwrap();
    assert!(!bytes.is_empty());
    let loaded = be.client().deserialize(&bytes).unwrap();
    let dev = be.client().upload(&input, &[8]).unwrap();
    let mut outs = loaded.execute(&[&dev]).unwrap();
    assert_eq!(outs.len(), 1);
    let out = outs.remove(0);
    let _ = out; // dtype/numel of raw outputs are set by the backend; read through it:
    let again = run_on(&be, &t, &[input]).unwrap();
    assert_eq!(again, a);
}

#[test]
fn random_matches_the_cpu_stream() {
    let be = pjrt();
    let mut t = Trace::new();
    for (seed, dist) in [
        (3u64, Distribution::Uniform),
        (7, Distribution::Normal),
        (u64::MAX, Distribution::Uniform),
    ] {
        for dt in [DType::F32, DType::BF16, DType::F16] {
            let r =
                t.push(Op::Random { seed, dist, shape: shape(&[3, 5]), dtype: dt }, &[]).unwrap();
            t.outputs.push(r);
        }
    }
    check(&be, "random", &t, &[]);
}

#[test]
fn bad_plugin_paths_give_clear_errors() {
    let missing = std::path::Path::new("/nonexistent/dir/plugin.so");
    let e = PjrtBackend::with_plugin(missing, MemoryTracker::new()).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/dir/plugin.so"), "{e}");
    // A plugin named explicitly is the only candidate, and must be a file.
    let e = plugin_candidates(Some(missing)).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/dir/plugin.so") && e.contains("does not name a file"), "{e}");
    let real = pjrt().plugin().path.clone();
    assert_eq!(plugin_candidates(Some(&real)).unwrap(), vec![real]);

    let dir = std::env::temp_dir().join(format!("deferfuse-pjrt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("not_a_plugin.so");
    std::fs::write(&junk, b"this is not a shared library").unwrap();
    let e = Plugin::load(&junk).unwrap_err().to_string();
    assert!(e.contains("not_a_plugin.so") && e.contains("cannot load PJRT plugin"), "{e}");

    // A real shared library without GetPjrtApi.
    let libc = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
    ]
    .iter()
    .map(std::path::Path::new)
    .find(|p| p.exists());
    if let Some(lib) = libc {
        let e = Plugin::load(lib).unwrap_err().to_string();
        assert!(
            e.contains("is not a PJRT plugin") && e.contains("GetPjrtApi") && e.contains("0.81"),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fused_programs_are_refused_with_the_kernel_named() {
    let be = pjrt();
    let mut t = Trace::new();
    let x = t.push_parameter(meta(&[4, 8], DType::F32));
    let e = t.push(Op::Unary { kind: UnaryOp::Exp }, &[x]).unwrap();
    let n = t.push(Op::Unary { kind: UnaryOp::Neg }, &[e]).unwrap();
    t.outputs = vec![n];
    let program = rewrite_rules::plan(&t, &rewrite_rules::PlanConfig::default()).unwrap();
    if program
        .kernels
        .iter()
        .all(|k| matches!(k.kind, rewrite_rules::program::KernelKind::Single { .. }))
    {
        return; // the planner did not fuse: nothing to refuse
    }
    let err = be.compile(&program).err().expect("fused kernels are not lowered").to_string();
    eprintln!("fused program refused: {err}");
    assert!(err.contains("unfused") && err.contains("pjrt"), "{err}");
}

#[test]
#[should_panic(expected = "element 1")]
fn the_comparison_catches_a_mismatch() {
    assert_close("self-check", &HostData::F32(vec![1.0, 2.0]), &HostData::F32(vec![1.0, 2.001]));
}

/// An input only the run holds is donated (its memory becomes an output);
/// one the caller still holds is not, and stays readable with its values.
#[test]
fn donation_only_takes_inputs_nobody_holds() {
    let be = pjrt();
    let mut t = Trace::new();
    let p = t.push_parameter(meta(&[1000], DType::F32));
    let g = t.push_parameter(meta(&[1000], DType::F32));
    let scaled = t.push(Op::Binary { kind: BinaryOp::Mul }, &[g, g]).unwrap();
    let new_p = t.push(Op::Binary { kind: BinaryOp::Sub }, &[p, scaled]).unwrap();
    let twice = t.push(Op::Binary { kind: BinaryOp::Add }, &[new_p, new_p]).unwrap();
    t.outputs = vec![new_p, twice];
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    let (pv, gv) = (noise(1000, 1, -1.0, 1.0), noise(1000, 2, -1.0, 1.0));
    let want: Vec<f32> = pv.iter().zip(&gv).map(|(p, g)| p - g * g).collect();
    let upload =
        |v: &[f32]| be.upload(meta(&[1000], DType::F32), HostData::F32(v.to_vec())).unwrap();
    let read = |b: &runtime::Buffer| match be.download(b).unwrap() {
        HostData::F32(v) => v,
        other => panic!("{other:?}"),
    };
    // XLA may fuse `p - g * g` into one multiply-add: allow its rounding.
    let close = |got: Vec<f32>, want: &[f32]| {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "element {i}: {g} vs {w}");
        }
    };
    let doubled: Vec<f32> = want.iter().map(|x| x + x).collect();

    // The caller keeps both inputs: nothing is donated, both stay readable.
    let (p_buf, g_buf) = (upload(&pv), upload(&gv));
    let outs = exe.run(vec![p_buf.clone(), g_buf.clone()]).unwrap();
    assert_eq!(be.stats().donated, 0);
    close(read(&outs[0]), &want);
    assert_eq!(read(&p_buf), pv);
    assert_eq!(read(&g_buf), gv);

    // The caller keeps g only: p is donated to the first output of its shape.
    let outs = exe.run(vec![upload(&pv), g_buf.clone()]).unwrap();
    assert_eq!(be.stats().donated, 1);
    close(read(&outs[0]), &want);
    close(read(&outs[1]), &doubled);
    assert_eq!(read(&g_buf), gv);

    // Both given away: each goes to its own output, and a second run with
    // the same pattern reuses the variant compiled for it.
    let compiles = be.cache_stats().compiles;
    for _ in 0..2 {
        let outs = exe.run(vec![upload(&pv), upload(&gv)]).unwrap();
        close(read(&outs[0]), &want);
        close(read(&outs[1]), &doubled);
    }
    assert_eq!(be.stats().donated, 5);
    assert_eq!(be.cache_stats().compiles, compiles + 1);
}

/// Zero-dimensional uploads of one value share one device buffer (a Rust
/// scalar in an op is uploaded at every call), which runs never donate.
#[test]
fn equal_scalars_upload_once_and_are_never_donated() {
    let be = pjrt();
    let scalar = |v: f32| be.upload(meta(&[], DType::F32), HostData::F32(vec![v])).unwrap();
    let before = be.stats().host_to_device;
    let (a, b) = (scalar(0.125), scalar(0.125));
    assert_eq!(
        be.stats().host_to_device,
        before + 1,
        "the second upload of 0.125 transferred again"
    );
    let c = scalar(0.25);
    assert_eq!(be.stats().host_to_device, before + 2);
    let mut t = Trace::new();
    let x = t.push_parameter(meta(&[], DType::F32));
    let y = t.push_parameter(meta(&[], DType::F32));
    let s = t.push(Op::Binary { kind: BinaryOp::Add }, &[x, y]).unwrap();
    t.outputs = vec![s];
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    // The run holds the only references to both buffers: still no donation.
    let out = exe.run(vec![a, c]).unwrap();
    assert_eq!(be.download(&out[0]).unwrap(), HostData::F32(vec![0.375]));
    assert_eq!(be.stats().donated, 0);
    assert_eq!(be.download(&b).unwrap(), HostData::F32(vec![0.125]));
    assert_eq!(be.download(&scalar(0.25)).unwrap(), HostData::F32(vec![0.25]));
}
