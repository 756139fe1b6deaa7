//! Pruning: `into_pruned` gives what `pruned` gives, and hands back a trace
//! it would not change without copying it.

use trace_ir::shape::shape;
use trace_ir::{BinaryOp, DType, Meta, Op, Trace, UnaryOp};

fn chain(dead_branch: bool) -> Trace {
    let mut t = Trace::new();
    let x = t.push_parameter(Meta::new(shape(&[4, 3]), DType::F32));
    let unused = t.push_parameter(Meta::new(shape(&[2]), DType::F32));
    let b = t.push_parameter(Meta::new(shape(&[3]), DType::F32));
    let y = t.push(Op::Binary { kind: BinaryOp::Add }, &[x, b]).unwrap();
    if dead_branch {
        t.push(Op::Unary { kind: UnaryOp::Exp }, &[unused]).unwrap();
    }
    let z = t.push(Op::Unary { kind: UnaryOp::Exp }, &[y]).unwrap();
    t.outputs = vec![z, y];
    t
}

#[test]
fn into_pruned_equals_pruned() {
    for dead in [false, true] {
        let t = chain(dead);
        let (want, want_params) = t.pruned();
        let (got, got_params) = t.clone().into_pruned();
        assert_eq!(got.to_json(), want.to_json());
        assert_eq!(got_params, want_params);
        assert_eq!(got_params, vec![0, 2]);
    }
}

#[test]
fn a_trace_with_nothing_to_prune_comes_back_as_it_is() {
    let mut t = chain(false);
    // Drop the unused parameter by hand: every node is live now.
    let (t2, _) = t.pruned();
    t = t2;
    let nodes = t.nodes.as_ptr();
    let (same, params) = t.into_pruned();
    assert_eq!(same.nodes.as_ptr(), nodes, "the node vector was not moved");
    assert_eq!(params, vec![0, 1]);
}
