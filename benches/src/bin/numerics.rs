//! The numerics of fused rounding, measured: each benchmark workload on bf16
//! inputs in Strict (eager, rounds after every op) and in DeferAndFuse with
//! `TORCH_TPU_FUSED_ROUNDING=once` and `per_op`, each compared with an f64
//! reference run on the same bf16 values.
//!
//! `per_op` should repeat eager's bits; the last column counts the elements
//! where it does not.
//!
//! `cargo run --release -p benches --bin numerics [-- --json] [--tiny] [--workload NAME]`

use benches::reference64::{
    error_stats, reference, run_step, workload_inputs, ErrorStats, HostInput, RELATIVE_FLOOR,
};
use benches::{Size, NAMES};
use clap::Parser;
use deferfuse::{Config, DType, FusedRounding, HostData, Mode, Result};

#[derive(Parser)]
#[command(
    about = "Errors of Strict and fused bf16 (rounding once or per op) against an f64 reference"
)]
struct Args {
    /// One JSON object per workload instead of a table.
    #[arg(long)]
    json: bool,
    /// The test sizes (an eighth of the quick ones) instead of the quick sizes.
    #[arg(long)]
    tiny: bool,
    /// Only these workloads (repeatable).
    #[arg(long)]
    workload: Vec<String>,
}

/// The ways a workload runs, as (label, config); Strict comes first.
fn ways() -> Vec<(&'static str, Config)> {
    let fused =
        |fused_rounding| Config { mode: Mode::DeferAndFuse, fused_rounding, ..Config::default() };
    vec![
        ("strict", Config { mode: Mode::Strict, ..Config::default() }),
        ("once", fused(FusedRounding::Once)),
        ("per_op", fused(FusedRounding::PerOp)),
    ]
}

/// One output of one workload: each way's errors, and how many of its
/// elements differ in bits from Strict's.
struct OutputReport {
    output: usize,
    numel: usize,
    ways: Vec<WayReport>,
}

struct WayReport {
    label: &'static str,
    errors: ErrorStats,
    bits_differing_from_strict: usize,
}

impl OutputReport {
    fn way(&self, label: &str) -> &WayReport {
        self.ways.iter().find(|w| w.label == label).expect("every way is measured")
    }
}

/// Elements whose bits differ (NaNs of any payload count as equal).
fn bit_differences(a: &HostData, b: &HostData) -> usize {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let differ = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
        .count();
    differ + a.len().abs_diff(b.len())
}

fn measure(name: &str, size: Size) -> Result<Vec<OutputReport>> {
    let (inputs, step) = workload_inputs(name, size, DType::BF16)?;
    let expected = reference(name, &inputs.iter().map(HostInput::to_array).collect::<Vec<_>>())?;
    let results = ways()
        .into_iter()
        .map(|(label, config)| Ok((label, run_step(config, step, &inputs)?)))
        .collect::<Result<Vec<_>>>()?;
    let strict = &results[0].1;
    Ok((0..expected.len())
        .map(|i| OutputReport {
            output: i,
            numel: expected[i].data.len(),
            ways: results
                .iter()
                .map(|(label, outs)| WayReport {
                    label,
                    errors: error_stats(&outs[i].to_f64_vec(), &expected[i].data),
                    bits_differing_from_strict: bit_differences(&outs[i], &strict[i]),
                })
                .collect(),
        })
        .collect())
}

fn json_line(name: &str, outputs: &[OutputReport]) -> String {
    let num = |v: f64| if v.is_finite() { format!("{v:e}") } else { "null".into() };
    let outputs: Vec<String> = outputs
        .iter()
        .map(|o| {
            let ways: Vec<String> = o
                .ways
                .iter()
                .map(|w| {
                    let e = &w.errors;
                    format!(
                        "\"{}\":{{\"max_abs\":{},\"max_rel\":{},\"rms\":{},\"ref_rms\":{},\"compared\":{},\"nonfinite_agree\":{},\"nonfinite_disagree\":{},\"bits_differing_from_strict\":{}}}",
                        w.label,
                        num(e.max_abs),
                        num(e.max_rel),
                        num(e.rms),
                        num(e.ref_rms),
                        e.compared,
                        e.nonfinite_agree,
                        e.nonfinite_disagree,
                        w.bits_differing_from_strict
                    )
                })
                .collect();
            format!(
                "{{\"output\":{},\"numel\":{},{},\"per_op_bitwise_equal_strict\":{}}}",
                o.output,
                o.numel,
                ways.join(","),
                o.way("per_op").bits_differing_from_strict == 0
            )
        })
        .collect();
    format!("{{\"workload\":\"{name}\",\"dtype\":\"bf16\",\"relative_floor\":{RELATIVE_FLOOR:e},\"outputs\":[{}]}}", outputs.join(","))
}

fn print_table(rows: &[(String, Vec<OutputReport>)]) {
    let shown = ["strict", "once", "per_op"];
    println!("bf16 inputs; errors against an f64 reference run on the same bf16 values.");
    println!("max_rel: over elements with |ref| >= {RELATIVE_FLOOR:e}. Last column: per_op elements whose bits differ from Strict's.");
    let head: Vec<String> = shown.iter().map(|l| format!("{l:^29}")).collect();
    println!("{:<20} {:>8} | {} | {:>9}", "", "", head.join(" | "), "per_op");
    let sub = format!("{:>9} {:>9} {:>9}", "max_abs", "max_rel", "rms");
    println!(
        "{:<20} {:>8} | {} | {:>9}",
        "workload",
        "numel",
        [sub.as_str(); 3].join(" | "),
        "!=strict"
    );
    for (name, outputs) in rows {
        for o in outputs {
            let label =
                if outputs.len() > 1 { format!("{name}[{}]", o.output) } else { name.clone() };
            let cells: Vec<String> = shown
                .iter()
                .map(|l| {
                    let e = o.way(l).errors;
                    format!("{:>9.2e} {:>9.2e} {:>9.2e}", e.max_abs, e.max_rel, e.rms)
                })
                .collect();
            println!(
                "{label:<20} {:>8} | {} | {:>9}",
                o.numel,
                cells.join(" | "),
                o.way("per_op").bits_differing_from_strict
            );
            let nonfinite: Vec<String> = o
                .ways
                .iter()
                .filter(|w| w.errors.nonfinite_agree + w.errors.nonfinite_disagree > 0)
                .map(|w| {
                    format!(
                        "{} {}/{}",
                        w.label, w.errors.nonfinite_agree, w.errors.nonfinite_disagree
                    )
                })
                .collect();
            if !nonfinite.is_empty() {
                println!(
                    "{:<20} non-finite, left out (agree/disagree with the reference): {}",
                    "",
                    nonfinite.join(", ")
                );
            }
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let size = if args.tiny { Size::Tiny } else { Size::Quick };
    let names: Vec<String> = if args.workload.is_empty() {
        NAMES.iter().map(|s| s.to_string()).collect()
    } else {
        args.workload.clone()
    };
    let mut rows = Vec::new();
    for name in names {
        let outputs = measure(&name, size)?;
        if args.json {
            println!("{}", json_line(&name, &outputs));
        }
        rows.push((name, outputs));
    }
    if !args.json {
        print_table(&rows);
    }
    Ok(())
}
