//! The options of the replication roles ([`ServeArgs`], [`FollowArgs`]): the flags of
//! `replicator serve` and `replicator follow` and the keys of `seqstreamd`'s `[[serve]]` and
//! `[[follow]]` tables, and how each builds its agents. One parser serves both, so a role is
//! configured one way wherever it runs.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use seqstream_agent::daemon::{Role, RoleContext};
use seqstream_agent::host::{Hosted, Placement};
use seqstream_agent::{Idle, OnError};
use seqstream_auth::Keyring;
use seqstream_store::{FlushPolicy, TailerOptions};

use crate::follower::{
    AckTiming, Follower, FollowerConfig, DEFAULT_MAX_SEGMENT_SIZE, GROUP_RECONNECT_MIN,
};
use crate::server::{Server, ServerConfig};
use crate::tls;

/// The default `--heartbeat-ms`.
pub const DEFAULT_HEARTBEAT_MS: u64 = 100;
/// The default `--peer-timeout-ms`.
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 5000;
/// The default `--max-consumers`.
pub const DEFAULT_MAX_CONSUMERS: u16 = 16;
/// The default `--key-overlap-ms`.
pub const DEFAULT_KEY_OVERLAP_MS: u64 = 60_000;
/// The default `--max-batch`, bytes.
pub const DEFAULT_MAX_BATCH: u32 = 256 << 10;

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
/// Options both replication roles have.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Store directory.
    #[arg(long)]
    pub store: PathBuf,
    /// Stream id of the store.
    #[arg(long)]
    pub stream_id: u32,
    /// Key file of the shared replication key: 16 to 4096 bytes of key material (a trailing
    /// newline removed), readable by its owner only. Both ends prove they hold it by
    /// challenge and response; it never crosses the wire. Rewritten, it is taken within a
    /// second, and the previous key stays valid for `--key-overlap-ms`.
    #[arg(long)]
    pub secret_file: PathBuf,
    /// After the key file changes, the previous key stays valid this many ms.
    #[arg(long, default_value_t = DEFAULT_KEY_OVERLAP_MS)]
    pub key_overlap_ms: u64,
    /// Idle strategy: busy-spin, yield, backoff, sleep:<N>us (of the senders' runners, or
    /// of the replication client's).
    #[arg(long, default_value = "backoff")]
    pub idle: Idle,
    /// What an error of the role (the acceptor, or the replication client) does: `stop`
    /// (the daemon exits with it) or `restart:<N>ms` (counted, logged, and the role started
    /// again after N ms).
    #[arg(long, default_value = "stop")]
    pub on_error: OnError,
    /// Heartbeat interval when idle, ms.
    #[arg(long, default_value_t = DEFAULT_HEARTBEAT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,
    /// Disconnect a peer silent this long, ms (at least 1).
    #[arg(long, default_value_t = DEFAULT_PEER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub peer_timeout_ms: u64,
    /// TLS: this end's certificate chain (PEM, leaf first). A server given one speaks only
    /// TLS; a replica given one presents it to its upstream (mutual TLS).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key of `--tls-cert` (PEM), readable by its owner only.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl Common {
    /// This end's certificate chain and key, when it has them.
    fn tls_identity(&self) -> Option<(&Path, &Path)> {
        self.tls_cert.as_deref().zip(self.tls_key.as_deref())
    }
}

/// The serving role: a store (read-only) served to replicas.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Addresses replicas may connect from (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', required = true)]
    pub allow: Vec<IpAddr>,
    /// Cores of the per-replica senders' runners: consumer slot i runs on the i-th (modulo
    /// the list), so live senders never share a core while replicas <= cores (none:
    /// unpinned). The acceptor is the slow path: it runs unpinned and sleeps 1 ms when idle.
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Most replicas at once (1 to 100).
    #[arg(long, default_value_t = DEFAULT_MAX_CONSUMERS, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub max_consumers: u16,
    /// SO_SNDBUF of each replica's socket, bytes.
    #[arg(long)]
    pub send_buffer: Option<usize>,
    /// Largest data message, bytes (4 KiB to 16 MiB; larger frames go in pieces).
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH, value_parser = clap::value_parser!(u32).range(4096..=(16 << 20)))]
    pub max_batch: u32,
    /// TLS: the CA certificates (PEM) every replica's certificate must chain to: mutual TLS.
    /// Needs `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

