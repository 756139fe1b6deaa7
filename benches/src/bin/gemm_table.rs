//! GEMM throughput (GFLOP/s) at the shapes of the benchmark workloads and of
//! the transformer block: deferfuse's matmul as users call it (Strict, one
//! program per call), the raw GEMM crates it could use, and, with `--peers`,
//! `torch.matmul` in the project venv (`.venv`, `bash .ci/setup_torch`),
//! measured in the same run with the calls of each side interleaved in
//! rounds so that both see the same load on the machine.
//!
//! `cargo run --release -p benches --bin gemm_table [-- --quick] [--peers] [--json]`
//!
//! Layouts name how the operands are stored: `nn` is `a @ b` with both
//! row-major, `nt` is `a @ w.t()` with `w` stored `[n, k]` (a linear layer,
//! PyTorch's `F.linear`), `tn` is `a.t() @ b` with `a` stored `[k, m]` (a
//! weight gradient). The transposes are views: nothing copies them before
//! the product.

use std::time::Instant;

use clap::Parser;
use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

#[derive(Parser)]
#[command(about = "GEMM GFLOP/s: deferfuse's matmul, the GEMM crates, torch.matmul")]
struct Args {
    /// Fewer rounds: the whole table in about a minute.
    #[arg(long)]
    quick: bool,
    /// Also time torch.matmul (`benches/peers/torch_matmul.py` in `.venv`).
    #[arg(long)]
    peers: bool,
    /// One JSON object per shape and dtype instead of a table.
    #[arg(long)]
    json: bool,
    /// Only the cases whose name contains this (repeatable).
    #[arg(long)]
    case: Vec<String>,
}

/// One product: `lhs @ rhs` with batch dimensions in front of `m, k` and
/// `k, n`; `ta`/`tb` say the operand is stored transposed (a view of
/// `[.., k, m]` or `[.., n, k]`).
struct Case {
    name: &'static str,
    lhs: Vec<usize>,
    rhs: Vec<usize>,
    ta: bool,
    tb: bool,
}

impl Case {
    fn dims(&self) -> (usize, usize, usize, usize) {
        let (l, r) = (&self.lhs, &self.rhs);
        let batch_l: usize = l[..l.len() - 2].iter().product();
        let batch_r: usize = r[..r.len() - 2].iter().product();
        (batch_l.max(batch_r), l[l.len() - 2], l[l.len() - 1], r[r.len() - 1])
    }

    fn flops(&self) -> f64 {
        let (b, m, k, n) = self.dims();
        2.0 * (b * m * k * n) as f64
    }

    fn layout(&self) -> &'static str {
        match (self.ta, self.tb) {
            (false, false) => "nn",
            (false, true) => "nt",
            (true, false) => "tn",
            (true, true) => "tt",
        }
    }

    /// The shape an operand is stored with: the last two dimensions swapped
    /// when it is used transposed.
    fn stored(shape: &[usize], transposed: bool) -> Vec<usize> {
        let mut s = shape.to_vec();
        if transposed {
            let r = s.len();
            s.swap(r - 2, r - 1);
        }
        s
    }

    /// The request line the torch peer understands.
    fn request(&self, dtype: DType) -> String {
        let dims = |s: &[usize]| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
        format!(
            "prepare {} {} {} {} {}",
            dims(&self.lhs),
            dims(&self.rhs),
            self.ta as u8,
            self.tb as u8,
            if dtype == DType::BF16 { "bf16" } else { "f32" }
        )
    }
}

fn cases() -> Vec<Case> {
    let c = |name, lhs: &[usize], rhs: &[usize], ta, tb| Case {
        name,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        ta,
        tb,
    };
    vec![
        // compare's mlp_block (full size) and its layouts.
        c("mlp_block up", &[256, 1024], &[1024, 4096], false, true),
        c("mlp_block down", &[256, 4096], &[4096, 1024], false, true),
        c("mlp_block up nn", &[256, 1024], &[1024, 4096], false, false),
        c("mlp_block up tn", &[256, 1024], &[1024, 4096], true, false),
        // bindings/bench/compare.py's MLP block.
        c("binding mlp up", &[256, 512], &[512, 2048], false, true),
        c("binding mlp down", &[256, 2048], &[2048, 512], false, true),
        c("binding mlp up nn", &[256, 512], &[512, 2048], false, false),
        // compare's transformer_block: projections of [8, 128, 256], four
        // heads of 64, an MLP of 1024.
        c("transformer qkv", &[8, 128, 256], &[256, 256], false, true),
        c("transformer scores", &[8, 4, 128, 64], &[8, 4, 64, 128], false, true),
        c("transformer attn@v", &[8, 4, 128, 128], &[8, 4, 128, 64], false, false),
        c("transformer mlp up", &[8, 128, 256], &[256, 1024], false, true),
        c("transformer mlp down", &[8, 128, 1024], &[1024, 256], false, true),
    ]
}

