//! `seqstreamd`: the seqstream host daemon. One process and one TOML file per host run any set
//! of roles (sequencers, compositors, replication servers and clients, forwarders) on threads
//! as the file says. See `docs/seqstreamd.md`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use seqstream_agent::daemon;
use seqstream_agent::host::{Placement, Threading};
use seqstreamd::{Host, HostFile};

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
}

const LONG_ABOUT: &str = "\
The seqstream host daemon: every role of a host, on threads as its file says.

The file (TOML) has top-level keys, thread tables and one table per role:

  threading = \"dedicated\" | \"shared\" | \"groups\"   (default dedicated)
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

SIGINT or SIGTERM stops every role; an error under on_error = \"stop\" stops the
daemon with it, \"restart:<N>ms\" restarts the thread's roles. See
docs/seqstreamd.md for a full example.";

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse();
    let file = HostFile::read(&cli.config)?;
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
        }
        return Ok(());
    }
    let host = Host::start(file, cli.counters, &stop)?;
    host.join()?;
    tracing::info!("stopped");
    Ok(())
}
