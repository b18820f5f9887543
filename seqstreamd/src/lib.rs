//! # seqstreamd
//!
//! The host daemon: one process and one TOML file per host, running any set of roles on
//! threads as the file says (Aeron's media driver is the model). This library reads the file
//! ([`HostFile::parse`]) into the roles' options and a [`Threading`], and starts them
//! ([`Host::start`]); the `seqstreamd` binary is a thin `main` around it.
//!
//! An application can also embed its host: with `threading = "invoker"` the host starts no
//! runner thread, and the application runs every role's duty cycle from its own loop
//! ([`Host::invoker`]; Aeron's `INVOKER` threading mode). The daemon refuses that threading:
//! it has no loop of its own to lend.
//!
//! A role's table takes the same keys as its one-role daemon's flags (`stream_id = 1` is
//! `--stream-id 1`), parsed by the same parser ([`seqstream_agent::daemon::Role`]), so a role
//! is configured one way wherever it runs:
//!
//! | table | role | one-role daemon |
//! |---|---|---|
//! | `[[sequencer]]` | [`SequencerArgs`] | `sequencer` |
//! | `[[compositor]]` | [`CompositorArgs`] | `compositor` |
//! | `[[serve]]` | [`ServeArgs`] | `replicator serve` |
//! | `[[follow]]` | [`FollowArgs`] | `replicator follow` |
//! | `[[forward]]` | [`ForwardArgs`] | `iodaemon` (its forwarding flags) |
//! | `[[sequencer_group]]` | [`GroupArgs`] | none: a member of a sequencer group ([`group`]) |
//!
//! `docs/seqstreamd.md` explains the file with a full example.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::clock::Clock;
use seqstream_agent::counters::CountersWriter;
use seqstream_agent::daemon::{table_to_flags, Role, RoleContext};
use seqstream_agent::host::{Layout, Placement, ThreadGroup, Threading, SENDERS_SUFFIX};
use seqstream_agent::{AgentInvoker, AgentRunner, CompositeAgent, Idle, OnError};
use seqstream_iodaemon::cli::{check_routes, ForwardArgs};
use seqstream_replication::cli::{FollowArgs, ServeArgs};
use seqstream_sequencer::cli::{CompositorArgs, SequencerArgs};
use seqstream_sequencer::sequencer::check_fenced_segment_size;
use serde::Deserialize;

pub mod group;

pub use group::GroupArgs;

/// Longest role or thread name, so that counter labels (`<name> <label>`, at most 55 bytes)
/// keep their meaning.
pub const MAX_NAME: usize = 20;

/// Counter slots of a `seqstreamd` file: every role's counters, its servers' consumer slots
/// (5 each) and each thread's runner counters.
pub const COUNTERS: usize = 4096;

/// The file as written: top-level keys, thread tables and role tables (kept as TOML tables
/// until each is parsed by its role's parser).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    threading: Option<String>,
    counters: Option<PathBuf>,
    shared: Option<RawThread>,
    #[serde(default)]
    thread: Vec<RawThread>,
    #[serde(default)]
    sequencer: Vec<toml::Table>,
    #[serde(default)]
    compositor: Vec<toml::Table>,
    #[serde(default)]
    serve: Vec<toml::Table>,
    #[serde(default)]
    follow: Vec<toml::Table>,
    #[serde(default)]
    forward: Vec<toml::Table>,
    #[serde(default)]
    sequencer_group: Vec<toml::Table>,
}

/// A `[shared]` or `[[thread]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawThread {
    name: Option<String>,
    core: Option<usize>,
    idle: Option<String>,
    on_error: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
}

/// One role of the host, parsed.
#[derive(Debug, Clone)]
pub enum RoleSpec {
    /// A `[[sequencer]]`.
    Sequencer(SequencerArgs),
    /// A `[[compositor]]`.
    Compositor(CompositorArgs),
    /// A `[[serve]]`.
    Serve(ServeArgs),
    /// A `[[follow]]`.
    Follow(FollowArgs),
    /// A `[[forward]]`.
    Forward(ForwardArgs),
    /// A `[[sequencer_group]]`.
    Group(Box<GroupArgs>),
}

