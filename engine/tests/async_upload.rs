//! Non-blocking uploads (`Context::from_host_async`): the data is read on
//! the context's stream while the caller goes on, reads and `sync` wait for
//! it, and a bad upload fails only what needs it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use deferfuse::{Config, Context, DType, HostData, Mode};

fn context(mode: Mode) -> Context {
    Context::new(Config { mode, cache_dir: None, ..Config::default() }).unwrap()
}

const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

#[test]
fn an_upload_used_by_ops_gives_what_a_plain_upload_gives() {
    let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 2.0).collect();
    for mode in MODES {
        let ctx = context(mode);
        let copy = data.clone();
        let later = ctx.from_host_async(&[4, 6], DType::F32, move || HostData::F32(copy)).unwrap();
        let now = ctx.from_slice(&data, &[4, 6]).unwrap();
        let f =
            |t: &deferfuse::Tensor| t.mul(1.5).unwrap().exp().unwrap().sum(&[1], false).unwrap();
        assert_eq!(f(&later).to_vec::<f32>().unwrap(), f(&now).to_vec::<f32>().unwrap(), "{mode}");
        assert_eq!(later.to_vec::<f32>().unwrap(), data, "{mode}");
    }
}

#[test]
fn the_caller_goes_on_before_the_data_is_read() {
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = context(mode);
        let (go, wait) = channel::<()>();
        let t = ctx
            .from_host_async(&[3], DType::I64, move || {
                wait.recv().unwrap();
                HostData::I64(vec![1, 2, 3])
            })
            .unwrap();
        // The stream is blocked inside `read`; recording goes on.
        let doubled = t.mul(2.0).unwrap();
        go.send(()).unwrap();
        assert_eq!(doubled.to_vec::<i64>().unwrap(), vec![2, 4, 6], "{mode}");
    }
}

#[test]
fn sync_waits_for_an_upload_nothing_reads() {
    for mode in MODES {
        let ctx = context(mode);
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let _t = ctx
            .from_host_async(&[2], DType::F32, move || {
                std::thread::sleep(Duration::from_millis(30));
                flag.store(true, Ordering::SeqCst);
                HostData::F32(vec![0.0, 1.0])
            })
            .unwrap();
        ctx.sync().unwrap();
        assert!(done.load(Ordering::SeqCst), "{mode}: sync returned before the upload ran");
    }
}

#[test]
fn a_wrong_upload_fails_its_readers_and_the_context_goes_on() {
    for mode in MODES {
        let ctx = context(mode);
        let short = ctx.from_host_async(&[4], DType::F32, || HostData::F32(vec![1.0; 3]));
        let other = ctx.from_host_async(&[2], DType::F32, || HostData::I32(vec![1, 2]));
        for (t, want) in [(short, "3 values cannot fill shape [4]"), (other, "another dtype")] {
            // Debug reads at once and fails the call; the others fail the read.
            let err = t.and_then(|t| t.add(1.0)?.to_vec::<f32>()).unwrap_err().to_string();
            assert!(err.contains("upload") && err.contains(want), "{mode}: {err}");
        }
        let fine = ctx.from_host_async(&[2], DType::F32, || HostData::F32(vec![1.0, 2.0])).unwrap();
        assert_eq!(fine.add(1.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0], "{mode}");
    }
}
