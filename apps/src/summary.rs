//! How an application reports at exit: one JSON object on stdout, and the same line in a
//! file when asked (the demo reads it from there).

use std::path::Path;

/// Prints `summary` as one line on stdout and, when `path` is given, writes that line there.
///
/// Errors: the file could not be written.
pub fn emit(summary: &serde_json::Value, path: Option<&Path>) -> std::io::Result<()> {
    println!("{summary}");
    match path {
        Some(p) => std::fs::write(p, format!("{summary}\n")),
        None => Ok(()),
    }
}
