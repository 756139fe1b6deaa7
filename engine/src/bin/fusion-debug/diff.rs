//! `diff A B`: why two flushes did, or did not, share a cache entry.

use std::fmt::Write;
use std::path::Path;

use deferfuse::dump::{first_difference, FlushDump};

pub fn diff((path_a, a): (&Path, &FlushDump), (path_b, b): (&Path, &FlushDump)) -> String {
    let mut s = String::new();
    for (name, path, d) in [("A", path_a, a), ("B", path_b, b)] {
        let inputs = d.recorded.num_parameters();
        let ops = d.recorded.len() - inputs;
        let kernels = d.program.kernels.len();
        let _ = writeln!(
            s,
            "{name} {} signature {} ({ops} ops on {inputs} inputs, {kernels} kernels)",
            path.display(),
            d.signature
        );
    }
    let _ =
        writeln!(s, "B's cache outcome: tier 1 {}, tier 2 {}, tier 3 {}", b.cache.tier1, b.cache.tier2, b.cache.tier3);
    match first_difference(&a.recorded, &b.recorded) {
        None => {
            s.push_str(
                "same signature: B can reuse A's program (tier 1 in the same process, tier 3 across processes)\n",
            );
            if a.backend != b.backend || a.engine_version != b.engine_version {
                let _ = writeln!(
                    s,
                    "but the on-disk key also holds the engine and backend: {} {} vs {} {}",
                    a.engine_version, a.backend, b.engine_version, b.backend
                );
            }
        }
        Some(difference) => {
            let _ =
                writeln!(s, "signatures differ, so B could not reuse A's program; first difference:\n  {difference}");
            if let Some(node) = difference.node {
                for (name, d) in [("A", a), ("B", b)] {
                    if let Some(line) = where_recorded(d, node) {
                        let _ = writeln!(s, "  in {name}: {line}");
                    }
                }
            }
        }
    }
    s
}

/// Where the user's code recorded `node`, or, for a program input, the op
/// that first read it (inputs are tensors made earlier, so they have no
/// call site of their own).
fn where_recorded(d: &FlushDump, node: usize) -> Option<String> {
    if let Some(site) = d.call_sites.get(node)?.as_ref() {
        return Some(format!("recorded at {site}"));
    }
    let reader = (node + 1..d.recorded.len()).find(|&r| d.recorded.nodes[r].inputs.contains(&node))?;
    let site = d.call_sites[reader].as_ref()?;
    Some(format!("first read by node {reader} ({}) at {site}", FlushDump::op_label(&d.recorded.nodes[reader].op)))
}