// Its doc comments are also its `--help` text, where `<N>` is meant as written.
#[allow(rustdoc::invalid_html_tags)]
/// The replica role: a local, byte-identical copy of an upstream's store.
#[derive(Debug, Clone, clap::Args)]
pub struct FollowArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// The upstream to follow; several (repeat, or comma-separate): the members of a
    /// sequencer group, tried in turn (only the leader admits consumers; after a round that
    /// found none, the next comes 5 ms later, doubling).
    #[arg(long, value_delimiter = ',', required = true)]
    pub upstream: Vec<SocketAddr>,
    /// TLS to the upstream: the CA certificates (PEM) its certificate must chain to.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// TLS: the name the upstream's certificate must carry (a DNS name or an IP address;
    /// default: the upstream's IP address). Needs `--tls-ca`.
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Core of the replication client's runner thread.
    #[arg(long)]
    pub core: Option<usize>,
    /// Flush policy of the replica: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    pub flush: FlushPolicy,
    /// The longest segment, bytes, the upstream may make this replica allocate (a longer
    /// segment header is refused as a lie); raise it to follow larger segments. At least
    /// 8 KiB (a segment header and a page of frames).
    #[arg(long, default_value_t = DEFAULT_MAX_SEGMENT_SIZE, value_parser = clap::value_parser!(u64).range(8192..))]
    pub max_segment_size: u64,
    /// When to acknowledge what a duty cycle wrote: immediate (in that cycle), next-cycle
    /// (at the start of the next, so that an application running this client under invoker
    /// threading reads the frames before the acknowledgement's send), or delayed:<N>us /
    /// delayed:<N>ms (one acknowledgement, at the first duty cycle to start N after the first
    /// write it covers; up to 100ms).
    #[arg(long, default_value = "immediate")]
    pub ack: AckTiming,
}

/// The replication keyring of `c`'s key file.
pub fn keys(c: &Common) -> Result<Keyring> {
    Keyring::open(&c.secret_file, Duration::from_millis(c.key_overlap_ms))
        .context("reading the replication key")
}

/// Fails unless a thread may be pinned to every core of `cores`
/// ([`seqstream_agent::affinity::check_core`]).
pub fn check_cores(cores: &[usize]) -> Result<()> {
    for &core in cores {
        seqstream_agent::affinity::check_core(core)?;
    }
    Ok(())
}

impl ServeArgs {
    /// Serving the replica `follow` keeps (tree fan-out) on `listen` to `allow`, with the
    /// replication client's secret, idle strategy, error policy and intervals.
    pub fn from_follow(follow: &FollowArgs, listen: SocketAddr, allow: Vec<IpAddr>) -> Self {
        ServeArgs {
            common: follow.common.clone(),
            listen,
            allow,
            cores: Vec::new(),
            max_consumers: DEFAULT_MAX_CONSUMERS,
            send_buffer: None,
            max_batch: DEFAULT_MAX_BATCH,
            tls_client_ca: None,
        }
    }
}

