//! The HTML view: one self-contained page (inline CSS, JS and SVG, nothing
//! fetched) with the drawing on the left and a side panel: the flush's cache
//! outcome and costs, the rules that fired, the kernel list, and the details
//! of the op under the pointer.
//!
//! The page's script marks `<body data-ready="1" data-clusters="N">` once it
//! has run, and `data-script-error` if anything threw, so a headless browser
//! can check that the page works.

use std::fmt::Write;

use deferfuse::dump::{kernel_kind, FlushDump};
use rewrite_rules::CutReason;

use crate::graph::Drawn;
use crate::layout::Laid;
use crate::svg::{esc, kernel_colors};
use crate::{human_bytes, human_ns};

const STYLE: &str = r#"
body { margin: 0; font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; display: flex; height: 100vh; }
#graph { flex: 1; overflow: auto; background: #fafafa; }
#panel { width: 380px; overflow: auto; border-left: 1px solid #ddd; padding: 12px 16px; background: #fff; }
h1 { font-size: 15px; margin: 4px 0 8px; word-break: break-all; }
h2 { font-size: 13px; margin: 16px 0 6px; text-transform: uppercase; letter-spacing: .04em; color: #555; }
table { border-collapse: collapse; width: 100%; }
td, th { padding: 2px 6px 2px 0; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; border: 1px solid; vertical-align: -1px; }
#kernels li { cursor: pointer; margin: 2px 0; }
#kernels li:hover { text-decoration: underline; }
ul { padding-left: 18px; margin: 4px 0; }
#details { min-height: 5.5em; background: #f6f6f6; border-radius: 6px; padding: 6px 8px; }
.op { cursor: default; }
.op:hover rect { stroke: #0b57d0; stroke-width: 2.5; }
.cluster.dim, .input.dim { opacity: .25; }
.note { color: #8a5300; }
"#;

const SCRIPT: &str = r#"
window.addEventListener('error', function (e) { document.body.setAttribute('data-script-error', String(e.message)); });
(function () {
  var details = document.getElementById('details');
  function show(op) {
    var title = op.querySelector('title');
    details.textContent = title ? title.textContent : '';
  }
  var ops = document.querySelectorAll('#graph .op');
  for (var i = 0; i < ops.length; i++) {
    ops[i].addEventListener('mouseenter', function () { show(this); });
  }
  var items = document.querySelectorAll('#kernels li');
  for (var j = 0; j < items.length; j++) {
    items[j].addEventListener('click', function () {
      var k = this.getAttribute('data-kernel');
      var groups = document.querySelectorAll('#graph .cluster, #graph .input');
      for (var g = 0; g < groups.length; g++) {
        var on = groups[g].getAttribute('data-kernel') === k;
        groups[g].classList.toggle('dim', !on);
      }
      var target = document.getElementById('kernel-' + k);
      if (target && target.scrollIntoView) { target.scrollIntoView({ block: 'center', inline: 'center' }); }
    });
  }
  document.body.setAttribute('data-clusters', String(document.querySelectorAll('#graph g.cluster').length));
  document.body.setAttribute('data-ready', '1');
})();
"#;

pub fn render(dump: &FlushDump, drawn: &Drawn, laid: &Laid, title: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fusion-debug: {}</title><style>{STYLE}</style></head>\n<body>\n<div id=\"graph\">\n",
        esc(title)
    );
    s.push_str(&crate::svg::render(drawn, laid));
    s.push_str("</div>\n<div id=\"panel\">\n");
    let _ = writeln!(s, "<h1>{}</h1>", esc(title));
    s.push_str(&overview(dump));
    if let Some(note) = &drawn.note {
        let _ = writeln!(s, "<p class=\"note\">{}</p>", esc(note));
    }
    s.push_str("<h2>Op under the pointer</h2><div id=\"details\" class=\"mono\" style=\"white-space: pre-wrap\">Hover an op for its shape, dtype and call site.</div>\n");
    s.push_str(&kernels(dump));
    s.push_str(&rules(dump));
    s.push_str(&cuts(dump));
    let _ = write!(s, "</div>\n<script>{SCRIPT}</script>\n</body></html>\n");
    s
}

fn overview(dump: &FlushDump) -> String {
    let m = &dump.memory;
    let t = &dump.timings_ns;
    let ops = dump
        .recorded
        .nodes
        .iter()
        .filter(|n| !matches!(n.op, trace_ir::Op::Parameter { .. }))
        .count();
    let rows = [
        ("signature", format!("<code>{}</code>", esc(&dump.signature))),
        ("shape class", format!("<code>{}</code>", esc(&dump.shape_class))),
        ("backend", format!("{} ({})", esc(&dump.backend), esc(&dump.preparation))),
        ("ops recorded", ops.to_string()),
        ("kernels", dump.program.kernels.len().to_string()),
        (
            "cache",
            format!(
                "tier 1 {} · tier 2 {} · tier 3 {}",
                dump.cache.tier1, dump.cache.tier2, dump.cache.tier3
            ),
        ),
        (
            "time",
            format!(
                "rewrite {} · plan {} · compile {} · run {}",
                human_ns(t.rewrite),
                human_ns(t.plan),
                human_ns(t.compile),
                human_ns(t.run)
            ),
        ),
        ("memory", format!("peak {} · written {}", human_bytes(m.peak), human_bytes(m.written))),
    ];
    let mut s = String::from("<table>");
    for (k, v) in rows {
        let _ = write!(s, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    s.push_str("</table>\n");
    s
}

fn kernels(dump: &FlushDump) -> String {
    let mut s = String::from("<h2>Kernels</h2><ul id=\"kernels\">\n");
    for (k, kernel) in dump.program.kernels.iter().enumerate() {
        let (fill, stroke) = kernel_colors(k);
        let written: u64 =
            dump.materialized.iter().filter(|m| m.producer == Some(k)).map(|m| m.bytes).sum();
        let _ = writeln!(
            s,
            "<li data-kernel=\"{k}\"><span class=\"swatch\" style=\"background:{fill};border-color:{stroke}\"></span>kernel {k} · {} · {} ops · writes {}</li>",
            esc(&kernel_kind(&kernel.kind)),
            kernel.nodes.len(),
            human_bytes(written)
        );
    }
    s.push_str("</ul>\n");
    s
}

fn rules(dump: &FlushDump) -> String {
    let mut s = String::from("<h2>Rules fired</h2>\n");
    let Some(r) = &dump.rewrite else {
        s.push_str(
            "<p>No rewrite report (unfused, or the program came from the on-disk cache).</p>\n",
        );
        return s;
    };
    if !r.ran_in_this_flush {
        s.push_str("<p>Tier-1 hit: the rewrite did not run again; these are the rules of the flush that built the program (for a resized program, at that flush's sizes).</p>\n");
    }
    let _ = writeln!(
        s,
        "<p>Stopped: <b>{}</b> after {} iterations ({} e-nodes, {} e-classes; limits {} nodes, {} iterations, {} ms).</p>",
        esc(&r.stop_reason.to_string()),
        r.iterations,
        r.egraph_nodes,
        r.egraph_classes,
        r.node_limit,
        r.iter_limit,
        r.time_limit_ms
    );
    if r.rules_fired.is_empty() {
        s.push_str("<p>No rule changed the graph.</p>\n");
        return s;
    }
    s.push_str("<table id=\"rules\">");
    let mut fired: Vec<_> = r.rules_fired.iter().collect();
    fired.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (name, count) in fired {
        let _ =
            write!(s, "<tr><td><code>{}</code></td><td class=\"n\">{count}</td></tr>", esc(name));
    }
    s.push_str("</table>\n");
    s
}

fn cuts(dump: &FlushDump) -> String {
    let mut s = String::from("<h2>Why not fused</h2>\n");
    if dump.program.cuts.is_empty() {
        s.push_str("<p>No cuts recorded.</p>\n");
        return s;
    }
    s.push_str("<ul id=\"cuts\">");
    let (inputs, cuts): (Vec<_>, Vec<_>) =
        dump.program.cuts.iter().partition(|c| c.reason == CutReason::Parameter);
    for c in cuts {
        let _ = write!(
            s,
            "<li><code>#{} → #{}</code>: {}</li>",
            c.producer,
            c.consumer,
            esc(&c.reason.to_string())
        );
    }
    s.push_str("</ul>\n");
    if !inputs.is_empty() {
        let _ = writeln!(
            s,
            "<p>and {} edges from program inputs, which are buffers already.</p>",
            inputs.len()
        );
    }
    s
}
