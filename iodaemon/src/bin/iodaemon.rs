//! `iodaemon`: the host daemon of the per-role layout. It keeps this host's replicas of the
//! streams it follows (`--follow`, one replication client agent on its own runner each),
//! forwards the host's outboxes to the streams' sequencers over UDP (`--route`), and resends
//! until each message appears in the host's copy of its stream. A shorthand of `seqstreamd`
//! with one `[[forward]]` table (the forwarding flags are its keys) and a `[[follow]]` table
//! per `--follow`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Parser;
use seqstream_agent::daemon::{self, DaemonArgs, Role, RoleContext};
use seqstream_agent::Idle;
use seqstream_iodaemon::cli::{check_routes, parse_route, ForwardArgs};
use seqstream_replication::cli::{
    Common, FollowArgs, DEFAULT_HEARTBEAT_MS, DEFAULT_KEY_OVERLAP_MS, DEFAULT_PEER_TIMEOUT_MS,
};
use seqstream_replication::follower::{AckTiming, DEFAULT_MAX_SEGMENT_SIZE};
use seqstream_store::FlushPolicy;

#[derive(Parser)]
#[command(
    name = "iodaemon",
    version,
    about = "Keep this host's stream replicas; forward outboxes to sequencers over UDP and resend until each message is sequenced"
)]
struct Cli {
    #[command(flatten)]
    forward: ForwardArgs,
    #[command(flatten)]
    follow: Follows,
    #[command(flatten)]
    daemon: DaemonArgs,
}

/// The replicas this daemon keeps.
#[derive(clap::Args)]
struct Follows {
    /// A stream to replicate to this host, STREAM_ID=UPSTREAM_ADDR=LOCAL_STORE_DIR (repeat):
    /// a replication client (an agent on its own runner) keeps LOCAL_STORE_DIR a
    /// byte-identical copy of the upstream's store. A route's local store is normally one of
    /// these.
    #[arg(long = "follow", value_parser = parse_follow, requires = "secret_file")]
    follows: Vec<Follow>,
    /// Key file of the replication key (16 to 4096 bytes, readable by its owner only): the
    /// replicas and their upstreams prove they hold it; it never crosses the wire.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Idle strategy of the replication clients' runners.
    #[arg(long, default_value = "backoff")]
    follow_idle: Idle,
    /// Cores for the replication clients' runners, in --follow order (none: unpinned).
    #[arg(long, value_delimiter = ',')]
    follow_cores: Vec<usize>,
    /// Flush policy of the replicas: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    follow_flush: FlushPolicy,
    /// The longest segment, bytes, an upstream may make a replica allocate (a longer segment
    /// header is refused as a lie); raise it to follow larger segments.
    #[arg(long, default_value_t = DEFAULT_MAX_SEGMENT_SIZE)]
    follow_max_segment_size: u64,
}

/// One `--follow`: a stream replicated into a local store.
#[derive(Debug, Clone)]
struct Follow {
    stream_id: u32,
    upstreams: Vec<SocketAddr>,
    store: PathBuf,
}

fn parse_follow(s: &str) -> Result<Follow, String> {
    let bad = || {
        format!("follow {s:?}: use STREAM_ID=UPSTREAM_ADDR[,ADDR...]=LOCAL_STORE_DIR (no NODE_ID@: a replica finds the leader by trying each)")
    };
    let r = parse_route(s).map_err(|_| bad())?;
    if !r.node_ids.is_empty() {
        return Err(bad());
    }
    Ok(Follow {
        stream_id: r.stream_id,
        upstreams: r.sequencers,
        store: r.local_store,
    })
}

impl Follows {
    /// Each `--follow` as the replica role's options, with the shared `--follow-*` settings
    /// and the forwarder's error policy.
    fn roles(&self, on_error: seqstream_agent::OnError) -> Result<Vec<(u32, FollowArgs)>> {
        if !self.follow_cores.is_empty() && self.follow_cores.len() != self.follows.len() {
            bail!(
                "--follow-cores names {} cores for {} --follow streams",
                self.follow_cores.len(),
                self.follows.len()
            );
        }
        for (i, f) in self.follows.iter().enumerate() {
            if self.follows[..i].iter().any(|g| g.store == f.store) {
                bail!(
                    "two --follow name the store {}: one replication client per store",
                    f.store.display()
                );
            }
        }
        let secret_file = self.secret_file.clone().unwrap_or_default();
        Ok(self
            .follows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let role = FollowArgs {
                    common: Common {
                        store: f.store.clone(),
                        stream_id: f.stream_id,
                        secret_file: secret_file.clone(),
                        idle: self.follow_idle.clone(),
                        on_error,
                        heartbeat_ms: DEFAULT_HEARTBEAT_MS,
                        peer_timeout_ms: DEFAULT_PEER_TIMEOUT_MS,
                        key_overlap_ms: DEFAULT_KEY_OVERLAP_MS,
                        tls_cert: None,
                        tls_key: None,
                    },
                    upstream: f.upstreams.clone(),
                    tls_ca: None,
                    tls_server_name: None,
                    core: self.follow_cores.get(i).copied(),
                    flush: self.follow_flush,
                    max_segment_size: self.follow_max_segment_size,
                    ack: AckTiming::Immediate,
                };
                (f.stream_id, role)
            })
            .collect())
    }
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    let follows = cli.follow.roles(cli.forward.placement.on_error)?;
    let kept: Vec<_> = cli
        .follow
        .follows
        .iter()
        .map(|f| (f.stream_id, f.store.as_path()))
        .collect();
    check_routes(&cli.forward.routes, &kept)?;
    daemon::run_dedicated("iodaemon", &cli.daemon, 128, &stop, |counters| {
        let mut roles = Vec::new();
        // Each replica's counters are scoped to its stream: `stream 5 replica position`.
        for (stream_id, follow) in &follows {
            let ctx = RoleContext {
                counters: counters.scoped(&format!("stream {stream_id} ")),
                sender_host: None,
            };
            roles.push((format!("follow stream {stream_id}"), follow.build(ctx)?));
        }
        let ctx = RoleContext {
            counters: counters.clone(),
            sender_host: None,
        };
        roles.push(("forward".to_string(), cli.forward.build(ctx)?));
        Ok(roles)
    })
}
