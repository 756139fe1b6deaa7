//! The cost model: bytes moved to and from memory, plus a small term for
//! arithmetic. Costs are in bytes.
//!
//! What a node costs depends on whether it must be materialized:
//! - reductions, matmuls and layout ops are kernel boundaries: they read
//!   their inputs and write their output, so they pay both;
//! - elementwise ops (and generated sources: `arange`, `rand`) fuse into the
//!   kernels around them and pay only [`ELEMENT_OP`] per element;
//! - the fused forms (`softmax`, `layer_norm`, ...) read their input once and
//!   stream their result into their consumers like an elementwise op, which
//!   makes them cheaper than the reductions they replace;
//! - parameters are already in memory, literals are generated in-kernel:
//!   both are free;
//! - every op adds [`PER_OP`], so that of two equal plans the one with fewer
//!   ops wins (zero-sized tensors included).
//!
//! The outputs are written whatever the plan, so their bytes are left out.
//! A node's cost depends only on the metas of its class and its inputs, so
//! the cost of a plan is the sum over the distinct classes it uses: a shared
//! value is paid once ([`crate::DagExtractor`]).

use egg::{CostFunction, Id, Language};

use crate::analysis::node_meta;
use crate::{NodeKind, TensorGraph, TensorNode};

/// Cost of one elementwise op per output element.
pub const ELEMENT_OP: f64 = 0.5;
/// Cost of a fused row op (softmax, norms) per element, on top of its reads.
pub const FUSED_ROW_OP: f64 = 1.0;
/// Cost of one multiply-add of a matmul.
pub const MATMUL_FLOP: f64 = 1.0 / 16.0;
/// Cost of any op, whatever its size.
pub const PER_OP: f64 = 1.0;

/// The bytes-moved cost of e-nodes of one e-graph.
#[derive(Debug, Clone, Copy)]
pub struct BytesMoved<'a> {
    egraph: &'a TensorGraph,
}

impl<'a> BytesMoved<'a> {
    /// The model over `egraph`'s classes.
    pub fn new(egraph: &'a TensorGraph) -> Self {
        BytesMoved { egraph }
    }

    /// What the node itself costs, its inputs not included.
    pub fn node_cost(&self, node: &TensorNode) -> f64 {
        let Some(out) = node_meta(self.egraph, node) else { return 0.0 };
        let inputs: Vec<_> =
            node.inputs().iter().filter_map(|&c| self.egraph[c].data.meta.as_ref()).collect();
        let elems = out.numel() as f64;
        let read: f64 = inputs.iter().map(|m| m.size_in_bytes() as f64).sum();
        let write = out.size_in_bytes() as f64;
        use NodeKind::*;
        match node.kind {
            Attr(_) | Parameter | Full => 0.0,
            Arange | Rand | Randn | Unary(_) | Binary(_) | Where | Cast => {
                PER_OP + ELEMENT_OP * elems
            }
            Reduce(_) | ArgReduce(_) => {
                let in_elems = inputs.first().map_or(0.0, |m| m.numel() as f64);
                PER_OP + read + write + ELEMENT_OP * in_elems
            }
            Expand | Reshape | Permute | Slice | Concat | GatherRows | ScatterAddRows => {
                PER_OP + read + write
            }
            MatMul => {
                let k = inputs.first().and_then(|m| m.shape.last()).copied().unwrap_or(0) as f64;
                PER_OP + read + write + MATMUL_FLOP * elems * k
            }
            Softmax | LogSoftmax | LayerNorm | RmsNorm => PER_OP + read + FUSED_ROW_OP * elems,
        }
    }
}

/// A node cost summed as a tree, as egg's [`egg::Extractor`] sums it: shared
/// values are paid once per use. Used as the fallback extraction, and to show
/// what the DAG cost changes.
pub struct TreeCost<F>(pub F);

impl<F: FnMut(&TensorNode) -> f64> CostFunction<TensorNode> for TreeCost<F> {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &TensorNode, mut costs: C) -> f64 {
        let own = (self.0)(enode);
        enode.children().iter().fold(own, |sum, &c| sum + costs(c))
    }
}