impl RoleSpec {
    /// The kind, as the file names its table (`sequencer`, `serve`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            RoleSpec::Sequencer(_) => SequencerArgs::KIND,
            RoleSpec::Compositor(_) => CompositorArgs::KIND,
            RoleSpec::Serve(_) => ServeArgs::KIND,
            RoleSpec::Follow(_) => FollowArgs::KIND,
            RoleSpec::Forward(_) => ForwardArgs::KIND,
            RoleSpec::Group(_) => GroupArgs::KIND,
        }
    }

    /// The store the role writes, and its stream: a sequencer's store, a compositor's
    /// output, a replica. `None` for a server (it only reads) and a forwarder.
    fn written(&self) -> Option<(u32, &Path)> {
        match self {
            RoleSpec::Sequencer(s) => Some((s.stream_id, &s.store)),
            RoleSpec::Compositor(c) => Some((c.stream_id, &c.output)),
            RoleSpec::Follow(f) => Some((f.common.stream_id, &f.common.store)),
            RoleSpec::Group(g) => Some((g.sequencer.stream_id, &g.sequencer.store)),
            RoleSpec::Serve(_) | RoleSpec::Forward(_) => None,
        }
    }

    fn build(&self, ctx: RoleContext) -> Result<Vec<seqstream_agent::host::Hosted>> {
        match self {
            RoleSpec::Sequencer(r) => r.build(ctx),
            RoleSpec::Compositor(r) => r.build(ctx),
            RoleSpec::Serve(r) => r.build(ctx),
            RoleSpec::Follow(r) => r.build(ctx),
            RoleSpec::Forward(r) => r.build(ctx),
            RoleSpec::Group(r) => r.build(ctx),
        }
    }
}

/// A host's file, parsed and checked: its roles (named; by kind — forwarders, sequencers,
/// compositors, servers, replication clients, sequencer group members — and each kind in file
/// order, which is the order a shared or invoked duty cycle visits them: a message the
/// application offered is sent before any other role's work, not after the replication
/// clients' reads and acknowledgements; a forwarder reads its confirmations and judges its
/// resend timeouts in the cycle's late half, `Agent::do_late_work`, after the clients have
/// written what confirms its messages),
/// how they are laid on threads, and where its counters go.
#[derive(Debug, Clone)]
pub struct HostFile {
    /// `(name, role)`, names unique.
    pub roles: Vec<(String, RoleSpec)>,
    /// The threading.
    pub threading: Threading,
    /// The counters file (`None`: `/dev/shm/seqstream-seqstreamd-<pid>.counters`).
    pub counters: Option<PathBuf>,
}

/// The one-role parser of role `R`: the table's keys as `R`'s flags.
#[derive(Parser)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct One<R: clap::Args> {
    #[command(flatten)]
    role: R,
}

/// The kind of threading the file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dedicated,
    Shared,
    Groups,
    Invoker,
}

fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        bail!("{what} name {name:?}: use 1 to {MAX_NAME} letters, digits, '-' or '_'");
    }
    Ok(())
}

fn placement(t: &RawThread, what: &str) -> Result<Placement> {
    let idle = match &t.idle {
        Some(s) => s
            .parse::<Idle>()
            .map_err(|e| anyhow::anyhow!("{what}: idle {s:?}: {e}"))?,
        None => Idle::backoff(),
    };
    let on_error = match &t.on_error {
        Some(s) => s
            .parse::<OnError>()
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?,
        None => OnError::Stop,
    };
    Ok(Placement {
        core: t.core,
        idle,
        on_error,
    })
}

/// A role parser's error as one line about keys: its reason and tip, without the usage
/// (which is the flags', not the table's), each flag named as its key (`'--stream-id
/// <STREAM_ID>'` → `'stream_id'`).
fn clap_reason(e: &clap::Error) -> String {
    e.render()
        .to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"))
        .map(|l| as_keys(l.trim_start_matches("error: ")))
        .fold(String::new(), |mut out, l| {
            if !out.is_empty() {
                // A list after a colon continues its line; a tip is a clause of its own.
                out.push_str(if out.ends_with(':') { " " } else { "; " });
            }
            out.push_str(&l);
            out
        })
}

/// Rewrites the flags clap names in `line` as table keys: a word `--stream-id` (quoted or
/// not) becomes `stream_id`, a `<VALUE>` placeholder after it goes, and the argument a tip
/// or an "unexpected argument" names (`'stream-id'`) is spelt as a key too.
fn as_keys(line: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut names_argument = false;
    for word in line.split(' ') {
        let quoted = word.strip_prefix('\'');
        let bare = quoted.unwrap_or(word);
        if bare.starts_with('<') {
            // A placeholder: keep only what closes the quote or the clause.
            let tail: String = bare.chars().skip_while(|&c| c != '>').skip(1).collect();
            if let Some(last) = words.last_mut() {
                last.push_str(&tail);
            }
            continue;
        }
        let is_flag = bare.starts_with("--") || (quoted.is_some() && names_argument);
        names_argument = word == "argument" || word == "exists:";
        if is_flag {
            let flag = bare.trim_start_matches("--");
            let end = flag
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(flag.len());
            let key = flag[..end].replace('-', "_");
            words.push(format!(
                "{}{key}{}",
                if quoted.is_some() { "'" } else { "" },
                &flag[end..]
            ));
        } else {
            words.push(word.to_string());
        }
    }
    words.join(" ")
}

