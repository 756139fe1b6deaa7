//! Shape classes whose sizes coincide: a trace where two sizes that vary
//! independently happen to be equal is an instance of the class where they
//! differ, and matches it only through that class's symbol positions.

use trace_ir::shape::shape;
use trace_ir::{DType, Meta, Op, ShapeClass, Trace};

/// `x[n, k] @ w[k, m]`.
fn product(n: usize, k: usize, m: usize) -> Trace {
    let mut t = Trace::new();
    let x = t.push_parameter(Meta::new(shape(&[n, k]), DType::F32));
    let w = t.push_parameter(Meta::new(shape(&[k, m]), DType::F32));
    let y = t.push(Op::MatMul, &[x, w]).unwrap();
    t.outputs = vec![y];
    t
}

#[test]
fn coinciding_sizes_are_an_instance_of_the_class_where_they_differ() {
    let general = product(12, 32, 16);
    let coincident = product(32, 32, 16);
    let (class, positions) = (ShapeClass::of(&general), ShapeClass::positions(&general));
    // Each parameter's shape twice (its value's and its op's), then y's.
    assert_eq!(positions, vec![0, 1, 0, 1, 1, 2, 1, 2, 0, 2]);
    // Another class of their own, with one structure.
    assert_ne!(ShapeClass::of(&coincident).signature, class.signature);
    assert_eq!(ShapeClass::structure_hash(&coincident), ShapeClass::structure_hash(&general));
    let instance = ShapeClass::instance(&coincident, &positions).unwrap();
    assert_eq!(instance.signature, class.signature);
    assert_eq!(instance.sizes, vec![32, 32, 16]);
    // Of the same class, the instance is the class itself.
    let same = ShapeClass::instance(&product(20, 32, 16), &positions).unwrap();
    assert_eq!(same, ShapeClass::of(&product(20, 32, 16)));
}

#[test]
fn a_symbol_that_would_take_two_sizes_is_no_instance() {
    // The class where n and m coincide cannot serve n != m.
    let coincident = product(16, 32, 16);
    let positions = ShapeClass::positions(&coincident);
    assert!(ShapeClass::instance(&product(12, 32, 16), &positions).is_none());
    // Nor does a trace of another structure fit.
    assert!(ShapeClass::instance(&product(1, 32, 16), &positions).is_none());
    assert_ne!(
        ShapeClass::structure_hash(&product(1, 32, 16)),
        ShapeClass::structure_hash(&coincident)
    );
}
