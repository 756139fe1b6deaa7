//! The `patterns` rule set: decomposed composites, as the engine records
//! them (`engine/src/ops.rs`) and as users write them, are lifted to the
//! fused forms of the trace IR, which the planner runs as one kernel each.
//!
//! - `softmax`: `exp(x - max(x)) / sum(exp(x - max(x)))` over one axis
//!   (`keepdim` reductions) => `softmax(x)`.
//! - `log-softmax`: `(x - max(x)) - log(sum(exp(x - max(x))))` => `log_softmax(x)`.
//! - `layer-norm`: with `c = x - mean(x)`, `c * rsqrt(mean(c * c) + eps)` =>
//!   `layer_norm(x, eps)`; `layer-norm-div` the same with `c / sqrt(..)`.
//! - `rms-norm`: `x * rsqrt(mean(x * x) + eps)` => `rms_norm(x, eps)`;
//!   `rms-norm-pow` the same with `pow(x, 2)`.
//! - `gelu-tanh`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x*x*x)))`
//!   in its usual spellings (any grouping of the outer product, `x*x*x` in
//!   either grouping, or `x * c * (1 + k * x * x)`) => `gelu_tanh(x)`;
//!   `gelu-tanh-pow` the same with `pow(x, 3)`.
//! - `silu`: `x * sigmoid(x)` => `silu(x)`; `silu-div`: `x / (1 + exp(-x))`.
//!
//! Scalars the engine records from Rust numbers (`eps`) are 0-d parameters:
//! the fused norms take them as their `eps` input, whatever their value.
//! The GELU and SiLU constants must be literal `full` constants, compared
//! with a tolerance (users write `0.7978845608`). Operand order does not
//! matter while `algebraic` (which holds the commutativity rules) is on.
//!
//! The engine's own decompositions lift to forms that the reference backend
//! evaluates the same way; user spellings (`c / sqrt(..)`, the GELU
//! constants) may differ from the fused form by rounding.

use crate::literals::{HALF, ONE, THREE, TWO};
use egg::rewrite;
use trace_ir::consts::{GELU_TANH_BETA, GELU_TANH_KAPPA};

use crate::any_of::any_of;
use crate::conditions::{all, constant, near};
use crate::guard::{checked, TensorRewrite};

/// The GELU alternatives, `cube` being the spelling of `x^3`.
fn gelu_spellings(cubes: &[&str]) -> Vec<String> {
    let mut inner: Vec<String> =
        cubes.iter().map(|c| format!("(mul ?c (add ?x (mul ?k {c})))")).collect();
    if cubes.len() > 1 {
        // HF's FastGELU: `x * c * (1 + k * x * x)`.
        inner.push("(mul (mul ?x ?c) (add ?one (mul (mul ?k ?x) ?x)))".into());
    }
    let mut out = Vec::new();
    for t in inner {
        let s = format!("(add ?one (tanh {t}))");
        out.push(format!("(mul (mul ?half ?x) {s})"));
        out.push(format!("(mul ?half (mul ?x {s}))"));
        out.push(format!("(mul ?x (mul ?half {s}))"));
    }
    out
}

/// The rules of the set, each named.
pub fn rules() -> Vec<TensorRewrite> {
    let shifted = "(sub ?x (max ?x ?ax true))";
    let sum_exp = format!("(sum (exp {shifted}) ?ax true)");
    let centered = "(sub ?x (mean ?x ?axes true))";
    let var = format!("(mean (mul {centered} {centered}) ?axes true)");
    let gelu_constants = || {
        all(vec![
            near("?half", HALF),
            near("?one", ONE),
            near("?c", GELU_TANH_BETA),
            near("?k", GELU_TANH_KAPPA),
        ])
    };
    vec![
        rewrite!("softmax"; { any_of([format!("(div (exp {shifted}) {sum_exp})")]) }
            => { checked("(softmax ?x ?ax)") }),
        rewrite!("log-softmax"; { any_of([format!("(sub {shifted} (log {sum_exp}))")]) }
            => { checked("(log_softmax ?x ?ax)") }),
        rewrite!("layer-norm"; { any_of([format!("(mul {centered} (rsqrt (add {var} ?eps)))")]) }
            => { checked("(layer_norm ?x ?eps ?axes)") }),
        rewrite!("layer-norm-div"; { any_of([format!("(div {centered} (sqrt (add {var} ?eps)))")]) }
            => { checked("(layer_norm ?x ?eps ?axes)") }),
        rewrite!("rms-norm"; "(mul ?x (rsqrt (add (mean (mul ?x ?x) ?axes true) ?eps)))"
            => { checked("(rms_norm ?x ?eps ?axes)") }),
        rewrite!("rms-norm-pow"; "(mul ?x (rsqrt (add (mean (pow ?x ?two) ?axes true) ?eps)))"
            => { checked("(rms_norm ?x ?eps ?axes)") } if constant("?two", |c, _| c == TWO)),
        rewrite!("gelu-tanh"; { any_of(gelu_spellings(&["(mul (mul ?x ?x) ?x)", "(mul ?x (mul ?x ?x))"])) }
            => { checked("(gelu_tanh ?x)") } if gelu_constants()),
        rewrite!("gelu-tanh-pow"; { any_of(gelu_spellings(&["(pow ?x ?three)"])) }
            => { checked("(gelu_tanh ?x)") } if gelu_constants() if constant("?three", |c, _| c == THREE)),
        rewrite!("silu"; "(mul ?x (sigmoid ?x))" => { checked("(silu ?x)") }),
        rewrite!("silu-div"; "(div ?x (add ?one (exp (neg ?x))))" => { checked("(silu ?x)") }
            if near("?one", ONE)),
    ]
}
