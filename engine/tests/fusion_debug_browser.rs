//! The fusion-debug HTML view in a real browser: headless Chromium (Debian's
//! `chromium`, installed by `.ci/setup_chromium`) loads the page from a file
//! with the network off; its script must run without error and find one
//! cluster per kernel, and a screenshot must show a drawing, not a blank page.

mod fusion_debug_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use deferfuse::dump::FlushDump;
use fusion_debug_common::*;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Runs headless Chromium on `page` with `extra` flags and a fresh profile,
/// killing it after a minute; returns its standard output.
fn chromium(page: &Path, extra: &[&str], profile: &Path) -> String {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run `bash .ci/setup_chromium` (the test command `bash .ci/test` does)"
    );
    let mut child = Command::new(CHROMIUM)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of attribute `name` in the `<body ...>` tag of `dom`.
fn body_attribute(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<body")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!("{name}=\"");
    let at = tag.find(&key)? + key.len();
    Some(tag[at..at + tag[at..].find('"')?].to_string())
}

fn html_of(dump: &Path, dir: &Path) -> PathBuf {
    let page = dir.join("flush.html");
    let out =
        cli(&["show", dump.to_str().unwrap(), "--format", "html", "-o", page.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    page
}

#[test]
fn the_html_view_loads_in_chromium_with_one_cluster_per_kernel() {
    let dir = TempDir::new("browser");
    let dump_path = run_workload(dir.path(), "transformer_block", 2);
    let kernels = FlushDump::load(&dump_path).unwrap().program.kernels.len();
    let page = html_of(&dump_path, dir.path());

    let html = std::fs::read_to_string(&page).unwrap();
    for remote in ["http://", "https://", "<link", "src=\""] {
        let found = html.replace("http://www.w3.org/2000/svg", "");
        assert!(!found.contains(remote), "the page must be self-contained, found {remote:?}");
    }

    let dom = chromium(
        &page,
        &["--dump-dom", "--virtual-time-budget=2000"],
        &dir.path().join("profile-dom"),
    );
    assert_eq!(body_attribute(&dom, "data-script-error"), None, "the page's script threw");
    assert_eq!(
        body_attribute(&dom, "data-ready").as_deref(),
        Some("1"),
        "the page's script did not run: {}",
        &dom[..dom.len().min(400)]
    );
    assert_eq!(body_attribute(&dom, "data-clusters"), Some(kernels.to_string()));
    assert_eq!(dom.matches(r#"<g class="cluster""#).count(), kernels);
    assert_eq!(
        dom.matches(r#"<li data-kernel=""#).count(),
        kernels,
        "the side panel lists every kernel"
    );
    assert!(dom.contains("id=\"rules\""), "the side panel lists the rules fired");

    let shot = dir.path().join("flush.png");
    let screenshot = format!("--screenshot={}", shot.display());
    chromium(
        &page,
        &[&screenshot, "--window-size=1400,900", "--hide-scrollbars"],
        &dir.path().join("profile-shot"),
    );
    let (width, height, distinct, spread) = image_stats(&shot);
    assert_eq!((width, height), (1400, 900));
    // A blank page is one colour; the drawing has white, cluster tints, red
    // edges and text.
    assert!(distinct > 50, "only {distinct} distinct colours: a blank screenshot?");
    assert!(spread > 200.0, "luminance variance {spread}: a blank screenshot?");
}

/// Width, height, distinct RGB colours and the variance of luminance of a PNG.
fn image_stats(path: &Path) -> (u32, u32, usize, f64) {
    let decoder = png::Decoder::new(std::fs::File::open(path).expect("the screenshot was written"));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(channels).collect();
    let mut colours: Vec<[u8; 3]> =
        pixels.iter().map(|p| [p[0], p[1 % channels], p[2 % channels]]).collect();
    let lum: Vec<f64> = colours
        .iter()
        .map(|c| 0.299 * c[0] as f64 + 0.587 * c[1] as f64 + 0.114 * c[2] as f64)
        .collect();
    let mean = lum.iter().sum::<f64>() / lum.len() as f64;
    let variance = lum.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / lum.len() as f64;
    colours.sort_unstable();
    colours.dedup();
    (info.width, info.height, colours.len(), variance)
}
