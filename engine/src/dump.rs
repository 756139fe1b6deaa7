//! Fusion dumps: one versioned JSON file per DeferAndFuse flush, written when
//! `TORCH_TPU_FUSION_DUMP=<dir>` is set and read by the `fusion-debug` CLI.
//!
//! A dump holds what a user needs to answer three questions about a flush:
//! *what ran* (the recorded trace with call sites, the extracted graph, the
//! kernels and the buffers materialized between them), *why something was
//! not fused* (the planner's reason for every cut), and *why it recompiled*
//! (the cache outcome per tier, the exact signature and the shape class that
//! keys tier 1; [`compare`] finds the first field where two flushes part,
//! and whether only sizes differ). Timings per phase and the flush's peak
//! bytes say what it cost.
//!
//! Loading treats the file as untrusted ([`FlushDump::load`]): a missing,
//! truncated, corrupt, foreign, newer or inconsistent file gives a
//! [`DumpError`] that names the path and the problem, never a panic, and a
//! dump that loads has every node and kernel index in range. It reads only
//! regular files (a symbolic link is not followed, a FIFO is not waited on)
//! of at most [`DEFAULT_MAX_DUMP_BYTES`] ([`FlushDump::load_limited`] takes
//! another limit: `fusion-debug --max-bytes`).
//!
//! ```
//! use deferfuse::{Config, Context, Mode};
//! use deferfuse::dump::FlushDump;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("deferfuse-dump-doc-{}", std::process::id()));
//! let config = Config { fusion_dump: Some(dir.clone()), ..Config::with_mode(Mode::DeferAndFuse) };
//! let ctx = Context::new(config)?;
//! let x = ctx.from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2])?;
//! let y = x.relu()?.exp()?.sum(&[-1], false)?;
//! y.to_vec::<f32>()?; // the flush writes one dump
//! let dumps = FlushDump::list(&dir)?;
//! let dump = FlushDump::load(&dumps[0])?;
//! assert_eq!(dump.program.kernels.len(), 1); // relu, exp and sum fused
//! assert!(dump.call_sites.iter().flatten().any(|s| s.file.ends_with(".rs")));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ahash::AHashMap;

use rewrite_rules::program::{KernelKind, Program};
use rewrite_rules::{RewriteConfig, RewriteReport, Stop};
use serde::{Deserialize, Serialize};
use trace_ir::signature::{ClassSize as Size, SizeSymbols};
use trace_ir::{NodeId, Op, Shape, ShapeClass, Signature, Trace};

use crate::pipeline::{CacheStats, Extracted};

/// The format name every dump starts with.
pub const DUMP_FORMAT: &str = "deferfuse-fusion-dump";
/// The format version this build writes; it reads this version and older.
///
/// Version 2 added `shape_class` and the tier-1 outcome `resized`, which a
/// version-1 reader cannot parse: the bump makes it say "newer", not "corrupt".
pub const DUMP_VERSION: u32 = 2;

/// The largest dump [`FlushDump::load`] reads: 256 MiB, far above the few
/// megabytes of a large model's flush.
pub const DEFAULT_MAX_DUMP_BYTES: u64 = 256 << 20;

/// One flush, as written to disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlushDump {
    /// Always [`DUMP_FORMAT`].
    pub format: String,
    /// [`DUMP_VERSION`] of the writer.
    pub version: u32,
    /// The deferfuse version that wrote it.
    pub engine_version: String,
    /// The backend that compiled and ran the program.
    pub backend: String,
    /// The writing process, and the flush's number among its dumps (from 0).
    pub process: u32,
    pub sequence: u64,
    /// `"fused"` (rewritten and planned) or `"unfused"` (`TORCH_TPU_FUSION=off`).
    pub preparation: String,
    /// The stable hash of the recorded trace's signature, in hex: two flushes
    /// with different hashes cannot share a tier-3 (on-disk) entry.
    pub signature: String,
    /// The stable hash of the recorded trace's shape class (sizes of 2 or
    /// more abstracted), in hex: the key of tier 1. Two flushes with the same
    /// class and other sizes share a program where the backend resizes
    /// executables (the native CPU backend). Version-1 dumps lack it; the
    /// loader computes it from `recorded`.
    #[serde(default)]
    pub shape_class: String,
    /// The trace as recorded (pruned to what the live tensors need): the
    /// signature is computed from exactly this.
    pub recorded: Trace,
    /// Where the user's code recorded each node of `recorded` (none for
    /// parameters and for ops recorded outside the public API).
    pub call_sites: Vec<Option<CallSite>>,
    /// The graph the planner saw (the extracted trace of the rewrite); the
    /// program's value ids are its node ids. For a resized program, the
    /// template's graph resized the same way. Absent when the program came
    /// (directly or resized) from the on-disk cache, which keeps programs only.
    pub graph: Option<Trace>,
    /// For each node of `graph`, the nodes of `recorded` it stands for.
    pub origins: Vec<Vec<NodeId>>,
    /// The e-graph rewrite that built the program, and its limits.
    pub rewrite: Option<RewriteDump>,
    /// The kernels, in execution order, with the reason for every cut.
    pub program: Program,
    /// Buffers written by one kernel and read by another or returned.
    pub materialized: Vec<Materialized>,
    pub cache: CacheOutcome,
    /// Nanoseconds spent by this flush in each phase (0 when skipped).
    pub timings_ns: PhaseTimes,
    pub memory: FlushMemory,
    /// What made this flush happen. Dumps written before deferfuse recorded
    /// it lack it.
    #[serde(default)]
    pub reason: Option<FlushReason>,
}

