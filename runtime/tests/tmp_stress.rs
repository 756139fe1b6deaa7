// Temporary: hunts NaN-vs-non-NaN disagreements on generated traces (no rewrites).
use rewrite_rules::planner::{plan, PlanConfig};
use rewrite_rules::program::Program;
use runtime::{Backend, CpuBackend, HostData, MemoryTracker};

fn run(p: &Program, inputs: &[HostData]) -> Vec<HostData> {
    let be = CpuBackend::new(MemoryTracker::new());
    let exe = be.compile(p).unwrap();
    let bufs = p.params.iter().zip(inputs).map(|(&q, d)| be.upload(p.values[q].clone(), d.clone()).unwrap()).collect();
    exe.run(bufs).unwrap().iter().map(|b| be.download(b).unwrap()).collect()
}

#[test]
fn stress() {
    let mut s: u64 = 1;
    let mut found = 0;
    for case in 0..20000 {
        let bytes: Vec<u8> = (0..200).map(|_| { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (s >> 56) as u8 }).collect();
        let mut src = trace_ir::generate::Bytes::new(&bytes);
        let g = trace_ir::generate::random_trace(&mut src, 12);
        let t = g.trace;
        let inputs: Vec<HostData> = g.params.iter().enumerate().map(|(i, m)| {
            let n = m.numel();
            let v: Vec<f64> = (0..n).map(|j| (((j * 7919 + i * 104729 + case) % 1000) as f64) / 250.0 - 2.0).collect();
            match m.dtype {
                trace_ir::DType::F32 => HostData::F32(v.iter().map(|&x| x as f32).collect()),
                trace_ir::DType::BF16 => HostData::BF16(v.iter().map(|&x| half::bf16::from_f64(x)).collect()),
                trace_ir::DType::F16 => HostData::F16(v.iter().map(|&x| half::f16::from_f64(x)).collect()),
                trace_ir::DType::Bool => HostData::Bool(v.iter().map(|&x| x > 0.0).collect()),
                trace_ir::DType::I32 => HostData::I32(v.iter().map(|&x| x as i32).collect()),
                trace_ir::DType::I64 => HostData::I64(v.iter().map(|&x| x as i64).collect()),
            }
        }).collect();
        let p = match plan(&t, &PlanConfig::default()) { Ok(p) => p, Err(e) => panic!("plan {e}") };
        let a = run(&p, &inputs);
        let b = run(&Program::unfused(&t), &inputs);
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            for (i, (u, v)) in x.iter().zip(&y).enumerate() {
                if u.is_nan() != v.is_nan() && found < 3 {
                    found += 1;
                    eprintln!("case {case} output {k} el {i}: fused {u} ref {v}\n{}", t.to_json().replace('\n', "").replace("  ", ""));
                }
            }
        }
    }
    assert_eq!(found, 0);
}
