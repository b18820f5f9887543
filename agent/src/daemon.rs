//! Plumbing every seqstream daemon shares (feature `daemon`): options from a TOML file,
//! shutdown on SIGINT/SIGTERM, logging (and rate-limited refusal lines), where counters live,
//! and the [`Role`] contract by which `seqstreamd` and the one-role daemons (`sequencer`,
//! `replicator`, …) build a role from the same options: one way to configure a role.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::ratelimit::{monotonic_ns, LogLimit};

/// A role's options (a `clap` parser: the one-role daemon's flags, and the keys of its table in
/// a `seqstreamd` file), and how to build its agents from them.
pub trait Role: clap::Args {
    /// The kind, as `seqstreamd`'s file names its tables (`sequencer`, `serve`, …).
    const KIND: &'static str;
    /// Options that place the role's threads (core, idle strategy, error policy): allowed in
    /// its `seqstreamd` table only under dedicated threading, where the role has threads of
    /// its own; a shared thread or a `[[thread]]` group is placed by its own settings.
    const PLACEMENT_KEYS: &'static [&'static str];

    /// Opens what the role needs (stores, sockets) and returns its agents, each with the
    /// thread it has under dedicated threading.
    fn build(&self, ctx: RoleContext) -> Result<Vec<crate::host::Hosted>>;
}

/// What a host gives a role it builds.
#[derive(Debug, Clone)]
pub struct RoleContext {
    /// Where the role's counters go: the process's file, scoped to the role's name in
    /// `seqstreamd` (`"md-seq "`), unscoped in a one-role daemon.
    pub counters: crate::counters::CountersWriter,
    /// Where the agents the role hands out while it runs go (a replication server's
    /// senders): a composite's sink, or `None` for runners of their own.
    pub sender_host: Option<crate::agent::AgentSink>,
}

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
/// Where a role's one thread runs under dedicated threading: the flags (and `seqstreamd`
/// table keys) `idle`, `on_error` and `core` of the roles that have one thread.
#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us.
    #[arg(long, default_value = "backoff")]
    pub idle: crate::Idle,
    /// What an error of the role does: `stop` (the daemon exits with it) or `restart:<N>ms`
    /// (counted, logged, and the role started again after N ms).
    #[arg(long, default_value = "stop")]
    pub on_error: crate::OnError,
    /// Core to pin the role's thread to.
    #[arg(long)]
    pub core: Option<usize>,
}

impl PlacementArgs {
    /// Its keys, for [`Role::PLACEMENT_KEYS`].
    pub const KEYS: &'static [&'static str] = &["idle", "on_error", "core"];

    /// As the runtime's placement.
    pub fn placement(&self) -> crate::host::Placement {
        crate::host::Placement {
            core: self.core,
            idle: self.idle.clone(),
            on_error: self.on_error,
        }
    }
}

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
/// Options of every one-role daemon beyond its role's.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// TOML file of options (keys = long flag names); command-line flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Counters file for seqstat (default /dev/shm/seqstream-<daemon>-<pid>.counters, removed
    /// at a clean exit).
    #[arg(long)]
    pub counters: Option<PathBuf>,
}

/// Runs `role` as daemon `name`, alone in its process, each of its agents on a thread of its
/// own (dedicated threading), until SIGINT/SIGTERM (`stop`) or an error under
/// `--on-error stop`.
pub fn run_one<R: Role>(
    name: &str,
    role: &R,
    daemon: &DaemonArgs,
    capacity: usize,
    stop: &Arc<AtomicBool>,
) -> Result<()> {
    run_dedicated(name, daemon, capacity, stop, |counters| {
        let agents = role.build(RoleContext {
            counters: counters.clone(),
            sender_host: None,
        })?;
        Ok(vec![(R::KIND.to_string(), agents)])
    })
}