/// Deferfuse's matmul in Strict, called as `F.linear` calls it: the stored
/// operands' transposes are views taken in the call, and the call is one op
/// group, so that the transpose is read by the product (one program, a
/// tier-1 hit after the first call) instead of being copied once outside
/// the timed call.
struct Ours {
    ctx: Context,
    a: Tensor,
    b: Tensor,
    ta: bool,
    tb: bool,
}

impl Ours {
    fn new(case: &Case, dtype: DType) -> Result<Ours> {
        let ctx = Context::new(Config { mode: Mode::Strict, ..Config::default() })?;
        let a = ctx.randn(&Case::stored(&case.lhs, case.ta), DType::F32, 1)?.to_dtype(dtype)?;
        let b = ctx.randn(&Case::stored(&case.rhs, case.tb), DType::F32, 2)?.to_dtype(dtype)?;
        ctx.sync()?;
        let ours = Ours { ctx, a, b, ta: case.ta, tb: case.tb };
        ours.call()?;
        Ok(ours)
    }

    fn product(&self) -> Result<Tensor> {
        let view = |t: &Tensor, transposed: bool| if transposed { t.t() } else { Ok(t.clone()) };
        view(&self.a, self.ta)?.matmul(&view(&self.b, self.tb)?)
    }

    fn call(&self) -> Result<f64> {
        let start = Instant::now();
        let group = self.ctx.op_group("matmul");
        let out = group.end(self.product())?;
        self.ctx.sync()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(out);
        Ok(ms)
    }
}

/// A raw f32 GEMM over strided operands, for the crates the CPU backend
/// could call (the batch dimensions broadcast as in `matmul`).
type RawGemm = fn(&Raw, &mut [f32]);

struct Raw {
    a: Vec<f32>,
    b: Vec<f32>,
    /// Per batch: the offsets of its lhs and rhs matrices.
    offsets: Vec<(usize, usize)>,
    m: usize,
    k: usize,
    n: usize,
    /// Row and column strides of one lhs and one rhs matrix.
    sa: (isize, isize),
    sb: (isize, isize),
}

impl Raw {
    fn new(case: &Case) -> Raw {
        let (batch, m, k, n) = case.dims();
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7 + seed) % 13) as f32 * 0.1 - 0.6).collect()
        };
        let (la, lb) = (m * k, k * n);
        let batch_a: usize = case.lhs[..case.lhs.len() - 2].iter().product();
        let batch_b: usize = case.rhs[..case.rhs.len() - 2].iter().product();
        let offsets =
            (0..batch).map(|i| ((i % batch_a) * la, (i % batch_b) * lb)).collect::<Vec<_>>();
        let strides = |rows: usize, cols: usize, transposed: bool| -> (isize, isize) {
            if transposed {
                (1, rows as isize)
            } else {
                (cols as isize, 1)
            }
        };
        Raw {
            a: fill(batch_a * la, 1),
            b: fill(batch_b * lb, 2),
            offsets,
            m,
            k,
            n,
            sa: strides(m, k, case.ta),
            sb: strides(k, n, case.tb),
        }
    }

    fn time(&self, f: RawGemm, out: &mut [f32]) -> f64 {
        let start = Instant::now();
        f(self, out);
        std::hint::black_box(&out);
        start.elapsed().as_secs_f64() * 1e3
    }
}

/// The `gemm` crate as the CPU backend calls it today: one call per batch,
/// parallel inside the call.
fn with_gemm(r: &Raw, out: &mut [f32]) {
    for (d, &(oa, ob)) in out.chunks_mut(r.m * r.n).zip(&r.offsets) {
        // SAFETY: the offsets and strides address m*k and k*n elements inside
        // `a` and `b`; `d` holds m*n row-major elements and aliases neither.
        unsafe {
            gemm::gemm(
                r.m,
                r.n,
                r.k,
                d.as_mut_ptr(),
                1,
                r.n as isize,
                false,
                r.a.as_ptr().add(oa),
                r.sa.1,
                r.sa.0,
                r.b.as_ptr().add(ob),
                r.sb.1,
                r.sb.0,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            )
        }
    }
}

/// `matrixmultiply` (single-threaded, no `threading` feature), its output
/// columns split over rayon's threads as the CPU backend splits them: each
/// thread packs its own columns of the rhs.
fn with_matrixmultiply(r: &Raw, out: &mut [f32]) {
    use rayon::prelude::*;
    let (m, k, n) = (r.m, r.k, r.n);
    let width = n.div_ceil(rayon::current_num_threads()).div_ceil(64) * 64;
    for (d, &(oa, ob)) in out.chunks_mut(m * n).zip(&r.offsets) {
        let dst = d.as_mut_ptr() as usize;
        (0..n.div_ceil(width)).into_par_iter().for_each(|t| {
            let (j0, j1) = (t * width, ((t + 1) * width).min(n));
            // SAFETY: as in `with_gemm`; each task writes its own columns.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    j1 - j0,
                    1.0,
                    r.a.as_ptr().add(oa),
                    r.sa.0,
                    r.sa.1,
                    r.b.as_ptr().add(ob + j0 * r.sb.1 as usize),
                    r.sb.0,
                    r.sb.1,
                    0.0,
                    (dst as *mut f32).add(j0),
                    n as isize,
                    1,
                )
            }
        });
    }
}

