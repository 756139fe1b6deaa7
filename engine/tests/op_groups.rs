//! Op groups: in Strict, one user-level op (a layer norm, a softmax, or
//! primitives a binding groups) runs as one program on the stream, and
//! computes what DeferAndFuse computes.

use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

fn strict() -> Context {
    Context::new(Config { mode: Mode::Strict, cache_dir: None, ..Config::default() }).unwrap()
}

/// Programs looked up in tier 1 so far: one per Strict job.
fn programs(ctx: &Context) -> u64 {
    let t1 = ctx.stats().cache.tier1;
    t1.hits + t1.misses
}

fn close(a: &[f32], b: &[f32]) -> bool {
    // f32 fused kernels on both sides (docs/numerics.md): a few ulps.
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 + 1e-5 * y.abs())
}

#[test]
fn a_layer_norm_in_strict_is_one_program_and_matches_defer_and_fuse() {
    let run = |ctx: &Context| -> Vec<f32> {
        let x = ctx.randn(&[64, 48], DType::F32, 1).unwrap();
        let w = ctx.randn(&[48], DType::F32, 2).unwrap();
        let b = ctx.randn(&[48], DType::F32, 3).unwrap();
        ctx.sync().unwrap();
        let before = (programs(ctx), ctx.stats().ops_recorded);
        let y = x.layer_norm(&[48], Some(&w), Some(&b), 1e-5).unwrap();
        let out = y.to_vec::<f32>().unwrap();
        if ctx.mode() == Mode::Strict {
            let ops = ctx.stats().ops_recorded - before.1;
            assert!(ops >= 7, "a layer norm is several primitives ({ops})");
            assert_eq!(programs(ctx) - before.0, 1, "one program for the whole op");
        }
        out
    };
    let fused = Context::with_mode(Mode::DeferAndFuse).unwrap();
    assert!(close(&run(&strict()), &run(&fused)));
}

#[test]
fn groups_nest_and_a_read_inside_a_group_runs_what_it_recorded() {
    let ctx = strict();
    let x = ctx.randn(&[8, 16], DType::F32, 4).unwrap();
    let outer = ctx.op_group("outer");
    let s = x.softmax(-1).unwrap(); // an inner group joins the outer one
    let total: f32 = s.sum_all().unwrap().item().unwrap(); // a read inside the group
    let y = s.mul(total as f64).unwrap();
    let y = outer.end(Ok(y)).unwrap();
    let rows = y.sum(&[-1], false).unwrap().to_vec::<f32>().unwrap();
    assert!((total - 8.0).abs() < 1e-4, "{total}");
    assert!(rows.iter().all(|r| (r - 8.0).abs() < 1e-3), "{rows:?}");
}

#[test]
fn an_error_inside_a_group_closes_it_and_the_context_goes_on() {
    let ctx = strict();
    let x = ctx.randn(&[4, 6], DType::F32, 5).unwrap();
    let bad: Result<Tensor> = (|| {
        let group = ctx.op_group("bad");
        let y = x.exp()?;
        let z = y.matmul(&y)?; // [4, 6] @ [4, 6]: refused at the call
        group.end(Ok(z))
    })();
    let err = bad.unwrap_err().to_string();
    assert!(err.contains("matmul"), "{err}");
    // The group closed on the early return: ops run on their own again.
    let before = programs(&ctx);
    let v = x.relu().unwrap().sum_all().unwrap().item::<f32>().unwrap();
    assert!(v >= 0.0);
    assert!(programs(&ctx) - before >= 2, "relu and sum run as their own programs");
}

#[test]
fn a_group_is_one_program_per_thread_even_when_threads_share_a_context() {
    let ctx = strict();
    let x = ctx.randn(&[32, 32], DType::F32, 6).unwrap();
    let want = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..20 {
                    let got = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
                    assert_eq!(got, want);
                }
            });
        }
    });
}

#[test]
fn groups_change_nothing_in_the_other_modes() {
    for mode in [Mode::Debug, Mode::DeferAndFuse] {
        let ctx = Context::with_mode(mode).unwrap();
        let x = ctx.randn(&[8, 8], DType::F32, 7).unwrap();
        let group = ctx.op_group("noop");
        let y = group.end(x.exp()).unwrap();
        assert_eq!(y.shape(), &[8, 8]);
        assert!(y.to_vec::<f32>().unwrap().iter().all(|v| *v > 0.0), "{mode}");
    }
}

#[test]
fn a_group_of_one_primitive_runs_as_that_op_and_a_second_one_joins_it() {
    let ctx = strict();
    let x = ctx.randn(&[16, 8], DType::F32, 7).unwrap();
    let y = ctx.randn(&[16, 8], DType::F32, 8).unwrap();
    let (xs, ys) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| (a * b).exp()).collect();
    // One primitive, then a second that reads it: one program for both.
    let before = programs(&ctx);
    let group = ctx.op_group("two");
    let z = group.end(x.mul(&y).and_then(|p| p.exp())).unwrap();
    assert!(close(&z.to_vec::<f32>().unwrap(), &want));
    assert_eq!(programs(&ctx) - before, 1, "both primitives in one program");
    // One primitive alone, read inside its group and after it.
    let group = ctx.op_group("one");
    let p = x.mul(&y).unwrap();
    let inside = p.to_vec::<f32>().unwrap();
    let p = group.end(Ok(p)).unwrap();
    let product: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a * b).collect();
    assert!(close(&inside, &product) && close(&p.to_vec::<f32>().unwrap(), &product));
    // A first primitive nobody holds is dropped when a second one comes.
    let before = programs(&ctx);
    let group = ctx.op_group("dropped");
    drop(x.mul(&y).unwrap());
    let e = group.end(y.exp()).unwrap();
    let want: Vec<f32> = ys.iter().map(|b| b.exp()).collect();
    assert!(close(&e.to_vec::<f32>().unwrap(), &want));
    assert_eq!(programs(&ctx) - before, 1, "only exp ran");
}
