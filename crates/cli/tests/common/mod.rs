//! Helpers shared by the command-line tests.

use std::process::Command;

/// Runs the `parcache` binary; returns success, stdout and stderr.
pub fn parcache(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(args)
        .env("PARCACHE_LOG", "warn")
        .output()
        .expect("the parcache binary runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}
