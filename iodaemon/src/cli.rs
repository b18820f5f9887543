//! The options of the forwarder role ([`ForwardArgs`]): the iodaemon's forwarding flags and
//! the keys of `seqstreamd`'s `[[forward]]` table, and how it builds its agent; and
//! [`check_routes`], the check of routes against the replicas a host keeps. One parser serves
//! both, so the role is configured one way wherever it runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use seqstream_agent::daemon::{PlacementArgs, Role, RoleContext};
use seqstream_agent::host::Hosted;
use seqstream_auth::sources::SourceKeyArgs;

use crate::forwarder::{self, Forwarder, ForwarderConfig, Route};

/// The forwarder role: outboxes drained to the streams' sequencers over UDP, resent until
/// each message appears in the host's copy of its stream.
#[derive(Debug, Clone, clap::Args)]
pub struct ForwardArgs {
    /// An outbox file to drain (repeat, or comma-separate). One that does not exist yet is
    /// looked for every 100 ms and drained once its application creates it.
    #[arg(long = "outbox", value_delimiter = ',', required = true)]
    pub outboxes: Vec<PathBuf>,
    /// A route, STREAM_ID=SEQUENCER_ADDR[,ADDR...]=LOCAL_STORE_DIR (repeat): where the stream's
    /// messages go, and the local copy in which they are confirmed. A sequencer group's
    /// members may be given as NODE_ID@ADDR (all or none): the forwarder then sends to the
    /// member a term-start frame names as the new leader as soon as the local copy shows it.
    #[arg(long = "route", required = true, value_parser = parse_route)]
    pub routes: Vec<Route>,
    /// Local UDP address to send from and receive NAKs on.
    #[arg(long, default_value_t = forwarder::DEFAULT_BIND)]
    pub bind: SocketAddr,
    /// Largest datagram, bytes.
    #[arg(long, default_value_t = forwarder::DEFAULT_MTU)]
    pub mtu: usize,
    /// Resend a message unconfirmed this many ms after it began to wait (sent with nothing
    /// else in flight, the confirmation before it, or its last resend).
    #[arg(long, default_value_t = forwarder::DEFAULT_RESEND_TIMEOUT.as_millis() as u64)]
    pub resend_timeout_ms: u64,
    /// Session epoch written in every datagram.
    #[arg(long, default_value_t = forwarder::DEFAULT_EPOCH)]
    pub epoch: u32,
    /// The keys of the sources whose datagrams are signed.
    #[command(flatten)]
    pub keys: SourceKeyArgs,
    /// The forwarder's thread (and, in the iodaemon, the error policy of its replication
    /// clients too).
    #[command(flatten)]
    pub placement: PlacementArgs,
}

/// Parses `STREAM_ID=SEQUENCER[,SEQUENCER...]=DIR`, the shape of a route (and of the
/// iodaemon's `--follow`): the addresses of a sequencer group's members, or of one sequencer.
/// Each SEQUENCER is `ADDR`, or `NODE_ID@ADDR` to name a group member (all or none): with node
/// ids the forwarder follows the leader a term-start frame names ([`Route::node_ids`]).
pub fn parse_route(s: &str) -> Result<Route, String> {
    let mut parts = s.splitn(3, '=');
    let bad = || {
        format!("route {s:?}: use STREAM_ID=SEQUENCER_ADDR[,ADDR...]=LOCAL_STORE_DIR, each ADDR optionally NODE_ID@ADDR (all or none)")
    };
    let stream_id = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let mut sequencers = Vec::new();
    let mut node_ids = Vec::new();
    for member in parts.next().ok_or_else(bad)?.split(',') {
        let addr = match member.split_once('@') {
            Some((id, addr)) => {
                node_ids.push(id.parse().map_err(|_| bad())?);
                addr
            }
            None => member,
        };
        sequencers.push(addr.parse().map_err(|_| bad())?);
    }
    if !node_ids.is_empty() && node_ids.len() != sequencers.len() {
        return Err(bad());
    }
    let local_store = PathBuf::from(parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?);
    Ok(Route {
        stream_id,
        sequencers,
        node_ids,
        local_store,
    })
}

/// Checks `routes` against the replicas `kept` (stream id, store) on the same host: a route
/// and a replica of another stream must not name the same store (an error); a route whose
/// store no replica keeps is logged (another process must replicate it).
pub fn check_routes(routes: &[Route], kept: &[(u32, &Path)]) -> Result<()> {
    for r in routes {
        if let Some((stream_id, store)) = kept
            .iter()
            .find(|(s, store)| *store == r.local_store && *s != r.stream_id)
        {
            bail!(
                "the route of stream {} and the replica of stream {stream_id} name the same store {}: one store holds one stream",
                r.stream_id,
                store.display()
            );
        }
        if !kept.iter().any(|(_, store)| *store == r.local_store) {
            tracing::warn!(stream_id = r.stream_id, store = %r.local_store.display(), "no replica on this host keeps this route's local store: another process must replicate it");
        }
    }
    Ok(())
}

impl Role for ForwardArgs {
    const KIND: &'static str = "forward";
    const PLACEMENT_KEYS: &'static [&'static str] = PlacementArgs::KEYS;

    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let cfg = ForwarderConfig {
            outboxes: self.outboxes.clone(),
            routes: self.routes.clone(),
            bind: self.bind,
            mtu: self.mtu,
            resend_timeout: Duration::from_millis(self.resend_timeout_ms),
            epoch: self.epoch,
            keys: self.keys.open().context("reading the sources' key files")?,
        };
        let forwarder = Forwarder::open(cfg, &ctx.counters).context("opening the outboxes")?;
        tracing::info!(bind = %forwarder.local_addr(), outboxes = self.outboxes.len(), "forwarding");
        Ok(vec![Hosted {
            agent: Box::new(forwarder),
            placement: self.placement.placement(),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_names_its_sequencers_with_node_ids_for_all_or_none() {
        let r = parse_route("2=1@10.0.0.1:7002,2@[::1]:7002=/var/lib/orders").unwrap();
        assert_eq!(r.stream_id, 2);
        assert_eq!(
            r.sequencers,
            [
                "10.0.0.1:7002".parse().unwrap(),
                "[::1]:7002".parse().unwrap()
            ]
        );
        assert_eq!(r.node_ids, [1, 2]);
        assert_eq!(r.local_store, PathBuf::from("/var/lib/orders"));
        let plain = parse_route("2=10.0.0.1:7002,10.0.0.4:7002=/s").unwrap();
        assert!(plain.node_ids.is_empty());
        assert_eq!(plain.sequencers.len(), 2);
        for bad in [
            "2=1@10.0.0.1:7002,10.0.0.4:7002=/s",
            "2=x@10.0.0.1:7002=/s",
            "2=1@=/s",
            "2=10.0.0.1:7002=",
            "2=10.0.0.1=/s",
        ] {
            let e = parse_route(bad).unwrap_err();
            assert!(e.contains("NODE_ID@ADDR"), "{bad}: {e}");
        }
    }
}
