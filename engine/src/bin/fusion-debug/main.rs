//! `fusion-debug`: what a DeferAndFuse flush ran, why ops were not fused, and
//! why a flush recompiled, read from the dumps `TORCH_TPU_FUSION_DUMP=<dir>`
//! writes (see `deferfuse::dump`).

mod diff;
mod dot;
mod explain;
mod graph;
mod html;
mod layout;
mod summary;
mod svg;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use deferfuse::dump::{DumpError, FlushDump, DEFAULT_MAX_DUMP_BYTES};

const EXIT_CODES: &str = "\
Exit codes:
  0  success (for diff: whether or not the two flushes could share a program)
  1  a dump is missing, unreadable, truncated, corrupt, inconsistent or from a newer deferfuse
  2  bad command line
  3  the request does not fit the dump (no such op, no graph in the dump)
  4  the output (a file, or standard output: closed or full) could not be written";

/// Shows what DeferAndFuse fused, why, and what it cost, from the JSON dumps
/// written with TORCH_TPU_FUSION_DUMP=<dir>.
#[derive(Parser)]
#[command(name = "fusion-debug", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The largest dump read, in bytes; a larger one is refused (exit code 1).
    #[arg(long, global = true, default_value_t = DEFAULT_MAX_DUMP_BYTES)]
    max_bytes: u64,
}

#[derive(Subcommand)]
enum Command {
    /// A table of flushes: ops, kernels, bytes materialized, cache outcome
    /// per tier (tier 1 `resized`: another size of a cached shape class),
    /// time per phase; then the top time sinks.
    Summary {
        /// A dump directory, or one dump file.
        path: PathBuf,
    },
    /// Draws a flush: its graph with each kernel a coloured cluster and
    /// materialized buffers as heavy edges labelled with their bytes.
    Show {
        dump: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Html)]
        format: Format,
        /// Where to write the drawing (standard output when absent).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Why graph node N is, or is not, in the same kernel as each neighbour.
    Explain {
        dump: PathBuf,
        /// The graph node id (the `#N` of `show`).
        #[arg(long = "op")]
        op: usize,
    },
    /// Why two flushes did or did not share a program: the same signature;
    /// the same shape class with other sizes (the first size that differs,
    /// and whether B's backend resizes or recompiles); or the first field in
    /// which their shape classes differ.
    Diff { a: PathBuf, b: PathBuf },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One self-contained page: the drawing, hover details, rules fired and kernel list.
    Html,
    /// The drawing alone.
    Svg,
    /// Graphviz source.
    Dot,
}

/// A failure, with the exit code it maps to.
enum Failure {
    Dump(DumpError),
    Request(String),
    Write(PathBuf, std::io::Error),
}

impl From<DumpError> for Failure {
    fn from(e: DumpError) -> Self {
        Failure::Dump(e)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command, cli.max_bytes) {
        // `print!` would panic on a closed or full standard output (`| head`,
        // `> /dev/full`); a write error is exit code 4 like any other output.
        Ok(text) => match write_stdout(&text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(4, &format!("standard output: cannot write: {e}")),
        },
        Err(Failure::Dump(e)) => fail(1, &e.to_string()),
        Err(Failure::Request(msg)) => fail(3, &msg),
        Err(Failure::Write(path, e)) => fail(4, &format!("{}: cannot write: {e}", path.display())),
    }
}

fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn fail(code: u8, message: &str) -> ExitCode {
    // Not `eprintln!`, which panics when standard error is closed too.
    let _ = writeln!(std::io::stderr(), "fusion-debug: {message}");
    ExitCode::from(code)
}

/// Runs a command, reading dumps of at most `max_bytes`; its result is what
/// to print.
fn run(command: Command, max_bytes: u64) -> Result<String, Failure> {
    let load = |path: &Path| FlushDump::load_limited(path, max_bytes);
    match command {
        Command::Summary { path } => {
            let files = FlushDump::list(&path)?;
            let dumps = files
                .iter()
                .map(|f| Ok((f.clone(), load(f)?)))
                .collect::<Result<Vec<_>, DumpError>>()?;
            Ok(summary::render(&dumps))
        }
        Command::Show { dump, format, output } => {
            let d = load(&dump)?;
            let title = dump
                .file_name()
                .map_or_else(|| "flush".into(), |n| n.to_string_lossy().into_owned());
            let drawn = graph::Drawn::of(&d);
            let laid = layout::lay_out(&drawn);
            let text = match format {
                Format::Html => html::render(&d, &drawn, &laid, &title),
                Format::Svg => svg::render(&drawn, &laid),
                Format::Dot => dot::render(&drawn, &title),
            };
            match output {
                None => Ok(text),
                Some(path) => write(&path, &text).map(|()| String::new()),
            }
        }
        Command::Explain { dump, op } => {
            explain::explain(&load(&dump)?, op).map_err(Failure::Request)
        }
        Command::Diff { a, b } => Ok(diff::diff((&a, &load(&a)?), (&b, &load(&b)?))),
    }
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).map_err(|e| Failure::Write(path.into(), e))
}

/// Bytes for people: `512 B`, `4.0 KiB`, `1.5 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `4.56 ms`, `1.20 s`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns} ns"),
        1_000..=999_999 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}