impl HostFile {
    /// Reads and parses the file at `path` (a regular file of at most 1 MiB).
    pub fn read(path: &Path) -> Result<HostFile> {
        let text = seqstream_agent::daemon::read_config(path)?;
        HostFile::parse(&text).with_context(|| format!("{}", path.display()))
    }

    /// Parses a host file's text. Errors name the table and key at fault: an unknown key, a
    /// value its role's parser refuses, a placement key (`core`, `idle`, …) in a role whose
    /// thread is not its own, a role in no `[[thread]]` or in two.
    pub fn parse(text: &str) -> Result<HostFile> {
        let raw: RawFile = toml::from_str(text)?;
        let kind = match raw.threading.as_deref().unwrap_or("dedicated") {
            "dedicated" => Kind::Dedicated,
            "shared" => Kind::Shared,
            "groups" => Kind::Groups,
            "invoker" => Kind::Invoker,
            other => bail!("threading {other:?}: use dedicated, shared, groups or invoker"),
        };
        if kind == Kind::Invoker && !raw.sequencer_group.is_empty() {
            // Its election campaigns and keeps its lease on a thread of its own: a member
            // whose application stopped invoking would lead, holding the stream, doing nothing.
            bail!("[[sequencer_group]] under threading = \"invoker\": a group member runs on the host's own threads (its election would keep it leading while the application does not invoke it); use shared, dedicated or groups");
        }
        if kind != Kind::Shared && raw.shared.is_some() {
            bail!("a [shared] table needs threading = \"shared\"");
        }
        if kind != Kind::Groups && !raw.thread.is_empty() {
            bail!("[[thread]] tables need threading = \"groups\"");
        }
        // The roles whose handed agents (senders) a thread group hosts.
        let grouped_senders: Vec<String> = raw
            .thread
            .iter()
            .flat_map(|t| t.roles.iter())
            .filter_map(|r| r.strip_suffix(SENDERS_SUFFIX).map(str::to_string))
            .collect();
        let mut roles = Vec::new();
        let mut parse = |kind_name: &str,
                         tables: &[toml::Table],
                         keys: &[&str],
                         make: &dyn Fn(Vec<String>) -> Result<RoleSpec, clap::Error>|
         -> Result<()> {
            for (i, table) in tables.iter().enumerate() {
                let mut table = table.clone();
                let name = match table.remove("name") {
                    Some(toml::Value::String(n)) => n,
                    Some(other) => bail!("[[{kind_name}]] name = {other}: a string"),
                    None => format!("{kind_name}-{}", i + 1),
                };
                let what = format!("[[{kind_name}]] {name}");
                check_name(&what, &name)?;
                for key in ["config", "counters"] {
                    if table.contains_key(key) {
                        bail!("{what}: {key} is the host's (a top-level key), not a role's");
                    }
                }
                // An empty array would set nothing, so its key would never be checked.
                if let Some((key, _)) = table
                    .iter()
                    .find(|(_, v)| v.as_array().is_some_and(|a| a.is_empty()))
                {
                    bail!("{what}: {key} = []: an empty array sets nothing; remove the key");
                }
                // Under groups threading, a server whose senders no group hosts still
                // places their own runners with `cores` and `idle`.
                let own_senders = kind == Kind::Groups && !grouped_senders.contains(&name);
                if kind != Kind::Dedicated {
                    for key in keys {
                        let allowed = own_senders && (*key == "cores" || *key == "idle");
                        if table.contains_key(*key) && !allowed {
                            let instead = if kind == Kind::Invoker {
                                "under threading = \"invoker\" the application's thread runs every role"
                            } else {
                                "set it on its [shared] or [[thread]] table"
                            };
                            bail!(
                                "{what}: {key} places a thread of the role's own, which it has only under threading = \"dedicated\"; {instead}"
                            );
                        }
                    }
                }
                let flags = table_to_flags(&table).with_context(|| what.clone())?;
                let spec =
                    make(flags).map_err(|e| anyhow::anyhow!("{what}: {}", clap_reason(&e)))?;
                roles.push((name, spec));
            }
            Ok(())
        };
        // Forwarders first: see `HostFile`.
        parse(
            ForwardArgs::KIND,
            &raw.forward,
            ForwardArgs::PLACEMENT_KEYS,
            &|f| One::<ForwardArgs>::try_parse_from(f).map(|o| RoleSpec::Forward(o.role)),
        )?;
        parse(
            SequencerArgs::KIND,
            &raw.sequencer,
            SequencerArgs::PLACEMENT_KEYS,
            &|f| One::<SequencerArgs>::try_parse_from(f).map(|o| RoleSpec::Sequencer(o.role)),
        )?;
        parse(
            CompositorArgs::KIND,
            &raw.compositor,
            CompositorArgs::PLACEMENT_KEYS,
            &|f| One::<CompositorArgs>::try_parse_from(f).map(|o| RoleSpec::Compositor(o.role)),
        )?;
        parse(
            ServeArgs::KIND,
            &raw.serve,
            ServeArgs::PLACEMENT_KEYS,
            &|f| One::<ServeArgs>::try_parse_from(f).map(|o| RoleSpec::Serve(o.role)),
        )?;
        parse(
            FollowArgs::KIND,
            &raw.follow,
            FollowArgs::PLACEMENT_KEYS,
            &|f| One::<FollowArgs>::try_parse_from(f).map(|o| RoleSpec::Follow(o.role)),
        )?;
        parse(
            GroupArgs::KIND,
            &raw.sequencer_group,
            GroupArgs::PLACEMENT_KEYS,
            &|f| One::<GroupArgs>::try_parse_from(f).map(|o| RoleSpec::Group(Box::new(o.role))),
        )?;
        if roles.is_empty() {
            bail!("no role: add a [[sequencer]], [[compositor]], [[serve]], [[follow]], [[forward]] or [[sequencer_group]] table");
        }
        for role in &grouped_senders {
            if let Some((_, spec)) = roles.iter().find(|(n, _)| n == role) {
                if !matches!(spec, RoleSpec::Serve(_) | RoleSpec::Group(_)) {
                    bail!(
                        "[[thread]] roles: {role}{SENDERS_SUFFIX}: {role} is a [[{}]], not a [[serve]]: it has no senders",
                        spec.kind()
                    );
                }
            }
        }
        let threading = match kind {
            Kind::Dedicated => Threading::Dedicated,
            Kind::Shared => {
                let t = raw.shared.unwrap_or(RawThread {
                    name: None,
                    core: None,
                    idle: None,
                    on_error: None,
                    roles: Vec::new(),
                });
                if !t.roles.is_empty() {
                    bail!("[shared] runs every role: it takes no roles key");
                }
                let name = t.name.clone().unwrap_or_else(|| "shared".into());
                check_name("[shared]", &name)?;
                Threading::Shared(ThreadGroup {
                    placement: placement(&t, "[shared]")?,
                    name,
                    roles: Vec::new(),
                })
            }
            Kind::Groups => {
                let mut groups = Vec::new();
                for (i, t) in raw.thread.iter().enumerate() {
                    let name = t
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("thread-{}", i + 1));
                    let what = format!("[[thread]] {name}");
                    check_name(&what, &name)?;
                    groups.push(ThreadGroup {
                        placement: placement(t, &what)?,
                        name,
                        roles: t.roles.clone(),
                    });
                }
                Threading::Groups(groups)
            }
            Kind::Invoker => Threading::Invoker,
        };
        let file = HostFile {
            roles,
            threading,
            counters: raw.counters,
        };
        // A layout that does not fit the roles fails here, before anything is opened.
        Layout::new(file.threading.clone(), &file.names())?;
        file.check_stores()?;
        file.check_routes()?;
        Ok(file)
    }

    /// The roles' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.roles.iter().map(|(n, _)| n.clone()).collect()
    }

    /// What the roles do to each other's files and ports: one writer per store (a sequencer's
    /// store, a compositor's output, a replica), a compositor that does not merge its own
    /// output, a server that names the stream its store's writer writes, one sequencer per
    /// listen address, one forwarder per outbox.
    fn check_stores(&self) -> Result<()> {
        let mut writers: Vec<(&str, u32, &Path)> = Vec::new();
        let mut listens = Vec::new();
        let mut outboxes: Vec<(&str, &Path)> = Vec::new();
        for (name, r) in &self.roles {
            match r {
                RoleSpec::Sequencer(s) if s.listen.port() != 0 => {
                    if let Some((other, _)) = listens.iter().find(|(_, l)| *l == s.listen) {
                        bail!("{name} and {other} both listen on {}", s.listen);
                    }
                    listens.push((name.as_str(), s.listen));
                }
                RoleSpec::Group(g) => {
                    g.split_members()
                        .with_context(|| format!("[[sequencer_group]] {name}"))?;
                    check_fenced_segment_size(g.sequencer.segment_size)
                        .with_context(|| format!("[[sequencer_group]] {name}"))?;
                    let listen = g.sequencer.listen;
                    if listen.port() != 0 {
                        if let Some((other, _)) = listens.iter().find(|(_, l)| *l == listen) {
                            bail!("{name} and {other} both listen on {listen}");
                        }
                        listens.push((name.as_str(), listen));
                    }
                }
                RoleSpec::Compositor(c) if c.components.contains(&c.output) => {
                    bail!(
                        "[[compositor]] {name}: its output {} is one of its components",
                        c.output.display()
                    );
                }
                RoleSpec::Forward(f) => {
                    for o in &f.outboxes {
                        if let Some((other, _)) = outboxes.iter().find(|(_, p)| *p == o.as_path()) {
                            bail!(
                                "[[forward]] {name} and {other} both drain {}: an outbox has one consumer",
                                o.display()
                            );
                        }
                        outboxes.push((name.as_str(), o.as_path()));
                    }
                }
                _ => {}
            }
            if let Some((stream, store)) = r.written() {
                if let Some((other, _, _)) = writers.iter().find(|(_, _, p)| *p == store) {
                    bail!(
                        "{name} and {other} both write the store {}: a store has one writer",
                        store.display()
                    );
                }
                writers.push((name.as_str(), stream, store));
            }
        }
        for (name, r) in &self.roles {
            if let RoleSpec::Serve(s) = r {
                let c = &s.common;
                if let Some((writer, stream, _)) = writers
                    .iter()
                    .find(|(_, st, p)| *p == c.store.as_path() && *st != c.stream_id)
                {
                    bail!(
                        "[[serve]] {name}: stream_id {} for {}, which {writer} writes as stream {stream}",
                        c.stream_id,
                        c.store.display()
                    );
                }
            }
        }
        Ok(())
    }

    /// The forwarders' routes against the stores this host keeps (its sequencers' stores,
    /// its compositors' outputs and its replicas).
    fn check_routes(&self) -> Result<()> {
        let kept: Vec<(u32, &Path)> = self.roles.iter().filter_map(|(_, r)| r.written()).collect();
        for (name, r) in &self.roles {
            if let RoleSpec::Forward(f) = r {
                check_routes(&f.routes, &kept).with_context(|| format!("[[forward]] {name}"))?;
            }
        }
        Ok(())
    }
}

