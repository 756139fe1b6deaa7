//! The `TORCH_TPU_*` switches and the engine configuration they produce.

use trace_ir::{Error, Result};

/// Selects the eager mode.
pub const ENV_EAGER_MODE: &str = "TORCH_TPU_EAGER_MODE";
/// How many ops DeferAndFuse buffers before it flushes on its own.
pub const ENV_MAX_PENDING_OPS: &str = "TORCH_TPU_MAX_PENDING_OPS";
/// Whether DeferAndFuse cuts its op stream where it starts to repeat
/// (`on` by default; see `repeats.rs`).
pub const ENV_CUT_REPEATS: &str = "TORCH_TPU_CUT_REPEATS";
/// Whether DeferAndFuse flushes a trace where a value was read in an
/// earlier one, ahead of the read (`on` by default; see `read_ahead.rs`).
pub const ENV_READ_AHEAD: &str = "TORCH_TPU_READ_AHEAD";
/// Which checks Debug mode runs after every op.
pub const ENV_DEBUG_CHECKS: &str = "TORCH_TPU_DEBUG_CHECKS";

/// How fused kernels round: `once` (default) or `per_op`.
pub const ENV_FUSED_ROUNDING: &str = "TORCH_TPU_FUSED_ROUNDING";
/// Where compiled programs are kept across processes, or `off`.
pub const ENV_CACHE_DIR: &str = "TORCH_TPU_CACHE_DIR";
/// The byte budget of the on-disk cache.
pub const ENV_CACHE_BYTES: &str = "TORCH_TPU_CACHE_BYTES";

/// A directory where every DeferAndFuse flush writes a JSON dump for
/// `fusion-debug`; unset (the default) writes nothing and costs nothing.
pub const ENV_FUSION_DUMP: &str = "TORCH_TPU_FUSION_DUMP";

/// The default on-disk cache budget: 256 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// The default pending-trace limit: large enough that real programs flush
/// because they read a value, small enough that an endless op stream stays
/// bounded in memory.
pub const DEFAULT_MAX_PENDING_OPS: usize = 4096;

/// The three eager modes of TorchTPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Op by op, asynchronous with the caller (the default).
    #[default]
    Strict,
    /// Op by op, synchronous, every output checked for NaN and Inf.
    Debug,
    /// Ops are buffered into a trace and run together when a value is needed.
    DeferAndFuse,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::Debug => "debug",
            Mode::DeferAndFuse => "defer_and_fuse",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mode {
    type Err = Error;
    /// Case-insensitive; anything else is an error that lists the valid values.
    fn from_str(s: &str) -> Result<Mode> {
        let lower = s.trim().to_ascii_lowercase();
        Mode::ALL.into_iter().find(|m| m.name() == lower).ok_or_else(|| Error::Config {
            var: ENV_EAGER_MODE.into(),
            value: s.into(),
            valid: "strict, debug, defer_and_fuse (case-insensitive)".into(),
        })
    }
}

/// Which checks Debug mode runs on every float output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugChecks {
    pub nan: bool,
    pub inf: bool,
}

impl Default for DebugChecks {
    fn default() -> Self {
        DebugChecks { nan: true, inf: true }
    }
}

impl std::str::FromStr for DebugChecks {
    type Err = Error;
    /// A comma list of `nan` and `inf`, or `none`.
    fn from_str(s: &str) -> Result<DebugChecks> {
        let mut checks = DebugChecks { nan: false, inf: false };
        for part in s.split(',').map(|p| p.trim().to_ascii_lowercase()) {
            match part.as_str() {
                "nan" => checks.nan = true,
                "inf" => checks.inf = true,
                "none" | "" => {}
                _ => {
                    return Err(Error::Config {
                        var: ENV_DEBUG_CHECKS.into(),
                        value: s.into(),
                        valid: "a comma list of nan, inf; or none".into(),
                    })
                }
            }
        }
        Ok(checks)
    }
}

/// How fused kernels round low-precision results (`once` or `per_op`).
pub use rewrite_rules::planner::Rounding as FusedRounding;

fn parse_rounding(s: &str) -> Result<FusedRounding> {
    match s.trim().to_ascii_lowercase().as_str() {
        "once" => Ok(FusedRounding::Once),
        "per_op" => Ok(FusedRounding::PerOp),
        _ => Err(Error::Config {
            var: ENV_FUSED_ROUNDING.into(),
            value: s.into(),
            valid: "once, per_op".into(),
        }),
    }
}

