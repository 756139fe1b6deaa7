//! Trace JSON: round trips, and every kind of malformed input is an error.

use proptest::prelude::*;
use trace_ir::shape::shape;
use trace_ir::{BinaryOp, DType, Error, Meta, Op, ReduceOp, Trace, UnaryOp};

fn sample() -> Trace {
    let mut t = Trace::new();
    let x = t.push_parameter(Meta::new(shape(&[4, 3]), DType::F32));
    let b = t.push_parameter(Meta::new(shape(&[3]), DType::F32));
    let c =
        t.push(Op::Full { value: f64::NAN, shape: shape(&[]), dtype: DType::F32 }, &[]).unwrap();
    let y = t.push(Op::Binary { kind: BinaryOp::Add }, &[x, b]).unwrap();
    let y = t.push(Op::Binary { kind: BinaryOp::Mul }, &[y, c]).unwrap();
    let z = t.push(Op::Unary { kind: UnaryOp::Exp }, &[y]).unwrap();
    let s =
        t.push(Op::Reduce { kind: ReduceOp::Sum, axes: shape(&[1]), keepdim: true }, &[z]).unwrap();
    t.outputs = vec![s, z];
    t
}

fn invalid(text: &str) -> String {
    match Trace::from_json(text) {
        Err(Error::InvalidTrace(msg)) => msg,
        other => panic!("expected InvalidTrace, got {other:?}"),
    }
}

#[test]
fn round_trip_keeps_everything_including_nan_literals() {
    let t = sample();
    let back = Trace::from_json(&t.to_json()).unwrap();
    assert_eq!(back.outputs, t.outputs);
    assert_eq!(back.nodes.len(), t.nodes.len());
    assert!(matches!(back.nodes[2].op, Op::Full { value, .. } if value.is_nan()));
    assert_eq!(back.to_json(), t.to_json());
}

#[test]
fn truncated_json_is_an_error() {
    let text = sample().to_json();
    for cut in [0, 1, text.len() / 3, text.len() / 2, text.len() - 2] {
        invalid(&text[..cut]);
    }
}

#[test]
fn wrong_version_and_format_are_errors() {
    let text = sample().to_json();
    let msg = invalid(&text.replace("\"version\": 1", "\"version\": 99"));
    assert!(msg.contains("99"), "{msg}");
    invalid(&text.replace("deferfuse-trace", "something-else"));
}

#[test]
fn dangling_and_forward_node_ids_are_errors() {
    let mut t = sample();
    t.nodes[3].inputs[0] = 42;
    let msg = invalid(&t.to_json());
    assert!(msg.contains("node 3"), "{msg}");
    let mut t = sample();
    t.outputs.push(1000);
    invalid(&t.to_json());
}

#[test]
fn shape_and_dtype_lies_are_errors() {
    let mut t = sample();
    t.nodes[5].meta.shape = shape(&[4, 4]);
    let msg = invalid(&t.to_json());
    assert!(msg.contains("[4, 4]") && msg.contains("[4, 3]"), "{msg}");
    let mut t = sample();
    t.nodes[5].meta.dtype = DType::BF16;
    invalid(&t.to_json());
}

#[test]
fn bad_parameter_numbering_and_bad_attributes_are_errors() {
    let mut t = sample();
    if let Op::Parameter { index, .. } = &mut t.nodes[1].op {
        *index = 7;
    }
    invalid(&t.to_json());
    let mut t = sample();
    t.nodes[6].op = Op::Reduce { kind: ReduceOp::Sum, axes: shape(&[5]), keepdim: true };
    invalid(&t.to_json());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any byte flipped, inserted or removed anywhere: an error or a valid
    /// trace, never a panic.
    #[test]
    fn mutated_json_never_panics(pos in 0usize..4000, byte in any::<u8>(), mode in 0u8..3) {
        let mut bytes = sample().to_json().into_bytes();
        let pos = pos % bytes.len();
        match mode {
            0 => bytes[pos] = byte,
            1 => bytes.insert(pos, byte),
            _ => { bytes.remove(pos); }
        }
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(t) = Trace::from_json(&text) {
            prop_assert!(t.validate().is_ok());
        }
    }
}
