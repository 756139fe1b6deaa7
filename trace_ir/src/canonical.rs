//! A compact canonical byte form of any `Serialize` value, for cache keys.
//!
//! Every value starts with a tag byte and every container ends with
//! [`END`], so the form is prefix-free: two values have equal bytes exactly
//! when serde sees them as equal (floats by their bits, so `-0.0 != 0.0` and
//! a NaN equals only the same NaN). It is several times faster than JSON,
//! which formats numbers and escapes strings: Strict computes one signature
//! per op, so this is on the per-op path.

use serde::ser::{self, Serialize};

/// Closes a sequence, map, struct or tuple.
const END: u8 = 0xff;

/// The canonical bytes of `value`.
pub fn to_bytes<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Writer(Vec::with_capacity(256));
    // The writer itself never fails; a type's own Serialize may (a map with
    // a non-serializable key), and none of the trace types do.
    value.serialize(&mut out).expect("trace types always serialize");
    out.0
}

struct Writer(Vec<u8>);

#[derive(Debug)]
pub struct Never(String);

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Never(msg.to_string())
    }
}

impl Writer {
    fn tag(&mut self, tag: u8) {
        self.0.push(tag);
    }

    /// A tag and a LEB128 number: sizes and node ids are small, and fewer
    /// bytes are less to hash.
    fn u64(&mut self, tag: u8, mut v: u64) {
        self.0.push(tag);
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn str(&mut self, tag: u8, s: &str) {
        self.u64(tag, s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

type Done = Result<(), Never>;

impl ser::Serializer for &mut Writer {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Done {
        self.u64(b'b', v as u64);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Done {
        self.serialize_i64(v as i64)
    }
    fn serialize_i16(self, v: i16) -> Done {
        self.serialize_i64(v as i64)
    }
    fn serialize_i32(self, v: i32) -> Done {
        self.serialize_i64(v as i64)
    }
    fn serialize_i64(self, v: i64) -> Done {
        self.u64(b'i', v as u64);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Done {
        self.serialize_u64(v as u64)
    }
    fn serialize_u16(self, v: u16) -> Done {
        self.serialize_u64(v as u64)
    }
    fn serialize_u32(self, v: u32) -> Done {
        self.serialize_u64(v as u64)
    }
    fn serialize_u64(self, v: u64) -> Done {
        self.u64(b'u', v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Done {
        self.serialize_f64(v as f64)
    }
    fn serialize_f64(self, v: f64) -> Done {
        self.u64(b'f', v.to_bits());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Done {
        self.u64(b'c', v as u64);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Done {
        self.str(b's', v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Done {
        self.u64(b'y', v.len() as u64);
        self.0.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Done {
        self.tag(b'n');
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        self.tag(b'S');
        value.serialize(self)
    }
    fn serialize_unit(self) -> Done {
        self.tag(b'0');
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Done {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Done {
        self.str(b'v', variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Done {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Done {
        self.str(b'V', variant);
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, Never> {
        self.tag(b'[');
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        self.str(b'T', variant);
        Ok(self)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self, Never> {
        self.tag(b'{');
        Ok(self)
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self, Never> {
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        self.str(b'R', variant);
        Ok(self)
    }
}

/// Elements, fields and entries are written in order; [`END`] closes them.
macro_rules! container {
    ($trait:ident, $method:ident) => {
        impl ser::$trait for &mut Writer {
            type Ok = ();
            type Error = Never;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
                value.serialize(&mut **self)
            }
            fn end(self) -> Done {
                self.tag(END);
                Ok(())
            }
        }
    };
}

container!(SerializeSeq, serialize_element);
container!(SerializeTuple, serialize_element);
container!(SerializeTupleStruct, serialize_field);
container!(SerializeTupleVariant, serialize_field);

impl ser::SerializeMap for &mut Writer {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(&mut **self)
    }
    fn end(self) -> Done {
        self.tag(END);
        Ok(())
    }
}

/// Struct fields are written as a name and a value, so an absent optional
/// field (`skip_serializing_if`) cannot be confused with the next one.
macro_rules! fields {
    ($trait:ident) => {
        impl ser::$trait for &mut Writer {
            type Ok = ();
            type Error = Never;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Done {
                self.str(b'k', key);
                value.serialize(&mut **self)
            }
            fn end(self) -> Done {
                self.tag(END);
                Ok(())
            }
        }
    };
}

fields!(SerializeStruct);
fields!(SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::to_bytes;

    #[test]
    fn equal_bytes_only_for_equal_values() {
        assert_eq!(to_bytes(&vec![1u32, 2]), to_bytes(&vec![1u64, 2]));
        assert_ne!(
            to_bytes(&(vec![1u32], vec![2u32])),
            to_bytes(&(vec![1u32, 2], Vec::<u32>::new()))
        );
        assert_ne!(to_bytes(&0.0f64), to_bytes(&-0.0f64));
        assert_ne!(to_bytes(&"ab"), to_bytes(&("a", "b")));
        assert_ne!(to_bytes(&Some(1u8)), to_bytes(&1u8));
    }
}
