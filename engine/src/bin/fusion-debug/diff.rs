//! `diff A B`: why two flushes did, or did not, share a cache entry.
//!
//! Tier 1 is keyed by the shape class, so the answer has three cases: the
//! same signature (one program), the same class with other sizes (the native
//! backend resizes the program; PJRT compiles per size), or different classes
//! (the first field that differs).

use std::fmt::Write;
use std::path::Path;

use deferfuse::dump::{compare, Comparison, FlushDump, TierOutcome};
use trace_ir::ShapeClass;

pub fn diff((path_a, a): (&Path, &FlushDump), (path_b, b): (&Path, &FlushDump)) -> String {
    let mut s = String::new();
    for (name, path, d) in [("A", path_a, a), ("B", path_b, b)] {
        let inputs = d.recorded.num_parameters();
        let ops = d.recorded.len() - inputs;
        let kernels = d.program.kernels.len();
        let _ = writeln!(
            s,
            "{name} {} signature {} shape class {} ({ops} ops on {inputs} inputs, {kernels} kernels; backend {}, process {})",
            path.display(),
            d.signature,
            d.shape_class,
            d.backend,
            d.process
        );
    }
    let _ = writeln!(
        s,
        "B's cache outcome: tier 1 {}, tier 2 {}, tier 3 {}",
        b.cache.tier1, b.cache.tier2, b.cache.tier3
    );
    match compare(&a.recorded, &b.recorded) {
        Comparison::Same => {
            s.push_str(
                "same signature: B can reuse A's program (tier 1 in the same context, tier 3 across processes)\n",
            );
            if a.backend != b.backend || a.engine_version != b.engine_version {
                let _ = writeln!(
                    s,
                    "but the on-disk key also holds the engine and backend: {} {} vs {} {}",
                    a.engine_version, a.backend, b.engine_version, b.backend
                );
            }
        }
        Comparison::SameClass(size) => {
            let _ = writeln!(
                s,
                "same shape class, different sizes; first size that differs:\n  {size}"
            );
            where_recorded(&mut s, a, b, size.node);
            s.push_str(&backend_verdict(a, b));
            s.push_str(&what_happened(a, b));
        }
        Comparison::Different(difference) => {
            let _ = writeln!(
                s,
                "shape classes differ, so B could not reuse A's program on any backend; first difference:\n  {difference}"
            );
            if let Some(node) = difference.node {
                where_recorded(&mut s, a, b, node);
            }
        }
    }
    if a.backend != b.backend {
        let _ = writeln!(s, "note: A ran on backend {}, B on {}", a.backend, b.backend);
    }
    s
}

/// What B's backend does with a new size of a cached shape class.
fn backend_verdict(a: &FlushDump, b: &FlushDump) -> String {
    match b.backend.as_str() {
        "cpu" => {
            // The test tier 1 applies: A's program must map onto B's sizes.
            let (from, to) = (ShapeClass::of(&a.recorded), ShapeClass::of(&b.recorded));
            if a.program.resized(from.size_map(&to)).is_some() {
                "on backend cpu (native, executables resize): in the context that ran A, B reuses A's program \
                 resized to its sizes, with no rewrite, plan or compile\n"
                    .into()
            } else {
                let why = "it holds a size that is not a size of its recorded trace, or a strided view that does not \
                           fold at B's sizes";
                format!(
                    "on backend cpu (native): A's program does not resize: {why}; so B is rewritten, planned and \
                     compiled anew even in the context that ran A\n"
                )
            }
        }
        "pjrt" => "on backend pjrt (executables are compiled per size): B is still a recompile, rewritten and \
                   compiled for its sizes even in the context that ran A\n"
            .into(),
        other => format!(
            "on backend {other}: a new size is resized where the backend's executables resize (the native cpu \
             backend's do) and recompiled otherwise (pjrt)\n"
        ),
    }
}

/// What B's tier-1 outcome says actually happened to it.
fn what_happened(a: &FlushDump, b: &FlushDump) -> String {
    let prepared = match (b.cache.tier3, b.backend.as_str()) {
        (TierOutcome::Hit, _) => {
            "its program came from the on-disk cache (tier 3) and was compiled"
        }
        // PJRT gets the rewritten trace unplanned: XLA fuses it.
        (_, "pjrt") => "it was rewritten and compiled for its own sizes",
        _ => "it was rewritten, planned and compiled for its own sizes",
    };
    match b.cache.tier1 {
        TierOutcome::Resized => {
            "here B was resized: tier 1 resized its shape class's program to B's sizes (nothing rewritten, planned \
             or compiled)\n"
                .into()
        }
        TierOutcome::Hit => "here B was a tier-1 hit: its context had already served these exact sizes\n".into(),
        TierOutcome::Miss if b.backend == "pjrt" => format!("here B was a tier-1 miss: {prepared}\n"),
        TierOutcome::Miss if a.process != b.process => format!(
            "here B was a tier-1 miss: A and B come from different processes ({} and {}), and tier 1 lives in \
             memory, per context (the on-disk tier 3 is keyed by exact sizes); {prepared}\n",
            a.process, b.process
        ),
        TierOutcome::Miss => format!(
            "here B was a tier-1 miss: its context held no program of this shape class that resizes (tier 1 is \
             per context, so A may have run in another one); {prepared}\n"
        ),
        TierOutcome::Rejected | TierOutcome::Skipped => String::new(),
    }
}

/// Appends where each flush recorded `node`.
fn where_recorded(s: &mut String, a: &FlushDump, b: &FlushDump, node: usize) {
    for (name, d) in [("A", a), ("B", b)] {
        if let Some(line) = recorded_at(d, node) {
            let _ = writeln!(s, "  in {name}: {line}");
        }
    }
}

/// Where the user's code recorded `node`, or, for a program input, the op
/// that first read it (inputs are tensors made earlier, so they have no
/// call site of their own).
fn recorded_at(d: &FlushDump, node: usize) -> Option<String> {
    if let Some(site) = d.call_sites.get(node)?.as_ref() {
        return Some(format!("recorded at {site}"));
    }
    let reader =
        (node + 1..d.recorded.len()).find(|&r| d.recorded.nodes[r].inputs.contains(&node))?;
    let site = d.call_sites[reader].as_ref()?;
    Some(format!(
        "first read by node {reader} ({}) at {site}",
        FlushDump::op_label(&d.recorded.nodes[reader].op)
    ))
}
