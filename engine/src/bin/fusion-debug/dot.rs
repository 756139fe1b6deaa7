//! The drawing as Graphviz source: `dot -Tsvg` lays it out with clusters.

use std::fmt::Write;

use crate::graph::Drawn;
use crate::svg::kernel_hue;

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}

pub fn render(drawn: &Drawn, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "digraph {} {{", quote(title));
    s.push_str("  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=monospace];\n");
    for (g, group) in drawn.groups.iter().enumerate() {
        let ops: String = group
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let tip = format!(
                    "{} {}\ncall site: {}",
                    op.shape,
                    op.dtype,
                    op.call_site.as_deref().unwrap_or("unknown")
                );
                let fill = if op.output { ", fillcolor=\"#fff7d6\", penwidth=2" } else { "" };
                format!(
                    "    g{g}_{i} [label={}, tooltip={}{fill}];\n",
                    quote(&op.label),
                    quote(&tip)
                )
            })
            .collect();
        match group.kernel {
            Some(k) => {
                let hue = kernel_hue(k);
                let _ = writeln!(
                    s,
                    "  subgraph cluster_kernel_{k} {{\n    label={}; style=\"rounded,filled\"; fillcolor={}; color={};\n{ops}  }}",
                    quote(&group.title),
                    quote(&hsl_to_hex(hue, 0.70, 0.93)),
                    quote(&hsl_to_hex(hue, 0.55, 0.42))
                );
            }
            None => s.push_str(&ops),
        }
    }
    for e in &drawn.edges {
        let (a, b) = (format!("g{}_{}", e.from.0, e.from.1), format!("g{}_{}", e.to.0, e.to.1));
        match e.label() {
            Some(label) => {
                let tip = e.reason.as_deref().map(|r| format!("cut: {r}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "  {a} -> {b} [penwidth=3.5, color=\"#b3261e\", label={}, tooltip={}];",
                    quote(&label),
                    quote(&tip)
                );
            }
            None => {
                let _ = writeln!(s, "  {a} -> {b};");
            }
        }
    }
    s.push_str("}\n");
    s
}

/// Graphviz does not read `hsl(...)`: the same colour as `#rrggbb`.
fn hsl_to_hex(h: f64, s: f64, l: f64) -> String {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (h / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}