impl Role for ServeArgs {
    const KIND: &'static str = "serve";
    const PLACEMENT_KEYS: &'static [&'static str] = &["idle", "on_error", "cores"];

    /// The acceptor (the slow path: unpinned, 1 ms sleeps when idle on a thread of its own);
    /// its senders go to the context's sender host, or to runners of their own.
    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let c = &self.common;
        let mut cfg = ServerConfig::new(c.store.clone(), c.stream_id, self.listen, keys(c)?);
        cfg.allow = self.allow.clone();
        cfg.cores = self.cores.clone();
        cfg.idle = c.idle.clone();
        cfg.sender_host = ctx.sender_host;
        cfg.max_consumers = self.max_consumers as usize;
        cfg.send_buffer = self.send_buffer;
        cfg.max_batch = self.max_batch as usize;
        cfg.heartbeat = Duration::from_millis(c.heartbeat_ms);
        cfg.peer_timeout = Duration::from_millis(c.peer_timeout_ms);
        cfg.tls = c
            .tls_identity()
            .map(|(cert, key)| tls::server_config(cert, key, self.tls_client_ca.as_deref()))
            .transpose()
            .context("TLS")?;
        check_cores(&cfg.cores)?;
        // Fail at start, not on each connection, when the store cannot be served. A store
        // not created yet (a replica this host follows and serves further) is served once it
        // exists: replicas are refused until then.
        match seqstream_store::Tailer::open_with(&c.store, TailerOptions::probe()) {
            Ok(t) if t.stream_id() != c.stream_id => bail!(
                "{} holds stream {}, not {}",
                c.store.display(),
                t.stream_id(),
                c.stream_id
            ),
            Ok(_) => {}
            Err(seqstream_store::StoreError::NoStore { .. }) => {
                tracing::warn!(store = %c.store.display(), "no store yet: replicas are refused until it exists");
            }
            Err(e) => {
                return Err(e).with_context(|| format!("opening {}", c.store.display()));
            }
        }
        let server = Server::bind(cfg, &ctx.counters)
            .with_context(|| format!("serving {} on {}", c.store.display(), self.listen))?;
        tracing::info!(stream_id = c.stream_id, listen = %server.local_addr(), store = %c.store.display(), "serving");
        Ok(vec![Hosted {
            agent: Box::new(server),
            placement: Placement {
                core: None,
                idle: Idle::Sleep(Duration::from_millis(1)),
                on_error: c.on_error,
            },
        }])
    }
}

impl Role for FollowArgs {
    const KIND: &'static str = "follow";
    const PLACEMENT_KEYS: &'static [&'static str] = &["idle", "on_error", "core"];

    /// The replication client. A session fault is counted, logged and retried with backoff
    /// inside it; what fails the agent is its replica's store.
    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let c = &self.common;
        let mut cfg = FollowerConfig::new(c.store.clone(), c.stream_id, self.upstream[0], keys(c)?);
        cfg.alternates = self.upstream[1..].to_vec();
        if !cfg.alternates.is_empty() {
            cfg.reconnect_min = GROUP_RECONNECT_MIN;
        }
        cfg.store_config = cfg.store_config.flush(self.flush);
        cfg.heartbeat = Duration::from_millis(c.heartbeat_ms);
        cfg.peer_timeout = Duration::from_millis(c.peer_timeout_ms);
        cfg.max_segment_size = self.max_segment_size;
        cfg.ack = self.ack;
        if self.tls_ca.is_some() && self.upstream.len() > 1 && self.tls_server_name.is_none() {
            bail!("TLS to several upstreams: give --tls-server-name, the name every upstream's certificate carries");
        }
        if c.tls_cert.is_some() && self.tls_ca.is_none() {
            bail!("--tls-cert on a replica is for mutual TLS: give --tls-ca, the CA of its upstream's certificate, too");
        }
        cfg.tls = match &self.tls_ca {
            Some(ca) => Some((
                tls::client_config(ca, c.tls_identity()).context("TLS")?,
                tls::server_name(self.tls_server_name.as_deref(), self.upstream[0].ip())?,
            )),
            None => None,
        };
        check_cores(&self.core.into_iter().collect::<Vec<_>>())?;
        let follower = Follower::new(cfg, &ctx.counters)
            .with_context(|| format!("opening the replica {}", c.store.display()))?;
        tracing::info!(stream_id = c.stream_id, upstream = ?self.upstream, store = %c.store.display(), "following");
        Ok(vec![Hosted {
            agent: Box::new(follower),
            placement: Placement {
                core: self.core,
                idle: c.idle.clone(),
                on_error: c.on_error,
            },
        }])
    }
}
