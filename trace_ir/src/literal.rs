//! Serde for f64 literals: JSON has no NaN or infinity, so those are written
//! as the strings "nan", "inf" and "-inf".

use serde::{de, Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_nan() {
        s.serialize_str("nan")
    } else if v.is_infinite() {
        s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
    } else {
        s.serialize_f64(*v)
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Lit {
        Num(f64),
        Str(String),
    }
    match Lit::deserialize(d)? {
        Lit::Num(v) => Ok(v),
        Lit::Str(s) => match s.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(de::Error::custom(format!("not a number literal: {other:?}"))),
        },
    }
}

/// The same for f32 literals (stored as the f64 they widen to, which reads
/// back exactly).
pub mod f32 {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        super::serialize(&(*v as f64), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        super::deserialize(d).map(|v| v as f32)
    }
}