/// Runs the roles `build` opens (named, with their agents; their counters in daemon `name`'s
/// file, of `capacity` slots) as daemon `name`, every agent on a thread of its own, until
/// SIGINT/SIGTERM (`stop`) or an error under `--on-error stop`.
pub fn run_dedicated(
    name: &str,
    daemon: &DaemonArgs,
    capacity: usize,
    stop: &Arc<AtomicBool>,
    build: impl FnOnce(
        &crate::counters::CountersWriter,
    ) -> Result<Vec<(String, Vec<crate::host::Hosted>)>>,
) -> Result<()> {
    let (counters, _cleanup) = counters(name, daemon.counters.clone(), capacity)?;
    let roles = build(&counters)?;
    let names: Vec<String> = roles.iter().map(|(r, _)| r.clone()).collect();
    let mut layout = crate::host::Layout::new(crate::host::Threading::Dedicated, &names)?;
    for (role, agents) in roles {
        layout.place(&role, agents);
    }
    tracing::info!(counters = %counters.path().display(), "started");
    let started = layout.start(Some(&counters), stop)?;
    crate::host::join_all(started.runners)?;
    tracing::info!("stopped");
    Ok(())
}

/// `table`'s keys as flags, the way [`args_with_config`] turns a config file into flags.
pub fn table_to_flags(table: &toml::Table) -> Result<Vec<String>> {
    let mut flags = Vec::new();
    for (key, value) in table {
        push_flag(&mut flags, &format!("--{}", key.replace('_', "-")), value)?;
    }
    Ok(flags)
}

/// Pushes `flag` for `value`: `--flag=value` (so a value that starts with `-` is a value,
/// never another flag), once per item of an array, bare for `true`, nothing for `false`.
fn push_flag(out: &mut Vec<String>, flag: &str, value: &toml::Value) -> Result<()> {
    match value {
        toml::Value::Boolean(true) => out.push(flag.to_string()),
        toml::Value::Boolean(false) => {}
        toml::Value::Array(items) => {
            for item in items {
                out.push(format!("{flag}={}", plain(item)?));
            }
        }
        other => out.push(format!("{flag}={}", plain(other)?)),
    }
    Ok(())
}

/// The process's arguments with the keys of the TOML file named by `--config FILE` inserted
/// as flags (`stream_id = 7` → `--stream-id 7`; an array → the flag once per item, so
/// `route = ["a", "b"]` → `--route a --route b`; `true` → a bare flag) before the other
/// arguments, for a `clap` parser. `--config=FILE` works too. Flags given on the command
/// line (`--flag v` or `--flag=v`) win: a key whose flag is present is skipped.
pub fn args_with_config() -> Result<Vec<String>> {
    merge_config(std::env::args().collect())
}

/// [`args_with_config`] on `args`.
fn merge_config(args: Vec<String>) -> Result<Vec<String>> {
    let Some(at) = args
        .iter()
        .position(|a| a == "--config" || a.starts_with("--config="))
    else {
        return Ok(args);
    };
    // `--config FILE` or `--config=FILE`.
    let (path, taken) = match args[at].strip_prefix("--config=") {
        Some(p) => (p, 1),
        None => (
            args.get(at + 1).context("--config needs a file")?.as_str(),
            2,
        ),
    };
    let text = read_config(Path::new(path))?;
    let table: toml::Table = text.parse().with_context(|| format!("parsing {path}"))?;
    let mut from_file = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        let given = |a: &String| *a == flag || a.starts_with(&format!("{flag}="));
        if args.iter().any(given) {
            continue;
        }
        push_flag(&mut from_file, &flag, &value)?;
    }
    let mut out = args[..at].to_vec();
    out.extend(from_file);
    out.extend_from_slice(&args[at + taken..]);
    Ok(out)
}

fn plain(v: &toml::Value) -> Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!("unsupported config value {other}"),
    })
}

/// The longest config file read: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of a config file: a regular file of at most [`MAX_CONFIG_BYTES`] (a device such
/// as `/dev/zero` would be read forever).
pub fn read_config(path: &Path) -> Result<String> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{}: a config file must be a regular file", path.display());
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        bail!(
            "{}: a config file of more than {MAX_CONFIG_BYTES} bytes",
            path.display()
        );
    }
    Ok(text)
}

/// A flag set by SIGINT or SIGTERM. Call it first in `main`: until a handler is installed a
/// signal takes its inherited action, and a process started in the background by a shell
/// inherits SIGINT *ignored*, so a SIGINT sent right after its start was lost.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// WARN lines of one cause of refusal, rate-limited by a [`LogLimit`] on the monotonic clock
/// ([`monotonic_ns`]): the first lines of an interval are logged, the rest counted and
/// reported in one line ("`cause`: N more suppressed") once the interval has ended. Keep the
/// exact number in a counter; call [`tick`](Self::tick) in the agent's housekeeping
/// ([`HOUSEKEEPING_EVERY_NS`](crate::HOUSEKEEPING_EVERY_NS)) so the summary is not held back
/// until the next occurrence.
#[derive(Debug)]
pub struct LimitedWarn {
    cause: &'static str,
    limit: LogLimit,
}

