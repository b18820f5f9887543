//! `seqstreamd`: the seqstream host daemon. One process and one TOML file per host run any set
//! of roles (sequencers, compositors, replication servers and clients, forwarders) on threads
//! as the file says. See `docs/seqstreamd.md`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use seqstream_agent::daemon;
use seqstream_agent::host::{Placement, Threading};
use seqstreamd::{Host, HostFile, RoleSpec};

#[derive(Parser)]
#[command(
    name = "seqstreamd",
    version,
    about = "The seqstream host daemon: every role of a host, on threads as its file says",
    long_about = LONG_ABOUT
)]
struct Cli {
    /// The host's TOML file.
    #[arg(long)]
    config: PathBuf,
    /// Counters file for seqstat (default: the file's `counters`, else
    /// /dev/shm/seqstream-seqstreamd-<pid>.counters, removed at a clean exit).
    #[arg(long)]
    counters: Option<PathBuf>,
    /// Parse and check the file, print its roles and threading, and exit without opening
    /// anything.
    #[arg(long)]
    check: bool,
    /// Ask the sequencer group of this member's file (`--group`, or its only
    /// `[[sequencer_group]]`) for a planned hand-over of its leadership, wait for the new
    /// leader, print a JSON line and exit, without starting anything. Needs only etcd.
    #[arg(long)]
    switchover: bool,
    /// With --switchover: the member to hand over to (default: the lowest-numbered other
    /// member of the in-sync set).
    #[arg(long, requires = "switchover")]
    to: Option<u32>,
    /// Make this file's member of its sequencer group lead, when none leads and it may not
    /// take over by itself (release = "immediate": the in-sync set names the dead leader
    /// alone). Needs --accept-loss: what only the dead leader held beyond this member's
    /// store is lost. Prints a JSON line (what the store holds) and exits.
    #[arg(long, requires = "accept_loss", conflicts_with = "switchover")]
    promote: bool,
    /// With --promote: accept the loss of the frames only the dead leader held (consumers
    /// that received them are refused as diverged and must be rebuilt).
    #[arg(long, requires = "promote")]
    accept_loss: bool,
    /// With --switchover or --promote: the `[[sequencer_group]]`'s name.
    #[arg(long)]
    group: Option<String>,
    /// With --switchover or --promote: how long to wait for the new leader (ms).
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

const LONG_ABOUT: &str = "\
The seqstream host daemon: every role of a host, on threads as its file says.

The file (TOML) has top-level keys, thread tables and one table per role:

  threading = \"dedicated\" | \"shared\" | \"groups\"   (default dedicated;
              \"invoker\" is for a host embedded in an application)
  counters  = \"/dev/shm/host.counters\"              (optional)