/// Whether DeferAndFuse rewrites and fuses (`on`) or runs its traces op by
/// op (`off`), to bisect a numerical difference.
pub const ENV_FUSION: &str = "TORCH_TPU_FUSION";

/// Selects the backend.
pub const ENV_BACKEND: &str = "TORCH_TPU_BACKEND";
/// Names the PJRT plugin library explicitly.
pub const ENV_PJRT_PLUGIN: &str = "TORCH_TPU_PJRT_PLUGIN";

/// The backends a context can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// The native CPU backend.
    #[default]
    Cpu,
    /// A PJRT plugin (needs the `pjrt` feature).
    Pjrt,
}

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::Cpu, BackendKind::Pjrt];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Pjrt => "pjrt",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = Error;
    /// Case-insensitive; anything else is an error that lists the valid values.
    fn from_str(s: &str) -> Result<BackendKind> {
        let lower = s.trim().to_ascii_lowercase();
        BackendKind::ALL.into_iter().find(|b| b.name() == lower).ok_or_else(|| Error::Config {
            var: ENV_BACKEND.into(),
            value: s.into(),
            valid: "cpu, pjrt (case-insensitive)".into(),
        })
    }
}

/// Set to 1 to run the native CPU backend's fused kernels on their portable
/// (scalar) path instead of AVX2/AVX-512, to bisect a numerical difference.
pub const ENV_NO_SIMD: &str = "TORCH_TPU_NO_SIMD";

/// An on/off switch: `on`, `1`, `true` or `off`, `0`, `false` (any case).
fn parse_switch(var: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err(Error::Config {
            var: var.into(),
            value: value.into(),
            valid: "on, off (or 1, 0; true, false)".into(),
        }),
    }
}
/// The largest on-disk cache entry read or written, in bytes.
pub const ENV_CACHE_MAX_ENTRY_BYTES: &str = "TORCH_TPU_CACHE_MAX_ENTRY_BYTES";
/// The most entries each in-memory cache tier (programs, executables) keeps.
pub const ENV_CACHE_ENTRIES: &str = "TORCH_TPU_CACHE_ENTRIES";
/// The most bytes each in-memory cache tier keeps (estimated).
pub const ENV_CACHE_MEMORY_BYTES: &str = "TORCH_TPU_CACHE_MEMORY_BYTES";

/// The default entry limit of the on-disk cache: 256 MiB, above any program
/// or executable the engine makes, far below what exhausts memory.
pub const DEFAULT_CACHE_MAX_ENTRY_BYTES: u64 = 256 << 20;
/// The default entry bound of each in-memory tier: far more distinct traces
/// than a model runs, few enough that a loop minting new traces stays bounded.
pub const DEFAULT_CACHE_ENTRIES: usize = 1024;
/// The default byte bound of each in-memory tier: 64 MiB.
pub const DEFAULT_CACHE_MEMORY_BYTES: u64 = 64 << 20;

