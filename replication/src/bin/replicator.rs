//! `replicator`: serve a store to replicas (`serve`), or keep a local replica of an upstream
//! (`follow`). One-role shorthands of `seqstreamd`: the flags of `serve` and `follow` are the
//! keys of its `[[serve]]` and `[[follow]]` tables. Options come from flags, or from a TOML
//! file (`--config`) whose keys are the long flag names (`listen = "0.0.0.0:7000"`); flags
//! given on the command line win.

use std::net::{IpAddr, SocketAddr};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use seqstream_agent::daemon::{self, DaemonArgs, Role, RoleContext};
use seqstream_replication::cli::{FollowArgs, ServeArgs};

#[derive(Parser)]
#[command(
    name = "replicator",
    version,
    about = "Replicate a seqstream store over TCP: byte-identical replicas, one sender agent per replica"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a store (read-only) to replicas.
    Serve {
        #[command(flatten)]
        role: ServeArgs,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Keep a local replica of an upstream (a primary's server or another replica's).
    Follow {
        #[command(flatten)]
        role: FollowArgs,
        #[command(flatten)]
        relay: Relay,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
}

/// Serving the replica further, from the same process.
#[derive(Args)]
struct Relay {
    /// Serve the replica further (tree fan-out) on this address, with the same secret.
    #[arg(long, requires = "serve_allow")]
    serve_listen: Option<SocketAddr>,
    /// Addresses allowed to connect to --serve-listen.
    #[arg(long, value_delimiter = ',')]
    serve_allow: Vec<IpAddr>,
}

/// Counter slots of a replicator: a server's 16 consumers take 5 each.
const COUNTERS: usize = 512;

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    match cli.cmd {
        Cmd::Serve { role, daemon } => {
            daemon::run_one("replicator", &role, &daemon, COUNTERS, &stop)
        }
        Cmd::Follow {
            role,
            relay,
            daemon,
        } => daemon::run_dedicated("replicator", &daemon, COUNTERS, &stop, |counters| {
            let ctx = RoleContext {
                counters: counters.clone(),
                sender_host: None,
            };
            let mut roles = Vec::new();
            if let Some(listen) = relay.serve_listen {
                // The relay serves the replica with the client's settings.
                let serve = ServeArgs::from_follow(&role, listen, relay.serve_allow.clone());
                roles.push(("relay".to_string(), serve.build(ctx.clone())?));
            }
            roles.push(("follow".to_string(), role.build(ctx)?));
            Ok(roles)
        }),
    }
}
