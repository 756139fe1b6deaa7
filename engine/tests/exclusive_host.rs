//! `Tensor::exclusive_host`: a caller (a collective's transport) writes a
//! value's host bytes in place, and only the handle that asked sees it.

use deferfuse::{Config, Context, Mode};

fn context(mode: Mode) -> Context {
    Context::new(Config { mode, cache_dir: None, ..Config::default() }).unwrap()
}

const MODES: [Mode; 3] = [Mode::Strict, Mode::Debug, Mode::DeferAndFuse];

#[test]
fn writes_reach_the_handle_that_asked_and_no_other() {
    for mode in MODES {
        let ctx = context(mode);
        let mut t = ctx.from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let shared = t.clone(); // the same value
        let pending = t.add(1.0).unwrap(); // recorded before the writes
        let (address, nbytes) = t.exclusive_host().unwrap().expect("host memory");
        assert_eq!(nbytes, 12, "{mode}");
        // SAFETY: `t` alone holds these 3 f32s now, and keeps them alive.
        unsafe { std::slice::from_raw_parts_mut(address.cast::<f32>(), 3) }.fill(5.0);
        assert_eq!(t.to_vec::<f32>().unwrap(), [5.0; 3], "{mode}");
        assert_eq!(shared.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0], "{mode}");
        assert_eq!(pending.to_vec::<f32>().unwrap(), [2.0, 3.0, 4.0], "{mode}");
        // Its buffer is its own now: asked again, the same bytes, no copy.
        assert_eq!(t.exclusive_host().unwrap().unwrap().0, address, "{mode}");
    }
}

#[test]
fn a_value_alone_is_not_copied_and_bools_are_not_lent() {
    for mode in MODES {
        let ctx = context(mode);
        let mut t = ctx.from_slice(&[1.0f32, 2.0], &[2]).unwrap().mul(2.0).unwrap();
        let (first, _) = t.exclusive_host().unwrap().unwrap();
        assert_eq!(t.exclusive_host().unwrap().unwrap().0, first, "{mode}");
        let mut flags = ctx.from_slice(&[true, false], &[2]).unwrap();
        assert!(flags.exclusive_host().unwrap().is_none(), "{mode}");
    }
}
