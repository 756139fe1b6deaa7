//! The `algebraic` rule set: identities that hold bit for bit in IEEE
//! arithmetic (and exactly on integers), so turning them on never changes a
//! result.
//!
//! Applied:
//! - `mul-commute`, `add-commute`: IEEE `*` and `+` are commutative. They
//!   are here so that the other rules, and the patterns, need to be written
//!   in one operand order only.
//! - `mul-one` (`x * 1 => x`), `div-one` (`x / 1 => x`): exact for every x,
//!   NaN, infinities and -0.0 included.
//! - `sub-zero` (`x - (+0) => x`): exact, -0.0 - (+0.0) is -0.0.
//! - `add-zero` (`x + 0 => x`) only where it is exact: on integers, or when
//!   the zero is -0.0 (x + -0.0 is x for every x, -0.0 included).
//! - `neg-neg` (`-(-x) => x`): negation only flips the sign bit.
//! - `cast-same` (`cast(x, dtype of x) => x`).
//! - `cast-widen-cast` (`cast(cast(x, wide), to) => cast(x, to)`) when the
//!   inner cast is lossless for x's dtype (bf16/f16 to f32, i32 to i64, bool
//!   to anything), so the outer cast sees the same value either way.
//! - `where-same` (`where(c, x, x) => x`).
//!
//! Every rule is also guarded by [`crate::guard`]: it fires only where the
//! result keeps the matched meta, so `x * 1` with a 1 that broadcasts `x`
//! to a larger shape stays as it is.
//!
//! Not applied, on purpose:
//! - `x * 0 => 0`: wrong for NaN and infinities (NaN), and for negative x (-0.0).
//! - `x + 0 => x` with a +0.0: wrong for x = -0.0 (-0.0 + 0.0 is +0.0).
//! - `x - x => 0`, `x / x => 1`: wrong for NaN and infinities.
//! - reassociation (`(a + b) + c => a + (b + c)`) and distribution: change
//!   rounding, and overflow.
//! - `x / y => x * (1 / y)`: two roundings instead of one.
//! - `exp(log x) => x`, `sqrt(x * x) => abs(x)`, `(x * y) / y => x`: change
//!   rounding, overflow or the domain.
//! - narrowing double casts (`f32 -> bf16 -> f32`): lose precision.

use egg::rewrite;
use trace_ir::DType;

use crate::conditions::{attr_of, constant, meta_of, Check};
use crate::guard::{checked, var, TensorRewrite};
use crate::literals::{ONE, ZERO};

/// A zero that leaves every x unchanged when added.
fn additive_identity(name: &str) -> Check {
    constant(name, |c, d| c == ZERO && (!d.is_float() || c.is_sign_negative()))
}

/// A zero that leaves every x unchanged when subtracted.
fn subtractive_identity(name: &str) -> Check {
    constant(name, |c, d| c == ZERO && (!d.is_float() || c.is_sign_positive()))
}

/// Whether every value of `from` is exactly representable in `to`.
pub fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to || from == Bool || matches!((from, to), (BF16 | F16, F32) | (I32, I64))
}

fn widening(x: &'static str, mid: &'static str) -> Check {
    let (x, mid) = (var(x), var(mid));
    Box::new(move |egraph, _, subst| {
        let from = meta_of(egraph, subst, x).map(|m| m.dtype);
        let to = attr_of(egraph, subst, mid);
        matches!((from, to), (Some(f), Some(crate::Attr::DType(t))) if lossless(f, t))
    })
}

/// The rules of the set, each named.
pub fn rules() -> Vec<TensorRewrite> {
    vec![
        rewrite!("mul-commute"; "(mul ?a ?b)" => { checked("(mul ?b ?a)") }),
        rewrite!("add-commute"; "(add ?a ?b)" => { checked("(add ?b ?a)") }),
        rewrite!("mul-one"; "(mul ?x ?one)" => { checked("?x") } if constant("?one", |c, _| c == ONE)),
        rewrite!("div-one"; "(div ?x ?one)" => { checked("?x") } if constant("?one", |c, _| c == ONE)),
        rewrite!("sub-zero"; "(sub ?x ?zero)" => { checked("?x") } if subtractive_identity("?zero")),
        rewrite!("add-zero"; "(add ?x ?zero)" => { checked("?x") } if additive_identity("?zero")),
        rewrite!("neg-neg"; "(neg (neg ?x))" => { checked("?x") }),
        rewrite!("cast-same"; "(cast ?x ?to)" => { checked("?x") }),
        rewrite!("cast-widen-cast"; "(cast (cast ?x ?mid) ?to)" => { checked("(cast ?x ?to)") }
            if widening("?x", "?mid")),
        rewrite!("where-same"; "(where ?c ?x ?x)" => { checked("?x") }),
    ]
}
