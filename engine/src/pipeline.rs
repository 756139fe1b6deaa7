//! From a trace to an executable, through the three cache tiers. Every mode
//! goes through here, so the same op sequence is rewritten, planned and
//! compiled once.
//!
//! - tier 1, in memory: trace signature → program (skips rewriting and
//!   planning). It is keyed by the trace's shape class ([`ShapeClass`]): a
//!   trace that differs only in sizes (a new batch size) reuses the program
//!   and executable planned for the first sizes, resized, when the backend's
//!   executables are shape-polymorphic (the native CPU backend's are); it is
//!   planned and compiled for its own sizes otherwise. A trace whose sizes
//!   merely coincide (a KV cache's length reaching a projection's width)
//!   is another class, but one that an earlier class serves: a miss looks
//!   for one among the classes of the same structure
//!   ([`ShapeClass::structure_hash`]) before it rewrites;
//! - tier 2, in memory: program fingerprint → executable (skips compiling; two
//!   traces that optimize to the same program share it);
//! - tier 3, on disk: a stable key of the signature, the engine and backend
//!   versions and the plan settings → program, so another process skips
//!   rewriting and planning too (see [`crate::disk_cache`]). A stored program
//!   that does not parse or compile is rejected and rebuilt.
//!
//! Tiers 1 and 2 are bounded in entries and in (estimated) bytes
//! ([`TierLimits`]) and evict their least recently used entries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ahash::AHashMap;
use rewrite_rules::planner::{plan, PlanConfig};
use rewrite_rules::program::Program;
use rewrite_rules::{optimize, RewriteConfig, RewriteReport};
use runtime::{Backend, Executable};
use trace_ir::{Result, ShapeClass, Signature, Trace};

use crate::disk_cache::{DiskCache, DiskCacheStats};
use crate::exact::ExactTraces;
use crate::lru::Lru;

/// How a trace becomes a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preparation {
    /// One kernel per op (Strict and Debug).
    Unfused,
    /// E-graph rewrites, then the kernel planner (DeferAndFuse).
    Fused,
}

/// Hits, misses and size of one in-memory cache tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    pub hits: u64,
    pub misses: u64,
    /// Entries held now.
    pub entries: u64,
    /// Bytes held now, estimated from the size of the programs' canonical
    /// form (compiled kernel state is not counted).
    pub bytes: u64,
    /// Entries dropped, least recently used first, to keep [`TierLimits`].
    pub evictions: u64,
}

/// The bounds of each in-memory tier ([`crate::Config::cache_entries`],
/// [`crate::Config::cache_memory_bytes`]). An entry alone over the bytes is
/// still kept, so the trace in use never recompiles on every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierLimits {
    pub entries: usize,
    pub bytes: u64,
}

impl TierLimits {
    /// The bounds `config` sets.
    pub fn from_config(config: &crate::config::Config) -> TierLimits {
        TierLimits { entries: config.cache_entries, bytes: config.cache_memory_bytes }
    }
}

impl Default for TierLimits {
    fn default() -> Self {
        TierLimits {
            entries: crate::config::DEFAULT_CACHE_ENTRIES,
            bytes: crate::config::DEFAULT_CACHE_MEMORY_BYTES,
        }
    }
}

/// Counters and phase times of a context's caches, read through
/// [`crate::Context::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Signature → program.
    pub tier1: TierStats,
    /// Tier-1 hits that served new sizes by resizing a program planned for
    /// others (no rewriting, planning or compiling).
    pub resized: u64,
    /// Program → executable.
    pub tier2: TierStats,
    /// On disk; `rejected` counts entries that were not authentic, corrupt,
    /// foreign or unusable, and were rebuilt.
    pub tier3: DiskCacheStats,
    /// Time spent in e-graph rewriting, planning and backend compilation.
    pub rewrite_ns: u64,
    pub plan_ns: u64,
    pub compile_ns: u64,
}

#[derive(Default)]
struct Counters {
    tier1: [AtomicU64; 2],
    resized: AtomicU64,
    tier2: [AtomicU64; 2],
    rewrite_ns: AtomicU64,
    plan_ns: AtomicU64,
    compile_ns: AtomicU64,
}