/// `torch.matmul` in a child process answering one request per line.
struct TorchPeer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl TorchPeer {
    fn start() -> std::result::Result<TorchPeer, String> {
        use std::process::{Command, Stdio};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = root.join(".venv/bin/python");
        if !python.is_file() {
            return Err(format!(
                "{} is missing: run `bash .ci/setup_python && bash .ci/setup_torch` first",
                python.display()
            ));
        }
        let mut child = Command::new(&python)
            .arg(root.join("benches/peers/torch_matmul.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(TorchPeer { child, stdin, stdout })
    }

    fn ask(&mut self, request: &str) -> std::result::Result<String, String> {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| format!("the torch peer failed: {e}"))?;
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line) {
                Ok(0) => return Err(format!("the torch peer gave no answer to `{request}`")),
                Ok(_) if line.starts_with('{') => return Ok(line.trim().to_string()),
                Ok(_) => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// `n` timed calls of the prepared product, in ms.
    fn run(&mut self, n: usize) -> std::result::Result<Vec<f64>, String> {
        let line = self.ask(&format!("run {n}"))?;
        let list = line.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap_or_default();
        list.split(',')
            .map(|v| v.trim().parse().map_err(|_| format!("unreadable answer: {line}")))
            .collect()
    }
}

impl Drop for TorchPeer {
    fn drop(&mut self) {
        let _ = self.ask("quit");
        let _ = self.child.wait();
    }
}

/// Minimum and median of a list of times.
fn min_median(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[0], t[t.len() / 2])
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (rounds, per_round) = if args.quick { (3, 3) } else { (7, 5) };
    let mut peer = match args.peers {
        true => Some(TorchPeer::start().map_err(|e| deferfuse::Error::backend("torch peer", e))?),
        false => None,
    };
    let peer_err = |e: String| deferfuse::Error::backend("torch peer", e);
    let columns = ["deferfuse", "gemm", "matrixmultiply", "torch"];
    if !args.json {
        println!(
            "GFLOP/s from the minimum time (median in parentheses), {rounds} rounds of {per_round} calls"
        );
        println!("{:<22} {:>4} {:>6} {:>22}", "case", "lay", "dtype", "b x m x k x n");
        println!("  {}", columns.map(|c| format!("{c:>18}")).join(""));
    }
    for case in cases() {
        if !args.case.is_empty() && !args.case.iter().any(|c| case.name.contains(c.as_str())) {
            continue;
        }
        for dtype in [DType::F32, DType::BF16] {
            let ours = Ours::new(&case, dtype)?;
            let raw = (dtype == DType::F32).then(|| Raw::new(&case));
            let (b, m, k, n) = case.dims();
            let mut out = vec![0.0f32; b * m * n];
            if let Some(p) = &mut peer {
                p.ask(&case.request(dtype)).map_err(peer_err)?;
            }
            let mut times: [Vec<f64>; 4] = Default::default();
            for _ in 0..rounds {
                for _ in 0..per_round {
                    times[0].push(ours.call()?);
                }
                if let Some(r) = &raw {
                    for _ in 0..per_round {
                        times[1].push(r.time(with_gemm, &mut out));
                    }
                    for _ in 0..per_round {
                        times[2].push(r.time(with_matrixmultiply, &mut out));
                    }
                }
                if let Some(p) = &mut peer {
                    times[3].extend(p.run(per_round).map_err(peer_err)?);
                }
            }
            let gflops = |ms: f64| case.flops() / (ms * 1e-3) / 1e9;
            let cells: Vec<Option<(f64, f64)>> = times
                .into_iter()
                .map(|t| (!t.is_empty()).then(|| min_median(t)))
                .map(|mm| mm.map(|(lo, med)| (gflops(lo), gflops(med))))
                .collect();
            let dt = if dtype == DType::BF16 { "bf16" } else { "f32" };
            if args.json {
                let keys: Vec<String> = columns
                    .iter()
                    .zip(&cells)
                    .filter_map(|(c, v)| {
                        v.map(|(best, med)| {
                            format!("\"{c}_gflops\":{best:.2},\"{c}_median_gflops\":{med:.2}")
                        })
                    })
                    .collect();
                println!(
                    "{{\"case\":\"{}\",\"layout\":\"{}\",\"dtype\":\"{dt}\",\"b\":{b},\"m\":{m},\"k\":{k},\"n\":{n},{}}}",
                    case.name,
                    case.layout(),
                    keys.join(",")
                );
            } else {
                println!(
                    "{:<22} {:>4} {:>6} {:>22}",
                    case.name,
                    case.layout(),
                    dt,
                    format!("{b}x{m}x{k}x{n}")
                );
                let row: Vec<String> = cells
                    .iter()
                    .map(|v| match v {
                        Some((best, med)) => format!("{:>18}", format!("{best:.1} ({med:.1})")),
                        None => format!("{:>18}", "-"),
                    })
                    .collect();
                println!("  {}", row.join(""));
            }
        }
    }
    Ok(())
}
