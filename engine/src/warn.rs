//! Warnings about the user's setup (a cache directory refused, a dump
//! directory that cannot be written), said once per process and subject.
//!
//! They go through `tracing` when the program has installed a subscriber,
//! and to standard error otherwise: without a subscriber `tracing::warn!`
//! prints nothing, and a cache that silently turns itself off, or dumps
//! that are silently not written, are exactly what the user must hear about.

use std::collections::HashSet;
use std::io::Write;
use std::sync::Mutex;

static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Says `message()` unless a warning about `subject` was said before in
/// this process. Returns whether it was said now.
pub(crate) fn warn_once(subject: &str, message: impl FnOnce() -> String) -> bool {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.get_or_insert_with(HashSet::new).insert(subject.to_string()) {
        return false;
    }
    drop(said);
    let message = message();
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{message}");
    } else {
        // A closed standard error must not turn a warning into a panic.
        let _ = writeln!(std::io::stderr(), "deferfuse: warning: {message}");
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_subject_is_warned_about_once() {
        assert!(super::warn_once("test subject a", || "first".into()));
        assert!(!super::warn_once("test subject a", || "second".into()));
        assert!(super::warn_once("test subject b", || "other".into()));
    }
}
