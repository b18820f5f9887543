//! A planned hand-over of a leadership, asked by an operator: [`request_switchover`] writes
//! the switchover key and waits for the next term's leader key.
//!
//! What happens between is the members' business: the leader's `election` thread watches the
//! key during its term and tells its owner ([`Fence::handover`](crate::Fence::handover));
//! the owner (the group member) stops sequencing, waits until the target has acknowledged
//! everything committed, and resigns, which revokes its lease; the target sees the leader
//! key go, campaigns (the other members do not while the request stands: their campaign
//! reads it), and its campaign transaction deletes the key. Nothing is lost: the old leader
//! released nothing the target lacks, and the forwarders resend what was not sequenced.

use std::time::{Duration, Instant, SystemTime};

use etcd_client::PutOptions;

use crate::campaign::{get_group, parse_in_sync, parse_leader};
use crate::config::ElectionConfig;
use crate::operator::{connect_for, next_leader};
use crate::{Error, LeaderRecord, SwitchoverRecord};

/// What a switchover did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switchover {
    /// The leader that handed over, and its term.
    pub from: LeaderRecord,
    /// The leader after it (`to` of the request, in a later term).
    pub to: LeaderRecord,
    /// When the request was written (the wall clock just before the write).
    pub requested: SystemTime,
    /// From writing the request to seeing the new leader key.
    pub took: Duration,
}

/// Asks the group of `cfg` (its endpoints and prefix; the node id is not used) to hand its
/// leadership to `to`, or, when `None`, to the lowest-numbered other member of the in-sync
/// set; waits at most `timeout` for the new leader. The request lives on a lease of about
/// `timeout` (whole seconds, at least 1), revoked before this returns, so a request nobody
/// acts on never outlives it. Each etcd call may take up to `timeout` (or the group's
/// `call_timeout` if longer).
///
/// Errors: `Switchover` when no member leads, `to` leads already or is not in the in-sync set
/// (or the group has none recorded and `to` is not given), or no new leader appeared within
/// `timeout` (the leader's log says why: a target that did not catch up in time, say); `Etcd`
/// for a failed call; `Corrupt` for a key this crate did not write.
pub fn request_switchover(
    cfg: &ElectionConfig,
    to: Option<u32>,
    timeout: Duration,
) -> Result<Switchover, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Spawn)?
        .block_on(run(cfg, to, timeout))
}

async fn run(
    cfg: &ElectionConfig,
    to: Option<u32>,
    timeout: Duration,
) -> Result<Switchover, Error> {
    let (mut c, timed) = connect_for(cfg, timeout).await?;
    let etcd = |e: etcd_client::Error| Error::Etcd(e.to_string());
    let keys = get_group(&timed, &mut c).await?;
    let kv_of = |k: &str| keys.kvs().iter().find(|kv| kv.key() == k.as_bytes());
    let refuse = |why: String| Err(Error::Switchover(why));
    let Some(leader) = kv_of(&cfg.leader_key()) else {
        return refuse("no member leads".into());
    };
    let from = parse_leader(cfg, leader.value())?;
    let in_sync = kv_of(&cfg.in_sync_key())
        .map(|kv| parse_in_sync(cfg, kv.value()))
        .transpose()?;
    let to = match (to, in_sync) {
        (Some(n), _) if n == from.node_id => return refuse(format!("node {n} leads already")),
        (Some(n), Some(set)) if !set.contains(n) => {
            return refuse(format!(
                "node {n} is not in the in-sync set {set}: it may lack released frames"
            ))
        }
        (Some(n), _) => n,
        (None, Some(set)) => match set.nodes().into_iter().find(|&n| n != from.node_id) {
            Some(n) => n,
            None => return refuse(format!("no other member is in the in-sync set {set}")),
        },
        (None, None) => return refuse("the group has no in-sync set yet: name the member".into()),
    };
    let ttl = timeout.as_secs_f64().ceil().max(1.0) as i64;
    let lease = c.lease_grant(ttl, None).await.map_err(etcd)?.id();
    let record = SwitchoverRecord {
        from: from.node_id,
        term: from.term,
        to,
    };
    let (requested, started) = (SystemTime::now(), Instant::now());
    let outcome = async {
        let put = c
            .put(
                cfg.switchover_key(),
                serde_json::to_vec(&record).expect("a SwitchoverRecord serializes"),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(etcd)?;
        let revision = put.header().map_or(0, |h| h.revision());
        next_leader(&mut c, cfg, revision, from.term, started + timeout)
            .await?
            .ok_or_else(|| {
                Error::Switchover(format!(
                    "no new leader within {timeout:?} (see node {}'s log)",
                    from.node_id
                ))
            })
    }
    .await;
    let took = started.elapsed();
    let _ = c.lease_revoke(lease).await;
    Ok(Switchover {
        from,
        to: outcome?,
        requested,
        took,
    })
}
