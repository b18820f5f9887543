//! What the operator's one-shot requests ([`request_switchover`](crate::request_switchover),
//! [`force_promotion`](crate::force_promotion)) share: their etcd connection and the wait for
//! the next term's leader key. Members never use it.

use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, WatchOptions};

use crate::campaign::{connect, parse_leader};
use crate::config::ElectionConfig;
use crate::{Error, LeaderRecord};

/// A connection to the group's etcd, and `cfg` with the `call_timeout` its calls get: up to
/// `timeout` (or the group's `call_timeout` if longer). The members' short call limit guards
/// their fencing, while a one-shot request should not fail because etcd was slow to sync its
/// disk once.
pub(crate) async fn connect_for(
    cfg: &ElectionConfig,
    timeout: Duration,
) -> Result<(Client, ElectionConfig), Error> {
    let cfg = ElectionConfig {
        call_timeout: cfg.call_timeout.max(timeout),
        ..cfg.clone()
    };
    Ok((connect(&cfg).await?, cfg))
}

/// Waits, until `deadline`, for a leader key of a term above `after_term` put after etcd
/// `revision`. `Ok(None)` when the deadline passed first.
///
/// Errors: `Etcd` for a failed watch; `Corrupt` for a leader key this crate did not write.
pub(crate) async fn next_leader(
    c: &mut Client,
    cfg: &ElectionConfig,
    revision: i64,
    after_term: u32,
    deadline: Instant,
) -> Result<Option<LeaderRecord>, Error> {
    let etcd = |e: etcd_client::Error| Error::Etcd(e.to_string());
    let opts = WatchOptions::new().with_start_revision(revision + 1);
    let mut watch = c.watch(cfg.leader_key(), Some(opts)).await.map_err(etcd)?;
    let wait = async {
        while let Some(msg) = watch.message().await.map_err(etcd)? {
            for e in msg
                .events()
                .iter()
                .filter(|e| e.event_type() == EventType::Put)
            {
                let Some(kv) = e.kv() else { continue };
                let next = parse_leader(cfg, kv.value())?;
                if next.term > after_term {
                    return Ok(next);
                }
            }
        }
        Err(Error::Etcd("the watch of the leader key ended".into()))
    };
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, wait).await {
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}