/// Why a DeferAndFuse flush ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlushReason {
    /// A value was read: copied to the host, or needed by another mode.
    Read,
    /// `Context::sync`.
    Sync,
    /// The op stream started to repeat itself (`TORCH_TPU_CUT_REPEATS`).
    Repeat,
    /// The pending trace reached `TORCH_TPU_MAX_PENDING_OPS` ops.
    Cap,
    /// The pending trace reached the point where a value was read before
    /// (`TORCH_TPU_READ_AHEAD`): it runs ahead of the read.
    ReadAhead,
}

impl std::fmt::Display for FlushReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlushReason::Read => "read",
            FlushReason::Sync => "sync",
            FlushReason::Repeat => "repeat",
            FlushReason::Cap => "cap",
            FlushReason::ReadAhead => "read_ahead",
        })
    }
}

/// A source location, from `#[track_caller]` on the public ops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSite {
    pub file: String,
    pub line: u32,
    pub column: u32,
}

impl std::fmt::Display for CallSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

impl From<&Location<'_>> for CallSite {
    fn from(l: &Location<'_>) -> Self {
        CallSite { file: l.file().to_string(), line: l.line(), column: l.column() }
    }
}

/// What the e-graph rewrite did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteDump {
    /// True when this flush ran the rewrite; false when the program came from
    /// the tier-1 cache and this is the report of the flush that built it
    /// (for a resized program: at the template's sizes, costs included).
    pub ran_in_this_flush: bool,
    /// How many times each rule changed the e-graph.
    pub rules_fired: BTreeMap<String, usize>,
    /// Why saturation stopped (in the file: `"saturated"`, `"node limit"`, ...).
    pub stop_reason: Stop,
    pub iterations: usize,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    /// Bytes moved, by the cost model, before and after.
    pub cost_before: Option<f64>,
    pub cost_after: Option<f64>,
    pub node_limit: usize,
    pub iter_limit: usize,
    pub time_limit_ms: u64,
}

impl RewriteDump {
    fn new(report: &RewriteReport, limits: &RewriteConfig, ran_in_this_flush: bool) -> Self {
        let finite = |v: f64| Some(v).filter(|v| v.is_finite());
        RewriteDump {
            ran_in_this_flush,
            rules_fired: report.rules_fired.clone(),
            stop_reason: report.stop_reason.clone(),
            iterations: report.iterations,
            egraph_nodes: report.egraph_nodes,
            egraph_classes: report.egraph_classes,
            cost_before: finite(report.cost_before),
            cost_after: finite(report.cost_after),
            node_limit: limits.node_limit,
            iter_limit: limits.iter_limit,
            time_limit_ms: limits.time_limit.as_millis() as u64,
        }
    }

    /// The limit that stopped saturation, if one did.
    pub fn limit_hit(&self) -> Option<&Stop> {
        Some(&self.stop_reason).filter(|r| r.is_limit())
    }
}

/// A value that lives in memory between kernels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Materialized {
    /// The value (a node of `graph`).
    pub value: NodeId,
    /// The kernel that writes it; none for a program input.
    pub producer: Option<usize>,
    /// The kernels that read it.
    pub consumers: Vec<usize>,
    /// Returned to the user.
    pub output: bool,
    pub shape: Vec<usize>,
    pub dtype: String,
    pub bytes: u64,
}

/// What each cache tier did for this flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierOutcome {
    Hit,
    /// Tier 1 only: the shape class was cached at other sizes, and its
    /// program and executable were resized to these (nothing rewritten,
    /// planned or compiled). Counted as a hit by [`CacheStats`].
    Resized,
    Miss,
    /// An on-disk entry was corrupt or foreign, and rebuilt.
    Rejected,
    /// Not consulted (a tier above hit, or the tier is off).
    Skipped,
}

impl std::fmt::Display for TierOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TierOutcome::Hit => "hit",
            TierOutcome::Resized => "resized",
            TierOutcome::Miss => "miss",
            TierOutcome::Rejected => "rejected",
            TierOutcome::Skipped => "-",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheOutcome {
    /// Shape class → program (`resized` for other sizes of a cached class).
    pub tier1: TierOutcome,
    /// Program → executable.
    pub tier2: TierOutcome,
    /// Programs on disk.
    pub tier3: TierOutcome,
}