/// A started host: its runners (or, under `threading = "invoker"`, its roles for the
/// caller's loop) and its counters file.
pub struct Host {
    runners: Vec<AgentRunner>,
    invoker: Option<AgentInvoker<CompositeAgent>>,
    counters: CountersWriter,
    threads: Vec<String>,
    _cleanup: seqstream_agent::daemon::RemoveOnExit,
}

impl Host {
    /// Opens every role of `file` (in its order; each one's counters scoped to its name),
    /// lays them on threads and starts them, all sharing `stop`. `counters` overrides the
    /// file's counters path. Under `threading = "invoker"` no runner starts and `stop` is
    /// unused: the roles run only when the caller invokes them ([`invoker`](Self::invoker)).
    pub fn start(
        file: HostFile,
        counters: Option<PathBuf>,
        stop: &Arc<AtomicBool>,
    ) -> Result<Host> {
        let (writer, cleanup) = seqstream_agent::daemon::counters(
            "seqstreamd",
            counters.or_else(|| file.counters.clone()),
            COUNTERS,
        )?;
        let mut layout = Layout::new(file.threading.clone(), &file.names())?;
        layout.scope_runner_counters();
        for (name, role) in &file.roles {
            let ctx = RoleContext {
                counters: writer.scoped(&format!("{name} ")),
                // Only a server hands out agents (its senders).
                sender_host: match role {
                    RoleSpec::Serve(_) | RoleSpec::Group(_) => layout.handed_agents_host(name),
                    _ => None,
                },
            };
            let agents = role
                .build(ctx)
                .with_context(|| format!("starting {name}"))?;
            layout.place(name, agents);
        }
        let threads = layout.describe();
        tracing::info!(threading = layout.threading(), roles = file.roles.len(), threads = threads.len(), counters = %writer.path().display(), "seqstreamd starting");
        for t in &threads {
            tracing::info!("thread {t}");
        }
        let started = layout.start(Some(&writer), stop)?;
        Ok(Host {
            runners: started.runners,
            invoker: started
                .invoked
                .map(|agent| AgentInvoker::new(agent, Clock::system())),
            counters: writer,
            threads,
            _cleanup: cleanup,
        })
    }

