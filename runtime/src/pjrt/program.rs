//! The trace of an unfused program: the PJRT backend lowers traces, and
//! the engine hands it programs.

use rewrite_rules::program::{KernelKind, Program};
use trace_ir::{Error, NodeId, Result, Trace};

use super::api::err;

/// Rebuilds the trace of a program whose kernels are all single ops (what
/// [`Program::unfused`] gives). XLA fuses the lowered module itself, so the
/// PJRT backend takes unfused programs; a planned program with fused
/// `Loop`/`MatMul` kernels is an error naming the kernel.
pub fn program_trace(program: &Program) -> Result<Trace> {
    let bad = |msg: String| Error::InvalidTrace(format!("program: {msg}"));
    let mut map: Vec<Option<NodeId>> = vec![None; program.values.len()];
    let mut t = Trace::new();
    for &p in &program.params {
        let meta = program
            .values
            .get(p)
            .ok_or_else(|| bad(format!("parameter value {p} does not exist")))?;
        if map[p].is_some() {
            return Err(bad(format!("value {p} is a parameter twice")));
        }
        map[p] = Some(t.push_parameter(meta.clone()));
    }
    let lookup = |map: &[Option<NodeId>], v: usize| -> Result<NodeId> {
        map.get(v)
            .copied()
            .flatten()
            .ok_or_else(|| bad(format!("value {v} is read before it is written")))
    };
    for (k, kernel) in program.kernels.iter().enumerate() {
        match &kernel.kind {
            KernelKind::Single { op } if !matches!(op, trace_ir::Op::Parameter { .. }) => {
                let [out] = kernel.outputs.as_slice() else {
                    return Err(bad(format!("kernel {k}: a single-op kernel writes one value")));
                };
                let inputs = kernel.inputs.iter().map(|&i| lookup(&map, i)).collect::<Result<Vec<_>>>()?;
                let id = t.push(op.clone(), &inputs).map_err(|e| bad(format!("kernel {k}: {e}")))?;
                if Some(t.meta(id)) != program.values.get(*out) {
                    return Err(bad(format!("kernel {k}: {} does not produce its output's meta", op.name())));
                }
                map[*out] = Some(id);
            }
            KernelKind::Single { .. } => return Err(bad(format!("kernel {k} is a parameter"))),
            KernelKind::Loop(_) | KernelKind::MatMul(_) => {
                return Err(err(format!(
                    "{}: the pjrt backend compiles unfused programs (Program::unfused); XLA fuses the lowered module itself",
                    program.describe_kernel(k)
                )))
            }
        }
    }
    t.outputs = program.outputs.iter().map(|&o| lookup(&map, o)).collect::<Result<_>>()?;
    Ok(t)
}