impl CacheOutcome {
    fn between(before: &CacheStats, after: &CacheStats) -> Self {
        let outcome = |hits: u64, misses: u64| match (hits, misses) {
            (0, 0) => TierOutcome::Skipped,
            (0, _) => TierOutcome::Miss,
            _ => TierOutcome::Hit,
        };
        let t3 = (after.tier3.hits - before.tier3.hits, after.tier3.misses - before.tier3.misses);
        let tier3 = if after.tier3.rejected > before.tier3.rejected {
            TierOutcome::Rejected
        } else {
            outcome(t3.0, t3.1)
        };
        let tier1 = match after.resized > before.resized {
            true => TierOutcome::Resized,
            false => outcome(
                after.tier1.hits - before.tier1.hits,
                after.tier1.misses - before.tier1.misses,
            ),
        };
        CacheOutcome {
            tier1,
            tier2: outcome(
                after.tier2.hits - before.tier2.hits,
                after.tier2.misses - before.tier2.misses,
            ),
            tier3,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub rewrite: u64,
    pub plan: u64,
    pub compile: u64,
    pub run: u64,
}

impl PhaseTimes {
    pub fn total(&self) -> u64 {
        self.rewrite + self.plan + self.compile + self.run
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushMemory {
    /// Bytes of the context's live buffers when the run started.
    pub live_before: u64,
    /// The most bytes live at once while the program ran.
    pub peak: u64,
    /// Bytes of every materialized buffer the program wrote (inputs excluded).
    pub written: u64,
}

/// Why a dump could not be read.
#[derive(Debug)]
pub enum DumpError {
    Missing {
        path: PathBuf,
    },
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file ends in the middle of the JSON (an interrupted write or copy).
    Truncated {
        path: PathBuf,
    },
    /// Not JSON, or JSON of the wrong shape.
    Corrupt {
        path: PathBuf,
        detail: String,
    },
    /// JSON, but not a fusion dump.
    Foreign {
        path: PathBuf,
        format: String,
    },
    /// Written by a newer deferfuse.
    NewerVersion {
        path: PathBuf,
        found: u32,
    },
    /// Well-formed, but its indices or shapes do not agree with each other.
    Inconsistent {
        path: PathBuf,
        detail: String,
    },
    /// A symbolic link, a FIFO, a device: only regular files are read.
    NotRegular {
        path: PathBuf,
        kind: String,
    },
    /// Larger than the limit the reader was given.
    TooLarge {
        path: PathBuf,
        limit: u64,
    },
    /// A directory without dumps.
    Empty {
        path: PathBuf,
    },
}

impl std::fmt::Display for DumpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DumpError::Missing { path } => write!(f, "{}: no such file or directory", path.display()),
            DumpError::Unreadable { path, error } => write!(f, "{}: cannot read: {error}", path.display()),
            DumpError::Truncated { path } => {
                write!(f, "{}: truncated: the JSON ends early (was the write interrupted?)", path.display())
            }
            DumpError::Corrupt { path, detail } => write!(f, "{}: corrupt fusion dump: {detail}", path.display()),
            DumpError::Foreign { path, format } => {
                write!(f, "{}: not a fusion dump (format {format:?}, expected {DUMP_FORMAT:?})", path.display())
            }
            DumpError::NewerVersion { path, found } => write!(
                f,
                "{}: written by a newer deferfuse (dump version {found}; this build reads versions 1 to {DUMP_VERSION})",
                path.display()
            ),
            DumpError::Inconsistent { path, detail } => write!(f, "{}: inconsistent fusion dump: {detail}", path.display()),
            DumpError::NotRegular { path, kind } => {
                write!(f, "{}: {kind}; only regular files are read as dumps", path.display())
            }
            DumpError::TooLarge { path, limit } => write!(
                f,
                "{}: larger than {limit} bytes, the most a dump may hold (fusion-debug --max-bytes raises it)",
                path.display()
            ),
            DumpError::Empty { path } => write!(f, "{}: no fusion dumps (*.json) in this directory", path.display()),
        }
    }
}

impl std::error::Error for DumpError {}

impl FlushDump {
    /// Reads and checks one dump of at most [`DEFAULT_MAX_DUMP_BYTES`].
    pub fn load(path: &Path) -> Result<FlushDump, DumpError> {
        FlushDump::load_limited(path, DEFAULT_MAX_DUMP_BYTES)
    }

    /// Reads and checks one dump; a file over `max_bytes`, or one that is
    /// not a regular file, is an error before anything is parsed.
    pub fn load_limited(path: &Path, max_bytes: u64) -> Result<FlushDump, DumpError> {
        use crate::fs_guard::ReadError;
        let (_, bytes) =
            crate::fs_guard::read_regular(path, max_bytes).map_err(|error| match error {
                ReadError::Missing => DumpError::Missing { path: path.into() },
                ReadError::Symlink => DumpError::NotRegular {
                    path: path.into(),
                    kind: "a symbolic link (not followed: name the file it points to)".into(),
                },
                ReadError::NotRegular(kind) => {
                    DumpError::NotRegular { path: path.into(), kind: kind.into() }
                }
                ReadError::TooLarge { limit } => DumpError::TooLarge { path: path.into(), limit },
                ReadError::Io(error) => DumpError::Unreadable { path: path.into(), error },
            })?;
        let text = std::str::from_utf8(&bytes).map_err(|e| DumpError::Corrupt {
            path: path.into(),
            detail: format!("not UTF-8 text: {e}"),
        })?;
        FlushDump::from_json(text).map_err(|e| e.at(path))
    }