    /// The counters file.
    pub fn counters_path(&self) -> &Path {
        self.counters.path()
    }

    /// One line per runner thread: its name, placement and agents.
    pub fn threads(&self) -> &[String] {
        &self.threads
    }

    /// Under `threading = "invoker"`, every role of the host as one agent for the caller's
    /// loop: each [`invoke`](AgentInvoker::invoke) is one duty cycle of every role (and of
    /// every replica's sender a server has handed out), in the order of
    /// [`HostFile::roles`]; the first starts them. Call it from one thread, as often as the latency you want needs (a role that
    /// is not invoked does nothing: a replication client that is not invoked for its
    /// server's `peer_timeout_ms` is dropped by it). An error is the role's, as a runner
    /// under `on_error = "stop"` would end with; the caller decides whether to go on.
    /// `None` under the other threadings, whose runners do the work.
    pub fn invoker(&mut self) -> Option<&mut AgentInvoker<CompositeAgent>> {
        self.invoker.as_mut()
    }

    /// Waits until every runner has ended (on `stop`, or after an error under
    /// `on_error = "stop"`, which stops them all); the first error. Under invoker threading,
    /// closes the roles instead (the first close error).
    pub fn join(mut self) -> Result<()> {
        if let Some(mut invoker) = self.invoker.take() {
            invoker
                .close()
                .map_err(|e| anyhow::anyhow!("closing the roles of invoker threading: {e}"))?;
        }
        seqstream_agent::host::join_all(self.runners)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEQ: &str = r#"
[[sequencer]]
name = "md"
store = "/tmp/x/md"
stream_id = 1
listen = "127.0.0.1:0"
source = ["1@127.0.0.1"]
"#;

    fn err(text: &str) -> String {
        format!("{:#}", HostFile::parse(text).unwrap_err())
    }

    #[test]
    fn a_file_parses_into_named_roles_and_its_threading() {
        let f = HostFile::parse(&format!("threading = \"shared\"\n[shared]\nidle = \"busy-spin\"\ncore = 0\n{SEQ}\n[[serve]]\nstore = \"/tmp/x/md\"\nstream_id = 1\nsecret_file = \"/s\"\nlisten = \"127.0.0.1:0\"\nallow = [\"127.0.0.1\"]\n")).unwrap();
        assert_eq!(f.names(), ["md", "serve-1"]);
        let Threading::Shared(g) = &f.threading else {
            panic!("{:?}", f.threading)
        };
        assert_eq!((g.name.as_str(), g.placement.core), ("shared", Some(0)));
        let RoleSpec::Sequencer(s) = &f.roles[0].1 else {
            panic!()
        };
        assert_eq!(s.stream_id, 1);
    }

    #[test]
    fn bad_files_are_refused_naming_the_table_and_key() {
        assert!(err(&format!("{SEQ}bogus = 1\n")).contains("bogus"));
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = 1\nstreamid = 2"));
        assert!(
            e.contains("[[sequencer]] md") && e.contains("streamid"),
            "{e}"
        );
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = \"one\""));
        assert!(
            e.contains("[[sequencer]] md") && e.contains("'stream_id'"),
            "{e}"
        );
        let e = err(&format!(
            "threading = \"shared\"\n{}",
            SEQ.replace("stream_id = 1", "stream_id = 1\ncore = 1")
        ));
        assert!(e.contains("core places a thread"), "{e}");
        let e = err(&format!(
            "threading = \"groups\"\n[[thread]]\nname = \"t\"\nroles = [\"other\"]\n{SEQ}"
        ));
        assert!(e.contains("no role of this host"), "{e}");
        let e = err(&format!(
            "threading = \"groups\"\n[[thread]]\nname = \"t\"\nroles = []\n{SEQ}"
        ));
        assert!(e.contains("in no [[thread]]"), "{e}");
        assert!(err(&format!("{SEQ}{SEQ}")).contains("two roles are named \"md\""));
        assert!(err("threading = \"fast\"\n").contains("dedicated, shared, groups or invoker"));
        let e = err(&format!(
            "threading = \"invoker\"\n{}",
            SEQ.replace("stream_id = 1", "stream_id = 1\nidle = \"yield\"")
        ));
        assert!(
            e.contains("the application's thread runs every role"),
            "{e}"
        );
        assert!(err(&format!("threading = \"invoker\"\n[shared]\n{SEQ}")).contains("[shared]"));
        assert!(err("").contains("no role"));
        let e = err(&SEQ.replace("name = \"md\"", "name = \"a b\""));
        assert!(e.contains("letters, digits"), "{e}");
        let e = err(&SEQ.replace("name = \"md\"", "name = \"md\"\ncounters = \"/c\""));
        assert!(e.contains("the host's"), "{e}");
        let e = err(&format!(
            "threading = \"groups\"\n[[thread]]\nroles = [\"md\"]\nidle = \"slow\"\n{SEQ}"
        ));
        assert!(e.contains("[[thread]] thread-1: idle"), "{e}");
    }

    #[test]
    fn parser_errors_name_keys_not_flags() {
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = \"one\""));
        assert!(e.contains("invalid value 'one' for 'stream_id':"), "{e}");
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = 1\nno_heartbeats = true"));
        assert!(
            e.contains("unexpected argument 'no_heartbeats'") && e.contains("'no_heartbeat'"),
            "{e}"
        );
        let e = err("[[sequencer]]\nname = \"x\"\nstream_id = 1\n");
        assert!(
            e.contains("store") && !e.contains("--") && !e.contains("<STORE>"),
            "{e}"
        );
        // A value that starts with a dash is a value.
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = -1"));
        assert!(e.contains("invalid value '-1' for 'stream_id'"), "{e}");
        let e = err(&SEQ.replace("stream_id = 1", "stream_id = 1\nbogus = []"));
        assert!(e.contains("bogus = []"), "{e}");
        let e = err(&format!(
            "threading = \"groups\"\n[[thread]]\nroles = [\"md\", \"md.senders\"]\n{SEQ}"
        ));
        assert!(e.contains("not a [[serve]]"), "{e}");
    }

    #[test]
    fn a_follow_table_says_when_its_client_acknowledges() {
        use seqstream_replication::follower::AckTiming;
        let follow = |ack: &str| {
            format!("[[follow]]\nname = \"rep\"\nstore = \"/tmp/x/rep\"\nstream_id = 1\nupstream = \"127.0.0.1:7000\"\nsecret_file = \"/s\"\n{ack}")
        };
        let ack = |text: &str| match &HostFile::parse(&follow(text)).unwrap().roles[0].1 {
            RoleSpec::Follow(f) => f.ack,
            other => panic!("{other:?}"),
        };
        assert_eq!(ack(""), AckTiming::Immediate);
        assert_eq!(ack("ack = \"next-cycle\"\n"), AckTiming::NextCycle);
        assert_eq!(
            ack("ack = \"delayed:200us\"\n"),
            AckTiming::Delayed(std::time::Duration::from_micros(200))
        );
        let e = err(&follow("ack = \"delayed:1s\"\n"));
        assert!(
            e.contains("[[follow]] rep") && e.contains("'ack'") && e.contains("delayed:<N>us"),
            "{e}"
        );
        let e = err(&follow("ack = \"delayed:500ms\"\n"));
        assert!(e.contains("from 1us to 100ms"), "{e}");
    }

    #[test]
    fn roles_that_clash_over_a_store_a_port_or_an_outbox_are_refused() {
        let second = SEQ.replace("name = \"md\"", "name = \"md2\"");
        let e = err(&format!(
            "{SEQ}{}",
            second.replace("127.0.0.1:0", "127.0.0.1:7001")
        ));
        assert!(e.contains("both write the store /tmp/x/md"), "{e}");
        let e = err(&format!(
            "{}{}",
            SEQ.replace("127.0.0.1:0", "127.0.0.1:7001"),
            second
                .replace("127.0.0.1:0", "127.0.0.1:7001")
                .replace("/tmp/x/md", "/tmp/x/md2")
        ));
        assert!(e.contains("both listen on 127.0.0.1:7001"), "{e}");
        let e = err(&format!(
            "{SEQ}[[serve]]\nstore = \"/tmp/x/md\"\nstream_id = 2\nsecret_file = \"/s\"\nlisten = \"127.0.0.1:0\"\nallow = [\"127.0.0.1\"]\n"
        ));
        assert!(e.contains("which md writes as stream 1"), "{e}");
        let e =
            err("[[compositor]]\ncomponent = [\"/a\", \"/c\"]\noutput = \"/c\"\nstream_id = 3\n");
        assert!(e.contains("is one of its components"), "{e}");
        let fwd = "[[forward]]\noutbox = [\"/o\"]\nroute = [\"1=127.0.0.1:9=/tmp/x/md\"]\n";
        let e = err(&format!("{SEQ}{fwd}{fwd}"));
        assert!(e.contains("both drain /o"), "{e}");
    }

    #[test]
    fn a_route_and_a_replica_of_another_stream_on_one_store_are_refused() {
        let e = err(&format!(
            "{SEQ}\n[[forward]]\noutbox = [\"/o\"]\nroute = [\"2=127.0.0.1:9=/tmp/x/md\"]\n"
        ));
        assert!(e.contains("one store holds one stream"), "{e}");
    }

    const GROUP: &str = r#"
