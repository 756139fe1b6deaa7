//! `explain --op N`: why graph node N shares, or does not share, a kernel
//! with each of its neighbours, from the cuts the planner recorded.

use std::fmt::Write;

use deferfuse::dump::FlushDump;
use trace_ir::NodeId;

use crate::human_bytes;

pub fn explain(dump: &FlushDump, n: NodeId) -> Result<String, String> {
    let Some(graph) = &dump.graph else {
        return Err("this dump has no graph (its program came from the on-disk cache, directly or resized); rerun with TORCH_TPU_CACHE_DIR=off to see one".into());
    };
    if n >= graph.len() {
        return Err(format!("no op {n}: the graph has ops 0 to {}", graph.len().saturating_sub(1)));
    }
    let program = &dump.program;
    let describe = |v: NodeId| {
        let m = &graph.nodes[v].meta;
        format!(
            "#{v} {} {}{:?}",
            FlushDump::op_label(&graph.nodes[v].op),
            m.dtype,
            m.shape.as_slice()
        )
    };
    let kernels_of = |v: NodeId| program.kernels_of(v);
    let mut s = String::new();
    let _ = writeln!(s, "op {}", describe(n));
    if let Some(site) = dump.call_site_of(n) {
        let _ = writeln!(s, "  recorded at {site}");
    }
    match dump.origins.get(n).map(Vec::as_slice) {
        Some([]) | None => {
            s.push_str("  introduced by the rewrites (no recorded op computes exactly this)\n")
        }
        Some(origins) => {
            let _ = writeln!(s, "  stands for recorded node(s) {origins:?}");
        }
    }
    let mine = kernels_of(n);
    match (mine.as_slice(), program.params.contains(&n)) {
        (_, true) => s.push_str("  a program input: its buffer is read by the kernels below\n"),
        ([], false) => s.push_str("  computed by no kernel (unused, or folded away)\n"),
        ([k], false) => {
            let _ = writeln!(s, "  in {}", program.describe_kernel(*k));
        }
        (ks, false) => {
            let _ = writeln!(s, "  recomputed in kernels {ks:?} (cheaper than a buffer)");
        }
    }

    let verdict = |producer: NodeId, consumer: NodeId| -> String {
        let (a, b) = (kernels_of(producer), kernels_of(consumer));
        if a.iter().any(|k| b.contains(k)) {
            let shared = a.iter().find(|k| b.contains(k)).copied().unwrap_or_default();
            return format!("fused (both in kernel {shared})");
        }
        let bytes = {
            let m = &program.values[producer];
            human_bytes((m.numel() * m.dtype.size_in_bytes()) as u64)
        };
        match program.why_cut(producer, consumer) {
            Some(reason) => format!("not fused: {reason}; the {bytes} buffer is materialized"),
            None if program.params.contains(&producer) => {
                format!("not fused: the producer is a program input ({bytes})")
            }
            None => format!("not fused; the planner recorded no reason ({bytes} materialized)"),
        }
    };
    let inputs = &graph.nodes[n].inputs;
    s.push_str("inputs:\n");
    if inputs.is_empty() {
        s.push_str("  (none)\n");
    }
    for &i in inputs {
        let _ = writeln!(s, "  {:<40} {}", describe(i), verdict(i, n));
    }
    s.push_str("consumers:\n");
    let consumers: Vec<NodeId> =
        (n + 1..graph.len()).filter(|&c| graph.nodes[c].inputs.contains(&n)).collect();
    if consumers.is_empty() {
        s.push_str("  (none)\n");
    }
    for c in consumers {
        let _ = writeln!(s, "  {:<40} {}", describe(c), verdict(n, c));
    }
    if program.outputs.contains(&n) {
        s.push_str("returned to the user: stored by its kernel\n");
    }
    Ok(s)
}