    /// Parses and checks a dump's text ([`DumpError`] paths are empty).
    pub fn from_json(text: &str) -> Result<FlushDump, DumpError> {
        let path = PathBuf::new();
        let json_error = |e: serde_json::Error| match e.classify() {
            serde_json::error::Category::Eof => DumpError::Truncated { path: PathBuf::new() },
            _ => DumpError::Corrupt { path: PathBuf::new(), detail: e.to_string() },
        };
        let value: serde_json::Value = serde_json::from_str(text).map_err(json_error)?;
        let format = value.get("format").and_then(|f| f.as_str());
        if format != Some(DUMP_FORMAT) {
            let format = format.map_or_else(|| "none".to_string(), str::to_string);
            return Err(DumpError::Foreign { path, format });
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if (1..=DUMP_VERSION as u64).contains(&v) => {}
            Some(v) if v > DUMP_VERSION as u64 => {
                return Err(DumpError::NewerVersion { path, found: v.min(u32::MAX as u64) as u32 })
            }
            other => {
                return Err(DumpError::Corrupt {
                    path,
                    detail: format!("version {other:?} is not a positive integer"),
                })
            }
        }
        let mut dump: FlushDump = serde_json::from_value(value).map_err(json_error)?;
        dump.check().map_err(|detail| DumpError::Inconsistent { path: PathBuf::new(), detail })?;
        if dump.shape_class.is_empty() {
            // A version-1 dump: the class follows from the recorded trace.
            dump.shape_class =
                format!("{:016x}", ShapeClass::of(&dump.recorded).signature.stable_hash());
        }
        Ok(dump)
    }

    /// The dumps in `path` (a directory: every `*.json` in name order, which
    /// is write order within a process), or `path` itself when it is a file.
    /// Links, FIFOs and the like named `*.json` are listed, so that loading
    /// them says what they are rather than skipping them silently.
    pub fn list(path: &Path) -> Result<Vec<PathBuf>, DumpError> {
        let meta = std::fs::metadata(path).map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => DumpError::Missing { path: path.into() },
            _ => DumpError::Unreadable { path: path.into(), error },
        })?;
        if !meta.is_dir() {
            return Ok(vec![path.into()]);
        }
        let entries = std::fs::read_dir(path)
            .map_err(|error| DumpError::Unreadable { path: path.into(), error })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            // The entry's own type: a link is not followed here either.
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DumpError::Empty { path: path.into() });
        }
        Ok(files)
    }

    /// Every index in range, every trace valid: what the CLI relies on.
    fn check(&self) -> Result<(), String> {
        self.recorded.validate().map_err(|e| format!("recorded trace: {e}"))?;
        if self.call_sites.len() != self.recorded.len() {
            return Err(format!(
                "{} call sites for {} recorded nodes",
                self.call_sites.len(),
                self.recorded.len()
            ));
        }
        let values = self.program.values.len();
        if let Some(graph) = &self.graph {
            graph.validate().map_err(|e| format!("graph: {e}"))?;
            if graph.len() != values {
                return Err(format!(
                    "the graph has {} nodes but the program {values} values",
                    graph.len()
                ));
            }
            if graph.nodes.iter().zip(&self.program.values).any(|(n, m)| &n.meta != m) {
                return Err("the program's value metas differ from the graph's".into());
            }
            if self.origins.len() != graph.len() {
                return Err(format!(
                    "{} origins for {} graph nodes",
                    self.origins.len(),
                    graph.len()
                ));
            }
        } else if !self.origins.is_empty() {
            return Err("origins without a graph".into());
        }
        if let Some(bad) = self.origins.iter().flatten().find(|&&o| o >= self.recorded.len()) {
            return Err(format!(
                "origin {bad} is not a recorded node ({} nodes)",
                self.recorded.len()
            ));
        }
        fn in_range<'a>(
            what: &str,
            values: usize,
            mut ids: impl Iterator<Item = &'a NodeId>,
        ) -> Result<(), String> {
            match ids.find(|&&v| v >= values) {
                Some(bad) => {
                    Err(format!("{what} refers to value {bad}, but the program has {values}"))
                }
                None => Ok(()),
            }
        }
        let p = &self.program;
        in_range("a parameter", values, p.params.iter())?;
        in_range("an output", values, p.outputs.iter())?;
        for (k, kernel) in p.kernels.iter().enumerate() {
            let ids = kernel.inputs.iter().chain(&kernel.outputs).chain(&kernel.nodes);
            in_range(&format!("kernel {k}"), values, ids)?;
        }
        in_range("a cut", values, p.cuts.iter().flat_map(|c| [&c.producer, &c.consumer]))?;
        let kernels = p.kernels.len();
        for m in &self.materialized {
            in_range("a materialized buffer", values, std::iter::once(&m.value))?;
            if m.producer.iter().chain(&m.consumers).any(|&k| k >= kernels) {
                return Err(format!(
                    "materialized value {} names a kernel beyond the {kernels} kernels",
                    m.value
                ));
            }
        }
        Ok(())
    }

    /// The label of a graph node: its op and attributes, short.
    pub fn op_label(op: &Op) -> String {
        match op {
            Op::Parameter { index, .. } => format!("param {index}"),
            Op::Reduce { axes, keepdim, .. } => {
                format!(
                    "{} {:?}{}",
                    op.name(),
                    axes.as_slice(),
                    if *keepdim { " keep" } else { "" }
                )
            }
            Op::Permute { perm } => format!("permute {:?}", perm.as_slice()),
            Op::Full { value, .. } => format!("full {value}"),
            Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::Concat { axis } => {
                format!("{} {axis}", op.name())
            }
            _ => op.name().to_string(),
        }
    }

    /// The user's call site of graph node `node`, through its origins.
    pub fn call_site_of(&self, node: NodeId) -> Option<&CallSite> {
        self.origins.get(node)?.iter().rev().find_map(|&o| self.call_sites.get(o)?.as_ref())
    }

    /// The kernel that writes value `v`, if a kernel does.
    pub fn producer_kernel(&self, v: NodeId) -> Option<usize> {
        self.program.kernels.iter().position(|k| k.outputs.contains(&v))
    }
}

