//! Golden tests of fusion dumps and the `fusion-debug` CLI on the benchmark
//! workloads (kernel and cluster counts, the reason for known cuts, a changed
//! batch size resized within one context, shape classes that differ), and of
//! the dump loader on damaged and older files. The HTML view in a real
//! browser: `fusion_debug_browser.rs`.

mod fusion_debug_common;

use deferfuse::dump::{
    compare, first_difference, Comparison, DumpError, FlushDump, TierOutcome, DUMP_VERSION,
};
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
        assert!(
            dump.timings_ns.rewrite > 0 && dump.timings_ns.run > 0,
            "{name}: {:?}",
            dump.timings_ns
        );
        assert!(
            dump.memory.peak >= dump.memory.live_before && dump.memory.peak > 0,
            "{name}: {:?}",
            dump.memory
        );
        assert!(dump.memory.written > 0);

        // Every recorded op carries the line of this workload that recorded
        // it, through composites (`#[track_caller]` all the way down).
        for (id, node) in dump.recorded.nodes.iter().enumerate() {
            let site = &dump.call_sites[id];
            if matches!(node.op, trace_ir::Op::Parameter { .. }) {
                continue;
            }
            let site = site.as_ref().unwrap_or_else(|| {
                panic!("{name}: node {id} ({}) has no call site", node.op.name())
            });
            assert!(
                site.file.ends_with("src/workloads.rs"),
                "{name}: node {id} recorded at {site}"
            );
        }

        let svg = cli(&["show", path_str(&path), "--format", "svg"]);
        assert!(svg.status.success(), "{}", stderr(&svg));
        assert_eq!(
            stdout(&svg).matches(r#"<g class="cluster""#).count(),
            kernels,
            "{name}: SVG clusters"
        );
        let dot = cli(&["show", path_str(&path), "--format", "dot"]);
        assert_eq!(
            stdout(&dot).matches("subgraph cluster_kernel_").count(),
            kernels,
            "{name}: DOT clusters"
        );
    }
    // The MLP block: the first matmul has its bias and GELU as an epilogue; the
    // second one's bias and residual go into the LayerNorm's row loop.
    let mlp = FlushDump::load(&FlushDump::list(dir.path()).unwrap()[3]).unwrap();
    let kinds: Vec<String> =
        mlp.program.kernels.iter().map(|k| deferfuse::dump::kernel_kind(&k.kind)).collect();
    assert_eq!(kinds, ["matmul + epilogue", "matmul", "row loop"]);
    assert!(
        mlp.rewrite.as_ref().unwrap().rules_fired.contains_key("gelu-tanh"),
        "{:?}",
        mlp.rewrite
    );
}

#[test]
fn explain_names_the_matmul_boundary_before_the_layer_norm() {
    let dir = TempDir::new("explain");
    let path = run_workload(dir.path(), "mlp_block", 8);
    let dump = FlushDump::load(&path).unwrap();
    let graph = dump.graph.as_ref().unwrap();
    // The LayerNorm's row loop reads the second matmul's result: a cut.
    let cut = dump.program.cuts.iter().find(|c| {
        c.reason == CutReason::MatMulBoundary && dump.program.kernels_of(c.consumer) == [2]
    });
    let cut = cut
        .unwrap_or_else(|| panic!("no matmul boundary into the row loop: {:?}", dump.program.cuts));
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
    let consumer = (cut.consumer + 1..graph.len())
        .find(|&c| graph.nodes[c].inputs.contains(&cut.consumer))
        .unwrap();
    assert!(
        text.lines().any(|l| l.contains(&format!("#{consumer} ")) && l.contains("fused (both in kernel 2)")),
        "{text}"
    );
    assert!(text.contains("recorded at") && text.contains("src/workloads.rs"), "{text}");
}

