//! `Display` for tensors, in PyTorch's style: nested brackets, long
//! dimensions summarized with an ellipsis. Printing reads the value.

use std::fmt::{self, Display, Formatter, Write};

use crate::Tensor;

/// Dimensions longer than this are shown as their first and last few items.
const SUMMARIZE_ABOVE: usize = 6;
const EDGE_ITEMS: usize = 3;

impl Display for Tensor {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let data = match self.host_data() {
            Ok(d) => d,
            Err(e) => return write!(f, "tensor(<error: {e}>)"),
        };
        let is_float = self.dtype().is_float();
        let is_bool = self.dtype() == trace_ir::DType::Bool;
        let values = data.to_f64_vec();
        let mut out = String::from("tensor(");
        write_nested(&mut out, self.shape(), &values, is_float, is_bool, 7);
        write!(out, ", dtype={})", self.dtype()).unwrap();
        f.write_str(&out)
    }
}

fn fmt_value(v: f64, is_float: bool, is_bool: bool) -> String {
    if is_bool {
        return if v != 0.0 { "True".into() } else { "False".into() };
    }
    if !is_float {
        return format!("{v}");
    }
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if v == v.trunc() && v.abs() < 1e8 {
        format!("{v:.0}.")
    } else if v.abs() >= 1e-4 && v.abs() < 1e8 {
        format!("{v:.4}")
    } else {
        format!("{v:.4e}")
    }
}

fn write_nested(
    out: &mut String,
    shape: &[usize],
    values: &[f64],
    is_float: bool,
    is_bool: bool,
    indent: usize,
) {
    let Some((&n, rest)) = shape.split_first() else {
        out.push_str(&fmt_value(values[0], is_float, is_bool));
        return;
    };
    let inner: usize = rest.iter().product();
    out.push('[');
    let shown: Vec<Option<usize>> = if n > SUMMARIZE_ABOVE {
        (0..EDGE_ITEMS).map(Some).chain([None]).chain((n - EDGE_ITEMS..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, item) in shown.iter().enumerate() {
        if k > 0 {
            out.push(',');
            if rest.is_empty() {
                out.push(' ');
            } else {
                out.push('\n');
                out.push_str(&" ".repeat(indent + 1));
            }
        }
        match item {
            Some(i) => write_nested(
                out,
                rest,
                &values[i * inner..(i + 1) * inner],
                is_float,
                is_bool,
                indent + 1,
            ),
            None => out.push_str("..."),
        }
    }
    out.push(']');
}