impl DumpError {
    fn at(self, path: &Path) -> DumpError {
        let path = path.to_path_buf();
        match self {
            DumpError::Truncated { .. } => DumpError::Truncated { path },
            DumpError::Corrupt { detail, .. } => DumpError::Corrupt { path, detail },
            DumpError::Foreign { format, .. } => DumpError::Foreign { path, format },
            DumpError::NewerVersion { found, .. } => DumpError::NewerVersion { path, found },
            DumpError::Inconsistent { detail, .. } => DumpError::Inconsistent { path, detail },
            other => other,
        }
    }
}

/// The buffers a program keeps in memory between kernels: its inputs that a
/// kernel reads, and every value a kernel writes.
pub fn materialized(program: &Program) -> Vec<Materialized> {
    let mut out = Vec::new();
    let readers = |v: NodeId| -> Vec<usize> {
        (0..program.kernels.len()).filter(|&k| program.kernels[k].inputs.contains(&v)).collect()
    };
    let mut push = |value: NodeId, producer: Option<usize>| {
        let meta = &program.values[value];
        out.push(Materialized {
            value,
            producer,
            consumers: readers(value),
            output: program.outputs.contains(&value),
            shape: meta.shape.to_vec(),
            dtype: meta.dtype.to_string(),
            bytes: (meta.numel() * meta.dtype.size_in_bytes()) as u64,
        });
    };
    for &p in &program.params {
        push(p, None);
    }
    for (k, kernel) in program.kernels.iter().enumerate() {
        for &v in &kernel.outputs {
            push(v, Some(k));
        }
    }
    out
}

/// The short name of a kernel's kind.
pub fn kernel_kind(kind: &KernelKind) -> String {
    match kind {
        KernelKind::Single { op } => format!("single {}", op.name()),
        KernelKind::Loop(l) if l.row_dims > 0 => "row loop".into(),
        KernelKind::Loop(_) => "elementwise loop".into(),
        KernelKind::MatMul(m) if m.epilogue.is_some() => "matmul + epilogue".into(),
        KernelKind::MatMul(_) => "matmul".into(),
    }
}

/// The first field in which two recorded traces differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The node where the traces part, if they part at a node.
    pub node: Option<NodeId>,
    /// What differs, for people: names the node, its op and the field.
    pub what: String,
}

impl Difference {
    fn at(node: NodeId, what: String) -> Self {
        Difference { node: Some(node), what }
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// Where two signatures part: the first field of the recorded traces that
/// differs, in the order the signature encodes them (node count, then node
/// by node: op, attributes, inputs, shape, dtype; then the outputs). `None`
/// when the signatures are equal.
pub fn first_difference(a: &Trace, b: &Trace) -> Option<Difference> {
    for (id, (x, y)) in a.nodes.iter().zip(&b.nodes).enumerate() {
        let what = format!("node {id} ({})", FlushDump::op_label(&x.op));
        if x.op.name() != y.op.name() {
            return Some(Difference::at(
                id,
                format!("{what}: op {} vs {}", x.op.name(), y.op.name()),
            ));
        }
        if x.meta.shape != y.meta.shape {
            return Some(Difference::at(
                id,
                format!("{what}: shape {}", shape_difference(&x.meta.shape, &y.meta.shape)),
            ));
        }
        if x.meta.dtype != y.meta.dtype {
            return Some(Difference::at(
                id,
                format!("{what}: dtype {} vs {}", x.meta.dtype, y.meta.dtype),
            ));
        }
        if x.inputs != y.inputs {
            return Some(Difference::at(
                id,
                format!("{what}: inputs {:?} vs {:?}", x.inputs.as_slice(), y.inputs.as_slice()),
            ));
        }
        if x.op != y.op {
            let json = |op: &Op| serde_json::to_string(op).unwrap_or_default();
            return Some(Difference::at(
                id,
                format!("{what}: attributes (constants) {} vs {}", json(&x.op), json(&y.op)),
            ));
        }
    }
    tail_difference(a, b)
}

/// The difference past the nodes both traces have: their count, or their
/// outputs. Neither holds sizes, so it is the same for shape classes.
fn tail_difference(a: &Trace, b: &Trace) -> Option<Difference> {
    if a.len() != b.len() {
        let (longer, n) = if a.len() > b.len() { ("first", b.len()) } else { ("second", a.len()) };
        let longer_trace = if a.len() > b.len() { a } else { b };
        return Some(Difference::at(
            n,
            format!(
                "node count {} vs {}: the {longer} trace goes on with node {n} ({})",
                a.len(),
                b.len(),
                FlushDump::op_label(&longer_trace.nodes[n].op)
            ),
        ));
    }
    if a.outputs != b.outputs {
        return Some(Difference {
            node: None,
            what: format!("outputs {:?} vs {:?}", a.outputs, b.outputs),
        });
    }
    None
}

/// How two recorded traces stand for tier 1 of the cache, which is keyed by
/// the shape class ([`ShapeClass`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comparison {
    /// Equal signatures: one program serves both.
    Same,
    /// One shape class, other sizes: a backend whose executables are
    /// shape-polymorphic (the native CPU backend) serves B by resizing the
    /// program of the class; one that compiles per size (PJRT) compiles anew.
    SameClass(SizeDifference),
    /// Different shape classes: no backend can reuse A's program for B.
    Different(Difference),
}

/// The first size in which two traces of one shape class differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeDifference {
    pub node: NodeId,
    /// The dimension of the node's shape (or the index among its size
    /// attributes, which follow the shape in every op that has them).
    pub dimension: usize,
    pub a: usize,
    pub b: usize,
    /// For people: the node, its op, both shapes and the dimension.
    pub what: String,
}