#[test]
fn explain_names_the_shape_change_after_a_transformer_projection() {
    let dir = TempDir::new("explain-shape");
    let path = run_workload(dir.path(), "transformer_block", 2);
    let dump = FlushDump::load(&path).unwrap();
    let cut = dump
        .program
        .cuts
        .iter()
        .find(|c| c.reason == CutReason::ShapeChange)
        .expect("a shape-change cut");
    let text = stdout(&cli(&["explain", path_str(&path), "--op", &cut.producer.to_string()]));
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("#{} ", cut.consumer))
                && l.contains("not fused: shape change")),
        "{text}"
    );
}

/// The size difference of two traces of one shape class; panics otherwise.
fn same_class(a: &FlushDump, b: &FlushDump) -> deferfuse::dump::SizeDifference {
    match compare(&a.recorded, &b.recorded) {
        Comparison::SameClass(size) => size,
        other => panic!("expected one shape class, got {other:?}"),
    }
}

#[test]
fn diff_names_the_changed_batch_dimension() {
    let dir = TempDir::new("diff");
    // Two contexts: tier 1 is per context, so B cannot find A's program.
    let a = run_workload(dir.path(), "mlp_block", 8);
    let b = run_workload(dir.path(), "mlp_block", 16);
    let (da, db) = (FlushDump::load(&a).unwrap(), FlushDump::load(&b).unwrap());
    assert_ne!(da.signature, db.signature);
    assert_eq!(da.shape_class, db.shape_class, "a batch size is not part of the shape class");
    assert_eq!(db.cache.tier1, TierOutcome::Miss);
    let difference = first_difference(&da.recorded, &db.recorded).unwrap();
    // Parameters are numbered in the order the ops read them: `w1.t()` reads W1 before x.
    assert_eq!(difference.node, Some(2), "{difference}");
    assert!(difference.what.contains("dimension 0: 8 vs 16"), "{difference}");
    let size = same_class(&da, &db);
    assert_eq!((size.node, size.dimension, size.a, size.b), (2, 0, 8, 16), "{size}");

    let out = cli(&["diff", path_str(&a), path_str(&b)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(&format!("shape class {} (", da.shape_class)), "{text}");
    assert!(text.contains("same shape class, different sizes; first size that differs:"), "{text}");
    assert!(
        text.contains("node 2 (param 1): shape [8, 64] vs [16, 64] (dimension 0: 8 vs 16)"),
        "{text}"
    );
    assert!(text.contains("on backend cpu (native, executables resize)"), "{text}");
    assert!(
        text.contains("here B was a tier-1 miss: its context held no program of this shape class"),
        "{text}"
    );

    // The same workload at the same batch: same signature.
    let c = run_workload(dir.path(), "mlp_block", 8);
    let text = stdout(&cli(&["diff", path_str(&a), path_str(&c)]));
    assert!(text.contains("same signature"), "{text}");
}

#[test]
fn a_new_batch_size_in_one_context_is_resized_and_dumped_with_its_graph() {
    let dir = TempDir::new("resized");
    let ctx = dumping_context(dir.path());
    let a = run_workload_in(&ctx, dir.path(), "mlp_block", 8);
    let b = run_workload_in(&ctx, dir.path(), "mlp_block", 16);
    let (da, db) = (FlushDump::load(&a).unwrap(), FlushDump::load(&b).unwrap());
    assert_eq!(db.version, DUMP_VERSION);
    assert_eq!(da.shape_class, db.shape_class);
    assert_ne!(da.signature, db.signature);
    assert_eq!(da.cache.tier1, TierOutcome::Miss);
    assert_eq!((db.cache.tier1, db.cache.tier2), (TierOutcome::Resized, TierOutcome::Skipped));
    assert_eq!((db.timings_ns.rewrite, db.timings_ns.plan, db.timings_ns.compile), (0, 0, 0));
    assert_eq!(ctx.stats().cache.resized, 1);
    // The template's graph, resized as the program was: `explain` works on it.
    let (ga, gb) = (da.graph.as_ref().unwrap(), db.graph.as_ref().expect("the resized graph"));
    assert_eq!(ga.len(), gb.len());
    assert_eq!(
        gb.nodes.iter().map(|n| &n.meta).collect::<Vec<_>>(),
        db.program.values.iter().collect::<Vec<_>>()
    );
    assert_eq!(db.program.kernels.len(), da.program.kernels.len());
    assert!(!db.rewrite.as_ref().expect("the template's rewrite report").ran_in_this_flush);
    let x =
        gb.nodes.iter().position(|n| n.meta.shape.as_slice() == [16, 64]).expect("x at batch 16");
    let text = stdout(&cli(&["explain", path_str(&b), "--op", &x.to_string()]));
    assert!(text.contains(&format!("op #{x} ")) && text.contains("f32[16, 64]"), "{text}");

    let size = same_class(&da, &db);
    assert_eq!((size.node, size.dimension, size.a, size.b), (2, 0, 8, 16), "{size}");
    let out = cli(&["diff", path_str(&a), path_str(&b)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("B's cache outcome: tier 1 resized, tier 2 -, tier 3 -"), "{text}");
    assert!(text.contains("same shape class, different sizes; first size that differs:"), "{text}");
    assert!(
        text.contains("node 2 (param 1): shape [8, 64] vs [16, 64] (dimension 0: 8 vs 16)"),
        "{text}"
    );
    assert!(
        text.contains(
            "B reuses A's program resized to its sizes, with no rewrite, plan or compile"
        ),
        "{text}"
    );
    assert!(text.contains("here B was resized"), "{text}");
    assert!(!text.contains("recompile"), "{text}");

    let text = stdout(&cli(&["summary", path_str(dir.path())]));
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("flush-")).collect();
    // Cells are separated by at least two spaces ("12.0 KiB" holds one).
    let cell = |row: &str, n: usize| {
        row.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .nth(n)
            .unwrap_or_default()
            .to_string()
    };
    // Why each flush ran (the workload reads its result), then tier 1.
    assert_eq!((cell(rows[0], 1).as_str(), cell(rows[1], 1).as_str()), ("read", "read"), "{text}");
    assert_eq!(
        (cell(rows[0], 6).as_str(), cell(rows[1], 6).as_str()),
        ("miss", "resized"),
        "{text}"
    );
    assert!(
        text.contains(
            "2 flushes, 2 distinct signatures in 1 shape classes, 1 tier-1 misses (rewrite and plan ran), 1 resized"
        ),
        "{text}"
    );
}

#[test]
fn a_program_with_strided_views_resizes_for_a_new_batch() {
    // The transformer block's attention matmuls read the heads through
    // strided views; resizing folds their layout steps again at the new sizes.
    let dir = TempDir::new("strided");
    let ctx = dumping_context(dir.path());
    let a = run_workload_in(&ctx, dir.path(), "transformer_block", 2);
    let b = run_workload_in(&ctx, dir.path(), "transformer_block", 6);
    let (da, db) = (FlushDump::load(&a).unwrap(), FlushDump::load(&b).unwrap());
    assert_eq!(da.shape_class, db.shape_class);
    assert_eq!(db.cache.tier1, TierOutcome::Resized);
    assert_eq!(ctx.stats().cache.resized, 1);
    let size = same_class(&da, &db);
    assert_eq!((size.node, size.dimension, size.a, size.b), (0, 0, 2, 6), "{size}");
    let text = stdout(&cli(&["diff", path_str(&a), path_str(&b)]));
    assert!(
        text.contains("node 0 (param 0): shape [2, 16, 64] vs [6, 16, 64] (dimension 0: 2 vs 6)"),
        "{text}"
    );
    assert!(
        text.contains(
            "B reuses A's program resized to its sizes, with no rewrite, plan or compile"
        ),
        "{text}"
    );
    assert!(text.contains("here B was resized"), "{text}");
}

/// The diff of `a` and `b` when `b`'s dump says `backend`, and tier 1 missed.
fn diff_as_if_on(
    backend: &str,
    dir: &std::path::Path,
    a: &std::path::Path,
    b: &std::path::Path,
) -> String {
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(b).unwrap()).unwrap();
    value["backend"] = backend.into();
    value["cache"]["tier1"] = "miss".into();
    let edited = dir.join(format!("{backend}.json"));
    std::fs::write(&edited, value.to_string()).unwrap();
    let out = cli(&["diff", path_str(a), path_str(&edited)]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn diff_says_a_new_size_is_still_a_recompile_on_pjrt() {
    let dir = TempDir::new("diff-pjrt");
    let ctx = dumping_context(dir.path());
    let a = run_workload_in(&ctx, dir.path(), "softmax", 8);
    let b = run_workload_in(&ctx, dir.path(), "softmax", 16);
    let text = diff_as_if_on("pjrt", dir.path(), &a, &b);
    assert!(text.contains("same shape class, different sizes"), "{text}");
    assert!(
        text.contains("node 0 (param 0): shape [8, 128] vs [16, 128] (dimension 0: 8 vs 16)"),
        "{text}"
    );
    assert!(
        text.contains(
            "on backend pjrt (executables are compiled per size): B is still a recompile"
        ),
        "{text}"
    );
    assert!(
        text.contains("here B was a tier-1 miss: it was rewritten and compiled for its own sizes"),
        "{text}"
    );
    assert!(!text.contains("B reuses A's program"), "{text}");
    let text = diff_as_if_on("tpu-next", dir.path(), &a, &b);
    assert!(text.contains("on backend tpu-next: a new size is resized where"), "{text}");
}

#[test]
fn a_size_of_one_is_another_shape_class_and_diff_names_it() {
    let dir = TempDir::new("diff-class");
    let ctx = dumping_context(dir.path());
    let a = run_workload_in(&ctx, dir.path(), "softmax", 1);
    let b = run_workload_in(&ctx, dir.path(), "softmax", 4);
    let (da, db) = (FlushDump::load(&a).unwrap(), FlushDump::load(&b).unwrap());
    assert_ne!(da.shape_class, db.shape_class, "a size of 1 is literal in the shape class");
    assert_eq!(db.cache.tier1, TierOutcome::Miss);
    let Comparison::Different(difference) = compare(&da.recorded, &db.recorded) else {
        panic!("one class")
    };
    assert_eq!(difference.node, Some(0), "{difference}");
    let line = "node 0 (param 0): shape [1, 128] vs [4, 128]: dimension 0 is 1 vs 4; \
                sizes 0 and 1 are part of the shape class (they decide broadcasting)";
    assert_eq!(difference.what, line);
    let out = cli(&["diff", path_str(&a), path_str(&b)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("shape classes differ, so B could not reuse A's program on any backend"),
        "{text}"
    );
    assert!(text.contains(line), "{text}");
    assert!(
        text.contains("in A: first read by node 1 (max [1] keep) at")
            && text.contains("workloads.rs"),
        "{text}"
    );

    // A batch equal to another size of the trace joins that size's symbol:
    // also another class (the MLP block's width is 64).
    let c = run_workload_in(&ctx, dir.path(), "mlp_block", 8);
    let d = run_workload_in(&ctx, dir.path(), "mlp_block", 64);
    let (dc, dd) = (FlushDump::load(&c).unwrap(), FlushDump::load(&d).unwrap());
    assert_ne!(dc.shape_class, dd.shape_class);
    let Comparison::Different(difference) = compare(&dc.recorded, &dd.recorded) else {
        panic!("one class")
    };
    assert_eq!(difference.node, Some(2), "{difference}");
    assert!(
        difference
            .what
            .starts_with("node 2 (param 1): shape [8, 64] vs [64, 64]: dimension 0 is 8 vs 64;"),
        "{difference}"
    );
    assert!(
        difference.what.contains(
            "in A it is a size of its own (8), in B the size of node 0's shape dimension 1 (64)"
        ),
        "{difference}"
    );
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
    let (first, second) =
        (FlushDump::load(&files[0]).unwrap(), FlushDump::load(&files[1]).unwrap());
    assert_eq!(first.signature, second.signature);
    assert_eq!(second.cache.tier1, TierOutcome::Hit);
    assert_eq!(second.cache.tier2, TierOutcome::Skipped);
    assert_eq!(
        (second.timings_ns.rewrite, second.timings_ns.plan, second.timings_ns.compile),
        (0, 0, 0)
    );
    let rewrite = second.rewrite.as_ref().expect("the report of the flush that built the program");
    assert!(!rewrite.ran_in_this_flush);
    assert_eq!(second.graph, first.graph);

    let summary = cli(&["summary", path_str(dir.path())]);
    assert!(summary.status.success(), "{}", stderr(&summary));
    let text = stdout(&summary);
    assert_eq!(text.lines().filter(|l| l.starts_with("flush-")).count(), 2, "{text}");
    assert!(
        text.contains("2 flushes, 1 distinct signatures in 1 shape classes, 1 tier-1 misses"),
        "{text}"
    );
    assert!(text.contains("top time sinks:"), "{text}");
    let row = text.lines().nth(2).unwrap();
    assert!(row.contains("hit"), "{text}");
}

#[test]
fn fusion_off_dumps_the_recorded_trace_unfused() {
    let dir = TempDir::new("unfused");
    let config = Config {
        fusion: false,
        fusion_dump: Some(dir.path().into()),
        ..Config::with_mode(Mode::DeferAndFuse)
    };
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
    let newer_message = format!(
        "written by a newer deferfuse (dump version {}; this build reads versions 1 to {DUMP_VERSION})",
        DUMP_VERSION + 1
    );
    let mut foreign = value.clone();
    foreign["format"] = "something-else".into();
    value["program"]["kernels"][0]["nodes"][0] = 9999.into();
    let out_of_range = value;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.json", text.as_bytes()[..text.len() / 2].to_vec(), "truncated"),
        (
            "corrupt.json",
            text.replacen("\"recorded\"", "\"recorded\" 17", 1).into_bytes(),
            "corrupt fusion dump",
        ),
        ("binary.json", vec![0xff, 0xfe, 0x00, 0x12], "not UTF-8"),
        ("empty.json", Vec::new(), "truncated"),
        ("newer.json", newer.to_string().into_bytes(), newer_message.as_str()),
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
fn a_version_1_dump_still_loads_and_gets_its_shape_class() {
    let text = real_dump_text();
    let current = FlushDump::from_json(&text).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["version"] = 1.into();
    value.as_object_mut().unwrap().remove("shape_class");
    let old = FlushDump::from_json(&value.to_string()).unwrap();
    assert_eq!(old.version, 1);
    assert_eq!(old.shape_class, current.shape_class);
    assert_eq!(old.shape_class.len(), 16);
    let dir = TempDir::new("v1");
    let path = dir.path().join("v1.json");
    std::fs::write(&path, value.to_string()).unwrap();
    let text = stdout(&cli(&["diff", path_str(&path), path_str(&path)]));
    assert!(text.contains("same signature"), "{text}");
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

    let out =
        cli(&["show", path_str(&path), "-o", path_str(&dir.path().join("no-such-dir/page.html"))]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let help = stdout(&cli(&["--help"]));
    assert!(
        help.contains("Exit codes:") && help.contains("3  the request does not fit the dump"),
        "{help}"
    );
    assert!(
        help.contains(
            "0  success (for diff: whether or not the two flushes could share a program)"
        ),
        "{help}"
    );
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
    let z = (-(&z + 1.0).unwrap())
        .unwrap()
        .layer_norm(&[16], None, None, 1e-5)
        .unwrap()
        .softmax(-1)
        .unwrap();
    z.to_vec::<f32>().unwrap();
    let dump = FlushDump::load(&FlushDump::list(dir.path()).unwrap()[0]).unwrap();
    let this_file = file!();
    for (id, node) in dump.recorded.nodes.iter().enumerate() {
        if matches!(node.op, trace_ir::Op::Parameter { .. }) {
            continue;
        }
        let site = dump.call_sites[id]
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} ({}) has no call site", node.op.name()));
        assert_eq!(site.file, this_file, "node {id} ({}) recorded at {site}", node.op.name());
    }
    // The i32 operand of `cat` is cast to f32 on the `cat` line.
    let cast = dump
        .recorded
        .nodes
        .iter()
        .position(|n| matches!(n.op, trace_ir::Op::Cast { .. }))
        .expect("a cast");
    assert_eq!(dump.call_sites[cast].as_ref().unwrap().line, line);
}

#[test]
fn a_lifted_softmax_points_back_at_the_recorded_ops_and_their_line() {
    let dir = TempDir::new("origins");
    let path = run_workload(dir.path(), "softmax", 4);
    let dump = FlushDump::load(&path).unwrap();
    let graph = dump.graph.as_ref().unwrap();
    let lifted = graph
        .nodes
        .iter()
        .position(|n| matches!(n.op, trace_ir::Op::Softmax { .. }))
        .expect("softmax lifted");
    // The fused softmax stands for the recorded division, the last op of the decomposition.
    let origins = &dump.origins[lifted];
    assert!(!origins.is_empty());
    assert!(origins.iter().any(|&o| dump.recorded.nodes[o].op.name() == "div"), "{origins:?}");
    let site = dump.call_site_of(lifted).expect("a call site");
    assert!(site.file.ends_with("src/workloads.rs"), "{site}");
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

#[test]
fn compare_sees_sizes_through_the_shape_class() {
    use trace_ir::{BinaryOp, DType, Meta, Op, ShapeClass, Signature, Trace, UnaryOp};
    let grow = |shape: &[usize], value: f64, extra: bool| {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new(shape.iter().copied().collect(), DType::F32));
        let c = t
            .push(
                Op::Full { value, shape: shape.iter().copied().collect(), dtype: DType::F32 },
                &[],
            )
            .unwrap();
        let mut y = t.push(Op::Binary { kind: BinaryOp::Mul }, &[x, c]).unwrap();
        if extra {
            y = t.push(Op::Unary { kind: UnaryOp::Neg }, &[y]).unwrap();
        }
        t.outputs = vec![y];
        t
    };
    let build = |shape: &[usize], value: f64| grow(shape, value, false);
    let base = build(&[4, 8], 2.0);
    let cases = [
        (build(&[4, 8], 2.0), "same"),
        (build(&[16, 8], 2.0), "node 0 (param 0): shape [4, 8] vs [16, 8] (dimension 0: 4 vs 16)"),
        (build(&[4, 8, 2], 2.0), "node 0 (param 0): shape [4, 8] vs [4, 8, 2] (rank 2 vs 3)"),
        (
            build(&[16, 8], 3.0),
            "node 1 (full 2): attributes (constants) {\"op\":\"full\",\"value\":2.0,\"shape\":[4,8],\"dtype\":\"f32\"} \
             vs {\"op\":\"full\",\"value\":3.0,\"shape\":[16,8],\"dtype\":\"f32\"}",
        ),
        (
            build(&[8, 8], 2.0),
            "node 0 (param 0): shape [4, 8] vs [8, 8]: dimension 1 is 8 vs 8; in A it is a size of its own (8), \
             in B the size of node 0's shape dimension 0 (8) (equal sizes share one symbol of the shape class)",
        ),
        // Other sizes, and one op more: the op count is what differs.
        (grow(&[16, 8], 2.0, true), "node count 3 vs 4: the second trace goes on with node 3 (neg)"),
    ];
    for (other, expected) in cases {
        let comparison = compare(&base, &other);
        let what = match &comparison {
            Comparison::Same => "same".to_string(),
            Comparison::SameClass(size) => size.what.clone(),
            Comparison::Different(d) => d.what.clone(),
        };
        assert_eq!(what, expected);
        // It agrees with the keys themselves.
        let same_class = ShapeClass::of(&base).signature == ShapeClass::of(&other).signature;
        let same_signature = Signature::of(&base) == Signature::of(&other);
        match comparison {
            Comparison::Same => assert!(same_signature),
            Comparison::SameClass(_) => assert!(same_class && !same_signature, "{expected}"),
            Comparison::Different(_) => assert!(!same_class, "{expected}"),
        }
    }
}

/// Runs fusion-debug with `stdout` as its standard output, killing it if it
/// has not finished within `limit` (a hang is the failure being tested).
fn cli_within(
    args: &[&str],
    stdout: std::process::Stdio,
    limit: std::time::Duration,
) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fusion-debug"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fusion-debug runs");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fusion-debug {args:?} still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.code(), err)
}

/// The write end of a pipe whose read end is already closed (as after
/// `| head -1` has read its line): every write fails with a broken pipe.
fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned here only.
    let (read, write) =
        unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    drop(read);
    write.into()
}