  [shared]                 shared threading: the one thread (core, idle, on_error)
  [[thread]]               groups threading: name, core, idle, on_error, and
                           roles = [\"md-seq\", \"md-serve.senders\", ...]
                           (\"<role>.senders\": this thread also runs that server's
                           per-replica senders)

  [[sequencer]]  the sequencer role     keys = `sequencer` flags
  [[compositor]] the compositor role    keys = `compositor` flags
  [[serve]]      a replication server   keys = `replicator serve` flags
  [[follow]]     a replication client   keys = `replicator follow` flags
  [[forward]]    the forwarder          keys = `iodaemon` forwarding flags
  [[sequencer_group]]  a member of a sequencer group (leader or standby, etcd
                 elects): `sequencer` flags plus node_id, member, etcd,
                 lease_ttl_s, release, bootstrap, secret_file, allow

Each role table takes `name` (default <kind>-<n>; its counters are labelled
\"<name> ...\") and the long flags of its one-role daemon without the dashes,
`_` for `-` (stream_id = 1 is --stream-id 1; an array repeats the flag).
core, cores, idle and on_error place a role's own threads: they belong in a
role's table under dedicated threading (and cores/idle in a [[serve]] whose
senders no [[thread]] hosts), otherwise in [shared] or [[thread]].
Relative paths are relative to the daemon's working directory.

dedicated: each role (and each replica's sender) on a thread of its own.
shared:    every role and sender on one thread: the fewest threads.
groups:    the threads you list; every role in exactly one.
invoker:   no thread: an application that embeds the host (the seqstreamd
           library's Host::invoker) runs every role from its own loop. This
           daemon has no such loop and refuses the file (--check accepts it).

seqstreamd --config member.toml --switchover [--to N] asks the sequencer group
of a member's file for a planned hand-over (etcd only; prints a JSON line).
seqstreamd --config member.toml --promote --accept-loss makes that member lead a
group whose leader is dead and whose standbys may not take over (release =
\"immediate\"), saying where its store ends: what the leader held beyond is lost.

SIGINT or SIGTERM stops every role; an error under on_error = \"stop\" stops the
daemon with it, \"restart:<N>ms\" restarts the thread's roles. See
docs/seqstreamd.md for a full example.";

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse();
    let file = HostFile::read(&cli.config)?;
    if cli.switchover {
        return switchover(&file, &cli);
    }
    if cli.promote {
        return promote(&file, &cli);
    }
    if cli.check {
        for (name, role) in &file.roles {
            println!("[[{}]] {name}", role.kind());
        }
        let place = |p: &Placement| {
            let core = p
                .core
                .map_or("unpinned".to_string(), |c| format!("core {c}"));
            format!("{core}, idle {}, on_error {}", p.idle, p.on_error)
        };
        match &file.threading {
            Threading::Dedicated => println!(
                "threading dedicated: a thread per role and per replica's sender, each placed by its table"
            ),
            Threading::Shared(t) => println!(
                "threading shared: every role on thread {} ({})",
                t.name,
                place(&t.placement)
            ),
            Threading::Groups(groups) => {
                for t in groups {
                    println!(
                        "thread {} ({}): {}",
                        t.name,
                        place(&t.placement),
                        t.roles.join(", ")
                    );
                }
            }
            Threading::Invoker => println!(
                "threading invoker: every role on the thread of the application that embeds the host (seqstreamd::Host::invoker); this daemon cannot run it"
            ),
        }
        return Ok(());
    }
    if matches!(file.threading, Threading::Invoker) {
        bail!(
            "{}: threading = \"invoker\" runs the roles on the thread of an application that embeds the host (seqstreamd::Host::invoker); this daemon has no such thread: use \"shared\" for one thread",
            cli.config.display()
        );
    }
    let host = Host::start(file, cli.counters, &stop)?;
    host.join()?;
    tracing::info!("stopped");
    Ok(())
}

/// `--switchover`: asks the group in `file` for a planned hand-over and prints the outcome:
/// `{"switchover":"ok","group":G,"from":N,"from_term":T,"to":M,"term":U,"requested_ns":R,"ms":F}`
/// (`requested_ns`: when the request was written, ns since the Unix epoch; `ms`: from then to
/// the new leader key).
fn switchover(file: &HostFile, cli: &Cli) -> Result<()> {
    let (name, group) = group_of(file, cli)?;
    let done = seqstream_election::request_switchover(
        &group.election_config(),
        cli.to,
        Duration::from_millis(cli.timeout_ms),
    )
    .with_context(|| format!("switchover of group {name}"))?;
    println!(
        "{{\"switchover\":\"ok\",\"group\":\"{name}\",\"from\":{},\"from_term\":{},\"to\":{},\"term\":{},\"requested_ns\":{},\"ms\":{:.3}}}",
        done.from.node_id,
        done.from.term,
        done.to.node_id,
        done.to.term,
        done
            .requested
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
        done.took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// `--promote --accept-loss`: makes this file's member lead its group (see
/// `seqstream_election::force_promotion`) and prints
/// `{"promote":"ok","group":G,"node":N,"term":T,"last_term":L,"store_end_seq":S,
/// "store_end_position":P,"store_end_term":E,"ms":F}`: the member's store ended at seq `S`
/// (position `P`, a frame of term `E`) when it was promoted; what the leader of term `L`
/// committed beyond that is lost. A warning on stderr says so in words.
fn promote(file: &HostFile, cli: &Cli) -> Result<()> {
    let (name, group) = group_of(file, cli)?;
    if group.release != seqstreamd::group::ReleasePolicy::Immediate {
        bail!(
            "group {name} releases under standby-ack: a member of its in-sync set takes over by \
             itself, holding every released frame; a forced promotion could lose released frames"
        );
    }
    let store = &group.sequencer.store;
    let marker = seqstreamd::group::catching_up_marker(store);
    if marker.exists() {
        bail!(
            "{} exists: this member's store is still catching up with a leader, so it never \
             campaigns; promote a member whose store is whole",
            marker.display()
        );
    }
    let (position, next_seq, term) =
        store_end(store).with_context(|| format!("reading the end of {}", store.display()))?;
    let cfg = group.election_config();
    let node = cfg.node_id;
    let done = seqstream_election::force_promotion(&cfg, Duration::from_millis(cli.timeout_ms))
        .with_context(|| format!("promotion of node {node} in group {name}"))?;
    tracing::warn!(group = %name, node = done.leader.node_id, term = done.leader.term, last_term = done.last_term, store_end_seq = next_seq - 1, store_end_position = position, "promoted with loss accepted: whatever the leader of the last term committed beyond this store's end is lost to the group; consumers that received it are refused as diverged and must be rebuilt; the old leader cuts it when it returns");
    println!(
        "{{\"promote\":\"ok\",\"group\":\"{name}\",\"node\":{},\"term\":{},\"last_term\":{},\"store_end_seq\":{},\"store_end_position\":{position},\"store_end_term\":{term},\"ms\":{:.3}}}",
        done.leader.node_id,
        done.leader.term,
        done.last_term,
        next_seq - 1,
        done.took.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Where the store in `dir` ends: its end position, the seq its next frame would get, and the
/// term of its last frame (zeros and 1 for a store not created yet).
fn store_end(dir: &std::path::Path) -> Result<(u64, u64, u32)> {
    let mut t =
        match seqstream_store::Tailer::open_with(dir, seqstream_store::TailerOptions::probe()) {
            Ok(t) => t,
            Err(seqstream_store::StoreError::NoStore { .. }) => return Ok((0, 1, 0)),
            Err(e) => return Err(e.into()),
        };
    // Past the end: the tailer stops at the end of the stream (BadPosition says so).
    match t.seek_position(u64::MAX) {
        Ok(()) | Err(seqstream_store::StoreError::BadPosition { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let position = t.position();
    Ok((position, t.next_seq(), t.term_before(position)?))
}

/// The `[[sequencer_group]]` of `file` that `--group` names, or its only one.
fn group_of<'f>(file: &'f HostFile, cli: &Cli) -> Result<(&'f String, &'f seqstreamd::GroupArgs)> {
    let groups: Vec<(&String, &seqstreamd::GroupArgs)> = file
        .roles
        .iter()
        .filter_map(|(name, r)| match r {
            RoleSpec::Group(g) => Some((name, g.as_ref())),
            _ => None,
        })
        .filter(|(name, _)| cli.group.as_ref().is_none_or(|g| g == *name))
        .collect();
    let (name, group) = match groups[..] {
        [one] => one,
        [] => bail!(
            "{}: no [[sequencer_group]]{}",
            cli.config.display(),
            cli.group
                .as_ref()
                .map_or(String::new(), |g| format!(" named {g}"))
        ),
        _ => bail!(
            "{}: several [[sequencer_group]]s: name one with --group",
            cli.config.display()
        ),
    };
    Ok((name, group))
}