/// Everything a [`crate::Context`] is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub max_pending_ops: usize,
    /// DeferAndFuse flushes where the op stream starts to repeat itself, so
    /// loop iterations become identical traces (on by default).
    pub cut_repeats: bool,
    /// DeferAndFuse flushes a loop's trace where a value was read in the
    /// loop's previous iteration, so it runs while the rest of the
    /// iteration is recorded (on by default).
    pub read_ahead: bool,
    pub debug_checks: DebugChecks,
    /// `per_op` also turns the `patterns` rule set off ([`Config::effective_rewrite`]).
    pub fused_rounding: FusedRounding,
    /// DeferAndFuse rewrites and fuses its traces (on by default).
    pub fusion: bool,
    /// The native CPU backend's fused kernels use SIMD (AVX2/AVX-512) where
    /// the CPU has it (on by default; `TORCH_TPU_NO_SIMD` turns it off).
    pub simd: bool,
    /// Limits and rule sets of the e-graph rewrites.
    pub rewrite: rewrite_rules::RewriteConfig,
    /// The on-disk cache directory; `None` disables it.
    pub cache_dir: Option<std::path::PathBuf>,
    pub cache_bytes: u64,
    /// The backend (`TORCH_TPU_BACKEND`, native CPU by default).
    pub backend: BackendKind,
    /// The PJRT plugin library (`TORCH_TPU_PJRT_PLUGIN`); `None` searches.
    pub pjrt_plugin: Option<std::path::PathBuf>,
    /// Where flushes write fusion dumps ([`crate::dump`]); `None` writes none.
    pub fusion_dump: Option<std::path::PathBuf>,
    /// The PyTorch binding runs every aten op that has a PyTorch
    /// decomposition as that decomposition (`TORCH_TPU_DECOMPOSE=all`), not
    /// only its measured list. The engine itself does not read it.
    pub decompose_all: bool,
    /// The binding's `tpu_dist` backend checks, before each collective,
    /// that every rank made the same call (`TORCH_TPU_DIST_CHECK_CALLS`): a
    /// mismatch is then an error on every rank instead of a transport that
    /// aborts or hangs. The engine itself does not read it.
    pub dist_check_calls: bool,
    /// The largest on-disk cache entry read or written; larger ones are
    /// rejected (`TORCH_TPU_CACHE_MAX_ENTRY_BYTES`).
    pub cache_max_entry_bytes: u64,
    /// The most entries each in-memory tier keeps (`TORCH_TPU_CACHE_ENTRIES`);
    /// the least recently used go first.
    pub cache_entries: usize,
    /// The most bytes each in-memory tier keeps, estimated from the size of
    /// its programs (`TORCH_TPU_CACHE_MEMORY_BYTES`).
    pub cache_memory_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Strict,
            max_pending_ops: DEFAULT_MAX_PENDING_OPS,
            cut_repeats: true,
            read_ahead: true,
            debug_checks: DebugChecks::default(),
            fused_rounding: FusedRounding::Once,
            fusion: true,
            simd: true,
            rewrite: rewrite_rules::RewriteConfig::default(),
            cache_dir: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
            backend: BackendKind::Cpu,
            pjrt_plugin: None,
            fusion_dump: None,
            decompose_all: false,
            dist_check_calls: true,
            cache_max_entry_bytes: DEFAULT_CACHE_MAX_ENTRY_BYTES,
            cache_entries: DEFAULT_CACHE_ENTRIES,
            cache_memory_bytes: DEFAULT_CACHE_MEMORY_BYTES,
        }
    }
}

/// The per-user default cache directory: `$XDG_CACHE_HOME/deferfuse`, else
/// `$HOME/.cache/deferfuse`, else none.
pub fn default_cache_dir(get: &impl Fn(&str) -> Option<String>) -> Option<std::path::PathBuf> {
    let base = get("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            get("HOME").filter(|v| !v.is_empty()).map(|h| std::path::Path::new(&h).join(".cache"))
        })?;
    Some(base.join("deferfuse"))
}

impl Config {
    pub fn with_mode(mode: Mode) -> Config {
        Config { mode, ..Config::default() }
    }

    /// The rewrites flushes run. `per_op` promises eager's bits, so it turns
    /// the `patterns` set off: a lifted GELU, softmax or LayerNorm is one
    /// fused op that computes in f32 inside and rounds only at its output,
    /// where eager rounds after each of the ops it was written with.
    pub fn effective_rewrite(&self) -> rewrite_rules::RewriteConfig {
        let mut rewrite = self.rewrite.clone();
        if self.fused_rounding == FusedRounding::PerOp {
            rewrite.rule_sets.patterns = false;
        }
        rewrite
    }

