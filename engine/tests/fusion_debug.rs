//! Golden tests of fusion dumps and the `fusion-debug` CLI on the benchmark
//! workloads (kernel and cluster counts, the reason for known cuts, the
//! signature difference of a changed batch), and of the dump loader on
//! damaged files. The HTML view in a real browser: `fusion_debug_browser.rs`.

mod fusion_debug_common;

use deferfuse::dump::{first_difference, DumpError, FlushDump, TierOutcome, DUMP_VERSION};
use deferfuse::{Config, Mode};
use fusion_debug_common::*;
use rewrite_rules::CutReason;

/// Kernels each workload plans into at batch 8: one fused loop for the
/// elementwise and row-reduction workloads; the MLP block's two matmuls (the
/// bias and GELU fused as the first one's epilogue) and one LayerNorm row
/// loop; the transformer block's twelve.
const GOLDEN_KERNELS: [(&str, usize); 6] = [
    ("gelu_tanh", 1),
    ("layer_norm", 1),
    ("softmax", 1),
    ("mlp_block", 3),
    ("adam_step", 1),
    ("transformer_block", 12),
];

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn every_workload_dumps_its_plan_and_draws_one_cluster_per_kernel() {
    let dir = TempDir::new("golden");
    for (name, kernels) in GOLDEN_KERNELS {
        let path = run_workload(dir.path(), name, 8);
        let dump = FlushDump::load(&path).unwrap();
        assert_eq!(dump.program.kernels.len(), kernels, "{name}: kernels");
        assert_eq!(dump.preparation, "fused");
        assert_eq!(
            (dump.cache.tier1, dump.cache.tier2),
            (TierOutcome::Miss, TierOutcome::Miss),
            "{name}: a fresh context"
        );
        let rewrite = dump.rewrite.as_ref().expect("the flush rewrote");
        assert!(rewrite.ran_in_this_flush);
        assert!(dump.timings_ns.rewrite > 0 && dump.timings_ns.run > 0, "{name}: {:?}", dump.timings_ns);
        assert!(dump.memory.peak >= dump.memory.live_before && dump.memory.peak > 0, "{name}: {:?}", dump.memory);
        assert!(dump.memory.written > 0);

        // Every recorded op carries the line of this workload that recorded
        // it, through composites (`#[track_caller]` all the way down).
        for (id, node) in dump.recorded.nodes.iter().enumerate() {
            let site = &dump.call_sites[id];
            if matches!(node.op, trace_ir::Op::Parameter { .. }) {
                continue;
            }
            let site =
                site.as_ref().unwrap_or_else(|| panic!("{name}: node {id} ({}) has no call site", node.op.name()));
            assert!(site.file.ends_with("fusion_debug_common/mod.rs"), "{name}: node {id} recorded at {site}");
        }

        let svg = cli(&["show", path_str(&path), "--format", "svg"]);
        assert!(svg.status.success(), "{}", stderr(&svg));
        assert_eq!(stdout(&svg).matches(r#"<g class="cluster""#).count(), kernels, "{name}: SVG clusters");
        let dot = cli(&["show", path_str(&path), "--format", "dot"]);
        assert_eq!(stdout(&dot).matches("subgraph cluster_kernel_").count(), kernels, "{name}: DOT clusters");
    }
    // The MLP block: the first matmul has its bias and GELU as an epilogue; the
    // second one's bias and residual go into the LayerNorm's row loop.
    let mlp = FlushDump::load(&FlushDump::list(dir.path()).unwrap()[3]).unwrap();
    let kinds: Vec<String> = mlp.program.kernels.iter().map(|k| deferfuse::dump::kernel_kind(&k.kind)).collect();
    assert_eq!(kinds, ["matmul + epilogue", "matmul", "row loop"]);
    assert!(mlp.rewrite.as_ref().unwrap().rules_fired.contains_key("gelu-tanh"), "{:?}", mlp.rewrite);
}

#[test]
fn explain_names_the_matmul_boundary_before_the_layer_norm() {
    let dir = TempDir::new("explain");
    let path = run_workload(dir.path(), "mlp_block", 8);
    let dump = FlushDump::load(&path).unwrap();
    let graph = dump.graph.as_ref().unwrap();
    // The LayerNorm's row loop reads the second matmul's result: a cut.
    let cut = dump
        .program
        .cuts
        .iter()
        .find(|c| c.reason == CutReason::MatMulBoundary && dump.program.kernels_of(c.consumer) == [2]);
    let cut = cut.unwrap_or_else(|| panic!("no matmul boundary into the row loop: {:?}", dump.program.cuts));
    let out = cli(&["explain", path_str(&path), "--op", &cut.consumer.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let producer_line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("#{} ", cut.producer)))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(producer_line.contains("not fused: matmul boundary"), "{text}");
    assert!(producer_line.contains("materialized"), "{text}");
    // Its consumer inside the row loop is fused with it.
    let consumer = (cut.consumer + 1..graph.len()).find(|&c| graph.nodes[c].inputs.contains(&cut.consumer)).unwrap();
    assert!(
        text.lines().any(|l| l.contains(&format!("#{consumer} ")) && l.contains("fused (both in kernel 2)")),
        "{text}"
    );
    assert!(text.contains("recorded at") && text.contains("fusion_debug_common/mod.rs"), "{text}");
}

#[test]
fn explain_names_the_shape_change_after_a_transformer_projection() {
    let dir = TempDir::new("explain-shape");
    let path = run_workload(dir.path(), "transformer_block", 2);
    let dump = FlushDump::load(&path).unwrap();
    let cut = dump.program.cuts.iter().find(|c| c.reason == CutReason::ShapeChange).expect("a shape-change cut");
    let text = stdout(&cli(&["explain", path_str(&path), "--op", &cut.producer.to_string()]));
    assert!(
        text.lines().any(|l| l.contains(&format!("#{} ", cut.consumer)) && l.contains("not fused: shape change")),
        "{text}"
    );
}

#[test]
fn diff_names_the_changed_batch_dimension() {
    let dir = TempDir::new("diff");
    let a = run_workload(dir.path(), "mlp_block", 8);
    let b = run_workload(dir.path(), "mlp_block", 16);
    let (da, db) = (FlushDump::load(&a).unwrap(), FlushDump::load(&b).unwrap());
    assert_ne!(da.signature, db.signature);
    let difference = first_difference(&da.recorded, &db.recorded).unwrap();
    // Parameters are numbered in the order the ops read them: `w1.t()` reads W1 before x.
    assert_eq!(difference.node, Some(2), "{difference}");
    assert!(difference.what.contains("dimension 0: 8 vs 16"), "{difference}");

    let out = cli(&["diff", path_str(&a), path_str(&b)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("signatures differ"), "{text}");
    assert!(text.contains("node 2 (param 1): shape [8, 64] vs [16, 64] (dimension 0: 8 vs 16)"), "{text}");

    // The same workload at the same batch: same signature.
    let c = run_workload(dir.path(), "mlp_block", 8);
    let text = stdout(&cli(&["diff", path_str(&a), path_str(&c)]));
    assert!(text.contains("same signature"), "{text}");
}

#[test]
fn a_second_flush_of_the_same_ops_is_a_tier1_hit_and_keeps_its_graph() {
    let dir = TempDir::new("hit");
    let ctx = dumping_context(dir.path());
    for seed in 0..2 {
        let x = input(&ctx, &[8, 128], seed, 2.0);
        softmax(&x).unwrap().to_vec::<f32>().unwrap();
    }
    let files = FlushDump::list(dir.path()).unwrap();
    assert_eq!(files.len(), 2);
    let (first, second) = (FlushDump::load(&files[0]).unwrap(), FlushDump::load(&files[1]).unwrap());
    assert_eq!(first.signature, second.signature);
    assert_eq!(second.cache.tier1, TierOutcome::Hit);
    assert_eq!(second.cache.tier2, TierOutcome::Skipped);
    assert_eq!((second.timings_ns.rewrite, second.timings_ns.plan, second.timings_ns.compile), (0, 0, 0));
    let rewrite = second.rewrite.as_ref().expect("the report of the flush that built the program");
    assert!(!rewrite.ran_in_this_flush);
    assert_eq!(second.graph, first.graph);

    let summary = cli(&["summary", path_str(dir.path())]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    let text = stdout(&summary);
    assert_eq!(text.lines().filter(|l| l.starts_with("flush-")).count(), 2, "{text}");
    assert!(text.contains("2 flushes, 1 distinct signatures, 1 tier-1 misses"), "{text}");
    assert!(text.contains("top time sinks:"), "{text}");
    let row = text.lines().nth(2).unwrap();
    assert!(row.contains("hit"), "{text}");
}

#[test]
fn fusion_off_dumps_the_recorded_trace_unfused() {
    let dir = TempDir::new("unfused");
    let config =
        Config { fusion: false, fusion_dump: Some(dir.path().into()), ..Config::with_mode(Mode::DeferAndFuse) };
    let ctx = deferfuse::Context::new(config).unwrap();
    let x = input(&ctx, &[4, 32], 1, 1.0);
    softmax(&x).unwrap().to_vec::<f32>().unwrap();
    let dump = FlushDump::load(&FlushDump::list(dir.path()).unwrap()[0]).unwrap();
    assert_eq!(dump.preparation, "unfused");
    assert_eq!(dump.graph.as_ref(), Some(&dump.recorded));
    assert_eq!(dump.program.kernels.len(), 5); // max, sub, exp, sum, div
    assert!(dump.rewrite.is_none());
}

#[test]
fn the_dump_variable_is_read_from_the_environment() {
    let vars = |k: &str| (k == "TORCH_TPU_FUSION_DUMP").then(|| "/tmp/dumps".to_string());
    assert_eq!(Config::from_vars(vars).unwrap().fusion_dump, Some("/tmp/dumps".into()));
    assert_eq!(Config::from_vars(|_| None).unwrap().fusion_dump, None);
    assert_eq!(Config::default().fusion_dump, None);
}

/// One real dump's text, to damage.
fn real_dump_text() -> String {
    let dir = TempDir::new("damage-src");
    let path = run_workload(dir.path(), "layer_norm", 4);
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn damaged_dumps_give_errors_never_panics() {
    let text = real_dump_text();
    let dir = TempDir::new("damaged");
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut newer = value.clone();
    newer["version"] = (DUMP_VERSION + 1).into();
    let mut foreign = value.clone();
    foreign["format"] = "something-else".into();
    value["program"]["kernels"][0]["nodes"][0] = 9999.into();
    let out_of_range = value;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.json", text.as_bytes()[..text.len() / 2].to_vec(), "truncated"),
        ("corrupt.json", text.replacen("\"recorded\"", "\"recorded\" 17", 1).into_bytes(), "corrupt fusion dump"),
        ("binary.json", vec![0xff, 0xfe, 0x00, 0x12], "not UTF-8"),
        ("empty.json", Vec::new(), "truncated"),
        ("newer.json", newer.to_string().into_bytes(), "written by a newer deferfuse (dump version 2"),
        ("foreign.json", foreign.to_string().into_bytes(), "not a fusion dump"),
        (
            "out-of-range.json",
            out_of_range.to_string().into_bytes(),
            "inconsistent fusion dump: kernel 0 refers to value 9999",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let err = FlushDump::load(&path).unwrap_err();
        assert!(err.to_string().contains(expected), "{name}: {err}");
        assert!(err.to_string().contains(name), "{name}: the error names the path: {err}");
        for args in [
            vec!["summary", path_str(&path)],
            vec!["show", path_str(&path)],
            vec!["explain", path_str(&path), "--op", "0"],
        ] {
            let out = cli(&args);
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}: {}", stderr(&out));
            assert!(stderr(&out).contains(expected), "{name}: {}", stderr(&out));
        }
    }
    // Every prefix of a real dump is an error, never a panic.
    for cut in (0..text.len()).step_by(97) {
        assert!(FlushDump::from_json(&text[..cut]).is_err(), "prefix of {cut} bytes");
    }
}

#[test]
fn missing_paths_and_bad_requests_have_their_exit_codes() {
    let dir = TempDir::new("requests");
    let missing = dir.path().join("nope.json");
    let out = cli(&["show", path_str(&missing)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no such file or directory"), "{}", stderr(&out));
    assert!(matches!(FlushDump::load(&missing), Err(DumpError::Missing { .. })));

    let out = cli(&["summary", path_str(dir.path())]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no fusion dumps"), "{}", stderr(&out));

    let path = run_workload(dir.path(), "softmax", 4);
    let out = cli(&["explain", path_str(&path), "--op", "4096"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no op 4096"), "{}", stderr(&out));

    let out = cli(&["show", path_str(&path), "--format", "pdf"]);
    assert_eq!(out.status.code(), Some(2));

    let out = cli(&["show", path_str(&path), "-o", path_str(&dir.path().join("no-such-dir/page.html"))]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let help = stdout(&cli(&["--help"]));
    assert!(help.contains("Exit codes:") && help.contains("3  the request does not fit the dump"), "{help}");
}

#[test]
fn a_program_from_the_disk_cache_is_drawn_by_kernel_and_explain_says_why_there_is_no_graph() {
    let dir = TempDir::new("tier3");
    let cache = TempDir::new("tier3-cache");
    let run = |tag: &str| {
        let dumps = dir.path().join(tag);
        let config = Config {
            fusion_dump: Some(dumps.clone()),
            cache_dir: Some(cache.path().into()),
            ..Config::with_mode(Mode::DeferAndFuse)
        };
        let ctx = deferfuse::Context::new(config).unwrap();
        softmax(&input(&ctx, &[8, 64], 1, 1.0)).unwrap().to_vec::<f32>().unwrap();
        FlushDump::list(&dumps).unwrap().remove(0)
    };
    let (_, second) = (run("first"), run("second"));
    let dump = FlushDump::load(&second).unwrap();
    assert_eq!((dump.cache.tier1, dump.cache.tier3), (TierOutcome::Miss, TierOutcome::Hit));
    assert!(dump.graph.is_none() && dump.rewrite.is_none());

    let svg = cli(&["show", path_str(&second), "--format", "svg"]);
    assert!(svg.status.success(), "{}", stderr(&svg));
    assert_eq!(stdout(&svg).matches(r#"<g class="cluster""#).count(), dump.program.kernels.len());
    let html = stdout(&cli(&["show", path_str(&second)]));
    assert!(html.contains("the graph is not in this dump"), "the page says why it is approximate");
    let out = cli(&["explain", path_str(&second), "--op", "1"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("on-disk cache"), "{}", stderr(&out));
}

#[test]
fn call_sites_point_at_the_users_line_through_composites_and_operators() {
    let dir = TempDir::new("sites");
    let ctx = dumping_context(dir.path());
    let x = input(&ctx, &[4, 16], 1, 1.0);
    let w = input(&ctx, &[8, 16], 2, 0.25);
    let b = input(&ctx, &[8], 3, 0.1);
    let i = ctx.from_vec(vec![1i32; 4 * 8], &[4, 8]).unwrap();
    let y = x.linear(&w, Some(&b)).unwrap().gelu(deferfuse::GeluApproximation::Tanh).unwrap();
    let line = line!() + 1;
    let z = deferfuse::Tensor::cat(&[&y, &i], -1).unwrap();
    let z = (-(&z + 1.0).unwrap()).unwrap().layer_norm(&[16], None, None, 1e-5).unwrap().softmax(-1).unwrap();
    z.to_vec::<f32>().unwrap();
    let dump = FlushDump::load(&FlushDump::list(dir.path()).unwrap()[0]).unwrap();
    let this_file = file!();
    for (id, node) in dump.recorded.nodes.iter().enumerate() {
        if matches!(node.op, trace_ir::Op::Parameter { .. }) {
            continue;
        }
        let site =
            dump.call_sites[id].as_ref().unwrap_or_else(|| panic!("node {id} ({}) has no call site", node.op.name()));
        assert_eq!(site.file, this_file, "node {id} ({}) recorded at {site}", node.op.name());
    }
    // The i32 operand of `cat` is cast to f32 on the `cat` line.
    let cast = dump.recorded.nodes.iter().position(|n| matches!(n.op, trace_ir::Op::Cast { .. })).expect("a cast");
    assert_eq!(dump.call_sites[cast].as_ref().unwrap().line, line);
}

#[test]
fn a_lifted_softmax_points_back_at_the_recorded_ops_and_their_line() {
    let dir = TempDir::new("origins");
    let path = run_workload(dir.path(), "softmax", 4);
    let dump = FlushDump::load(&path).unwrap();
    let graph = dump.graph.as_ref().unwrap();
    let lifted = graph.nodes.iter().position(|n| matches!(n.op, trace_ir::Op::Softmax { .. })).expect("softmax lifted");
    // The fused softmax stands for the recorded division, the last op of the decomposition.
    let origins = &dump.origins[lifted];
    assert!(!origins.is_empty());
    assert!(origins.iter().any(|&o| dump.recorded.nodes[o].op.name() == "div"), "{origins:?}");
    let site = dump.call_site_of(lifted).expect("a call site");
    assert!(site.file.ends_with("fusion_debug_common/mod.rs"), "{site}");
    let text = stdout(&cli(&["explain", path_str(&path), "--op", &lifted.to_string()]));
    assert!(text.contains(&format!("stands for recorded node(s) {origins:?}")), "{text}");
}

#[test]
fn the_first_difference_names_a_dtype_an_op_a_constant_or_a_longer_trace() {
    use trace_ir::{BinaryOp, DType, Meta, Op, Trace, UnaryOp};
    let build = |dtype: DType, value: f64, unary: UnaryOp, extra: bool| {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new([4, 8].into_iter().collect(), dtype));
        let c = t.push(Op::Full { value, shape: Default::default(), dtype }, &[]).unwrap();
        let y = t.push(Op::Binary { kind: BinaryOp::Mul }, &[x, c]).unwrap();
        let mut z = t.push(Op::Unary { kind: unary }, &[y]).unwrap();
        if extra {
            z = t.push(Op::Unary { kind: UnaryOp::Neg }, &[z]).unwrap();
        }
        t.outputs = vec![z];
        t
    };
    let base = build(DType::F32, 2.0, UnaryOp::Exp, false);
    assert_eq!(first_difference(&base, &build(DType::F32, 2.0, UnaryOp::Exp, false)), None);
    let dtype = first_difference(&base, &build(DType::BF16, 2.0, UnaryOp::Exp, false)).unwrap();
    assert_eq!((dtype.node, dtype.what.as_str()), (Some(0), "node 0 (param 0): dtype f32 vs bf16"));
    let constant = first_difference(&base, &build(DType::F32, 3.0, UnaryOp::Exp, false)).unwrap();
    assert_eq!(constant.node, Some(1));
    assert!(constant.what.starts_with("node 1 (full 2): attributes (constants)"), "{constant}");
    let op = first_difference(&base, &build(DType::F32, 2.0, UnaryOp::Tanh, false)).unwrap();
    assert_eq!(op.what, "node 3 (exp): op exp vs tanh");
    let longer = first_difference(&base, &build(DType::F32, 2.0, UnaryOp::Exp, true)).unwrap();
    assert_eq!(longer.what, "node count 4 vs 5: the second trace goes on with node 4 (neg)");
}