impl std::fmt::Display for SizeDifference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// Compares two recorded traces as tier 1 does: by shape class first, then
/// by sizes. Fields are visited in the order [`first_difference`] visits
/// them, with every size of 2 or more replaced by its symbol, numbered as
/// [`ShapeClass::of`] numbers them; so `Same` means equal signatures and
/// `SameClass` equal shape classes.
pub fn compare(a: &Trace, b: &Trace) -> Comparison {
    let (mut sa, mut sb) = (Symbols::default(), Symbols::default());
    let mut first_size: Option<SizeDifference> = None;
    for (id, (x, y)) in a.nodes.iter().zip(&b.nodes).enumerate() {
        let what = format!("node {id} ({})", FlushDump::op_label(&x.op));
        let differ =
            |detail: String| Comparison::Different(Difference::at(id, format!("{what}: {detail}")));
        if x.op.name() != y.op.name() {
            return differ(format!("op {} vs {}", x.op.name(), y.op.name()));
        }
        let (mut ox, mut oy) = (x.op.clone(), y.op.clone());
        let attrs = |op: &mut Op| op.size_attrs_mut().into_iter().map(|d| *d).collect::<Shape>();
        let (px, py) = (attrs(&mut ox), attrs(&mut oy));
        let mut shapes = vec![("shape", &x.meta.shape, &y.meta.shape)];
        if !px.is_empty() || !py.is_empty() {
            shapes.push(("size attributes", &px, &py));
        }
        // The value's shape, then the op's size attributes: the order in
        // which `ShapeClass::of` numbers the symbols.
        let mut symbolized: Vec<(Shape, Shape)> = Vec::new();
        for (field, p, q) in shapes {
            if p.len() != q.len() {
                return differ(format!("{field} {p:?} vs {q:?} (rank {} vs {})", p.len(), q.len()));
            }
            let (mut ep, mut eq) = (Shape::new(), Shape::new());
            for (dim, (&m, &n)) in p.iter().zip(q.iter()).enumerate() {
                let at = (id, field, dim);
                let (u, v) = (sa.symbol(m, at), sb.symbol(n, at));
                if u != v {
                    let why = match (u, v) {
                        (Size::Literal(_), _) | (_, Size::Literal(_)) => {
                            "sizes 0 and 1 are part of the shape class (they decide broadcasting)".to_string()
                        }
                        _ => format!(
                            "in A it is {}, in B {} (equal sizes share one symbol of the shape class)",
                            sa.describe(u, at),
                            sb.describe(v, at)
                        ),
                    };
                    return differ(format!(
                        "{field} {p:?} vs {q:?}: dimension {dim} is {m} vs {n}; {why}"
                    ));
                }
                if m != n && first_size.is_none() {
                    let sizes = shape_difference(p, q);
                    first_size = Some(SizeDifference {
                        node: id,
                        dimension: dim,
                        a: m,
                        b: n,
                        what: format!("{what}: {field} {sizes}"),
                    });
                }
                ep.push(u.encoded());
                eq.push(v.encoded());
            }
            symbolized.push((ep, eq));
        }
        if x.meta.dtype != y.meta.dtype {
            return differ(format!("dtype {} vs {}", x.meta.dtype, y.meta.dtype));
        }
        if x.inputs != y.inputs {
            return differ(format!(
                "inputs {:?} vs {:?}",
                x.inputs.as_slice(),
                y.inputs.as_slice()
            ));
        }
        // The other attributes, compared in the signature's own encoding (JSON).
        if let Some((ep, eq)) = symbolized.get(1) {
            ox.size_attrs_mut().into_iter().zip(ep).for_each(|(d, e)| *d = *e);
            oy.size_attrs_mut().into_iter().zip(eq).for_each(|(d, e)| *d = *e);
        }
        let json = |op: &Op| serde_json::to_string(op).unwrap_or_default();
        if json(&ox) != json(&oy) {
            return differ(format!("attributes (constants) {} vs {}", json(&x.op), json(&y.op)));
        }
    }
    match (tail_difference(a, b), first_size) {
        (Some(d), _) => Comparison::Different(d),
        (None, Some(size)) => Comparison::SameClass(size),
        (None, None) => Comparison::Same,
    }
}