    /// Reads the `TORCH_TPU_*` variables of this process. The on-disk cache
    /// is on by default here (at [`default_cache_dir`]); `Config::default()`
    /// leaves it off, so tests and embedders opt in.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get`, so tests need not touch the process
    /// environment (which other threads may be reading).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut config = Config::default();
        if let Some(v) = get(ENV_EAGER_MODE) {
            config.mode = v.parse()?;
        }
        if let Some(v) = get(ENV_MAX_PENDING_OPS) {
            config.max_pending_ops =
                v.trim().parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| Error::Config {
                    var: ENV_MAX_PENDING_OPS.into(),
                    value: v.clone(),
                    valid: "a positive integer".into(),
                })?;
        }
        if let Some(v) = get(ENV_CUT_REPEATS) {
            config.cut_repeats = parse_switch(ENV_CUT_REPEATS, &v)?;
        }
        if let Some(v) = get(ENV_READ_AHEAD) {
            config.read_ahead = parse_switch(ENV_READ_AHEAD, &v)?;
        }
        if let Some(v) = get(ENV_DEBUG_CHECKS) {
            config.debug_checks = v.parse()?;
        }
        if let Some(v) = get(ENV_FUSED_ROUNDING) {
            config.fused_rounding = parse_rounding(&v)?;
        }
        if let Some(v) = get(ENV_FUSION) {
            config.fusion = parse_switch(ENV_FUSION, &v)?;
        }
        if let Some(v) = get(ENV_NO_SIMD) {
            config.simd = !parse_switch(ENV_NO_SIMD, &v)?;
        }
        config.cache_dir = match get(ENV_CACHE_DIR) {
            Some(v) if v.trim().eq_ignore_ascii_case("off") => None,
            Some(v) if !v.trim().is_empty() => Some(v.trim().into()),
            _ => default_cache_dir(&get),
        };
        if let Some(v) = get(ENV_CACHE_BYTES) {
            config.cache_bytes = v.trim().parse().map_err(|_| Error::Config {
                var: ENV_CACHE_BYTES.into(),
                value: v.clone(),
                valid: "a number of bytes".into(),
            })?;
        }
        if let Some(v) = get(ENV_BACKEND) {
            config.backend = v.parse()?;
        }
        config.pjrt_plugin = get(ENV_PJRT_PLUGIN).filter(|v| !v.trim().is_empty()).map(Into::into);
        config.fusion_dump =
            get(ENV_FUSION_DUMP).filter(|v| !v.trim().is_empty()).map(|v| v.trim().into());
        if let Some(v) = get(ENV_DECOMPOSE) {
            config.decompose_all = parse_decompose(&v)?;
        }
        if let Some(v) = get(ENV_DIST_CHECK_CALLS) {
            config.dist_check_calls = parse_switch(ENV_DIST_CHECK_CALLS, &v)?;
        }
        if let Some(v) = get(ENV_CACHE_MAX_ENTRY_BYTES) {
            config.cache_max_entry_bytes =
                positive(ENV_CACHE_MAX_ENTRY_BYTES, &v, "a positive number of bytes")?;
        }
        if let Some(v) = get(ENV_CACHE_ENTRIES) {
            config.cache_entries = positive(ENV_CACHE_ENTRIES, &v, "a positive integer")?;
        }
        if let Some(v) = get(ENV_CACHE_MEMORY_BYTES) {
            config.cache_memory_bytes =
                positive(ENV_CACHE_MEMORY_BYTES, &v, "a positive number of bytes")?;
        }
        Ok(config)
    }
}

/// A positive integer, or an error naming the variable and `valid`.
fn positive<T>(var: &str, value: &str, valid: &str) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + Default,
{
    value.trim().parse().ok().filter(|n| *n > T::default()).ok_or_else(|| Error::Config {
        var: var.into(),
        value: value.into(),
        valid: valid.into(),
    })
}

/// Whether the binding's `tpu_dist` backend checks that the ranks agree on
/// each collective call (`on` by default).
pub const ENV_DIST_CHECK_CALLS: &str = "TORCH_TPU_DIST_CHECK_CALLS";

/// Which aten ops the PyTorch binding decomposes: `all`, or `default` (its
/// measured list; also what an empty or unset value means).
pub const ENV_DECOMPOSE: &str = "TORCH_TPU_DECOMPOSE";

fn parse_decompose(s: &str) -> Result<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "all" => Ok(true),
        "default" | "" => Ok(false),
        _ => Err(Error::Config {
            var: ENV_DECOMPOSE.into(),
            value: s.into(),
            valid: "all, default (or unset)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_simd_is_a_switch_and_bad_values_name_the_valid_ones() {
        let with = |v: &str| Config::from_vars(|k| (k == ENV_NO_SIMD).then(|| v.to_string()));
        assert!(Config::from_vars(|_| None).unwrap().simd);
        assert!(!with("1").unwrap().simd);
        assert!(!with("ON").unwrap().simd);
        assert!(with("off").unwrap().simd);
        let e = with("yes").unwrap_err().to_string();
        assert!(e.contains(ENV_NO_SIMD) && e.contains("on, off"), "{e}");
    }

    #[test]
    fn names_parse_and_bad_ones_list_the_valid_values() {
        assert_eq!("cpu".parse::<BackendKind>().unwrap(), BackendKind::Cpu);
        assert_eq!(" PJRT ".parse::<BackendKind>().unwrap(), BackendKind::Pjrt);
        let e = "tpu".parse::<BackendKind>().unwrap_err().to_string();
        assert!(e.contains(ENV_BACKEND) && e.contains("tpu") && e.contains("cpu, pjrt"), "{e}");
    }
}
