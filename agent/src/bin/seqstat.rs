//! `seqstat`: prints the counters of running seqstream daemons, once or every interval.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use seqstream_agent::counters;

#[derive(Parser)]
#[command(
    name = "seqstat",
    version,
    about = "Print the counters of running seqstream daemons (their .counters files)"
)]
struct Cli {
    /// Counters files, or directories to search for `*.counters` (default: /dev/shm).
    paths: Vec<PathBuf>,
    /// Print again every this many milliseconds until interrupted (without it: once).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    every_ms: Option<u64>,
    /// One JSON object per file per line instead of text.
    #[arg(long)]
    json: bool,
}

fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let default = [PathBuf::from("/dev/shm")];
    let paths = if paths.is_empty() {
        &default[..]
    } else {
        paths
    };
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "counters"))
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn main() -> Result<()> {
    // Die quietly on a closed pipe (`seqstat | head`), as command-line tools do.
    // SAFETY: setting a signal disposition at start-up, before any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    loop {
        for f in files(&cli.paths)? {
            let snap = match counters::read(&f) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("seqstat: {e}");
                    continue;
                }
            };
            let running = alive(snap.pid);
            if cli.json {
                let map: serde_json::Map<String, serde_json::Value> = snap
                    .counters
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).into()))
                    .collect();
                let kinds: serde_json::Map<String, serde_json::Value> = snap
                    .counters
                    .iter()
                    .zip(&snap.kinds)
                    .map(|((k, _), kind)| (k.clone(), kind.to_string().into()))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "file": snap.path, "pid": snap.pid, "running": running, "counters": map,
                        "kinds": kinds
                    })
                );
            } else {
                println!(
                    "{} (pid {}{})",
                    snap.path.display(),
                    snap.pid,
                    if running { "" } else { ", not running" }
                );
                for ((label, value), kind) in snap.counters.iter().zip(&snap.kinds) {
                    println!("  {label:<48} {value:>20}  {kind}");
                }
            }
        }
        let Some(every_ms) = cli.every_ms else {
            return Ok(());
        };
        std::thread::sleep(Duration::from_millis(every_ms));
    }
}