impl LimitedWarn {
    /// The default limit ([`LogLimit::default`]) for `cause`, a short name of the refusal.
    pub fn new(cause: &'static str) -> Self {
        LimitedWarn {
            cause,
            limit: LogLimit::default(),
        }
    }

    /// One refusal: logs `line` (prefixed with the cause) unless the limit is reached.
    pub fn warn(&mut self, line: std::fmt::Arguments<'_>) {
        let d = self.limit.occur(monotonic_ns());
        if let Some(n) = d.summary {
            self.summary(n);
        }
        if d.log {
            tracing::warn!("{}: {line}", self.cause);
        }
    }

    /// Logs the summary of an interval that has ended, if one is owed.
    pub fn tick(&mut self) {
        if self.limit.owes_summary() {
            if let Some(n) = self.limit.tick(monotonic_ns()) {
                self.summary(n);
            }
        }
    }

    fn summary(&self, n: u64) {
        tracing::warn!("{}: {n} more suppressed", self.cause);
    }
}

/// The counters file of daemon `name`: `explicit`, or
/// `/dev/shm/seqstream-<name>-<pid>.counters`. The flag says whether it is the default one
/// (which the daemon removes at a clean exit).
pub fn counters_path(name: &str, explicit: Option<PathBuf>) -> (PathBuf, bool) {
    match explicit {
        Some(p) => (p, false),
        None => (
            PathBuf::from(format!(
                "/dev/shm/seqstream-{name}-{}.counters",
                std::process::id()
            )),
            true,
        ),
    }
}

/// Creates daemon `name`'s counters file (see [`counters_path`]) with room for `capacity`
/// counters, and the guard that removes a default one at exit.
pub fn counters(
    name: &str,
    explicit: Option<PathBuf>,
    capacity: usize,
) -> Result<(crate::counters::CountersWriter, RemoveOnExit)> {
    let (path, temporary) = counters_path(name, explicit);
    let w = crate::counters::CountersWriter::create(&path, capacity)
        .with_context(|| format!("creating {}", path.display()))?;
    Ok((w, RemoveOnExit(temporary.then_some(path))))
}

/// Removes a file (a default counters file) when dropped: at the end of `main`, on success,
/// on error and on a panic that unwinds.
#[derive(Debug)]
pub struct RemoveOnExit(pub Option<PathBuf>);

impl Drop for RemoveOnExit {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn config_keys_become_flags_arrays_repeat_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.toml");
        std::fs::write(
            &file,
            "stream_id = 7\nfollow = [\"1=a=b\", \"2=c=d\"]\nidle = \"yield\"\nverbose = true\nepoch = -1\n",
        )
        .unwrap();
        let f = file.display().to_string();
        let merged = merge_config(args(&["d", "--config", &f, "--idle", "spin"])).unwrap();
        assert_eq!(
            merged,
            args(&[
                "d",
                "--epoch=-1",
                "--follow=1=a=b",
                "--follow=2=c=d",
                "--stream-id=7",
                "--verbose",
                "--idle",
                "spin"
            ])
        );
        let eq = merge_config(args(&["d", &format!("--config={f}"), "--idle=spin"])).unwrap();
        assert!(eq.contains(&"--stream-id=7".to_string()));
        assert!(
            !eq.contains(&"--idle=yield".to_string()),
            "--idle=spin overrides the file"
        );
        assert_eq!(
            merge_config(args(&["d", "--x"])).unwrap(),
            args(&["d", "--x"])
        );
        assert!(merge_config(args(&["d", "--config"])).is_err());
    }

    #[test]
    fn a_config_that_is_no_regular_file_or_too_large_is_refused() {
        let e = merge_config(args(&["d", "--config", "/dev/zero"])).unwrap_err();
        assert!(e.to_string().contains("regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        let e = merge_config(args(&["d", "--config", big.to_str().unwrap()])).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }
}