/// The symbols of one trace ([`SizeSymbols`]), and where each was first seen.
#[derive(Default)]
struct Symbols {
    numbering: SizeSymbols,
    first_seen: Vec<(NodeId, &'static str, usize)>,
}

impl Symbols {
    fn symbol(&mut self, d: usize, at: (NodeId, &'static str, usize)) -> Size {
        let size = self.numbering.symbol(d);
        if self.first_seen.len() < self.numbering.sizes.len() {
            self.first_seen.push(at);
        }
        size
    }

    /// A symbol for people: by where it was first seen, or as new when that
    /// is `at`.
    fn describe(&self, size: Size, at: (NodeId, &'static str, usize)) -> String {
        match size {
            Size::Literal(d) => format!("the literal size {d}"),
            Size::Symbol(k) if self.first_seen[k] == at => {
                format!("a size of its own ({})", self.numbering.sizes[k])
            }
            Size::Symbol(k) => {
                let (node, field, dim) = self.first_seen[k];
                let size = self.numbering.sizes[k];
                format!("the size of node {node}'s {field} dimension {dim} ({size})")
            }
        }
    }
}

fn shape_difference(a: &[usize], b: &[usize]) -> String {
    if a.len() != b.len() {
        return format!("{a:?} vs {b:?} (rank {} vs {})", a.len(), b.len());
    }
    let dims: Vec<String> = (0..a.len())
        .filter(|&d| a[d] != b[d])
        .map(|d| format!("dimension {d}: {} vs {}", a[d], b[d]))
        .collect();
    format!("{a:?} vs {b:?} ({})", dims.join(", "))
}

/// Numbers the dumps a process writes.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The most graphs a context keeps for dumps of cache hits; past it, they
/// are dropped and kept again as flushes prepare them.
const MAX_GRAPHS: usize = 1024;

/// What a context keeps while fusion dumps are on: the directory, and the
/// graph of every program it prepared, by shape class and sizes (an exact
/// signature), so the dump of a later tier-1 hit, or of a program resized
/// from it, shows the graph too. Contexts without dumps have none of this.
pub(crate) struct Dumps {
    dir: PathBuf,
    rewrite_limits: RewriteConfig,
    graphs: Mutex<AHashMap<ShapeClass, Arc<Extracted>>>,
}

/// What a flush measured before it asked the pipeline for its program.
pub(crate) struct Probe {
    cache_before: CacheStats,
    reason: FlushReason,
}

/// What a flush hands to [`Dumps::write`].
pub(crate) struct FlushFacts<'a> {
    pub backend: &'static str,
    pub fused: bool,
    pub recorded: &'a Trace,
    pub call_sites: &'a [Option<&'static Location<'static>>],
    pub program: &'a Program,
    /// Whether this flush ran the rewrite (a tier-1 or tier-3 hit did not).
    pub rewrote: bool,
    /// The class of the template `program` was resized from, if it was.
    pub resized_from: Option<&'a ShapeClass>,
    /// The graph this flush prepared, if it prepared one.
    pub prepared_graph: Option<Arc<Extracted>>,
    pub cache_after: CacheStats,
    pub run_ns: u64,
    pub live_before: u64,
    pub peak: u64,
}

impl Dumps {
    /// Dumps into `dir`, created if missing. A `dir` that cannot hold dumps
    /// (a file, a directory this process cannot write) is warned about once,
    /// now, rather than when the first flush quietly writes nothing.
    pub fn new(dir: &Path, rewrite_limits: &RewriteConfig) -> Dumps {
        if let Err(why) = check_writable(dir) {
            warn_unwritable(dir, &why);
        }
        Dumps {
            dir: dir.into(),
            rewrite_limits: rewrite_limits.clone(),
            graphs: Mutex::new(AHashMap::new()),
        }
    }

    pub fn start(&self, cache_before: CacheStats, reason: FlushReason) -> Probe {
        Probe { cache_before, reason }
    }

    /// Writes the dump; a failure is logged, never returned: dumps must not
    /// change what the program computes.
    pub fn write(&self, probe: Probe, facts: FlushFacts<'_>) {
        let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let process = std::process::id();
        let dump = self.dump(probe, facts, process, sequence);
        let name = format!("flush-{process}-{sequence:06}.json");
        if let Err(e) = write_atomically(&self.dir, &name, dump.to_json().as_bytes()) {
            warn_unwritable(&self.dir, &e.to_string());
        }
    }

