//! The structural signature of a trace: ops, attributes, shapes, dtypes and
//! topology, never data. Two runs of the same op sequence on different values
//! have equal signatures, which is what makes the caches hit.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::Trace;

/// A canonical encoding of a trace plus a stable 64-bit hash of it. Equality
/// compares the full encoding, so a hash collision can never alias two traces.
#[derive(Debug, Clone)]
pub struct Signature {
    canonical: Arc<[u8]>,
    stable_hash: u64,
}

impl Signature {
    pub fn of(trace: &Trace) -> Self {
        // The serialized trace is already canonical: node order is topological,
        // parameters are numbered by first appearance, and no buffer data is in it.
        let canonical: Arc<[u8]> = crate::canonical::to_bytes(trace).into();
        let stable_hash = stable_hash64(&canonical);
        Signature { canonical, stable_hash }
    }

    /// A hash that is the same on every machine and version of Rust, for
    /// on-disk keys. (In-memory maps may hash it again with anything.)
    pub fn stable_hash(&self) -> u64 {
        self.stable_hash
    }

    pub fn canonical(&self) -> &[u8] {
        &self.canonical
    }
}

impl PartialEq for Signature {
    fn eq(&self, other: &Self) -> bool {
        self.stable_hash == other.stable_hash && self.canonical == other.canonical
    }
}

impl Eq for Signature {}

impl Hash for Signature {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.stable_hash);
    }
}

/// A trace's signature with its sizes abstracted: every size of 2 or more
/// (in value shapes and size attributes) becomes a symbol, numbered by first
/// appearance, and equal sizes share a symbol. Sizes 0 and 1 stay literal, so
/// the rank and the broadcast pattern are part of the class.
///
/// Two traces in one class differ only in the values of their symbols; a
/// shape-polymorphic executable planned for one serves the other once its
/// sizes are mapped (see [`ShapeClass::size_map`]). Slice bounds are sizes
/// too ([`crate::Op::size_attrs_mut`]), so a loop that slices with a new
/// bound each iteration stays in one class; arange lengths and slice steps
/// stay literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapeClass {
    pub signature: Signature,
    /// The value of each symbol, in symbol order.
    pub sizes: Vec<usize>,
}

/// A size as a shape class sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassSize {
    /// 0 or 1, kept as it is: they decide broadcasting.
    Literal(usize),
    /// The k-th distinct size of 2 or more, in order of first appearance.
    Symbol(usize),
}

impl ClassSize {
    /// How the class writes the size: literals as they are, symbols as 2,
    /// 3, ...; no literal size of 2 or more survives, so this is unambiguous.
    pub fn encoded(self) -> usize {
        match self {
            ClassSize::Literal(d) => d,
            ClassSize::Symbol(k) => k + 2,
        }
    }
}

/// Numbers the sizes of one trace as its shape class does. Visit the sizes
/// in the order [`ShapeClass::of`] does: node by node, the value's shape and
/// then the op's size attributes.
#[derive(Debug, Clone, Default)]
pub struct SizeSymbols {
    /// The value of each symbol, in symbol order.
    pub sizes: Vec<usize>,
}

impl SizeSymbols {
    pub fn symbol(&mut self, d: usize) -> ClassSize {
        if d < 2 {
            return ClassSize::Literal(d);
        }
        let k = self.sizes.iter().position(|&s| s == d).unwrap_or_else(|| {
            self.sizes.push(d);
            self.sizes.len() - 1
        });
        ClassSize::Symbol(k)
    }
}

/// Every size a shape class numbers, in its order: node by node, the
/// value's shape and then the op's size attributes.
fn for_each_size(trace: &mut Trace, mut f: impl FnMut(&mut usize)) {
    for node in &mut trace.nodes {
        node.meta.shape.iter_mut().chain(node.op.size_attrs_mut()).for_each(&mut f);
    }
}

impl ShapeClass {
    pub fn of(trace: &Trace) -> ShapeClass {
        let mut symbols = SizeSymbols::default();
        let mut t = trace.clone();
        for_each_size(&mut t, |d| *d = symbols.symbol(*d).encoded());
        ShapeClass { signature: Signature::of(&t), sizes: symbols.sizes }
    }

    /// The symbol of each size of 2 or more of `trace`, in order: with the
    /// signature, what [`ShapeClass::instance`] needs to match another trace
    /// against this class.
    pub fn positions(trace: &Trace) -> Vec<u32> {
        let mut symbols = SizeSymbols::default();
        let mut positions = Vec::new();
        for_each_size(&mut trace.clone(), |d| {
            if let ClassSize::Symbol(k) = symbols.symbol(*d) {
                positions.push(k as u32);
            }
        });
        positions
    }

    /// A hash of `trace` with every size of 2 or more written alike: traces
    /// whose classes differ only in which of their sizes happen to be equal
    /// (a KV cache's length reaching a projection's width) share it.
    pub fn structure_hash(trace: &Trace) -> u64 {
        let mut t = trace.clone();
        for_each_size(&mut t, |d| *d = (*d).min(2));
        stable_hash64(&crate::canonical::to_bytes(&t))
    }

    /// `trace` as an instance of the class whose sizes of 2 or more have the
    /// symbols `positions` (from [`ShapeClass::positions`]): that numbering
    /// applied to `trace`, with each symbol's size here. None when a symbol
    /// would take two sizes. A class whose symbols are distinct serves a
    /// trace where two of them are equal: the caller compares the signature
    /// with that class's.
    pub fn instance(trace: &Trace, positions: &[u32]) -> Option<ShapeClass> {
        let mut t = trace.clone();
        let (mut at, mut sizes, mut consistent) = (0, Vec::new(), true);
        for_each_size(&mut t, |d| {
            if *d < 2 || !consistent {
                return;
            }
            let Some(&k) = positions.get(at) else {
                consistent = false;
                return;
            };
            at += 1;
            let k = k as usize;
            match sizes.get(k) {
                Some(&bound) => consistent &= bound == *d,
                None if k == sizes.len() => sizes.push(*d),
                None => consistent = false,
            }
            *d = ClassSize::Symbol(k).encoded();
        });
        (consistent && at == positions.len())
            .then(|| ShapeClass { signature: Signature::of(&t), sizes })
    }

    /// Maps each size of `self` to the size of the same symbol in `other`
    /// (of the same class); sizes 0 and 1 map to themselves, and a size that
    /// is not a symbol of `self` maps to nothing.
    pub fn size_map<'a>(&'a self, other: &'a ShapeClass) -> impl Fn(usize) -> Option<usize> + 'a {
        move |d| {
            if d < 2 {
                return Some(d);
            }
            let k = self.sizes.iter().position(|&s| s == d)?;
            other.sizes.get(k).copied()
        }
    }
}

/// The one 64-bit hash that must be the same on every machine, process and
/// version: signatures, on-disk cache file names and PJRT executable keys
/// (whose users also compare the full bytes: it is no integrity check).
/// XXH3-64 with seed 0, whose output is frozen by its specification. Chosen
/// by measurement over the hand-rolled hash it replaced and xxh64, SipHash-1-3,
/// BLAKE3 and rapidhash (docs/results/hashes.md): Strict hashes one signature
/// per op, so speed on a few hundred bytes matters.
pub fn stable_hash64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// [`stable_hash64`] of everything `reader` yields, streamed, and its length
/// in bytes: for files too large to hold (a PJRT plugin library).
pub fn stable_hash64_of_reader(mut reader: impl std::io::Read) -> std::io::Result<(u64, u64)> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok((hasher.digest(), len)),
            Ok(n) => {
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
