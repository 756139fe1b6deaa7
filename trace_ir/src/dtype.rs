//! Element types and PyTorch's type promotion.

use serde::{Deserialize, Serialize};

/// The element types deferfuse stores. bf16 and f16 are stored as such and
/// computed in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    I32,
    I64,
    BF16,
    F16,
    F32,
}

/// The three kinds PyTorch's promotion orders: bool < integer < floating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    pub const ALL: [DType; 6] =
        [DType::Bool, DType::I32, DType::I64, DType::BF16, DType::F16, DType::F32];

    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        }
    }

    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::BF16 | DType::F16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }

    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I32 | DType::I64 => Category::Int,
            DType::BF16 | DType::F16 | DType::F32 => Category::Float,
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    pub fn is_int(self) -> bool {
        self.category() == Category::Int
    }

    /// PyTorch's `promote_types` for two tensors of equal priority.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category().max(b.category()), a.category() == b.category()) {
            // bf16 and f16 meet in f32; otherwise the wider float wins.
            (Category::Float, true) => F32,
            (Category::Float, false) => {
                if a.is_float() {
                    a
                } else {
                    b
                }
            }
            (Category::Int, true) => I64,
            (Category::Int, false) => {
                if a.is_int() {
                    a
                } else {
                    b
                }
            }
            (Category::Bool, _) => Bool,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| crate::Error::Config {
            var: "dtype".into(),
            value: s.into(),
            valid: "bool, i32, i64, bf16, f16, f32".into(),
        })
    }
}

/// One operand of an op as promotion sees it. PyTorch ranks operands in three
/// priorities: tensors with dimensions, zero-dimensional tensors, and Python
/// (here Rust) scalars. A lower-priority operand only decides the dtype when it
/// is of a higher category than everything above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    Tensor(DType),
    ZeroDim(DType),
    /// A scalar of the given category; floats default to f32, ints to i64.
    Scalar(Category),
}

/// The dtype an op computes in, following `torch.result_type`.
pub fn result_type(operands: &[Operand]) -> DType {
    let mut dims: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut scalar: Option<Category> = None;
    let merge =
        |slot: &mut Option<DType>, d: DType| *slot = Some(slot.map_or(d, |s| DType::promote(s, d)));
    for op in operands {
        match *op {
            Operand::Tensor(d) => merge(&mut dims, d),
            Operand::ZeroDim(d) => merge(&mut zero, d),
            Operand::Scalar(c) => scalar = Some(scalar.map_or(c, |s| s.max(c))),
        }
    }
    let mut result = dims;
    if let Some(z) = zero {
        result = Some(match result {
            Some(r) if r.category() >= z.category() => r,
            _ => z,
        });
    }
    if let Some(c) = scalar {
        let default = match c {
            Category::Bool => DType::Bool,
            Category::Int => DType::I64,
            Category::Float => DType::F32,
        };
        result = Some(match result {
            Some(r) if r.category() >= c => r,
            _ => default,
        });
    }
    result.unwrap_or(DType::F32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_matches_pytorch() {
        use DType::*;
        assert_eq!(DType::promote(BF16, F16), F32);
        assert_eq!(DType::promote(I32, BF16), BF16);
        assert_eq!(DType::promote(I32, I64), I64);
        assert_eq!(DType::promote(Bool, I32), I32);
        assert_eq!(DType::promote(F16, F32), F32);
        assert_eq!(result_type(&[Operand::Tensor(BF16), Operand::Scalar(Category::Float)]), BF16);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::Scalar(Category::Float)]), F32);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::Scalar(Category::Int)]), I32);
        assert_eq!(result_type(&[Operand::Tensor(BF16), Operand::ZeroDim(F32)]), BF16);
        assert_eq!(result_type(&[Operand::Tensor(I32), Operand::ZeroDim(F16)]), F16);
        assert_eq!(result_type(&[Operand::ZeroDim(I64), Operand::Scalar(Category::Float)]), F32);
    }
}
