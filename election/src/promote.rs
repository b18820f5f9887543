//! A forced promotion, asked by an operator when no member leads and none may take over by
//! itself: [`force_promotion`] records an in-sync set naming only the member to promote,
//! then waits for its leader key.
//!
//! Under the `immediate` release policy the leader releases what it commits without waiting
//! for any standby, so no standby is known to hold every released frame: the in-sync set
//! names the leader alone, and when the leader dies nobody campaigns. Promoting a standby
//! then accepts the loss of what the dead leader committed beyond the standby's store:
//! consumers that received those frames hold a history the group no longer has, and are
//! refused as diverged when they reconnect (never merged). The old leader, when it returns,
//! is not in the set, follows the new leader and cuts that tail.
//!
//! The member named campaigns on its own once the set names it (a member barred from
//! campaigning reads the group again every `retry_every`); this module never writes the
//! leader key.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::campaign::{get_group, in_sync_value, parse_in_sync, parse_leader};
use crate::config::ElectionConfig;
use crate::operator::{connect_for, next_leader};
use crate::{Error, LeaderRecord, NodeSet};

/// What a forced promotion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promotion {
    /// The term of the last leader (the group's term counter before the promotion; 0 when
    /// none ever led).
    pub last_term: u32,
    /// The promoted member's leadership.
    pub leader: LeaderRecord,
    /// From recording the in-sync set to seeing the new leader key.
    pub took: Duration,
}

/// Makes the member `cfg.node_id` of the group at `cfg.prefix` the only member of its in-sync
/// set, so that it campaigns and nobody else does, and waits at most `timeout` for it to
/// lead. Each etcd call may take up to `timeout` (or the group's `call_timeout` if longer).
///
/// Errors: `Promotion` when a member leads (a live leader hands over with a switchover), the
/// in-sync set names more than one member (a standby-ack group: one of them takes over by
/// itself), the group changed between the read and the write (a leader appeared: nothing was written),
/// or the member did not lead within `timeout` (its `seqstreamd` not running, or its store
/// not eligible: its log says; the set still names it); `Etcd` for a failed call; `Corrupt`
/// for a key this crate did not write.
pub fn force_promotion(cfg: &ElectionConfig, timeout: Duration) -> Result<Promotion, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Spawn)?
        .block_on(run(cfg, timeout))
}

async fn run(cfg: &ElectionConfig, timeout: Duration) -> Result<Promotion, Error> {
    let (mut c, timed) = connect_for(cfg, timeout).await?;
    let etcd = |e: etcd_client::Error| Error::Etcd(e.to_string());
    let refuse = |why: String| Err(Error::Promotion(why));
    let keys = get_group(&timed, &mut c).await?;
    let kv_of = |k: &str| keys.kvs().iter().find(|kv| kv.key() == k.as_bytes());
    if let Some(kv) = kv_of(&cfg.leader_key()) {
        let leader = parse_leader(cfg, kv.value())?;
        return refuse(format!(
            "node {} leads term {}: a live leader hands over with --switchover",
            leader.node_id, leader.term
        ));
    }
    let last_term = match kv_of(&cfg.term_key()) {
        None => 0,
        Some(kv) => std::str::from_utf8(kv.value())
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .ok_or_else(|| Error::Corrupt {
                key: cfg.term_key(),
                reason: "not a decimal u32".into(),
            })?,
    };
    if let Some(kv) = kv_of(&cfg.in_sync_key()) {
        let set = parse_in_sync(cfg, kv.value())?;
        if set.nodes().len() > 1 {
            return refuse(format!(
                "the in-sync set {set} names more than the last leader: those members hold \
                 every released frame and one of them takes over by itself (a standby-ack \
                 group)"
            ));
        }
    }
    let in_sync_rev = kv_of(&cfg.in_sync_key()).map_or(0, |kv| kv.mod_revision());
    let txn = Txn::new()
        .when([
            Compare::create_revision(cfg.leader_key().as_str(), CompareOp::Equal, 0),
            Compare::mod_revision(cfg.in_sync_key().as_str(), CompareOp::Equal, in_sync_rev),
        ])
        .and_then([TxnOp::put(
            cfg.in_sync_key().as_str(),
            in_sync_value(last_term, NodeSet::of([cfg.node_id])),
            None,
        )]);
    let started = Instant::now();
    let done = c.txn(txn).await.map_err(etcd)?;
    if !done.succeeded() {
        return refuse(
            "the group changed while it was read (a leader appeared?): nothing was written; \
             look again"
                .into(),
        );
    }
    let revision = done.header().map_or(0, |h| h.revision());
    let Some(leader) = next_leader(&mut c, cfg, revision, last_term, started + timeout).await?
    else {
        return refuse(format!(
            "node {} did not lead within {timeout:?}: is its seqstreamd running, its store \
             eligible? (its log says; the in-sync set names it alone now)",
            cfg.node_id
        ));
    };
    Ok(Promotion {
        last_term,
        leader,
        took: started.elapsed(),
    })
}
