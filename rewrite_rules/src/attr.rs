//! Attribute leaves: the non-tensor arguments of an op (axes, shapes,
//! dtypes, literal values) stored as e-nodes of their own.
//!
//! Keeping attributes in the e-graph, instead of inside the op, makes them
//! part of e-node identity (`sum` over `[0]` and over `[1]` are different
//! nodes) and lets a pattern bind one with a variable, as in
//! `(softmax ?x ?ax)` bound from `(max ?x ?ax true)`.

use std::fmt;
use std::str::FromStr;

use trace_ir::{DType, Shape};

/// One attribute value. Its text form is what patterns write.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attr {
    /// An axis, a parameter index, a length, a seed, a slice bound: `3`.
    Int(u64),
    /// `keepdim`: `true` or `false`.
    Flag(bool),
    /// A shape, an axis list or a permutation: `[0,2,1]` (no spaces: patterns
    /// split on whitespace).
    Dims(Shape),
    /// A dtype by name: `f32`.
    DType(DType),
    /// An f64 literal, stored as its bits so that NaN and -0.0 have an
    /// identity (`Eq` and `Hash` on f64 would not).
    Lit(u64),
}

impl Attr {
    /// The attribute for an f64 literal.
    pub fn lit(v: f64) -> Self {
        Attr::Lit(v.to_bits())
    }

    /// The attribute for a count or an index.
    pub fn int(v: usize) -> Self {
        Attr::Int(v as u64)
    }

    /// The count or index, if this is one that fits a `usize`.
    pub fn as_usize(&self) -> Option<usize> {
        match self {
            Attr::Int(v) => usize::try_from(*v).ok(),
            _ => None,
        }
    }

    /// The list of dimensions, if this is one.
    pub fn as_dims(&self) -> Option<&Shape> {
        match self {
            Attr::Dims(d) => Some(d),
            _ => None,
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Flag(b) => write!(f, "{b}"),
            Attr::Dims(d) => {
                let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
                write!(f, "[{}]", parts.join(","))
            }
            Attr::DType(d) => write!(f, "{d}"),
            // `{:?}` always prints a '.', an exponent, `inf` or `NaN`, so a
            // literal never reads back as an `Int`.
            Attr::Lit(bits) => write!(f, "{:?}", f64::from_bits(*bits)),
        }
    }
}

impl FromStr for Attr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(b) = s.parse::<bool>() {
            return Ok(Attr::Flag(b));
        }
        if let Some(d) = DType::ALL.into_iter().find(|d| d.name() == s) {
            return Ok(Attr::DType(d));
        }
        if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let dims: Result<Shape, _> = inner
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| p.trim().parse::<usize>())
                .collect();
            return dims.map(Attr::Dims).map_err(|e| format!("bad dimension list {s:?}: {e}"));
        }
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s.parse().map(Attr::Int).map_err(|e| format!("bad integer {s:?}: {e}"));
        }
        s.parse::<f64>().map(Attr::lit).map_err(|_| format!("{s:?} is not an attribute"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        let attrs = [
            Attr::Int(7),
            Attr::Flag(true),
            Attr::Dims(Shape::from_slice(&[2, 0, 3])),
            Attr::Dims(Shape::new()),
            Attr::DType(DType::BF16),
            Attr::lit(1.0),
            Attr::lit(-0.0),
            Attr::lit(1e-5),
            Attr::lit(f64::INFINITY),
            Attr::lit(f64::NAN),
        ];
        for a in attrs {
            assert_eq!(a.to_string().parse::<Attr>(), Ok(a.clone()), "{a}");
        }
    }
}
