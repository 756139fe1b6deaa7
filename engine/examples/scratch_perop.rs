use deferfuse::{Config, Context, DType, Mode};
use std::time::Instant;
fn main() {
    let mut config = Config::from_env().unwrap();
    config.mode = Mode::DeferAndFuse;
    config.cache_dir = None;
    let ctx = Context::new(config).unwrap();
    let a = ctx.ones(&[8], DType::F32).unwrap();
    let t0 = Instant::now();
    for _ in 0..2000 {
        let mut y = ctx.ones(&[8], DType::F32).unwrap();
        for _ in 0..3000 {
            y = y.mul(&a).unwrap();
        }
        ctx.sync().unwrap();
    }
    println!("{:.3} us/op", t0.elapsed().as_secs_f64() / 6e6 * 1e6);
}