const SECONDS_10: std::time::Duration = std::time::Duration::from_secs(10);

#[test]
fn a_full_or_closed_standard_output_is_exit_code_4_without_a_panic() {
    let dir = TempDir::new("stdout");
    let path = run_workload(dir.path(), "softmax", 4);
    for args in [
        vec!["summary", path_str(dir.path())],
        vec!["show", path_str(&path), "--format", "svg"],
        vec!["explain", path_str(&path), "--op", "1"],
        vec!["diff", path_str(&path), path_str(&path)],
    ] {
        let full = std::fs::File::options().write(true).open("/dev/full").unwrap();
        let (code, err) = cli_within(&args, full.into(), SECONDS_10);
        assert_eq!(code, Some(4), "{args:?} > /dev/full: {err}");
        assert!(!err.contains("panicked") && err.contains("standard output"), "{err}");

        let (code, err) = cli_within(&args, closed_pipe(), SECONDS_10);
        assert_eq!(code, Some(4), "{args:?} | (closed): {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_fifo_a_link_and_a_dump_over_the_limit_are_refused_quickly() {
    let dir = TempDir::new("special-inputs");
    let real = run_workload(dir.path(), "softmax", 4);
    let fifo = dir.path().join("fifo.json");
    mkfifo(&fifo);
    let null = std::process::Stdio::null;
    let (code, err) = cli_within(&["show", path_str(&fifo)], null(), SECONDS_10);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("FIFO") && err.contains(path_str(&fifo)), "{err}");
    // In a directory, too: the summary names it instead of waiting on it.
    let (code, err) = cli_within(&["summary", path_str(dir.path())], null(), SECONDS_10);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("FIFO"), "{err}");
    std::fs::remove_file(&fifo).unwrap();

    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (code, err) = cli_within(&["explain", path_str(&link), "--op", "1"], null(), SECONDS_10);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    std::fs::remove_file(&link).unwrap();
    let zero = dir.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    assert!(matches!(FlushDump::load(&zero), Err(DumpError::NotRegular { .. })));
    std::fs::remove_file(&zero).unwrap();

    let len = std::fs::metadata(&real).unwrap().len();
    let limit = (len - 1).to_string();
    let (code, err) =
        cli_within(&["show", path_str(&real), "--max-bytes", &limit], null(), SECONDS_10);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("larger than {limit} bytes")) && err.contains("--max-bytes"),
        "{err}"
    );
    let fits = len.to_string();
    let (code, err) =
        cli_within(&["--max-bytes", &fits, "show", path_str(&real)], null(), SECONDS_10);
    assert_eq!(code, Some(0), "{err}");
    assert!(matches!(
        FlushDump::load_limited(&real, len - 1),
        Err(DumpError::TooLarge { limit, .. }) if limit == len - 1
    ));
}