[[sequencer_group]]
name = "md"
store = "/tmp/x/md"
stream_id = 1
listen = "10.0.0.1:7001"
source = ["1@10.0.0.9"]
node_id = 1
member = ["1=10.0.0.1:7101", "2=10.0.0.2:7101"]
etcd = ["http://10.0.0.5:2379"]
secret_file = "/s"
allow = ["10.0.0.9"]
"#;

    #[test]
    fn a_sequencer_segment_size_it_would_refuse_is_refused_at_parse() {
        let min = seqstream_sequencer::sequencer::MIN_SEGMENT_SIZE;
        for role in [SEQ, GROUP] {
            let with = |bytes: u64| format!("{role}segment_size = {bytes}\n");
            for bad in [0, 4096, min - 4096] {
                let e = err(&with(bad));
                assert!(e.contains(&format!("at least {min} bytes")), "{e}");
            }
            for bad in [min + 1, 4 << 30] {
                let e = err(&with(bad));
                assert!(e.contains(&format!("segment_size {bad}")), "{e}");
            }
            let fenced = seqstream_sequencer::sequencer::MIN_FENCED_SEGMENT_SIZE;
            let shortest = if role == GROUP { fenced } else { min };
            HostFile::parse(&with(shortest)).unwrap();
            if role == GROUP {
                let e = err(&with(fenced - 4096));
                assert!(e.contains(&format!("at least {fenced} bytes")), "{e}");
            }
        }
    }

    #[test]
    fn a_sequencer_group_member_parses_and_checks_its_members() {
        let f = HostFile::parse(GROUP).unwrap();
        let RoleSpec::Group(g) = &f.roles[0].1 else {
            panic!("{:?}", f.roles)
        };
        assert_eq!((g.node_id, g.members.len(), g.lease_ttl_s), (1, 2, 2));
        assert_eq!(g.sequencer.stream_id, 1);
        let e = err(&GROUP.replace("\"1=10.0.0.1:7101\", ", ""));
        assert!(
            e.contains("at least two members") || e.contains("not one of"),
            "{e}"
        );
        let e = err(&format!("threading = \"invoker\"\n{GROUP}"));
        assert!(e.contains("under threading = \"invoker\""), "{e}");
        // A consumer on a member's host (allowed by its address) is a consumer: it does not
        // say it is a standby.
        HostFile::parse(&GROUP.replace("allow = [\"10.0.0.9\"]", "allow = [\"10.0.0.2\"]"))
            .unwrap();
        let e = err(&GROUP.replace("2=10.0.0.2:7101", "2=0.0.0.0:7101"));
        assert!(e.contains("is no address"), "{e}");
        let e = err(&GROUP.replace("2=10.0.0.2:7101", "2=10.0.0.1:7102"));
        assert!(e.contains("members on one address"), "{e}");
        let e = err(&GROUP.replace("2=10.0.0.2", "x=10.0.0.2"));
        assert!(
            e.contains("NODE=REPLICATION_ADDRESS") || e.contains("node id"),
            "{e}"
        );
        let e = err(&GROUP.replace("node_id = 1", "node_id = 1\nrelease = \"sometimes\""));
        assert!(e.contains("standby-ack") && e.contains("immediate"), "{e}");
        let e = err(&GROUP.replace(
            "node_id = 1",
            "node_id = 1\nrelease = \"immediate\"\ndegrade_after_ms = 100",
        ));
        assert!(e.contains("degrade_after_ms is for"), "{e}");
        let e = err(&GROUP.replace(
            "node_id = 1",
            "node_id = 1\nrelease = \"immediate\"\nsync_standbys = 1",
        ));
        assert!(e.contains("sync_standbys is for"), "{e}");
        let e = err(&GROUP.replace("node_id = 1", "node_id = 1\nsync_standbys = 2"));
        assert!(e.contains("sync_standbys = 2, but"), "{e}");
        let e = err(&GROUP.replace("node_id = 1", "node_id = 1\nsync_standbys = 0"));
        assert!(
            e.contains("sync_standbys") || e.contains("sync-standbys"),
            "{e}"
        );
        let e = err(&format!(
            "{SEQ}{}",
            GROUP
                .replace("/tmp/x/md", "/tmp/x/md2")
                .replace("10.0.0.1:7001", "127.0.0.1:7001")
                .replace("name = \"md\"", "name = \"grp\"")
        )
        .replace("127.0.0.1:0", "127.0.0.1:7001"));
        assert!(e.contains("both listen on 127.0.0.1:7001"), "{e}");
    }

    #[test]
    fn the_example_of_the_docs_parses() {
        let doc = include_str!("../../docs/seqstreamd.md");
        let start = doc.find("```toml\n").expect("a toml block") + "```toml\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let f = HostFile::parse(&doc[start..end]).unwrap();
        assert_eq!(f.roles.len(), 5);
        let Threading::Groups(groups) = &f.threading else {
            panic!("{:?}", f.threading)
        };
        assert_eq!(groups.len(), 2);
    }
}
