//! The drawing as SVG: kernels as coloured clusters, ops as boxes with a
//! `<title>` tooltip (shape, dtype, call site), materialized buffers as heavy
//! edges labelled with their bytes. The HTML view embeds the same SVG.

use std::fmt::Write;

use crate::graph::Drawn;
use crate::layout::{Laid, OP_HEIGHT};

/// The fill and stroke colours of kernel `k`: hues spread by the golden angle
/// so neighbouring kernels differ.
pub fn kernel_colors(k: usize) -> (String, String) {
    let hue = kernel_hue(k);
    (format!("hsl({hue:.0}, 70%, 93%)"), format!("hsl({hue:.0}, 55%, 42%)"))
}

/// The hue of kernel `k`, in degrees.
pub fn kernel_hue(k: usize) -> f64 {
    (k as f64 * 137.508) % 360.0
}

/// Escapes text for XML content and attributes.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

pub fn render(drawn: &Drawn, laid: &Laid) -> String {
    let mut s = String::new();
    let (w, h) = (laid.width.ceil(), laid.height.ceil());
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="fusion-graph" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="12">"#
    );
    s.push_str(concat!(
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker>"##,
        r##"<marker id="arrow-heavy" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="4" markerHeight="4" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#b3261e"/></marker></defs>"##,
        "\n"
    ));
    s.push_str(r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    s.push('\n');

    for (g, group) in drawn.groups.iter().enumerate() {
        let r = laid.groups[g];
        let (fill, stroke, class, id) = match group.kernel {
            Some(k) => {
                let (f, s) = kernel_colors(k);
                (f, s, "cluster", format!("kernel-{k}"))
            }
            None => ("#f4f4f4".into(), "#9e9e9e".into(), "input", format!("group-{g}")),
        };
        let kernel_attr =
            group.kernel.map(|k| format!(r#" data-kernel="{k}""#)).unwrap_or_default();
        let _ = writeln!(s, r#"<g class="{class}" id="{id}"{kernel_attr}>"#);
        let dash = if group.kernel.is_none() { r#" stroke-dasharray="4 3""# } else { "" };
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="8" fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>"#,
            r.x, r.y, r.w, r.h
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" fill="{stroke}" font-weight="bold">{}</text>"#,
            r.x + 10.0,
            r.y + 16.0,
            esc(&group.title)
        );
        for (i, op) in group.ops.iter().enumerate() {
            let o = laid.ops[g][i];
            let site = op.call_site.as_deref().unwrap_or("unknown");
            let tip = format!(
                "{}\nshape {} {}\ncall site: {site}{}",
                op.label,
                op.shape,
                op.dtype,
                if op.output { "\nreturned to the user" } else { "" }
            );
            let _ = writeln!(
                s,
                r#"<g class="op" data-node="{}" data-shape="{}" data-dtype="{}" data-site="{}"><title>{}</title>"#,
                op.node,
                esc(&op.shape),
                esc(&op.dtype),
                esc(site),
                esc(&tip)
            );
            let (fill, width) = if op.output {
                ("#fff7d6", 2.0)
            } else {
                ("#ffffff", if op.stored { 1.6 } else { 1.0 })
            };
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{OP_HEIGHT}" rx="4" fill="{fill}" stroke="#444" stroke-width="{width}"/>"##,
                o.x, o.y, o.w
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text></g>"#,
                o.center_x(),
                o.y + 19.0,
                esc(&op.label)
            );
        }
        s.push_str("</g>\n");
    }

    // Edges last, so heavy ones stay visible over the clusters they cross.
    for e in &drawn.edges {
        let (a, b) = (laid.ops[e.from.0][e.from.1], laid.ops[e.to.0][e.to.1]);
        let (x1, y1, x2, y2) = (a.center_x(), a.bottom(), b.center_x(), b.y);
        let bend = ((y2 - y1).abs() / 2.0).max(20.0);
        let path = format!(
            "M{x1:.1},{y1:.1} C{x1:.1},{:.1} {x2:.1},{:.1} {x2:.1},{y2:.1}",
            y1 + bend,
            y2 - bend
        );
        if e.materialized() {
            let label = e.label().unwrap_or_default();
            let why = e.reason.as_deref().map(|r| format!(" (cut: {r})")).unwrap_or_default();
            let _ = writeln!(
                s,
                r##"<g class="edge materialized"><title>{} → {}: {label} materialized{}</title><path d="{path}" fill="none" stroke="#b3261e" stroke-width="3.5" stroke-opacity="0.8" marker-end="url(#arrow-heavy)"/>"##,
                esc(&drawn.groups[e.from.0].ops[e.from.1].label),
                esc(&drawn.groups[e.to.0].ops[e.to.1].label),
                esc(&why)
            );
            let (mx, my) = ((x1 + x2) / 2.0, (y1 + y2) / 2.0);
            let _ = writeln!(
                s,
                r##"<text x="{mx:.1}" y="{my:.1}" text-anchor="middle" fill="#b3261e" font-size="11" stroke="#ffffff" stroke-width="3" paint-order="stroke">{}</text></g>"##,
                esc(&label)
            );
        } else {
            let _ = writeln!(
                s,
                r##"<path class="edge" d="{path}" fill="none" stroke="#555" stroke-width="1.2" marker-end="url(#arrow)"/>"##
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
