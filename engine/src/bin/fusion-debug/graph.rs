//! The drawable form of a flush: one group per kernel (and one per program
//! input), the ops inside, and the edges between them. Every renderer (SVG,
//! HTML, DOT) draws this, so they agree on what is shown.

use deferfuse::dump::{kernel_kind, FlushDump};
use trace_ir::NodeId;

use crate::human_bytes;

/// A flush ready to lay out and draw.
pub struct Drawn {
    pub groups: Vec<Group>,
    pub edges: Vec<Edge>,
    /// Why the graph is approximate, when it is.
    pub note: Option<String>,
}

/// A kernel, or a program input outside every kernel.
pub struct Group {
    pub kernel: Option<usize>,
    pub title: String,
    pub ops: Vec<DrawnOp>,
}

pub struct DrawnOp {
    pub node: NodeId,
    pub label: String,
    pub shape: String,
    pub dtype: String,
    pub call_site: Option<String>,
    /// Written to memory by its kernel (or a program input).
    pub stored: bool,
    /// Returned to the user.
    pub output: bool,
}

/// An edge from `from` to `to`, each `(group, op)` indices into [`Drawn::groups`].
pub struct Edge {
    pub from: (usize, usize),
    pub to: (usize, usize),
    /// For an edge between groups: the bytes of the buffer that crosses.
    pub bytes: Option<u64>,
    /// For an edge between kernels: why the planner cut it.
    pub reason: Option<String>,
}

impl Edge {
    pub fn materialized(&self) -> bool {
        self.bytes.is_some()
    }

    pub fn label(&self) -> Option<String> {
        self.bytes.map(human_bytes)
    }
}

impl Drawn {
    pub fn of(dump: &FlushDump) -> Drawn {
        let mut drawn = Builder { dump, groups: Vec::new(), edges: Vec::new() };
        let program = &dump.program;
        let inputs: Vec<NodeId> = program
            .params
            .iter()
            .copied()
            .filter(|p| program.kernels.iter().any(|k| k.inputs.contains(p)))
            .collect();
        let mut param_group = vec![None; program.values.len()];
        for &p in &inputs {
            param_group[p] = Some(drawn.groups.len());
            drawn.groups.push(Group {
                kernel: None,
                title: "input".into(),
                ops: vec![drawn.op(p, true)],
            });
        }
        let first_kernel_group = drawn.groups.len();
        for (k, kernel) in program.kernels.iter().enumerate() {
            let ops =
                kernel.nodes.iter().map(|&n| drawn.op(n, kernel.outputs.contains(&n))).collect();
            let title = format!("kernel {k} · {}", kernel_kind(&kernel.kind));
            drawn.groups.push(Group { kernel: Some(k), title, ops });
        }
        // Where each stored value can be read from.
        let source = |v: NodeId| -> Option<(usize, usize)> {
            if let Some(g) = param_group[v] {
                return Some((g, 0));
            }
            let k = dump.producer_kernel(v)?;
            let g = first_kernel_group + k;
            let i = program.kernels[k].nodes.iter().position(|&n| n == v)?;
            Some((g, i))
        };
        let mut note = None;
        for (k, kernel) in program.kernels.iter().enumerate() {
            let g = first_kernel_group + k;
            match &dump.graph {
                Some(graph) => {
                    for (i, &n) in kernel.nodes.iter().enumerate() {
                        for &input in &graph.nodes[n].inputs {
                            if let Some(j) = kernel.nodes.iter().position(|&m| m == input) {
                                drawn.edges.push(Edge {
                                    from: (g, j),
                                    to: (g, i),
                                    bytes: None,
                                    reason: None,
                                });
                            } else if let Some(from) = source(input) {
                                let reason = program.why_cut(input, n).map(|r| r.to_string());
                                let bytes = Some(value_bytes(dump, input));
                                drawn.edges.push(Edge { from, to: (g, i), bytes, reason });
                            }
                        }
                    }
                }
                None => {
                    // Without the graph, connect each input buffer to the kernel's first op.
                    note = Some("the graph is not in this dump (the program came from the on-disk cache): edges join buffers to kernels, not ops".into());
                    for &input in &kernel.inputs {
                        if let (Some(from), false) = (source(input), kernel.nodes.is_empty()) {
                            let bytes = Some(value_bytes(dump, input));
                            drawn.edges.push(Edge { from, to: (g, 0), bytes, reason: None });
                        }
                    }
                }
            }
        }
        Drawn { groups: drawn.groups, edges: drawn.edges, note }
    }
}

fn value_bytes(dump: &FlushDump, v: NodeId) -> u64 {
    let meta = &dump.program.values[v];
    (meta.numel() * meta.dtype.size_in_bytes()) as u64
}

struct Builder<'a> {
    dump: &'a FlushDump,
    groups: Vec<Group>,
    edges: Vec<Edge>,
}

impl Builder<'_> {
    fn op(&self, node: NodeId, stored: bool) -> DrawnOp {
        let dump = self.dump;
        let meta = &dump.program.values[node];
        let label = match &dump.graph {
            Some(graph) => FlushDump::op_label(&graph.nodes[node].op),
            None => "value".into(),
        };
        DrawnOp {
            node,
            label: format!("#{node} {label}"),
            shape: format!("{:?}", meta.shape.as_slice()),
            dtype: meta.dtype.to_string(),
            call_site: dump.call_site_of(node).map(|s| s.to_string()),
            stored,
            output: dump.program.outputs.contains(&node),
        }
    }
}