/// What the last fused preparation did, for dumps and tests.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub program: Arc<Program>,
    /// The rewrite report, when this preparation rewrote (a tier-1 or tier-3
    /// hit skips rewriting and has none).
    pub rewrite: Option<RewriteReport>,
    /// When the program is the tier-1 template of its shape class resized to
    /// this trace's sizes: the template's class, so a fusion dump can resize
    /// the template's graph the same way.
    pub resized_from: Option<ShapeClass>,
}

/// The trace the planner saw and where its nodes came from, for fusion dumps.
#[derive(Debug)]
pub struct Extracted {
    /// The optimized trace: the program's value ids are its node ids.
    pub trace: Trace,
    /// For each node, the recorded nodes it stands for (see
    /// [`rewrite_rules::Optimized::origins`]).
    pub origins: Vec<Vec<trace_ir::NodeId>>,
    /// The report of the rewrite that produced it, if rewriting succeeded.
    pub rewrite: Option<RewriteReport>,
}

#[derive(Clone)]
struct Instance {
    program: Arc<Program>,
    executable: Arc<dyn Executable>,
    /// The template's class, when this instance was resized from it.
    resized_from: Option<ShapeClass>,
}

impl Instance {
    fn served(self, rewrite: Option<RewriteReport>) -> (Arc<dyn Executable>, Prepared) {
        let Instance { program, executable, resized_from } = self;
        (executable, Prepared { program, rewrite, resized_from })
    }
}

/// Everything tier 1 holds for one shape class.
struct Entry {
    /// The sizes planned first, and what was planned for them: other sizes
    /// are resized from it.
    template: (ShapeClass, Instance),
    /// Instances by sizes (the template's included).
    by_sizes: AHashMap<Vec<usize>, Instance>,
    /// The size of the signature's and the template program's canonical
    /// forms; resized programs are taken to be the template's size.
    signature_bytes: u64,
    program_bytes: u64,
}

/// The most sizes one shape class keeps instances for.
const MAX_INSTANCES: usize = 64;

/// The most structures whose classes are remembered for coinciding sizes;
/// past it they are forgotten, all at once (tier 1 itself is unaffected).
const MAX_STRUCTURES: usize = 1024;

impl Entry {
    fn new(class: ShapeClass, instance: Instance, program_bytes: u64) -> Entry {
        let by_sizes = AHashMap::from_iter([(class.sizes.clone(), instance.clone())]);
        let signature_bytes = class.signature.canonical().len() as u64;
        Entry { template: (class, instance), by_sizes, signature_bytes, program_bytes }
    }

    /// What the entry holds, for the tier's byte bound.
    fn bytes(&self) -> u64 {
        self.signature_bytes + self.program_bytes * self.by_sizes.len() as u64
    }

    fn insert(&mut self, sizes: Vec<usize>, instance: Instance) {
        if self.by_sizes.len() >= MAX_INSTANCES {
            let template = self.template.0.sizes.clone();
            self.by_sizes.retain(|k, _| *k == template);
        }
        self.by_sizes.insert(sizes, instance);
    }

    /// The template resized to `class`'s sizes, when both the program and
    /// its executable allow it.
    fn resize(&self, class: &ShapeClass) -> Option<Instance> {
        let (from, template) = &self.template;
        let program = template.program.resized(from.size_map(class))?;
        let executable = template.executable.resized(&program)?;
        Some(Instance { program: Arc::new(program), executable, resized_from: Some(from.clone()) })
    }
}

/// Compiled executables by program fingerprint.
type Executables = Lru<Arc<[u8]>, Arc<dyn Executable>>;

/// The tier-1 classes of each structure, each with its symbol positions.
type Structures = AHashMap<(Preparation, u64), Vec<(Signature, Arc<[u32]>)>>;

pub(crate) struct Pipeline {
    backend: Arc<dyn Backend>,
    rewrite: RewriteConfig,
    plan: PlanConfig,
    /// Tier 1. Each entry also holds its executable, so a hit costs one
    /// signature and one lookup (a trace seen before, in [`Self::exact`],
    /// not even the signature).
    programs: Mutex<Lru<(Preparation, Signature), Entry>>,
    /// Tier 1's front (see [`crate::exact`]): exact traces to their
    /// instances, so a trace seen before costs no shape class.
    exact: Mutex<ExactTraces<Instance>>,
    /// See [`Pipeline::lookup_coincident`]; at most [`MAX_STRUCTURES`].
    structures: Mutex<Structures>,
    /// Tier 2, keyed by the program's fingerprint.
    executables: Mutex<Executables>,
    disk: Option<DiskCache>,
    counters: Counters,
    /// While fusion dumps are on, the graph of the last fused preparation
    /// (taken by the flush that caused it); off, nothing is kept.
    last_extracted: Mutex<Option<Arc<Extracted>>>,
    keep_extracted: std::sync::atomic::AtomicBool,
}

