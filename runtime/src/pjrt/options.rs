//! The XLA debug options sent with every compile on the CPU plugin (see
//! [`compile_overrides`]), as `CompileOptionsProto.env_option_overrides`
//! ([`super::api::compile_options`] encodes them).

/// The value of a debug-option override (`CompileOptionsProto.env_option_overrides`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// For enums and repeated fields too: names, comma-separated.
    Str(&'static str),
    Bool(bool),
}

/// The XLA debug options every CPU compile overrides: the values jax
/// (0.10) sends with each compile, where they differ from what an XLA CPU
/// plugin does with its own defaults. jax compiles with a full
/// `DebugOptions` of its own defaults; a plain PJRT client gets the
/// plugin's, under which `xla-cpu-pjrt` 0.0.1 lowers dots and reductions
/// to its generic loops instead of YNNPACK. An option the user sets in
/// `XLA_FLAGS` is left to the user.
pub fn compile_overrides() -> Vec<(&'static str, OptionValue)> {
    let all = [
        (
            "xla_cpu_experimental_ynn_fusion_type",
            OptionValue::Str("LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"),
        ),
        ("xla_cpu_enable_concurrency_optimized_scheduler", OptionValue::Bool(false)),
        // NaN propagates through max/min, as in the native backend.
        ("xla_cpu_enable_fast_min_max", OptionValue::Bool(false)),
    ];
    let user = std::env::var("XLA_FLAGS").unwrap_or_default();
    all.into_iter().filter(|(name, _)| !user.contains(name)).collect()
}
