//! `summary`: one row per flush, then totals and the top time sinks.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::PathBuf;

use deferfuse::dump::{FlushDump, TierOutcome};
use trace_ir::Op;

use crate::{human_bytes, human_ns};

const HEADER: [&str; 14] = [
    "flush",
    "why",
    "ops",
    "kernels",
    "ops/kernel",
    "materialized",
    "t1",
    "t2",
    "t3",
    "rewrite",
    "plan",
    "compile",
    "run",
    "peak",
];

pub fn render(dumps: &[(PathBuf, FlushDump)]) -> String {
    let mut rows: Vec<[String; HEADER.len()]> = Vec::new();
    let mut sinks: Vec<(u64, String)> = Vec::new();
    for (path, d) in dumps {
        let name = path
            .file_name()
            .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let ops = d.recorded.nodes.iter().filter(|n| !matches!(n.op, Op::Parameter { .. })).count();
        let kernels = d.program.kernels.len();
        let per_kernel =
            if kernels == 0 { "-".into() } else { format!("{:.1}", ops as f64 / kernels as f64) };
        let t = &d.timings_ns;
        rows.push([
            name.clone(),
            d.reason.map_or_else(|| "-".into(), |r| r.to_string()),
            ops.to_string(),
            kernels.to_string(),
            per_kernel,
            human_bytes(d.memory.written),
            d.cache.tier1.to_string(),
            d.cache.tier2.to_string(),
            d.cache.tier3.to_string(),
            human_ns(t.rewrite),
            human_ns(t.plan),
            human_ns(t.compile),
            human_ns(t.run),
            human_bytes(d.memory.peak),
        ]);
        for (phase, ns) in
            [("rewrite", t.rewrite), ("plan", t.plan), ("compile", t.compile), ("run", t.run)]
        {
            sinks.push((ns, format!("{name} {phase}")));
        }
    }
    let mut s = table(&rows);
    let total: u64 = dumps.iter().map(|(_, d)| d.timings_ns.total()).sum();
    let tier1 = |outcome| dumps.iter().filter(|(_, d)| d.cache.tier1 == outcome).count();
    let signatures: BTreeSet<&str> = dumps.iter().map(|(_, d)| d.signature.as_str()).collect();
    let classes: BTreeSet<&str> = dumps.iter().map(|(_, d)| d.shape_class.as_str()).collect();
    let _ = writeln!(
        s,
        "\n{} flushes, {} distinct signatures in {} shape classes, {} tier-1 misses (rewrite and plan ran), \
         {} resized (no rewrite, plan or compile), {} in all phases",
        dumps.len(),
        signatures.len(),
        classes.len(),
        tier1(TierOutcome::Miss),
        tier1(TierOutcome::Resized),
        human_ns(total)
    );
    // A budget that ran out leaves a program less fused than it could be:
    // one line per flush it happened in (none when it never did).
    for (path, d) in dumps {
        if !d.program.budgets_exhausted.is_empty() {
            let stops: Vec<String> =
                d.program.budgets_exhausted.iter().map(|b| b.to_string()).collect();
            let name = path
                .file_name()
                .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
            let _ = writeln!(s, "{name}: {}", stops.join("; "));
        }
    }
    sinks.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    s.push_str("\ntop time sinks:\n");
    for (ns, what) in sinks.iter().take(5).filter(|(ns, _)| *ns > 0) {
        let share = if total > 0 { 100.0 * *ns as f64 / total as f64 } else { 0.0 };
        let _ = writeln!(s, "  {:>10}  {share:5.1}%  {what}", human_ns(*ns));
    }
    s
}

/// Left-aligned first column, right-aligned numbers.
fn table(rows: &[[String; HEADER.len()]]) -> String {
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str("  ");
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut s = line(&mut HEADER.iter().copied());
    for row in rows {
        s.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    s
}