fn count(pair: &[AtomicU64; 2], hit: bool) {
    pair[usize::from(!hit)].fetch_add(1, Ordering::Relaxed);
}

fn elapsed_ns(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

impl Pipeline {
    pub fn new(
        backend: Arc<dyn Backend>,
        rewrite: RewriteConfig,
        plan: PlanConfig,
        disk: Option<DiskCache>,
        limits: TierLimits,
    ) -> Self {
        Pipeline {
            backend,
            rewrite,
            plan,
            programs: Mutex::new(Lru::new(limits.entries, limits.bytes)),
            exact: Mutex::new(ExactTraces::new(limits)),
            structures: Mutex::new(AHashMap::new()),
            executables: Mutex::new(Lru::new(limits.entries, limits.bytes)),
            disk,
            counters: Counters::default(),
            last_extracted: Mutex::new(None),
            keep_extracted: Default::default(),
        }
    }

    /// Keeps the graph of each fused preparation for [`Pipeline::take_extracted`].
    pub fn keep_extracted(&self) {
        self.keep_extracted.store(true, Ordering::Relaxed);
    }

    /// The graph of the fused preparation since the last call, if one ran.
    pub fn take_extracted(&self) -> Option<Arc<Extracted>> {
        self.last_extracted.lock().unwrap().take()
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        fn tier<K: std::hash::Hash + Eq + Clone, V>(
            p: &[AtomicU64; 2],
            lru: &Lru<K, V>,
        ) -> TierStats {
            TierStats {
                hits: p[0].load(Ordering::Relaxed),
                misses: p[1].load(Ordering::Relaxed),
                entries: lru.len() as u64,
                bytes: lru.bytes(),
                evictions: lru.evictions(),
            }
        }
        CacheStats {
            tier1: tier(&c.tier1, &self.programs.lock().unwrap()),
            resized: c.resized.load(Ordering::Relaxed),
            tier2: tier(&c.tier2, &self.executables.lock().unwrap()),
            tier3: self.disk.as_ref().map(|d| d.stats()).unwrap_or_default(),
            rewrite_ns: c.rewrite_ns.load(Ordering::Relaxed),
            plan_ns: c.plan_ns.load(Ordering::Relaxed),
            compile_ns: c.compile_ns.load(Ordering::Relaxed),
        }
    }

    /// The executable for `trace` and the program it runs, when tier 1
    /// has it (counted as a hit); `None`, counted as nothing, when it does
    /// not.
    pub fn cached(
        &self,
        trace: &Trace,
        how: Preparation,
    ) -> Option<(Arc<dyn Executable>, Prepared)> {
        if let Some(instance) = self.lookup_exact(trace, how) {
            return Some(instance.served(None));
        }
        let instance = self.lookup(&ShapeClass::of(trace), how)?;
        self.exact.lock().unwrap().insert(trace, how, instance.clone());
        Some(instance.served(None))
    }

    /// The front of tier 1 (counted as a hit when it has `trace`).
    fn lookup_exact(&self, trace: &Trace, how: Preparation) -> Option<Instance> {
        let instance = self.exact.lock().unwrap().get(trace, how)?;
        count(&self.counters.tier1, true);
        Some(instance)
    }

    /// Tier 1 by shape class (counted as a hit when it has `class`).
    fn lookup(&self, class: &ShapeClass, how: Preparation) -> Option<Instance> {
        let key = (how, class.signature.clone());
        let hit = self.programs.lock().unwrap().update(
            &key,
            |entry| match entry.by_sizes.get(&class.sizes) {
                Some(instance) => Some(instance.clone()),
                None => entry.resize(class).inspect(|instance| {
                    self.counters.resized.fetch_add(1, Ordering::Relaxed);
                    entry.insert(class.sizes.clone(), instance.clone());
                }),
            },
            Entry::bytes,
        );
        let instance = hit??;
        count(&self.counters.tier1, true);
        Some(instance)
    }

    /// The executable for `trace`, and the program it runs.
    pub fn executable(
        &self,
        trace: &Trace,
        how: Preparation,
    ) -> Result<(Arc<dyn Executable>, Prepared)> {
        if let Some(instance) = self.lookup_exact(trace, how) {
            return Ok(instance.served(None));
        }
        let (instance, rewrite) = self.instance(trace, how)?;
        self.exact.lock().unwrap().insert(trace, how, instance.clone());
        Ok(instance.served(rewrite))
    }

    /// Tier 1 by shape class, else the other tiers; a new program goes
    /// into tier 1. With the report of the rewrite, when one ran.
    fn instance(
        &self,
        trace: &Trace,
        how: Preparation,
    ) -> Result<(Instance, Option<RewriteReport>)> {
        let class = ShapeClass::of(trace);
        if let Some(instance) = self.lookup(&class, how) {
            return Ok((instance, None));
        }
        let structure = (how, ShapeClass::structure_hash(trace));
        if let Some(instance) = self.lookup_coincident(trace, &structure) {
            return Ok((instance, None));
        }
        let key = (how, class.signature.clone());
        count(&self.counters.tier1, false);
        let (prepared, executable, program_bytes) =
            self.prepare_and_compile(trace, how, &Signature::of(trace))?;
        let instance =
            Instance { program: prepared.program.clone(), executable, resized_from: None };
        let mut programs = self.programs.lock().unwrap();
        let sizes = class.sizes.clone();
        let added =
            programs.update(&key, |entry| entry.insert(sizes, instance.clone()), Entry::bytes);
        if added.is_none() {
            let positions = ShapeClass::positions(trace).into();
            let mut structures = self.structures.lock().unwrap();
            if structures.len() >= MAX_STRUCTURES {
                structures.clear();
            }
            structures.entry(structure).or_default().push((class.signature.clone(), positions));
            let entry = Entry::new(class, instance.clone(), program_bytes);
            let bytes = entry.bytes();
            programs.insert(key, entry, bytes);
        }
        Ok((instance, prepared.rewrite))
    }

    /// Tier 1 for a trace whose class is new only because some of its sizes
    /// coincide: a class of the same structure whose symbols, bound to this
    /// trace's sizes position by position, give exactly its signature. Its
    /// program, planned for sizes that differ, is valid where they are equal
    /// and is resized to them.
    fn lookup_coincident(&self, trace: &Trace, structure: &(Preparation, u64)) -> Option<Instance> {
        let candidates = self.structures.lock().unwrap().get(structure)?.clone();
        candidates.iter().find_map(|(signature, positions)| {
            let class = ShapeClass::instance(trace, positions)?;
            (class.signature == *signature).then(|| self.lookup(&class, structure.0)).flatten()
        })
    }

    /// Tier 2: programs that two signatures share compile once. Also returns
    /// the size of the program's canonical form (the tiers' byte estimate).
    fn compile(&self, program: &Program) -> Result<(Arc<dyn Executable>, u64)> {
        let key: Arc<[u8]> = program.canonical().into();
        let program_bytes = key.len() as u64;
        if let Some(exe) = self.executables.lock().unwrap().get(&key) {
            count(&self.counters.tier2, true);
            return Ok((exe.clone(), program_bytes));
        }
        count(&self.counters.tier2, false);
        // Compile outside the lock; a racing thread may compile the same
        // program too, and the first insert wins.
        let start = Instant::now();
        let exe = self.backend.compile(program)?;
        self.counters.compile_ns.fetch_add(elapsed_ns(start), Ordering::Relaxed);
        let mut executables = self.executables.lock().unwrap();
        if let Some(first) = executables.get(&key) {
            return Ok((first.clone(), program_bytes));
        }
        // The key, and the program the executable keeps.
        executables.insert(key, exe.clone(), 2 * program_bytes);
        Ok((exe, program_bytes))
    }

    /// Tier 3, else rewriting and planning; then tier 2. A stored program
    /// that does not parse or compile is rejected (removed) and rebuilt, so
    /// one bad entry costs one rebuild instead of failing every later run.
    fn prepare_and_compile(
        &self,
        trace: &Trace,
        how: Preparation,
        signature: &Signature,
    ) -> Result<(Prepared, Arc<dyn Executable>, u64)> {
        let disk = self.disk.as_ref().filter(|_| how == Preparation::Fused);
        let disk_key = disk.map(|_| self.disk_key(signature));
        // Held from the lookup to the store: another process building the
        // same program finishes first, and this one reads its entry.
        let _building = disk.zip(disk_key.as_ref()).and_then(|(disk, k)| disk.lock(k));
        if let (Some(disk), Some(k)) = (disk, &disk_key) {
            if let Some(bytes) = disk.get(k) {
                let parsed = std::str::from_utf8(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|text| Program::from_json(text).map_err(|e| e.to_string()));
                match parsed {
                    Ok(program) => match self.compile(&program) {
                        Ok((exe, n)) => {
                            let program = Arc::new(program);
                            let prepared = Prepared { program, rewrite: None, resized_from: None };
                            return Ok((prepared, exe, n));
                        }
                        Err(e) => {
                            disk.reject(k, &format!("the stored program does not compile: {e}"))
                        }
                    },
                    Err(e) => disk.reject(k, &format!("the stored program does not parse: {e}")),
                }
            }
        }
        let prepared = self.prepare(trace, how)?;
        let (exe, n) = self.compile(&prepared.program)?;
        // Stored only once it compiled: the disk never holds a program that
        // this build knows to fail.
        if let (Some(disk), Some(k)) = (disk, &disk_key) {
            disk.put(k, prepared.program.to_json().as_bytes());
        }
        Ok((prepared, exe, n))
    }

    fn prepare(&self, trace: &Trace, how: Preparation) -> Result<Prepared> {
        if how == Preparation::Unfused {
            return Ok(Prepared {
                program: Arc::new(Program::unfused(trace)),
                rewrite: None,
                resized_from: None,
            });
        }
        let start = Instant::now();
        let (optimized, report, origins) = match optimize(trace, &self.rewrite) {
            Ok(o) => (o.trace, Some(o.report), o.origins),
            Err(e) => {
                // Rewrites are an optimization: a failure costs speed, not results.
                tracing::warn!(error = %e, "rewriting failed; planning the trace as recorded");
                (trace.clone(), None, (0..trace.len()).map(|n| vec![n]).collect())
            }
        };
        self.counters.rewrite_ns.fetch_add(elapsed_ns(start), Ordering::Relaxed);
        let start = Instant::now();
        // The rewrite's exhausted budgets shaped the trace the program runs.
        let with_budgets = |mut program: Program| {
            if let Some(r) = &report {
                program.budgets_exhausted.splice(0..0, r.budgets_exhausted.iter().cloned());
            }
            program
        };
        if self.backend.fuses_itself() {
            // One module per flush; the backend's compiler (XLA) fuses it.
            let program = Arc::new(with_budgets(Program::unfused(&optimized)));
            return Ok(Prepared { program, rewrite: report, resized_from: None });
        }
        let program = plan(&optimized, &self.plan).or_else(|e| {
            tracing::warn!(error = %e, "planning failed; running the trace op by op");
            Ok::<_, trace_ir::Error>(Program::unfused(&optimized))
        })?;
        let program = with_budgets(program);
        self.counters.plan_ns.fetch_add(elapsed_ns(start), Ordering::Relaxed);
        if let Some(r) = &report {
            tracing::debug!(rules = ?r.rules_fired, stop = %r.stop_reason, kernels = program.kernels.len(), "prepared");
        }
        if self.keep_extracted.load(Ordering::Relaxed) {
            let extracted = Extracted { trace: optimized, origins, rewrite: report.clone() };
            *self.last_extracted.lock().unwrap() = Some(Arc::new(extracted));
        }
        Ok(Prepared { program: Arc::new(program), rewrite: report, resized_from: None })
    }

    /// Everything the on-disk program depends on, in a canonical form.
    fn disk_key(&self, signature: &Signature) -> Vec<u8> {
        let mut key = format!(
            "deferfuse {} backend {} rewrite {:?} plan {:?}\n",
            env!("CARGO_PKG_VERSION"),
            self.backend.name(),
            self.rewrite.rule_sets,
            self.plan
        )
        .into_bytes();
        key.extend_from_slice(signature.canonical());
        key
    }
}
