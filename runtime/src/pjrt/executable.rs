//! [`PjrtExecutable`], a compiled trace on a PJRT device, and buffer
//! donation: which inputs a run may hand to its outputs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use trace_ir::{Meta, Result};

use super::api::{err, DeviceBuffer, LoadedExecutable};
use super::compiler::{bump, Compiler};
use super::lower::Lowered;
use super::scalars::device_buffer;
use crate::backend::Executable;
use crate::buffer::{Buffer, Storage};

/// `(parameter, output)` pairs a run donates.
type Aliases = Vec<(usize, usize)>;

/// A compiled trace: runs on device buffers (uploading any host inputs) and
/// leaves its outputs on the device.
///
/// Buffer donation: an input that only this run holds (no tensor, no other
/// pending use) and that has the shape and dtype of an output is donated to
/// it: the run executes a variant of the module whose parameter is marked
/// `tf.aliasing_output`, and XLA writes the output into the input's memory
/// instead of allocating (and page-faulting) a new buffer. An optimizer step
/// whose new state replaces the old allocates nothing. Each donation
/// pattern compiles once, when a run first meets it (through the same
/// in-memory cache and store as the module itself); inputs someone still
/// holds are never donated, so they stay readable.
pub struct PjrtExecutable {
    /// `None` for a trace without outputs (nothing to run).
    exe: Option<Arc<LoadedExecutable>>,
    lowered: Lowered,
    compiler: Arc<Compiler>,
    /// Donating variants by `(parameter, output)` pairs.
    donating: Mutex<HashMap<Aliases, Arc<LoadedExecutable>>>,
}

impl PjrtExecutable {
    /// The executable of `lowered`, compiled as `exe` (`None` when the
    /// trace has no outputs) by `compiler`.
    pub(super) fn new(
        exe: Option<Arc<LoadedExecutable>>,
        lowered: Lowered,
        compiler: Arc<Compiler>,
    ) -> PjrtExecutable {
        PjrtExecutable { exe, lowered, compiler, donating: Mutex::new(HashMap::new()) }
    }

    /// The StableHLO module this executable was compiled from.
    pub fn module(&self) -> &str {
        &self.lowered.text
    }

    pub fn loaded(&self) -> Option<&Arc<LoadedExecutable>> {
        self.exe.as_ref()
    }

    /// The executable that donates `aliases` (the plain one for none).
    fn variant(
        &self,
        base: &Arc<LoadedExecutable>,
        aliases: &[(usize, usize)],
    ) -> Result<Arc<LoadedExecutable>> {
        if aliases.is_empty() {
            return Ok(base.clone());
        }
        if let Some(exe) = self.donating.lock().unwrap_or_else(|p| p.into_inner()).get(aliases) {
            return Ok(exe.clone());
        }
        let exe = self
            .compiler
            .executable(&self.lowered.with_aliases(aliases), self.lowered.outputs.len())?;
        self.donating
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(aliases.to_vec(), exe.clone());
        Ok(exe)
    }
}

/// `(input, output)` pairs to donate: each input that only the run holds
/// (`owned`) goes to the first output of its meta not taken yet.
fn donations(owned: &[bool], params: &[Meta], outputs: &[Meta]) -> Vec<(usize, usize)> {
    let mut taken = vec![false; outputs.len()];
    let mut pairs = Vec::new();
    for (k, meta) in params.iter().enumerate() {
        if !owned[k] || meta.numel() == 0 {
            continue;
        }
        if let Some(j) = (0..outputs.len()).find(|&j| !taken[j] && outputs[j] == *meta) {
            taken[j] = true;
            pairs.push((k, j));
        }
    }
    pairs
}

/// An input of a run: a device buffer it already has, or one uploaded for it.
enum Input<'a> {
    Resident(&'a DeviceBuffer),
    Uploaded(DeviceBuffer),
}

impl Input<'_> {
    fn buffer(&self) -> &DeviceBuffer {
        match self {
            Input::Resident(b) => b,
            Input::Uploaded(b) => b,
        }
    }
}

impl Executable for PjrtExecutable {
    fn run(&self, inputs: Vec<Arc<Buffer>>) -> Result<Vec<Arc<Buffer>>> {
        let params = &self.lowered.params;
        if inputs.len() != params.len() {
            return Err(err(format!(
                "the trace takes {} inputs, got {}",
                params.len(),
                inputs.len()
            )));
        }
        let Some(base) = &self.exe else { return Ok(Vec::new()) };
        let c = &self.compiler;
        let mut device = Vec::with_capacity(inputs.len());
        let mut owned = vec![false; inputs.len()];
        for (k, (buf, want)) in inputs.iter().zip(params).enumerate() {
            if buf.meta() != want {
                return Err(err(format!(
                    "input {k} is {:?} {} but the trace expects {:?} {}",
                    buf.meta().shape.as_slice(),
                    buf.meta().dtype,
                    want.shape.as_slice(),
                    want.dtype
                )));
            }
            device.push(match buf.storage() {
                Storage::Device(d) => {
                    let (b, shared) = device_buffer(d.as_ref())
                        .ok_or_else(|| err(format!("input {k} lives on another device backend")))?;
                    if !Arc::ptr_eq(b.client(), &c.client) {
                        return Err(err(format!("input {k} lives on another PJRT client")));
                    }
                    // Only this run holds it: nobody can read it after the run.
                    owned[k] = !shared && Arc::strong_count(buf) == 1 && Arc::weak_count(buf) == 0;
                    Input::Resident(b)
                }
                Storage::Host(data) => {
                    data.check_holds("pjrt", format_args!("input {k}"), want)?;
                    bump(&c.counters.host_to_device);
                    Input::Uploaded(c.client.upload(data, &want.shape)?)
                }
            });
        }
        let aliases = donations(&owned, params, &self.lowered.outputs);
        let exe = self.variant(base, &aliases)?;
        let refs: Vec<&DeviceBuffer> = device.iter().map(Input::buffer).collect();
        let outs = exe.execute(&refs)?;
        c.counters.donated.fetch_add(aliases.len() as u64, Ordering::Relaxed);
        drop(refs);
        drop(device);
        // Donated inputs are invalid now; dropping them only frees handles.
        drop(inputs);
        Ok(outs
            .into_iter()
            .zip(&self.lowered.outputs)
            .map(|(mut d, meta)| {
                d.set_meta(meta.dtype, meta.numel());
                Arc::new(Buffer::device(meta.clone(), Box::new(d), &c.tracker))
            })
            .collect())
    }
}