    /// The graph of the program a trace of `class` runs: the one just
    /// prepared, the one kept when an earlier flush prepared it, or, for a
    /// program resized from a template, the template's graph resized alike.
    fn graph(
        &self,
        class: &ShapeClass,
        prepared: Option<Arc<Extracted>>,
        resized_from: Option<&ShapeClass>,
    ) -> Option<Arc<Extracted>> {
        let mut graphs = self.graphs.lock().unwrap();
        if let Some(graph) = prepared {
            if graphs.len() >= MAX_GRAPHS {
                graphs.clear();
            }
            graphs.insert(class.clone(), graph.clone());
            return Some(graph);
        }
        if let Some(graph) = graphs.get(class) {
            return Some(graph.clone());
        }
        let from = resized_from?;
        let template = graphs.get(from)?;
        let trace = resized_trace(&template.trace, from.size_map(class))?;
        Some(Arc::new(Extracted {
            trace,
            origins: template.origins.clone(),
            rewrite: template.rewrite.clone(),
        }))
    }

    fn dump(&self, probe: Probe, facts: FlushFacts<'_>, process: u32, sequence: u64) -> FlushDump {
        let signature = Signature::of(facts.recorded);
        let class = ShapeClass::of(facts.recorded);
        let program = facts.program.clone();
        let graph = self.graph(&class, facts.prepared_graph, facts.resized_from);
        let (graph, origins, rewrite) = match (graph, facts.fused) {
            (Some(x), true) => {
                let rewrite = x
                    .rewrite
                    .as_ref()
                    .map(|r| RewriteDump::new(r, &self.rewrite_limits, facts.rewrote));
                (Some(x.trace.clone()), x.origins.clone(), rewrite)
            }
            // Unfused programs run the recorded trace itself.
            (_, false) => (
                Some(facts.recorded.clone()),
                (0..facts.recorded.len()).map(|n| vec![n]).collect(),
                None,
            ),
            (None, true) => (None, Vec::new(), None),
        };
        let materialized = materialized(&program);
        let written = materialized.iter().filter(|m| m.producer.is_some()).map(|m| m.bytes).sum();
        let (before, after) = (&probe.cache_before, &facts.cache_after);
        let mut dump = FlushDump {
            format: DUMP_FORMAT.into(),
            version: DUMP_VERSION,
            engine_version: env!("CARGO_PKG_VERSION").into(),
            backend: facts.backend.into(),
            process,
            sequence,
            preparation: if facts.fused { "fused" } else { "unfused" }.into(),
            signature: format!("{:016x}", signature.stable_hash()),
            shape_class: format!("{:016x}", class.signature.stable_hash()),
            recorded: facts.recorded.clone(),
            call_sites: (0..facts.recorded.len())
                .map(|n| facts.call_sites.get(n).copied().flatten().map(CallSite::from))
                .collect(),
            graph,
            origins,
            rewrite,
            program,
            materialized,
            cache: CacheOutcome::between(before, after),
            timings_ns: PhaseTimes {
                rewrite: after.rewrite_ns - before.rewrite_ns,
                plan: after.plan_ns - before.plan_ns,
                compile: after.compile_ns - before.compile_ns,
                run: facts.run_ns,
            },
            memory: FlushMemory { live_before: facts.live_before, peak: facts.peak, written },
            reason: Some(probe.reason),
        };
        // Write only what the loader accepts: a graph that does not match
        // the program (a program the cache adapted) is left out, not trusted.
        if let Err(why) = dump.check() {
            tracing::warn!(%why, "fusion dump written without its graph");
            (dump.graph, dump.origins) = (None, Vec::new());
        }
        dump
    }
}

impl FlushDump {
    /// Pretty JSON, as written to disk.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a dump always serializes")
    }
}

/// `trace` with every size of its shapes and size attributes mapped, as
/// [`Program::resized`] maps a program's: the graph of a resized program.
/// `None` when a size has no image.
fn resized_trace(trace: &Trace, map: impl Fn(usize) -> Option<usize>) -> Option<Trace> {
    let resize = |shape: &mut Shape| shape.iter_mut().try_for_each(|d| map(*d).map(|m| *d = m));
    let mut t = trace.clone();
    for node in &mut t.nodes {
        resize(&mut node.meta.shape)?;
        for d in node.op.size_attrs_mut() {
            *d = map(*d)?;
        }
    }
    Some(t)
}

/// Says once per process and directory that dumps cannot be written there.
fn warn_unwritable(dir: &Path, why: &str) {
    crate::warn::warn_once(&format!("fusion dump {}", dir.display()), || {
        format!(
            "{}={}: fusion dumps cannot be written there ({why}); flushes still run, \
             without dumps",
            crate::config::ENV_FUSION_DUMP,
            dir.display()
        )
    });
}

/// Whether `dir` is (or can be made) a directory this process can write a
/// file in: tried, since modes alone do not say (root, ACLs, read-only mounts).
fn check_writable(dir: &Path) -> Result<(), String> {
    if dir.exists() && !dir.is_dir() {
        return Err("it is not a directory".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it: {e}"))?;
    static PROBE: AtomicU64 = AtomicU64::new(0);
    let probe = dir.join(format!(
        ".probe-{}-{}.tmp",
        std::process::id(),
        PROBE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot write in it: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Writes `dir/name` through a temporary file and a rename, so a reader never
/// sees half a dump.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, dir.join(name))
}
