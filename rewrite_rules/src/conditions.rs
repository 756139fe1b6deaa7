//! Conditions rules state on their matches, beyond the meta check of
//! [`crate::guard`]: literal values, attributes, dtypes.

use egg::{Id, Subst, Var};
use trace_ir::{DType, Meta};

use crate::guard::var;
use crate::numeric::unit_roundoff;
use crate::{Attr, TensorGraph};

/// A condition type: egg calls it with the matched class and substitution.
pub type Check = Box<dyn Fn(&mut TensorGraph, Id, &Subst) -> bool + Send + Sync>;

/// The constant bound to `name` and its dtype, if it is one.
fn constant_of(egraph: &TensorGraph, subst: &Subst, name: Var) -> Option<(f64, DType)> {
    let data = &egraph[*subst.get(name)?].data;
    Some((data.constant?, data.meta.as_ref()?.dtype))
}

/// `name` is a literal constant satisfying `pred(value, dtype)`.
pub fn constant(name: &str, pred: impl Fn(f64, DType) -> bool + Send + Sync + 'static) -> Check {
    let v = var(name);
    Box::new(move |egraph, _, subst| constant_of(egraph, subst, v).is_some_and(|(c, d)| pred(c, d)))
}

/// `name` is a literal constant equal to `target` up to the rounding of its
/// dtype plus `1e-6`: users write `0.7978845608` for `sqrt(2 / pi)`.
pub fn near(name: &str, target: f64) -> Check {
    constant(name, move |c, d| is_near(c, target, d))
}

/// `c` equals `target` up to the rounding of `dtype` plus `1e-6` ([`near`]).
pub fn is_near(c: f64, target: f64, dtype: DType) -> bool {
    (c - target).abs() <= 1e-6 + 2.0 * unit_roundoff(dtype) * target.abs()
}

/// Every condition.
pub fn all(checks: Vec<Check>) -> Check {
    Box::new(move |egraph, id, subst| checks.iter().all(|c| c(egraph, id, subst)))
}

/// The attribute bound to `name`.
pub fn attr_of(egraph: &TensorGraph, subst: &Subst, name: Var) -> Option<Attr> {
    egraph[*subst.get(name)?].data.attr.clone()
}

/// The meta of the tensor bound to `name`.
pub fn meta_of(egraph: &TensorGraph, subst: &Subst, name: Var) -> Option<Meta> {
    egraph[*subst.get(name)?].data.meta.clone()
}
